//! A seed replays exactly; a run of thousands of page operations is cheap.

use super::*;
use crate::{Delivery, InFlightFate, PartitionNotice, MICROSECOND, MILLISECOND};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random workload over EC(2,1) on 4 nodes with faults, driven by a workload generator of its
/// own seed: writes, reads and pings at random times, a stall, a partition, a kill. Returns every
/// delivery with its time.
fn workload(cluster_seed: u64, operations: usize) -> Vec<(SimTime, Delivery)> {
    let params = CodecParams::new(2, 1, 4096).unwrap();
    let mut harness = Harness::new(cluster_seed, 4);
    let range = Range::map(&mut harness, params, 0);
    let mut workload_rng = StdRng::seed_from_u64(99);
    let mut log = Vec::new();
    let mut out = Vec::new();
    for operation in 0..operations {
        harness.now += workload_rng.gen_range(0..20 * MICROSECOND);
        let slot = workload_rng.gen_range(0..16);
        match workload_rng.gen_range(0..3) {
            0 => range.write(
                &mut harness,
                slot,
                (operation % 255 + 1) as u8,
                &page_of(operation as u64, 4096),
                &[0, 1, 2],
            ),
            1 => {
                for split in 0..3 {
                    harness.send(split, &Control::ReadSplit { slab_id: range.slabs[split], slot });
                }
            }
            _ => {
                harness.send(3, &Control::Ping);
            }
        }
        match operation {
            100 => harness.cluster.stall(harness.now, 1, harness.now + MILLISECOND).unwrap(),
            200 => harness
                .cluster
                .partition(harness.now, 2, harness.now + MILLISECOND, PartitionNotice::Immediately)
                .unwrap(),
            300 => harness.cluster.kill(harness.now, 3).unwrap(),
            400 => harness.cluster.crash_client(
                harness.now,
                CLIENT + 1,
                InFlightFate::Random { delivered_ppm: 1 },
            ),
            _ => {}
        }
        harness.cluster.poll(harness.now, &mut out);
        log.extend(out.drain(..).map(|delivery| (harness.now, delivery)));
    }
    while let Some(at) = harness.cluster.next_event_time() {
        harness.now = harness.now.max(at);
        harness.cluster.poll(harness.now, &mut out);
        log.extend(out.drain(..).map(|delivery| (harness.now, delivery)));
    }
    log
}

#[test]
fn the_same_seed_gives_the_same_deliveries_byte_for_byte() {
    let first = workload(5, 600);
    assert!(first.len() > 500, "the workload delivers ({})", first.len());
    assert_eq!(first, workload(5, 600));
    assert_ne!(first, workload(6, 600), "another seed, other delays");
}

#[test]
fn thousands_of_page_operations_take_milliseconds() {
    // 3000 operations, each a 3-split write or a 3-split read: about 9000 frames each way.
    let started = std::time::Instant::now();
    let log = workload(7, 3000);
    let elapsed = started.elapsed();
    assert!(log.len() > 2000);
    // Generous for a shared 2-core machine running an unoptimised test build.
    assert!(elapsed < std::time::Duration::from_secs(2), "took {elapsed:?}");
}
