//! Rebuilds: what is rebuilt, skipped and lost, and that rebuilt splits are the codec's.

use super::*;
use crate::{Delivery, PartitionNotice, RegenerationReport, MICROSECOND, MILLISECOND, SECOND};
use remem_proto::{judge_split, ErrorCode, RegenerationSource, SplitVerdict};

/// The `Regenerate` asking `node`'s slab `slab_id` to rebuild `pages` pages from the range's
/// splits `sources` (split i on node i).
fn regenerate(range: &Range, slab_id: u32, pages: u32, sources: &[usize], cluster: &SimCluster) -> Control {
    Control::Regenerate {
        slab_id,
        data_splits: range.params.data_splits as u8,
        parity_splits: range.params.parity_splits as u8,
        page_bytes: range.params.page_bytes as u32,
        pages,
        sources: sources
            .iter()
            .map(|&split| RegenerationSource {
                split_index: split as u8,
                slab_id: range.slabs[split],
                address: cluster.node_address(split),
            })
            .collect(),
    }
}

/// The sources of a rebuild of `target`: every other split of the range.
fn all_but(range: &Range, target: usize) -> Vec<usize> {
    (0..range.params.total_splits()).filter(|split| *split != target).collect()
}

fn done_counts(replies: &[Reply], request_id: u64) -> (u64, u64, u64) {
    let done: Vec<_> = replies
        .iter()
        .filter_map(|reply| match reply {
            Reply::Control {
                request_id: id,
                message: Control::RegenerationDone { pages_rebuilt, pages_skipped, pages_lost, .. },
            } if *id == request_id => Some((*pages_rebuilt, *pages_skipped, *pages_lost)),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 1, "one RegenerationDone: {replies:?}");
    done[0]
}

/// Checks that slot `slot` of the rebuilt slab holds split `target` of `page` at `version`.
fn assert_rebuilt(
    harness: &Harness,
    range: &Range,
    (node, slab_id): (usize, u32),
    target: usize,
    slot: u32,
    version: u8,
    page: &[u8],
) {
    let (meta, payload) = harness.cluster.slab_split(node, slab_id, slot).unwrap();
    assert_eq!(meta.version, version, "slot {slot}");
    assert_eq!(payload, &range.splits(page)[target][..], "slot {slot} holds the codec's split");
    let verdict = judge_split(&payload, meta, range.first_page + u64::from(slot), target as u8);
    assert_eq!(verdict, SplitVerdict::Valid { version });
}

/// EC(8,2) on nodes 0..10, the lost split rebuilt on node 10; pages of every kind.
fn rebuild_ec_8_2(target: usize) {
    let params = CodecParams::new(8, 2, 4096).unwrap();
    let mut harness = Harness::new(30 + target as u64, 11);
    let range = Range::map(&mut harness, params, 1000);
    let all: Vec<usize> = (0..10).collect();
    let others: Vec<usize> = all_but(&range, target);
    let page = |slot: u32, version: u8| page_of(u64::from(slot) * 1000 + u64::from(version), 4096);
    for slot in 0..5 {
        range.write(&mut harness, slot, 1, &page(slot, 1), &all);
    }
    range.write(&mut harness, 4, 2, &page(4, 2), &all); // the newest version wins
                                                        // Slot 5 is never written.
                                                        // Slot 6: only 7 of the 9 sources hold it: fewer than k agree, lost.
    let seven: Vec<usize> = others.iter().copied().take(7).collect();
    range.write(&mut harness, 6, 1, &page(6, 1), &seven);
    // Slot 7: torn between versions 1 and 2 (3 splits of v2): never mixed, lost.
    range.write(&mut harness, 7, 1, &page(7, 1), &all);
    range.write(&mut harness, 7, 2, &page(7, 2), &others[..3]);
    // Slot 8: one source split corrupt: decoded from the others.
    range.write(&mut harness, 8, 1, &page(8, 1), &all);
    let corrupt = others[0];
    harness.write_split(
        corrupt,
        range.slabs[corrupt],
        8,
        SplitMeta { version: 1, checksum: 12345 },
        &vec![0; 512],
    );
    harness.settle();

    let (new_slab, _) = harness.map(10, 512, target as u8, 1000);
    let request = regenerate(&range, new_slab, 16, &others, &harness.cluster);
    // Regenerate names sources by their nodes' addresses: split i is on node i.
    let request_id = harness.send(10, &request);
    // Slot 9: the client writes the new slab during the rebuild; its write wins.
    let fresh = page(9, 3);
    let fresh_split = &range.splits(&fresh)[target];
    let fresh_meta = SplitMeta { version: 3, checksum: split_checksum(fresh_split, 3, 1009, target as u8) };
    let write_id = harness.write_split(10, new_slab, 9, fresh_meta, fresh_split);
    let replies = replies_from(&harness.settle(), 10);
    let ids: Vec<u64> = replies.iter().map(Reply::request_id).collect();
    assert_eq!(ids, vec![request_id, write_id, request_id], "Ok, the write's answer, then the report");
    assert_eq!(replies[0], Reply::Control { request_id, message: Control::Ok });
    assert_eq!(done_counts(&replies, request_id), (6, 8, 2));

    for slot in [0, 1, 2, 3, 8] {
        assert_rebuilt(&harness, &range, (10, new_slab), target, slot, 1, &page(slot, 1));
    }
    assert_rebuilt(&harness, &range, (10, new_slab), target, 4, 2, &page(4, 2));
    assert_eq!(harness.cluster.slab_meta(10, new_slab, 9), Some(fresh_meta));
    for slot in [5, 6, 7, 10, 15] {
        assert_eq!(
            harness.cluster.slab_meta(10, new_slab, slot),
            Some(SplitMeta::default()),
            "slot {slot} unwritten"
        );
    }
    let report = harness.cluster.regeneration_reports()[0];
    assert_eq!(
        (
            report.node,
            report.slab_id,
            report.request_id,
            report.pages_rebuilt,
            report.pages_skipped,
            report.pages_lost
        ),
        (10, new_slab, request_id, 6, 8, 2)
    );
    assert!(report.report_sent);
    assert!(
        report.finished_at >= report.started_at + 16 * harness.cluster.options().regeneration_ns_per_page
    );
    assert!(!harness.cluster.slab_info(10, new_slab).unwrap().regenerating);
}

#[test]
fn rebuild_of_a_data_split_ec_8_2_decodes_skips_empty_and_written_pages_and_counts_lost_ones() {
    rebuild_ec_8_2(3);
}

#[test]
fn rebuild_of_a_parity_split_ec_8_2_re_encodes() {
    rebuild_ec_8_2(9);
}

#[test]
fn rebuild_of_a_replica_k1_r1_copies_the_surviving_one() {
    let params = CodecParams::new(1, 1, 4096).unwrap();
    let mut harness = Harness::new(40, 3);
    let range = Range::map(&mut harness, params, 0);
    let slots = (SLAB_BYTES / 4096) as u32;
    for slot in 0..slots - 1 {
        range.write(&mut harness, slot, 5, &page_of(u64::from(slot), 4096), &[0, 1]);
    }
    harness.settle();
    let (new_slab, _) = harness.map(2, 4096, 1, 0);
    let request_id = harness.send(2, &regenerate(&range, new_slab, slots, &[0], &harness.cluster));
    let replies = replies_from(&harness.settle(), 2);
    assert_eq!(done_counts(&replies, request_id), (u64::from(slots) - 1, 1, 0));
    for slot in 0..slots - 1 {
        assert_rebuilt(&harness, &range, (2, new_slab), 1, slot, 5, &page_of(u64::from(slot), 4096));
    }
}

fn small_batches() -> NetworkOptions {
    NetworkOptions { regeneration_batch_pages: 8, ..NetworkOptions::default() }
}

/// EC(2,2) over nodes 0..4 with 32 written pages, split 3 to be rebuilt on node 4.
fn ec_2_2(seed: u64) -> (Harness, Range, u32) {
    let params = CodecParams::new(2, 2, 4096).unwrap();
    let mut harness = Harness::with_options(seed, 5, small_batches());
    let range = Range::map(&mut harness, params, 0);
    for slot in 0..32 {
        range.write(&mut harness, slot, 1, &page_of(u64::from(slot), 4096), &[0, 1, 2, 3]);
    }
    harness.settle();
    let (new_slab, _) = harness.map(4, 2048, 3, 0);
    (harness, range, new_slab)
}

#[test]
fn a_dead_source_is_replaced_by_another_and_too_few_sources_lose_every_page() {
    let (mut harness, range, new_slab) = ec_2_2(41);
    harness.cluster.kill(harness.now, 0).unwrap();
    let request_id = harness.send(4, &regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster));
    assert_eq!(done_counts(&replies_from(&harness.settle(), 4), request_id), (32, 0, 0));
    assert_rebuilt(&harness, &range, (4, new_slab), 3, 17, 1, &page_of(17, 4096));

    let (mut harness, range, new_slab) = ec_2_2(42);
    harness.cluster.kill(harness.now, 0).unwrap();
    harness.cluster.partition(harness.now, 1, harness.now + SECOND, PartitionNotice::Never).unwrap();
    let request_id = harness.send(4, &regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster));
    assert_eq!(done_counts(&replies_from(&harness.settle(), 4), request_id), (0, 0, 32));
    assert_eq!(harness.cluster.slab_meta(4, new_slab, 0), Some(SplitMeta::default()));
}

