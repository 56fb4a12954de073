//! What counts as a degraded read (`OpDone::degraded`, behind `remem_kv_degraded_reads_total`):
//! a read that decoded because a data split was missing (its node dead, its reply corrupt), not
//! one that decoded because a parity answered before a slow data split on a healthy cluster.

use crate::common;

use common::*;
use remem_simnet::{FaultAction, NetworkOptions, SimOp, MILLISECOND};

/// Reads every page of `pages` (each must hold generation 1) and returns how many decoded and
/// how many were degraded.
fn read_counting(driver: &mut SimDriver, pages: std::ops::Range<u64>) -> (usize, usize) {
    for page in pages.clone() {
        driver.submit(SimOp::Read { page });
    }
    assert!(driver.run_until_idle(driver.now() + LIMIT), "reads hang\n{}", trace_of(driver));
    let (mut decoded, mut degraded) = (0, 0);
    for completion in driver.take_completed() {
        assert!(completion.result.is_ok(), "read of page {} failed\n{}", completion.page, trace_of(driver));
        assert_eq!(identify(completion.page, &completion.data), Some((completion.page, 1)));
        assert!(completion.decoded || !completion.degraded, "degraded without decoding");
        decoded += usize::from(completion.decoded);
        degraded += usize::from(completion.degraded);
    }
    (decoded, degraded)
}

#[test]
fn a_parity_before_a_slow_data_split_decodes_but_is_not_degraded_and_a_dead_data_node_is_ec_8_2() {
    // Ten nodes: no spare, so the range stays without its dead node's slab.
    let mut driver = start(301, 10, 16, NetworkOptions::default(), config());
    driver.create_region(EC_8_2, 64).unwrap();
    write_all(&mut driver, 0..64, 1);
    let nodes = range_nodes(&driver, 0);
    // The node of data split 0 answers 2 ms late (below the request timeout): with delta 1 the
    // first parity comes first, and every read of the range decodes, though nothing is missing.
    driver.fault_now(nodes[0], FaultAction::ExtraDelay { delay_ns: 2 * MILLISECOND, jitter_ns: 0 });
    let (decoded, degraded) = read_counting(&mut driver, 0..16);
    assert!(decoded > 0, "no read decoded past the slow data split\n{}", trace_of(&driver));
    assert_eq!(degraded, 0, "a healthy cluster's reads counted as degraded");
    driver.fault_now(nodes[0], FaultAction::ExtraDelay { delay_ns: 0, jitter_ns: 0 });
    // The node of data split 1 dies: once the client knows, every read of the range decodes
    // without it, degraded. (A read that raced the death decoded past a split that was only
    // late as far as it could tell: not counted.)
    kill(&mut driver, nodes[1]);
    driver.run_for(50 * MILLISECOND);
    assert!(driver.engine().ranges()[0].unavailable & (1 << 1) != 0, "{}", trace_of(&driver));
    let (decoded, degraded) = read_counting(&mut driver, 0..16);
    assert_eq!((decoded, degraded), (16, 16), "{}", trace_of(&driver));
}
