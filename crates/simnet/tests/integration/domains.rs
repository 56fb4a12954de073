//! Failure domains and rebuilds: a rebuilt slab goes where its range keeps at most r splits per
//! failure domain (losing one domain must not lose data), as the range's first placement does.
//! When only a crowded domain has a free node the slab stays unrebuilt (the range runs degraded)
//! until a node of another domain can take it, unless `allow_shared_domains` accepts the risk.

use crate::common;
use common::*;
use remem_simnet::{NetworkOptions, PlacementPolicy, SimCluster};

const EC_4_2: Shape = Shape { data_splits: 4, parity_splits: 2, extra_reads: 1 };

/// EC(4,2) over nodes in domains `domains` (one node per entry), 8 slabs each, one range.
fn start_in_domains(seed: u64, domains: &[&str], config: EngineConfig) -> SimDriver {
    let mut cluster = SimCluster::new(seed, NetworkOptions::default());
    for domain in domains {
        cluster.add_node((*domain).to_owned(), 8, SLAB_BYTES);
    }
    let mut driver = SimDriver::new(cluster, config, PlacementPolicy::LeastLoaded, seed);
    driver.enable_trace();
    driver
}

/// Most splits of range 0 in one failure domain, counting only slabs that can be read or are
/// being rebuilt (where the range will be once healed).
fn most_splits_in_one_domain(driver: &SimDriver) -> usize {
    let range = &driver.engine().ranges()[0];
    let mut per_domain: std::collections::HashMap<String, usize> = Default::default();
    for (split, slab) in range.slabs.iter().enumerate() {
        let lost = range.unavailable & (1 << split) != 0 && range.rebuilding & (1 << split) == 0;
        if !lost {
            *per_domain.entry(driver.engine().node(slab.node).info.failure_domain.clone()).or_default() += 1;
        }
    }
    per_domain.into_values().max().unwrap_or(0)
}

/// Seven nodes: three in domain a, two in b, one each in c and d. The range takes two of a,
/// both of b, c and d; when the node of d dies, the only free node is a's third, where the range
/// would hold three splits.
const CROWDED: [&str; 7] = ["a", "a", "a", "b", "b", "c", "d"];

fn range_loses_domain_d(driver: &mut SimDriver) -> std::ops::Range<u64> {
    let region = driver.create_region(EC_4_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(driver, pages.clone(), 1);
    assert_eq!(most_splits_in_one_domain(driver), 2, "placed with r splits per domain at most");
    let node_of_d = range_nodes(driver, 0)
        .into_iter()
        .find(|&node| driver.engine().node(node).info.failure_domain == "d")
        .expect("the range uses domain d");
    kill(driver, node_of_d);
    let noticed =
        driver.run_until_condition(driver.now() + LIMIT, |driver| !driver.engine().node(node_of_d).connected);
    assert!(noticed, "the client noticed the death\n{}", trace_of(driver));
    pages
}

#[test]
fn rebuilt_slab_waits_rather_than_crowd_a_failure_domain_past_r() {
    let mut driver = start_in_domains(301, &CROWDED, config());
    let pages = range_loses_domain_d(&mut driver);
    driver.run_for(2 * SECOND);
    assert!(!driver.is_healed(), "only domain a has a free node: the slab must wait\n{}", trace_of(&driver));
    assert_eq!(most_splits_in_one_domain(&driver), 2, "no third split in domain a\n{}", trace_of(&driver));
    verify_all(&mut driver, pages.clone(), |_| 1);
    // A node in a new domain joins: the slab is rebuilt there.
    let added = driver.add_node("e".to_owned(), 8, SLAB_BYTES);
    heal(&mut driver);
    assert!(range_nodes(&driver, 0).contains(&added), "the rebuilt slab went to domain e");
    assert_eq!(most_splits_in_one_domain(&driver), 2);
    verify_all(&mut driver, pages, |_| 1);
}

#[test]
fn rebuilt_slab_prefers_a_domain_below_r_over_a_crowded_one() {
    // As above plus a second node in domain c: two nodes are free, one in a domain holding r
    // splits of the range. Equally loaded, placement alone would take the lower node index.
    let mut domains = CROWDED.to_vec();
    domains.push("c");
    let mut driver = start_in_domains(302, &domains, config());
    let pages = range_loses_domain_d(&mut driver);
    let used = range_nodes(&driver, 0);
    let crowded_free = (0..domains.len()).filter(|node| !used.contains(node)).any(|node| {
        used.iter().filter(|&&other| domains[other] == domains[node]).count() == EC_4_2.parity_splits
    });
    assert!(crowded_free, "a free node in a domain holding r splits: {used:?}");
    heal(&mut driver);
    assert_eq!(
        most_splits_in_one_domain(&driver),
        2,
        "rebuilt outside the crowded domain\n{}",
        trace_of(&driver)
    );
    verify_all(&mut driver, pages, |_| 1);
}

#[test]
fn allow_shared_domains_rebuilds_into_a_crowded_domain_when_no_other_can() {
    let mut config = config();
    config.allow_shared_domains = true;
    let mut driver = start_in_domains(303, &CROWDED, config);
    let pages = range_loses_domain_d(&mut driver);
    heal(&mut driver);
    assert_eq!(most_splits_in_one_domain(&driver), 3, "the risk accepted: three splits in domain a");
    verify_all(&mut driver, pages, |_| 1);
}
