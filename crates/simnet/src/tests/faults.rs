//! What each fault does to the client's view.

use super::*;
use crate::{
    Delivery, FaultCounts, FaultSchedule, InFlightFate, PartitionNotice, SimError, MICROSECOND, MILLISECOND,
    SECOND,
};
use remem_proto::{judge_split, ErrorCode, SplitVerdict};

fn lost(node: usize) -> Delivery {
    Delivery::ConnectionLost { client_id: CLIENT, node }
}

#[test]
fn a_stalled_node_answers_nothing_until_the_stall_ends_then_everything_in_order() {
    let mut harness = Harness::new(10, 2);
    let until = harness.now + 5 * MILLISECOND;
    harness.cluster.stall(harness.now, 0, until).unwrap();
    assert_eq!(
        harness.cluster.connect(harness.now, 0, CLIENT + 1),
        Err(SimError::NodeStalled { node: 0, until })
    );
    let ids: Vec<u64> = (0..5).map(|_| harness.send(0, &Control::Ping)).collect();
    let other = harness.send(1, &Control::Ping);
    let early = harness.run_until(until - 1);
    assert_eq!(replies_from(&early, 0), vec![], "nothing from the stalled node");
    assert_eq!(replies_from(&early, 1).iter().map(Reply::request_id).collect::<Vec<_>>(), vec![other]);
    let late = harness.settle();
    assert_eq!(replies_from(&late, 0).iter().map(Reply::request_id).collect::<Vec<_>>(), ids);
    assert!(harness.now >= until);
    assert!(harness.cluster.is_connected(0, CLIENT), "a stall closes nothing");
    assert_eq!(harness.cluster.fault_counts().stalls, 1);
}

#[test]
fn replies_already_on_the_wire_still_arrive_from_a_node_that_stalls() {
    let mut harness = Harness::new(11, 1);
    let id = harness.send(0, &Control::Ping);
    // The first event is the ping reaching the node, which answers at once; stall right then.
    let mut out = Vec::new();
    let arrival = harness.cluster.next_event_time().unwrap();
    harness.now = arrival;
    harness.cluster.poll(arrival, &mut out);
    assert!(out.is_empty(), "the reply is still on the wire");
    harness.cluster.stall(harness.now, 0, harness.now + SECOND).unwrap();
    out.extend(harness.run_until(harness.now + 100 * MICROSECOND));
    assert_eq!(replies_from(&out, 0).iter().map(Reply::request_id).collect::<Vec<_>>(), vec![id]);
}

#[test]
fn a_killed_node_loses_its_memory_and_refuses_connections_until_restarted_empty() {
    let mut harness = Harness::new(12, 2);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    harness.cluster.kill(harness.now, 0).unwrap();
    assert_eq!(harness.cluster.kill(harness.now, 0), Err(SimError::NodeDead { node: 0 }));
    harness.send(0, &Control::Ping);
    let deliveries = harness.settle();
    assert_eq!(deliveries, vec![lost(0)], "bytes to a dead node vanish; the client hears of the loss");
    assert!(!harness.cluster.is_connected(0, CLIENT));
    assert_eq!(harness.cluster.connect(harness.now, 0, CLIENT), Err(SimError::NodeDead { node: 0 }));
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 0), None);
    assert!(harness.cluster.is_connected(1, CLIENT), "other nodes are untouched");

    harness.cluster.restart_empty(harness.now, 0).unwrap();
    let info = harness.cluster.connect(harness.now, 0, CLIENT).unwrap();
    assert_eq!(
        (info.slabs_mapped, info.node_id),
        (0, 1 + (1 << 32)),
        "a restarted node is a new process with a new node id"
    );
    assert_eq!(harness.cluster.node_state(0).incarnation, 1);
    let refused = harness.call(0, &Control::ReadSplit { slab_id, slot: 0 }).control();
    assert!(matches!(refused, Control::Error { code: ErrorCode::UnknownSlab, .. }));
    let counts = harness.cluster.fault_counts();
    assert_eq!((counts.kills, counts.restarts), (1, 1));
}

#[test]
fn replies_in_flight_when_a_node_dies_arrive_before_the_connection_lost() {
    let mut harness = Harness::new(13, 1);
    let id = harness.send(0, &Control::Ping);
    let mut out = harness.run_until(30 * MICROSECOND); // the ping has arrived and been answered
    harness.cluster.kill(harness.now, 0).unwrap();
    out.extend(harness.settle());
    let Some(Delivery::Bytes { bytes, .. }) = out.first() else { panic!("{out:?}") };
    assert_eq!(parse(bytes)[0].request_id(), id);
    assert_eq!(out.last(), Some(&lost(0)));
}

