//! The event logic on small clusters, deterministic by seed.

use super::*;

/// 200 nodes in 10 racks of 20, EC(8,2) width, nothing failing unless a test says so.
fn quiet_config(domain_aware: bool) -> Config {
    Config {
        nodes: 200,
        load_balancing_factor: 2,
        slabs_per_node: 16,
        rack_size: 20,
        domain_aware,
        node_mttf_years: 0.0,
        rack_mttf_years: 0.0,
        transient_mttf_years: 0.0,
        transient_mean_seconds: 300.0,
        weibull_shape: None,
        detect_seconds: 10.0,
        slab_bytes: 1 << 30,
        rebuild_mib_per_second: 200.0,
        rebuild_parallel: 1,
        replace_hours: 24.0,
    }
}

/// Ranges with more than `parity` slabs in `rack`.
fn crowded_ranges(trial: &Trial<'_>, config: &Config, width: usize, parity: usize, rack: u32) -> u64 {
    trial
        .range_nodes()
        .chunks(width)
        .filter(|range| range.iter().filter(|&&n| config.rack_of(n as usize) == rack).count() > parity)
        .count() as u64
}

#[test]
fn one_rack_failure_loses_nothing_with_domain_aware_placement() {
    let config = quiet_config(true);
    for policy in [
        Policy::CodingSets,
        Policy::CodingSetsPowerOfTwo,
        Policy::EcCache,
        Policy::PowerOfTwoPerSlab,
        Policy::LeastLoaded,
    ] {
        let mut trial = Trial::new(&config, policy, 8, 2, 7).unwrap();
        assert_eq!(crowded_ranges(&trial, &config, 10, 1, 0), 0, "{policy:?}: one split per rack");
        trial.fail_rack_now(0);
        trial.run_quiet_until(86_400.0);
        let result = trial.result();
        assert_eq!(result.ranges_lost, 0, "{policy:?}");
        assert_eq!(result.node_failures, 20);
        // Every slab of the rack was rebuilt elsewhere within the day (20 nodes x 16 slabs, on
        // average; the exact count is what the nodes held).
        assert!(result.rebuilds >= 250, "{policy:?}: {} rebuilds", result.rebuilds);
        assert_eq!(result.down_windows, result.rebuilds);
        assert!(result.expected_ranges_lost == 0.0, "no second failure can happen: all rates are 0");
    }
}

#[test]
fn one_rack_failure_loses_the_crowded_ranges_without_domain_awareness() {
    let config = quiet_config(false);
    for policy in [Policy::CodingSets, Policy::EcCache] {
        let mut trial = Trial::new(&config, policy, 8, 2, 7).unwrap();
        let crowded = crowded_ranges(&trial, &config, 10, 2, 0);
        assert!(crowded > 0, "{policy:?}: racks of 20 >= k+r placed unaware crowd some range");
        trial.fail_rack_now(0);
        trial.run_quiet_until(86_400.0);
        assert_eq!(trial.result().ranges_lost, crowded, "{policy:?}");
        assert_eq!(trial.result().loss_events, 1, "one rack, one event");
    }
}

fn busy_config() -> Config {
    Config {
        nodes: 60,
        rack_size: 6,
        node_mttf_years: 0.5,
        rack_mttf_years: 5.0,
        transient_mttf_years: 0.5,
        transient_mean_seconds: 600.0,
        detect_seconds: 3600.0,
        rebuild_mib_per_second: 1.0,
        replace_hours: 48.0,
        ..quiet_config(true)
    }
}

#[test]
fn same_seed_same_trial() {
    let config = busy_config();
    let run = |seed| {
        let trial = Trial::new(&config, Policy::CodingSetsPowerOfTwo, 4, 2, seed).unwrap();
        serde_json::to_string(&trial.run(5.0, &mut |_| {})).unwrap()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

#[test]
fn invariants_hold_through_a_busy_decade() {
    let config = Config { weibull_shape: Some(0.7), ..busy_config() };
    for policy in [Policy::CodingSets, Policy::EcCache, Policy::LeastLoaded] {
        let mut trial = Trial::new(&config, policy, 4, 2, 11).unwrap();
        trial.run_quiet_until(10.0 * SECONDS_PER_YEAR);
        let result = trial.result();
        assert!(result.node_failures > 100 && result.transient_failures > 100, "{result:?}");
        assert!(result.rebuilds > 0 && result.slabs_returned > 0, "{result:?}");
    }
}

#[test]
fn transient_failures_shorter_than_the_lease_rebuild_nothing() {
    let config = Config {
        transient_mttf_years: 0.1,
        transient_mean_seconds: 60.0,
        detect_seconds: 1e9,
        ..quiet_config(true)
    };
    let result = Trial::new(&config, Policy::EcCache, 8, 2, 5).unwrap().run(1.0, &mut |_| {});
    assert!(result.transient_failures > 1000, "{result:?}");
    assert_eq!(result.rebuilds, 0);
    assert_eq!(result.slabs_returned, result.down_windows);
    assert!(result.slabs_returned > 10_000);
}

#[test]
fn first_order_estimate_matches_observed_losses_of_rep2() {
    // rep(2) with long windows loses often; the first-order estimate is exact in expectation.
    let config = Config { transient_mttf_years: 0.0, ..busy_config() };
    let mut observed = 0;
    let mut expected = 0.0;
    for seed in 0..4 {
        let result = Trial::new(&config, Policy::EcCache, 1, 1, seed).unwrap().run(20.0, &mut |_| {});
        observed += result.ranges_lost;
        expected += result.expected_first_order;
        assert!(
            (result.expected_ranges_lost - result.expected_first_order).abs()
                < 1e-6 * result.expected_first_order
        );
    }
    assert!(observed > 50, "{observed}");
    let tolerance = 5.0 * expected.sqrt();
    assert!((observed as f64 - expected).abs() < tolerance, "observed {observed}, expected {expected:.1}");
}

#[test]
fn second_order_estimate_is_near_observed_losses_of_ec_r2() {
    // Two failures must meet a third within an hour-long window: frequent only at these rates.
    let config = Config { transient_mttf_years: 0.0, node_mttf_years: 0.05, ..busy_config() };
    let mut observed = 0;
    let mut expected = 0.0;
    for seed in 0..4 {
        let result = Trial::new(&config, Policy::EcCache, 4, 2, seed).unwrap().run(4.0, &mut |_| {});
        observed += result.ranges_lost;
        expected += result.expected_ranges_lost;
    }
    assert!(observed > 15, "observed {observed}, expected {expected:.1}");
    let ratio = expected / observed as f64;
    assert!((0.5..2.0).contains(&ratio), "observed {observed}, expected {expected:.1}");
}

#[test]
fn poisson_interval_matches_tables() {
    let (low, high) = poisson_interval_95(0);
    assert_eq!(low, 0.0);
    assert!((high - 3.689).abs() < 1e-3, "{high}");
    let (low, high) = poisson_interval_95(10);
    assert!((low - 4.795).abs() < 1e-3 && (high - 18.39).abs() < 1e-2, "{low} {high}");
}

#[test]
fn gamma_of_integers_and_half() {
    assert!((gamma(5.0) - 24.0).abs() < 1e-9);
    assert!((gamma(0.5) - std::f64::consts::PI.sqrt()).abs() < 1e-9);
}
