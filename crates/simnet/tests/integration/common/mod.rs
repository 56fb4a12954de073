//! Helpers of the named simulator scenarios (`scenarios.rs`, `parity_stale.rs`): a client over a
//! small simulated cluster with timeouts in milliseconds, whole-range writes and checked reads,
//! and waiting for the cluster to heal. Each test binary uses some of them.
#![allow(dead_code)]

pub use remem_client::core::Shape;
pub use remem_client::engine::EngineConfig;
pub use remem_simnet::scenario::{identify, page_pattern, PAGE_BYTES, SLAB_BYTES};
use remem_simnet::{
    FaultAction, NetworkOptions, PlacementPolicy, SimCluster, SimOp, MICROSECOND, MILLISECOND,
};
pub use remem_simnet::{SimDriver, SimTime, SECOND};

pub const EC_8_2: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
/// Longest any step of a named scenario may take in simulated time.
pub const LIMIT: SimTime = 10 * SECOND;
pub const REQUEST_TIMEOUT: SimTime = 10 * MILLISECOND;

pub fn config() -> EngineConfig {
    let mut config = EngineConfig::new(0x00C1_1E47, PAGE_BYTES);
    config.max_in_flight = 8;
    config.request_timeout = std::time::Duration::from_nanos(REQUEST_TIMEOUT);
    config.heartbeat_interval = std::time::Duration::from_millis(20);
    config.probe_interval = std::time::Duration::from_millis(20);
    config
}

/// A client over `nodes` nodes (one failure domain each) of `capacity` 16 KiB slabs.
pub fn start(
    seed: u64,
    nodes: usize,
    capacity: u32,
    options: NetworkOptions,
    config: EngineConfig,
) -> SimDriver {
    let mut cluster = SimCluster::new(seed, options);
    for node in 0..nodes {
        cluster.add_node(format!("d{node}"), capacity, SLAB_BYTES);
    }
    let mut driver = SimDriver::new(cluster, config, PlacementPolicy::LeastLoaded, seed);
    driver.enable_trace();
    driver
}

/// Rebuilds of 100 us per page in steps of 4 pages: slow enough to act in the middle of one.
pub fn slow_rebuilds() -> NetworkOptions {
    NetworkOptions {
        regeneration_ns_per_page: 100 * MICROSECOND,
        regeneration_batch_pages: 4,
        ..Default::default()
    }
}

/// The trace of a failed scenario, for its panic message.
pub fn trace_of(driver: &SimDriver) -> String {
    driver.trace().join("\n")
}

/// Writes `generation` of every page of `pages`; every write must succeed.
pub fn write_all(driver: &mut SimDriver, pages: std::ops::Range<u64>, generation: u64) {
    for page in pages {
        driver.submit(SimOp::Write { page, data: page_pattern(page, generation) });
    }
    assert!(driver.run_until_idle(driver.now() + LIMIT), "writes hang\n{}", trace_of(driver));
    for completion in driver.take_completed() {
        if let Err(error) = &completion.result {
            panic!("write of page {} failed: {error}\n{}", completion.page, trace_of(driver));
        }
    }
}

/// Reads every page of `pages`: each must hold `generation(page)`.
pub fn verify_all(driver: &mut SimDriver, pages: std::ops::Range<u64>, generation: impl Fn(u64) -> u64) {
    for page in pages {
        driver.submit(SimOp::Read { page });
    }
    assert!(driver.run_until_idle(driver.now() + LIMIT), "reads hang\n{}", trace_of(driver));
    for completion in driver.take_completed() {
        let page = completion.page;
        match completion.result {
            Err(error) => panic!("read of page {page} failed: {error}\n{}", trace_of(driver)),
            Ok(()) => assert_eq!(
                identify(page, &completion.data),
                Some((page, generation(page))),
                "page {page} read back wrong\n{}",
                trace_of(driver)
            ),
        }
    }
}

pub fn heal(driver: &mut SimDriver) {
    let healed = driver.run_until_healed(driver.now() + LIMIT);
    assert!(
        healed,
        "not healed: {:?}, ranges {:?}\n{}",
        driver.engine().regeneration_status(),
        driver.engine().ranges().iter().map(|range| range.unavailable).collect::<Vec<_>>(),
        trace_of(driver)
    );
}

pub fn range_nodes(driver: &SimDriver, range: usize) -> Vec<usize> {
    driver.engine().ranges()[range].slabs.iter().map(|slab| slab.node).collect()
}

pub fn named_anywhere(driver: &SimDriver, node: usize) -> bool {
    driver.engine().ranges().iter().any(|range| range.slabs.iter().any(|slab| slab.node == node))
}

/// Our slabs on `node` (by the cluster).
pub fn our_slabs_on(driver: &SimDriver, node: usize) -> Vec<u32> {
    let client_id = driver.client_id();
    driver
        .cluster()
        .slabs_of(node)
        .into_iter()
        .filter(|(_, owner)| *owner == client_id)
        .map(|(id, _)| id)
        .collect()
}

pub fn kill(driver: &mut SimDriver, node: usize) {
    driver.fault_now(node, FaultAction::Kill);
}
