//! Frames round trip through a simulated node as through `crates/node`.

use super::*;
use crate::Delivery;
use remem_proto::{ErrorCode, SplitVerdict};

#[test]
fn a_split_written_reads_back_with_its_metadata_and_an_unwritten_slot_reads_zero() {
    let mut harness = Harness::new(1, 1);
    let (slab_id, slots) = harness.map(0, 512, 3, 100);
    assert_eq!(slots, (SLAB_BYTES / 512) as u32);
    let payload = page_of(5, 512);
    let meta = SplitMeta { version: 7, checksum: split_checksum(&payload, 7, 105, 3) };
    let request_id = harness.write_split(0, slab_id, 5, meta, &payload);
    let replies = replies_from(&harness.settle(), 0);
    assert_eq!(replies, vec![Reply::Control { request_id, message: Control::WriteSplitOk }]);
    let (read_meta, read_payload) = harness.read_split(0, slab_id, 5);
    assert_eq!((read_meta, &read_payload), (meta, &payload));
    assert_eq!(
        remem_proto::judge_split(&read_payload, read_meta, 105, 3),
        SplitVerdict::Valid { version: 7 }
    );
    assert_eq!(harness.read_split(0, slab_id, 6), (SplitMeta::default(), vec![0; 512]));
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 5), Some(meta));

    let reply = harness.call(0, &Control::ReadSplits { slab_id, first_slot: 4, count: 3 });
    let Reply::Splits { entries, .. } = reply else { panic!("{reply:?}") };
    assert_eq!(
        entries,
        vec![(SplitMeta::default(), vec![0; 512]), (meta, payload), (SplitMeta::default(), vec![0; 512])]
    );
}

#[test]
fn node_info_ping_unmap_and_capacity_answer_like_the_real_node() {
    let mut harness = Harness::new(2, 1);
    let Control::NodeInfoReply(info) = harness.call(0, &Control::NodeInfo).control() else { panic!() };
    assert_eq!((info.node_id, info.failure_domain.as_str()), (1, "d0"));
    // The real node's capacity counts each slab's footprint (slab, metadata, header, rounded to
    // a page): the simulated node lends room for 8 slabs of the smallest splits.
    let footprint = |split_bytes| remem_proto::shm::ShmLayout::new(SLAB_BYTES, split_bytes).unwrap();
    let capacity_bytes = 8 * footprint(64).total_bytes;
    assert_eq!(
        (info.capacity_bytes, info.free_bytes, info.slab_size_bytes),
        (capacity_bytes, capacity_bytes, SLAB_BYTES)
    );
    assert_eq!(harness.call(0, &Control::Ping).control(), Control::Pong);
    assert_eq!(harness.call(0, &Control::AnswerActivity).control(), Control::Ok);
    // No reply to a Pong or to an activity answer.
    assert!(harness.call_all(0, &Control::Pong).is_empty());
    assert!(harness.call_all(0, &Control::SlabActivity { slab_id: 1, accesses: 3 }).is_empty());

    let slabs: Vec<u32> = (0..8).map(|split| harness.map(0, 4096, split, 0).0).collect();
    assert_eq!(slabs, (1..=8).collect::<Vec<u32>>(), "slab ids run from 1");
    let refused =
        harness.call(0, &Control::MapSlab { split_bytes: 4096, split_index: 0, first_page: 0, range_id: 0 });
    assert!(matches!(refused.control(), Control::Error { code: ErrorCode::NoCapacity, .. }));
    let Control::NodeInfoReply(info) = harness.call(0, &Control::NodeInfo).control() else { panic!() };
    let mapped = footprint(4096);
    assert_eq!((info.free_bytes, info.slabs_mapped), (capacity_bytes - 8 * mapped.total_bytes, 8));
    assert!(info.free_bytes < mapped.total_bytes, "no room for a ninth");
    assert_eq!(info.metadata_bytes, 8 * mapped.metadata_bytes());

    assert_eq!(harness.call(0, &Control::UnmapSlab { slab_id: 3 }).control(), Control::Ok);
    let again = harness.call(0, &Control::UnmapSlab { slab_id: 3 }).control();
    assert!(matches!(again, Control::Error { code: ErrorCode::UnknownSlab, .. }));
    assert_eq!(harness.cluster.slabs_of(0).len(), 7);
    assert_eq!(harness.map(0, 4096, 0, 0).0, 9, "ids are not reused");
    for split_bytes in [0, 32, 100, 128 * 1024] {
        let bad =
            harness.call(0, &Control::MapSlab { split_bytes, split_index: 0, first_page: 0, range_id: 0 });
        assert!(
            matches!(bad.control(), Control::Error { code: ErrorCode::BadSplitSize, .. }),
            "{split_bytes}"
        );
    }
}