#[test]
fn sources_lost_mid_rebuild_end_it_with_the_rest_lost() {
    let (mut harness, range, new_slab) = ec_2_2(43);
    let request_id = harness.send(4, &regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster));
    // Batches of 8 pages take 16 us each: kill two sources after the first batch is stored.
    let mut out = Vec::new();
    while harness.cluster.regeneration_reports().is_empty() {
        let at = harness.cluster.next_event_time().unwrap();
        harness.now = at;
        harness.cluster.poll(at, &mut out);
        if harness.cluster.slab_meta(4, new_slab, 7).unwrap().version != 0 {
            break;
        }
    }
    harness.cluster.kill(harness.now, 0).unwrap();
    harness.cluster.stall(harness.now, 1, harness.now + SECOND).unwrap();
    out.extend(harness.settle());
    assert_eq!(done_counts(&replies_from(&out, 4), request_id), (8, 0, 24));
}

#[test]
fn a_stalled_rebuilder_reports_after_its_stall_and_a_killed_one_never() {
    let (mut harness, range, new_slab) = ec_2_2(44);
    let request_id = harness.send(4, &regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster));
    let stall_until = harness.now + 10 * MILLISECOND;
    harness.run_until(harness.now + 30 * MICROSECOND); // accepted, first batch not done
    harness.cluster.stall(harness.now, 4, stall_until).unwrap();
    let replies = replies_from(&harness.settle(), 4);
    assert_eq!(done_counts(&replies, request_id), (32, 0, 0));
    assert!(harness.cluster.regeneration_reports()[0].finished_at >= stall_until);

    let (mut harness, range, new_slab) = ec_2_2(45);
    harness.send(4, &regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster));
    harness.run_until(harness.now + 30 * MICROSECOND);
    harness.cluster.kill(harness.now, 4).unwrap();
    let deliveries = harness.settle();
    assert!(harness.cluster.regeneration_reports().is_empty());
    assert!(deliveries.contains(&Delivery::ConnectionLost { client_id: CLIENT, node: 4 }));
}

