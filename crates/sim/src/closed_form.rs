//! The seed's closed form for the probability of data loss (seed 000 §5.1), and the same
//! formula fed with a layout's actual number of copysets.
//!
//! A *copyset* is a set of r+1 nodes whose joint failure loses at least one range. The seed
//! counts them per coding group, C(group nodes, r+1), and treats each of the C(F, r+1)
//! (r+1)-subsets of the F failed nodes as an independent draw that hits a copyset with
//! probability copysets / C(N, r+1):
//!
//!   P[Group] = C(group nodes, r+1) / C(N, r+1)
//!   P(loss)  = 1 - (1 - P[Group] * G)^C(F, r+1),   F = N * f
//!
//! with groups of k+r nodes and G = N*S/(k+r) for random placement (EC-Cache, power of two),
//! groups of k+r+l nodes and G = N/(k+r+l) for CodingSets.

/// C(n, k) as a float (exact for the sizes used here up to rounding).
pub fn binomial(n: u64, k: u64) -> f64 {
    if k > n {
        return 0.0;
    }
    let k = k.min(n - k);
    (1..=k).fold(1.0, |product, i| product * (n - k + i) as f64 / i as f64)
}

/// The seed's P[Group]: the chance that r+1 random nodes out of `nodes` are all in one given
/// group of `group_nodes`.
pub fn group_probability(nodes: u64, group_nodes: u64, parity_splits: u64) -> f64 {
    binomial(group_nodes, parity_splits + 1) / binomial(nodes, parity_splits + 1)
}

/// 1 - (1 - copysets / C(N, r+1))^C(F, r+1), computed in log space so that tiny values keep
/// their digits. One if the copysets cover every (r+1)-subset.
pub fn loss_probability_from_copysets(
    nodes: u64,
    copysets: f64,
    parity_splits: u64,
    failed_nodes: u64,
) -> f64 {
    let hit = copysets / binomial(nodes, parity_splits + 1);
    if hit >= 1.0 {
        return if failed_nodes > parity_splits { 1.0 } else { 0.0 };
    }
    let draws = binomial(failed_nodes, parity_splits + 1);
    -f64::exp_m1(draws * f64::ln_1p(-hit))
}

/// The seed's closed form with G groups of `group_nodes` each.
pub fn loss_probability(
    nodes: u64,
    group_nodes: u64,
    groups: f64,
    parity_splits: u64,
    failed_nodes: u64,
) -> f64 {
    let copysets = binomial(group_nodes, parity_splits + 1) * groups;
    loss_probability_from_copysets(nodes, copysets, parity_splits, failed_nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_small_values() {
        assert_eq!(binomial(10, 3), 120.0);
        assert_eq!(binomial(12, 3), 220.0);
        assert_eq!(binomial(1000, 3), 166_167_000.0);
        assert_eq!(binomial(3, 5), 0.0);
        assert_eq!(binomial(7, 0), 1.0);
    }

    #[test]
    fn group_probability_of_the_seed_example() {
        // Seed §5.1: an (8+2) group has C(10,3) = 120 copysets.
        assert!((group_probability(1000, 10, 2) - 120.0 / 166_167_000.0).abs() < 1e-18);
        // By hand: N=10, groups of 3, r=1: C(3,2)/C(10,2) = 3/45.
        assert!((group_probability(10, 3, 1) - 1.0 / 15.0).abs() < 1e-15);
    }

    #[test]
    fn closed_form_by_hand_for_a_small_cluster() {
        // N=10, k=2, r=1, groups of 3, G=3, F=3: P[Group]*G = 9/45 = 0.2, C(3,2) = 3 draws,
        // P = 1 - 0.8^3 = 0.488.
        let p = loss_probability(10, 3, 3.0, 1, 3);
        assert!((p - 0.488).abs() < 1e-12, "{p}");
        // Fewer than r+1 failures can lose nothing.
        assert_eq!(loss_probability(10, 3, 3.0, 1, 1), 0.0);
    }

    #[test]
    fn closed_form_at_the_seed_base_point() {
        // N=1000, k=8, r=2, S=16, f=1%: EC-Cache has G=1600 groups of 10,
        // CodingSets (l=2) G=1000/12 groups of 12; 120 triples among 10 failed nodes.
        let ec_cache = loss_probability(1000, 10, 1600.0, 2, 10);
        let expected_ec_cache = 1.0 - (1.0 - 120.0 * 1600.0 / 166_167_000.0f64).powi(120);
        assert!((ec_cache - expected_ec_cache).abs() < 1e-12, "{ec_cache}");
        let coding_sets = loss_probability(1000, 12, 1000.0 / 12.0, 2, 10);
        let expected_coding_sets = 1.0 - (1.0 - 220.0 * (1000.0 / 12.0) / 166_167_000.0f64).powi(120);
        assert!((coding_sets - expected_coding_sets).abs() < 1e-12, "{coding_sets}");
        // The seed's claim: about an order of magnitude apart.
        assert!(ec_cache / coding_sets > 9.0 && ec_cache / coding_sets < 11.0);
    }

    #[test]
    fn saturated_copysets_mean_certain_loss() {
        assert_eq!(loss_probability_from_copysets(10, 45.0, 1, 2), 1.0);
    }
}