#[test]
fn another_client_can_neither_read_nor_write_nor_unmap_a_slab() {
    let mut harness = Harness::new(3, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    let stranger = CLIENT + 1;
    harness.cluster.connect(harness.now, 0, stranger).unwrap();
    let mut frames = Vec::new();
    Control::ReadSplit { slab_id, slot: 0 }.encode(10, &mut frames);
    Control::UnmapSlab { slab_id }.encode(11, &mut frames);
    let prefix = WriteSplitPrefix { slab_id, slot: 0, version: 1, checksum: 0 };
    encode_write_split(12, &prefix, &[0; 512], &mut frames);
    harness.cluster.send(harness.now, 0, stranger, &frames);
    let deliveries = harness.settle();
    let codes: Vec<_> = replies_from(&deliveries, 0)
        .into_iter()
        .map(|reply| match reply.control() {
            Control::Error { code, .. } => code,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(codes, vec![ErrorCode::NotOwner; 3]);
    // A refused WriteSplit closes the connection: the stream cannot continue.
    assert_eq!(deliveries.last(), Some(&Delivery::ConnectionLost { client_id: stranger, node: 0 }));
    assert!(harness.cluster.is_connected(0, CLIENT), "the owner's connection is untouched");
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 0), Some(SplitMeta::default()));
}

#[test]
fn refused_requests_without_payload_keep_the_connection_and_replies_keep_request_order() {
    let mut harness = Harness::new(4, 1);
    let (slab_id, slots) = harness.map(0, 512, 0, 0);
    let mut frames = Vec::new();
    Control::ReadSplit { slab_id, slot: slots }.encode(20, &mut frames);
    Control::ReadSplits { slab_id, first_slot: slots - 1, count: 2 }.encode(21, &mut frames);
    Control::ExportSlab { slab_id }.encode(22, &mut frames);
    Control::InjectFault {
        fault: remem_proto::FaultKind::Evict,
        slab_id,
        delay_us: 0,
        fraction_ppm: 0,
        flips: 0,
        seed: 0,
    }
    .encode(23, &mut frames);
    Control::Ping.encode(24, &mut frames);
    harness.cluster.send(harness.now, 0, CLIENT, &frames);
    let deliveries = harness.settle();
    assert_eq!(deliveries.len(), 1, "one arrival, one write of all its replies");
    let replies = replies_from(&deliveries, 0);
    assert_eq!(replies.iter().map(Reply::request_id).collect::<Vec<_>>(), vec![20, 21, 22, 23, 24]);
    let codes: Vec<_> = replies[..4]
        .iter()
        .map(|reply| match reply.clone().control() {
            Control::Error { code, .. } => code,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            ErrorCode::SlotOutOfRange,
            ErrorCode::SlotOutOfRange,
            ErrorCode::Unsupported,
            ErrorCode::Unsupported
        ]
    );
    assert!(harness.cluster.is_connected(0, CLIENT));
}

#[test]
fn a_frame_split_across_sends_is_served_once_whole() {
    let mut harness = Harness::new(5, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    let payload = page_of(9, 512);
    let mut frame = Vec::new();
    let prefix = WriteSplitPrefix { slab_id, slot: 2, version: 1, checksum: 77 };
    encode_write_split(30, &prefix, &payload, &mut frame);
    Control::Ping.encode(31, &mut frame);
    for chunk in frame.chunks(100) {
        harness.cluster.send(harness.now, 0, CLIENT, chunk);
        harness.now += 1_000;
    }
    let replies = replies_from(&harness.settle(), 0);
    assert_eq!(replies.iter().map(Reply::request_id).collect::<Vec<_>>(), vec![30, 31]);
    assert_eq!(
        harness.cluster.slab_split(0, slab_id, 2),
        Some((SplitMeta { version: 1, checksum: 77 }, payload.clone()))
    );
}

#[test]
fn a_wrong_payload_size_or_zero_version_write_is_refused_and_closes() {
    let mut harness = Harness::new(6, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    let request_id = harness.write_split(0, slab_id, 0, SplitMeta { version: 1, checksum: 0 }, &[1; 256]);
    let deliveries = harness.settle();
    let replies = replies_from(&deliveries, 0);
    assert_eq!(replies[0].request_id(), request_id);
    assert!(matches!(replies[0].clone().control(), Control::Error { code: ErrorCode::BadSplitSize, .. }));
    assert!(matches!(deliveries.last(), Some(Delivery::ConnectionLost { node: 0, .. })));
    assert!(!harness.cluster.is_connected(0, CLIENT));

    harness.cluster.connect(harness.now, 0, CLIENT).unwrap();
    let mut frame = Vec::new();
    let prefix = WriteSplitPrefix { slab_id, slot: 0, version: 1, checksum: 0 };
    encode_write_split(40, &prefix, &[1; 512], &mut frame);
    frame[HEADER_BYTES + 8] = 0; // version 0: malformed
    harness.cluster.send(harness.now, 0, CLIENT, &frame);
    let deliveries = harness.settle();
    assert!(matches!(
        replies_from(&deliveries, 0)[0].clone().control(),
        Control::Error { code: ErrorCode::Malformed, .. }
    ));
    assert!(matches!(deliveries.last(), Some(Delivery::ConnectionLost { node: 0, .. })));
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 0), Some(SplitMeta::default()), "never applied");
}

#[test]
fn replies_of_one_node_keep_their_order_and_nodes_interleave() {
    let mut harness = Harness::new(7, 3);
    let mut sent = Vec::new();
    for round in 0..200 {
        for node in 0..3 {
            let request_id = harness.send(node, &Control::Ping);
            sent.push((node, request_id));
        }
        harness.now += 1_000 * (round % 7);
    }
    let deliveries = harness.settle();
    for node in 0..3 {
        let ids: Vec<u64> = replies_from(&deliveries, node).iter().map(Reply::request_id).collect();
        let expected: Vec<u64> = sent.iter().filter(|(to, _)| *to == node).map(|(_, id)| *id).collect();
        assert_eq!(ids, expected, "node {node} answers in request order");
    }
    let order: Vec<u64> = deliveries
        .iter()
        .flat_map(|delivery| match delivery {
            Delivery::Bytes { bytes, .. } => parse(bytes).iter().map(Reply::request_id).collect::<Vec<u64>>(),
            other => panic!("{other:?}"),
        })
        .collect();
    let sent_order: Vec<u64> = sent.iter().map(|(_, id)| *id).collect();
    assert_ne!(order, sent_order, "replies of different nodes overtake each other");
}

#[test]
fn a_reopened_connection_never_gets_the_old_ones_replies_but_the_old_requests_still_land() {
    let mut harness = Harness::new(8, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    let meta = SplitMeta { version: 1, checksum: 5 };
    harness.write_split(0, slab_id, 3, meta, &[7; 512]);
    harness.cluster.connect(harness.now, 0, CLIENT).unwrap();
    let ping = harness.send(0, &Control::Ping);
    let replies = replies_from(&harness.settle(), 0);
    assert_eq!(replies.iter().map(Reply::request_id).collect::<Vec<_>>(), vec![ping]);
    assert_eq!(harness.cluster.slab_meta(0, slab_id, 3), Some(meta), "the old connection's write landed");
}

#[test]
fn several_clients_each_get_their_own_replies() {
    let mut harness = Harness::new(9, 1);
    let other = CLIENT + 7;
    harness.cluster.connect(harness.now, 0, other).unwrap();
    let mut frame = Vec::new();
    Control::MapSlab { split_bytes: 512, split_index: 0, first_page: 0, range_id: 0 }.encode(70, &mut frame);
    harness.cluster.send(harness.now, 0, other, &frame);
    let mine = harness.send(0, &Control::Ping);
    let deliveries = harness.settle();
    for delivery in &deliveries {
        let Delivery::Bytes { client_id, bytes, .. } = delivery else { panic!("{delivery:?}") };
        let expected = if *client_id == other { 70 } else { mine };
        assert_eq!(parse(bytes)[0].request_id(), expected);
    }
    assert_eq!(deliveries.len(), 2);
    assert_eq!(harness.cluster.slabs_of(0), vec![(1, other)]);
}