#[test]
fn a_partition_drops_both_ways_notifies_as_asked_and_heals_with_memory_intact() {
    for notice in
        [PartitionNotice::Immediately, PartitionNotice::After(3 * MILLISECOND), PartitionNotice::Never]
    {
        let mut harness = Harness::new(14, 1);
        let (slab_id, _) = harness.map(0, 512, 0, 0);
        let payload = page_of(1, 512);
        harness.write_split(0, slab_id, 1, SplitMeta { version: 1, checksum: 9 }, &payload);
        harness.settle();
        harness.send(0, &Control::Ping); // in flight: dropped
        let start = harness.now;
        let until = start + 10 * MILLISECOND;
        harness.cluster.partition(start, 0, until, notice).unwrap();
        assert_eq!(
            harness.cluster.connect(start, 0, CLIENT + 1),
            Err(SimError::NodePartitioned { node: 0, until })
        );
        let deliveries = harness.run_until(until - 1);
        match notice {
            PartitionNotice::Immediately => assert_eq!(deliveries, vec![lost(0)]),
            PartitionNotice::After(_) => {
                assert_eq!(deliveries, vec![lost(0)]);
                assert!(!harness.cluster.is_connected(0, CLIENT));
            }
            PartitionNotice::Never => {
                assert_eq!(deliveries, vec![], "silence: the client must time out");
                assert!(harness.cluster.is_connected(0, CLIENT));
                harness.send(0, &Control::Ping);
                harness.cluster.disconnect(harness.now, 0, CLIENT);
            }
        }
        assert!(harness.cluster.is_partitioned(0, harness.now));
        harness.run_until(until);
        assert!(!harness.cluster.is_partitioned(0, harness.now));
        harness.cluster.connect(harness.now, 0, CLIENT).unwrap();
        assert_eq!(
            harness.read_split(0, slab_id, 1),
            (SplitMeta { version: 1, checksum: 9 }, payload.clone())
        );
    }
}

#[test]
fn a_lost_notice_after_a_delay_comes_then_and_no_earlier() {
    let mut harness = Harness::new(15, 1);
    harness.cluster.partition(0, 0, SECOND, PartitionNotice::After(3 * MILLISECOND)).unwrap();
    assert_eq!(harness.run_until(3 * MILLISECOND - 1), vec![]);
    assert_eq!(harness.run_until(3 * MILLISECOND), vec![lost(0)]);
}

#[test]
fn a_straggler_answers_late_and_others_overtake_it() {
    let mut harness = Harness::new(16, 2);
    harness.cluster.set_extra_delay(0, 0, 2 * MILLISECOND, 0).unwrap();
    let slow = harness.send(0, &Control::Ping);
    let fast = harness.send(1, &Control::Ping);
    let mut deliveries = Vec::new();
    let mut times = Vec::new();
    while let Some(at) = harness.cluster.next_event_time() {
        harness.now = at;
        let before = deliveries.len();
        harness.cluster.poll(at, &mut deliveries);
        times.extend(std::iter::repeat_n(at, deliveries.len() - before));
    }
    let order: Vec<u64> = deliveries
        .iter()
        .map(|delivery| match delivery {
            Delivery::Bytes { bytes, .. } => parse(bytes)[0].request_id(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(order, vec![fast, slow]);
    assert!(times[1] >= 2 * MILLISECOND);
    assert_eq!(harness.cluster.fault_counts().stragglers, 1);
}

#[test]
fn flipped_bits_turn_written_splits_into_checksum_failures() {
    let mut harness = Harness::new(17, 1);
    let (slab_id, _) = harness.map(0, 512, 2, 0);
    assert_eq!(harness.cluster.flip_bits(harness.now, 0, slab_id, 5), Ok(vec![]), "nothing written yet");
    let payload = page_of(3, 512);
    let meta = SplitMeta { version: 4, checksum: split_checksum(&payload, 4, 6, 2) };
    harness.write_split(0, slab_id, 6, meta, &payload);
    harness.settle();
    assert_eq!(harness.cluster.flip_bits(harness.now, 0, slab_id, 3), Ok(vec![6]));
    let (read_meta, read_payload) = harness.read_split(0, slab_id, 6);
    assert_eq!(read_meta, meta, "metadata untouched");
    assert_eq!(judge_split(&read_payload, read_meta, 6, 2), SplitVerdict::Corrupt);
    assert_eq!(
        harness.cluster.flip_bits(harness.now, 0, 99, 1),
        Err(SimError::UnknownSlab { node: 0, slab_id: 99 })
    );
    let counts = harness.cluster.fault_counts();
    assert_eq!((counts.bit_flip_faults, counts.bits_flipped), (2, 3));
}

#[test]
fn an_evicted_slab_is_announced_with_request_id_zero_then_unknown() {
    let mut harness = Harness::new(18, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    harness.cluster.evict(harness.now, 0, slab_id).unwrap();
    let replies = replies_from(&harness.settle(), 0);
    assert_eq!(replies, vec![Reply::Control { request_id: 0, message: Control::SlabEvicted { slab_id } }]);
    let refused = harness.call(0, &Control::ReadSplit { slab_id, slot: 0 }).control();
    assert!(matches!(refused, Control::Error { code: ErrorCode::UnknownSlab, .. }));
    assert_eq!(
        harness.cluster.evict(harness.now, 0, slab_id),
        Err(SimError::UnknownSlab { node: 0, slab_id })
    );
    assert_eq!(harness.cluster.fault_counts().evictions, 1);
}

#[test]
fn dropped_writes_never_land_nor_answer_and_later_writes_do() {
    let mut harness = Harness::new(19, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    harness.cluster.drop_next_writes(harness.now, 0, 2).unwrap();
    let meta = SplitMeta { version: 1, checksum: 1 };
    let ids: Vec<u64> = (0..3).map(|slot| harness.write_split(0, slab_id, slot, meta, &[5; 512])).collect();
    let ping = harness.send(0, &Control::Ping);
    let replies = replies_from(&harness.settle(), 0);
    assert_eq!(replies.iter().map(Reply::request_id).collect::<Vec<_>>(), vec![ids[2], ping]);
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 0), Some(SplitMeta::default()));
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 1), Some(SplitMeta::default()));
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 2), Some(meta));
    let counts = harness.cluster.fault_counts();
    assert_eq!((counts.writes_armed_to_drop, counts.writes_dropped), (2, 2));
}