#[test]
fn node_info_shows_progress_and_an_evicted_target_ends_the_rebuild() {
    let (mut harness, range, new_slab) = ec_2_2(46);
    let request_id = harness.send(4, &regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster));
    harness.run_until(harness.now + 60 * MICROSECOND);
    let info = harness.cluster.node_info(4).unwrap();
    assert_eq!((info.regenerating_slabs, info.regeneration_pages_total), (1, 32));
    assert!(info.regeneration_pages_done > 0 && info.regeneration_pages_done < 32, "{info:?}");
    assert!(harness.cluster.slab_info(4, new_slab).unwrap().regenerating);
    harness.cluster.evict(harness.now, 4, new_slab).unwrap();
    let replies = replies_from(&harness.settle(), 4);
    let (rebuilt, skipped, lost) = done_counts(&replies, request_id);
    assert_eq!(rebuilt + skipped + lost, 32);
    assert!(lost > 0);
    assert!(replies
        .contains(&Reply::Control { request_id: 0, message: Control::SlabEvicted { slab_id: new_slab } }));
    let info = harness.cluster.node_info(4).unwrap();
    assert_eq!(
        (info.regenerating_slabs, info.regeneration_pages_done, info.regeneration_pages_total),
        (0, 0, 0)
    );
}

#[test]
fn invalid_regenerate_requests_are_refused_like_the_real_node() {
    let (mut harness, range, new_slab) = ec_2_2(47);
    let code_of = |reply: Reply| match reply.control() {
        Control::Error { code, .. } => code,
        other => panic!("{other:?}"),
    };
    let mut cases: Vec<(Control, ErrorCode)> = vec![
        (regenerate(&range, new_slab, 32, &[0], &harness.cluster), ErrorCode::Unsupported),
        (regenerate(&range, new_slab, 32, &[0, 0, 1], &harness.cluster), ErrorCode::Unsupported),
        (regenerate(&range, new_slab, 33, &[0, 1], &harness.cluster), ErrorCode::SlotOutOfRange),
        (regenerate(&range, 99, 32, &[0, 1], &harness.cluster), ErrorCode::UnknownSlab),
    ];
    let mut outside_code = regenerate(&range, new_slab, 32, &[0, 1], &harness.cluster);
    if let Control::Regenerate { sources, .. } = &mut outside_code {
        sources[1].split_index = 4;
    }
    cases.push((outside_code, ErrorCode::Unsupported));
    let mut wrong_page = regenerate(&range, new_slab, 32, &[0, 1], &harness.cluster);
    if let Control::Regenerate { page_bytes, .. } = &mut wrong_page {
        *page_bytes = 8192;
    }
    cases.push((wrong_page, ErrorCode::BadSplitSize));
    let mut bad_code = regenerate(&range, new_slab, 32, &[0, 1], &harness.cluster);
    if let Control::Regenerate { data_splits, .. } = &mut bad_code {
        *data_splits = 3;
    }
    cases.push((bad_code, ErrorCode::BadSplitSize));
    for (request, expected) in cases {
        assert_eq!(code_of(harness.call(4, &request)), expected, "{request:?}");
    }
    assert!(harness.cluster.is_connected(4, CLIENT), "refusals keep the connection");

    // A second rebuild of the same slab, and a fifth one on the node, are refused.
    let request = regenerate(&range, new_slab, 32, &[0, 1], &harness.cluster);
    let mut frames = Vec::new();
    request.encode(200, &mut frames);
    request.encode(201, &mut frames);
    harness.cluster.send(harness.now, 4, CLIENT, &frames);
    let replies = replies_from(&harness.settle(), 4);
    assert_eq!(replies[0], Reply::Control { request_id: 200, message: Control::Ok });
    assert_eq!(code_of(replies[1].clone()), ErrorCode::Unsupported);

    let extra: Vec<u32> = (0..5).map(|_| harness.map(4, 2048, 3, 0).0).collect();
    let mut frames = Vec::new();
    for (index, slab_id) in extra.iter().enumerate() {
        regenerate(&range, *slab_id, 32, &[0, 1], &harness.cluster).encode(300 + index as u64, &mut frames);
    }
    harness.cluster.send(harness.now, 4, CLIENT, &frames);
    let replies = replies_from(&harness.settle(), 4);
    let first_answers: Vec<&Reply> = replies.iter().take(5).collect();
    assert!(first_answers[..4]
        .iter()
        .all(|reply| matches!(reply, Reply::Control { message: Control::Ok, .. })));
    assert_eq!(code_of(first_answers[4].clone()), ErrorCode::NoCapacity);
    let reports: Vec<RegenerationReport> = harness.cluster.regeneration_reports().to_vec();
    assert_eq!(reports.len(), 5, "the first rebuild and four of the five");
}

#[test]
fn a_source_named_by_an_unknown_address_fails_like_an_unreachable_node() {
    let (mut harness, range, new_slab) = ec_2_2(48);
    let mut request = regenerate(&range, new_slab, 32, &[0, 1, 2], &harness.cluster);
    if let Control::Regenerate { sources, .. } = &mut request {
        sources[0].address = "192.0.2.1:7077".parse().unwrap();
    }
    let request_id = harness.send(4, &request);
    assert_eq!(
        done_counts(&replies_from(&harness.settle(), 4), request_id),
        (32, 0, 0),
        "rebuilt from 1 and 2"
    );
}

#[test]
fn the_slab_being_replaced_may_be_a_source_like_on_the_real_node() {
    // EC(2,2): split 3 on node 3 is being replaced by a new slab on node 4 (say its node corrupts);
    // the client names the old slab as a source next to splits 0 and 1.
    let (mut harness, range, new_slab) = ec_2_2(48);
    let request = regenerate(&range, new_slab, 32, &[3, 0], &harness.cluster);
    let request_id = harness.send(4, &request);
    let replies = replies_from(&harness.settle(), 4);
    assert_eq!(replies[0], Reply::Control { request_id, message: Control::Ok });
    assert_eq!(done_counts(&replies, request_id), (32, 0, 0));
    for slot in [0, 17, 31] {
        assert_rebuilt(&harness, &range, (4, new_slab), 3, slot, 1, &page_of(u64::from(slot), 4096));
    }
}