#[test]
fn a_client_crash_mid_fan_out_tears_pages_across_nodes_and_keeps_its_slabs() {
    let params = CodecParams::new(2, 2, 4096).unwrap();
    let mut torn_pages = 0;
    for seed in 0..20 {
        let mut harness = Harness::new(100 + seed, 4);
        let range = Range::map(&mut harness, params, 0);
        for slot in 0..8 {
            range.write(&mut harness, slot, 1, &page_of(u64::from(slot), 4096), &[0, 1, 2, 3]);
        }
        harness.settle();
        for slot in 0..8 {
            range.write(&mut harness, slot, 2, &page_of(u64::from(slot) + 50, 4096), &[0, 1, 2, 3]);
        }
        harness.cluster.crash_client(harness.now, CLIENT, InFlightFate::Random { delivered_ppm: 500_000 });
        assert!(harness.settle().is_empty(), "a crashed client hears nothing");
        for slot in 0..8 {
            let versions: Vec<u8> = (0..4)
                .map(|split| harness.cluster.slab_meta(split, range.slabs[split], slot).unwrap().version)
                .collect();
            assert!(versions.iter().all(|version| [1, 2].contains(version)));
            torn_pages += usize::from(versions.contains(&1) && versions.contains(&2));
        }
        // Restarted with the same id, the client still owns its slabs.
        harness.cluster.connect(harness.now, 0, CLIENT).unwrap();
        let (meta, _) = harness.read_split(0, range.slabs[0], 0);
        assert_ne!(meta.version, 0);
        assert_eq!(harness.cluster.fault_counts().client_crashes, 1);
    }
    assert!(torn_pages > 10, "random fates tear pages ({torn_pages})");
}

#[test]
fn a_crash_with_in_flight_writes_delivered_or_dropped_lands_all_or_none() {
    for (fate, landed) in [(InFlightFate::Delivered, 2), (InFlightFate::Dropped, 0)] {
        let mut harness = Harness::new(20, 1);
        let (slab_id, _) = harness.map(0, 512, 0, 0);
        harness.write_split(0, slab_id, 0, SplitMeta { version: 2, checksum: 0 }, &[1; 512]);
        harness.cluster.crash_client(harness.now, CLIENT, fate);
        harness.settle();
        let version = harness.cluster.slab_meta(0, slab_id, 0).unwrap().version;
        assert_eq!(version, landed, "{fate:?}");
    }
}

#[test]
fn generated_fault_schedules_apply_without_panics_and_are_counted() {
    let params = CodecParams::new(2, 1, 4096).unwrap();
    let mut applied = FaultCounts::default();
    for seed in 0..50 {
        let mut harness = Harness::new(seed, 5);
        let range = Range::map(&mut harness, params, 0);
        let schedule = FaultSchedule::beyond_tolerance(seed, 5, 1, 20 * MILLISECOND);
        for (slot, fault) in schedule.faults.iter().enumerate() {
            harness.run_until(fault.at);
            range.write(&mut harness, slot as u32 % 16, 1, &page_of(seed, 4096), &[0, 1, 2]);
            let _ = harness.cluster.apply_fault(harness.now, fault);
        }
        harness.settle();
        let counts = harness.cluster.fault_counts();
        applied.kills += counts.kills;
        applied.partitions += counts.partitions;
        applied.evictions += counts.evictions;
    }
    assert!(applied.kills > 0 && applied.partitions > 0 && applied.evictions > 0, "{applied:?}");
}
