//! Background regeneration across real in-process nodes: a range of EC(8,2) pages written to ten
//! nodes over the protocol, a lost split rebuilt on an eleventh from the survivors.
//!
//! `REMEM_REGEN_BENCH_MIB` (e.g. 256) sets the slab size of the throughput measurement; without
//! it the measurement runs on a 1 MiB slab so it never rots.

use crate::common;

use common::*;
use remem_codec::{new_codec, CodecParams};
use remem_proto::blocking;
use remem_proto::*;
use std::io::Write;
use std::time::{Duration, Instant};

const K: usize = 8;
const R: usize = 2;
const PAGE: usize = 4096;
const SPLIT: usize = PAGE / K;
const CLIENT: u64 = 42;
const FIRST_PAGE: u64 = 5000;

/// Deterministic page content, so big runs need not keep their pages.
fn page_bytes(page: u64, version: u8) -> Vec<u8> {
    let mut state = page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(version);
    (0..PAGE / 8)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .collect()
}

/// All k + r splits of a page.
fn splits_of(codec: &mut dyn remem_codec::PageCodec, page: &[u8]) -> Vec<Vec<u8>> {
    let mut parity = vec![0u8; R * SPLIT];
    codec.encode(page, &mut parity);
    (0..K)
        .map(|i| page[i * SPLIT..(i + 1) * SPLIT].to_vec())
        .chain((0..R).map(|j| parity[j * SPLIT..(j + 1) * SPLIT].to_vec()))
        .collect()
}

/// One range on k + r nodes (slab of split i on node i) plus a spare node for the rebuild.
struct Range {
    nodes: Vec<Option<TestNode>>,
    clients: Vec<Client>,
    slabs: Vec<u32>,
    spare: TestNode,
    slots: u32,
}

impl Range {
    fn new(slab_bytes: u64, delay_faults: bool) -> Range {
        let start = || {
            if delay_faults {
                TestNode::start_with_faults(2 * slab_bytes, slab_bytes)
            } else {
                TestNode::start(2 * slab_bytes, slab_bytes)
            }
        };
        let nodes: Vec<TestNode> = (0..K + R).map(|_| start()).collect();
        let mut clients: Vec<Client> = nodes.iter().map(|node| node.client(CLIENT)).collect();
        let mut slots = 0;
        let slabs = clients
            .iter_mut()
            .enumerate()
            .map(|(index, client)| {
                let (slab_id, count) = client.map_slab(SPLIT as u32, index as u8, FIRST_PAGE);
                slots = count;
                slab_id
            })
            .collect();
        Range { nodes: nodes.into_iter().map(Some).collect(), clients, slabs, spare: start(), slots }
    }

    /// Writes split `split` of `page_bytes` at `slot` with `version` to its node (pipelined per
    /// node: every frame first, then every reply).
    fn write(&mut self, writes: &[(u32, u8, usize, Vec<u8>)]) {
        let mut bursts = vec![Vec::new(); K + R];
        let mut counts = [0; K + R];
        for (slot, version, split, payload) in writes {
            let checksum = split_checksum(payload, *version, FIRST_PAGE + u64::from(*slot), *split as u8);
            let prefix =
                WriteSplitPrefix { slab_id: self.slabs[*split], slot: *slot, version: *version, checksum };
            encode_write_split(7, &prefix, payload, &mut bursts[*split]);
            counts[*split] += 1;
        }
        for (index, client) in self.clients.iter_mut().enumerate() {
            client.stream.write_all(&bursts[index]).unwrap();
            for _ in 0..counts[index] {
                assert_eq!(
                    blocking::read_control(&mut client.stream, &mut client.body).unwrap().1,
                    Control::WriteSplitOk
                );
            }
        }
    }

    /// Writes version 1 of every page `0..pages`.
    fn fill(&mut self, pages: u32) {
        self.fill_slots(&(0..pages).collect::<Vec<_>>());
    }

    /// Writes version 1 of the pages at `slots`, all k + r splits of each.
    fn fill_slots(&mut self, slots: &[u32]) {
        let mut codec = new_codec(CodecParams::new(K, R, PAGE).unwrap());
        for chunk in slots.chunks(512) {
            let mut writes = Vec::new();
            for &slot in chunk {
                let page = page_bytes(FIRST_PAGE + u64::from(slot), 1);
                for (split, payload) in splits_of(codec.as_mut(), &page).into_iter().enumerate() {
                    writes.push((slot, 1, split, payload));
                }
            }
            self.write(&writes);
        }
    }

    fn sources(&self, lost: usize) -> Vec<RegenerationSource> {
        (0..K + R)
            .filter(|split| *split != lost)
            .map(|split| RegenerationSource {
                split_index: split as u8,
                slab_id: self.slabs[split],
                address: self.nodes[split].as_ref().map_or("127.0.0.1:9".parse().unwrap(), |node| node.addr),
            })
            .collect()
    }
}

/// Sends Regenerate on `client` and returns RegenerationDone's numbers (rebuilt, skipped, lost)
/// and how long the rebuild took.
fn regenerate(
    client: &mut Client,
    slab_id: u32,
    pages: u32,
    sources: Vec<RegenerationSource>,
) -> ((u64, u64, u64), Duration) {
    let started = Instant::now();
    let message = Control::Regenerate {
        slab_id,
        data_splits: K as u8,
        parity_splits: R as u8,
        page_bytes: PAGE as u32,
        pages,
        sources,
    };
    blocking::write_control(&mut client.stream, 77, &message).unwrap();
    client.stream.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    let (header, reply) = blocking::read_control(&mut client.stream, &mut client.body).unwrap();
    assert_eq!((header.request_id, reply), (77, Control::Ok));
    let (header, done) = blocking::read_control(&mut client.stream, &mut client.body).unwrap();
    assert_eq!(header.request_id, 77, "RegenerationDone echoes the Regenerate request id");
    let Control::RegenerationDone { slab_id: done_slab, pages_rebuilt, pages_skipped, pages_lost } = done
    else {
        panic!("expected RegenerationDone, got {done:?}");
    };
    assert_eq!(done_slab, slab_id);
    client.stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    ((pages_rebuilt, pages_skipped, pages_lost), started.elapsed())
}

/// Checks slot `slot` of the rebuilt slab holds `expected` at `version` with a valid checksum.
fn assert_rebuilt(client: &mut Client, slab_id: u32, slot: u32, split: u8, version: u8, expected: &[u8]) {
    let (meta, payload) = client.read_split(slab_id, slot).unwrap();
    assert_eq!(meta.version, version, "slot {slot}");
    assert_eq!(payload, expected, "slot {slot} differs from the original split");
    assert_eq!(
        split_checksum(&payload, version, FIRST_PAGE + u64::from(slot), split),
        meta.checksum,
        "slot {slot}"
    );
}

#[test]
fn lost_data_split_is_rebuilt_from_nine_survivors_k8_r2_keeping_new_writes_and_torn_pages_consistent() {
    let mut range = Range::new(64 * 1024, false);
    let pages = range.slots;
    range.fill(pages);
    let mut codec = new_codec(CodecParams::new(K, R, PAGE).unwrap());
    let lost = 3;
    let mut target = range.spare.client(CLIENT);
    let (new_slab, _) = target.map_slab(SPLIT as u32, lost as u8, FIRST_PAGE);

    // Slot 5: the client already wrote a newer page to the new slab; it must survive.
    let fresh = vec![0xEE; SPLIT];
    let checksum = split_checksum(&fresh, 9, FIRST_PAGE + 5, lost as u8);
    target.write_split(&WriteSplitPrefix { slab_id: new_slab, slot: 5, version: 9, checksum }, &fresh);
    // Slot 7: three survivors corrupted (bad checksums): 6 valid splits < k, the page is lost.
    let garbage: Vec<_> = [0usize, 4, 9].iter().map(|split| (7u32, 1u8, *split, vec![0x11; SPLIT])).collect();
    for (slot, version, split, payload) in &garbage {
        let prefix = WriteSplitPrefix {
            slab_id: range.slabs[*split],
            slot: *slot,
            version: *version,
            checksum: 0xBAD,
        };
        assert_eq!(range.clients[*split].write_split(&prefix, payload), Control::WriteSplitOk);
    }
    // Slot 8: one data source corrupted: the rebuild asks a spare source and still succeeds.
    let prefix = WriteSplitPrefix { slab_id: range.slabs[1], slot: 8, version: 1, checksum: 0xBAD };
    range.clients[1].write_split(&prefix, &vec![0x22; SPLIT]);
    // Slot 9: a torn write: version 2 reached 8 splits (not split 8, and not the lost one).
    let page_v2 = page_bytes(FIRST_PAGE + 9, 2);
    let splits_v2 = splits_of(codec.as_mut(), &page_v2);
    let torn: Vec<_> = [0usize, 1, 2, 4, 5, 6, 7, 9]
        .iter()
        .map(|split| (9u32, 2u8, *split, splits_v2[*split].clone()))
        .collect();
    range.write(&torn);

    let sources = range.sources(lost);
    let ((rebuilt, skipped, lost_pages), _) = regenerate(&mut target, new_slab, pages, sources);
    assert_eq!((rebuilt, skipped, lost_pages), (u64::from(pages) - 2, 1, 1));

    for slot in 0..pages {
        match slot {
            5 => assert_eq!(
                target.read_split(new_slab, 5).unwrap(),
                (SplitMeta { version: 9, checksum }, fresh.clone())
            ),
            7 => assert_eq!(
                target.read_split(new_slab, 7).unwrap().0,
                SplitMeta::default(),
                "a lost page stays unwritten"
            ),
            9 => assert_rebuilt(&mut target, new_slab, 9, lost as u8, 2, &splits_v2[lost]),
            _ => {
                let page = page_bytes(FIRST_PAGE + u64::from(slot), 1);
                assert_rebuilt(
                    &mut target,
                    new_slab,
                    slot,
                    lost as u8,
                    1,
                    &page[lost * SPLIT..(lost + 1) * SPLIT],
                );
            }
        }
    }
    let Control::NodeInfoReply(info) = target.call(&Control::NodeInfo) else { panic!("no NodeInfoReply") };
    assert_eq!(
        (info.regenerating_slabs, info.regeneration_pages_done, info.regeneration_pages_total),
        (0, 0, 0)
    );
}

#[test]
fn lost_parity_split_is_rebuilt_while_a_source_is_down_and_progress_shows_in_node_info() {
    // 512 KiB slabs: 1024 slots, four batches; a slowed source makes the rebuild observable.
    let mut range = Range::new(512 * 1024, true);
    let pages = range.slots;
    range.fill(pages);
    let lost = K + 1;
    let mut target = range.spare.client(CLIENT);
    let (new_slab, _) = target.map_slab(SPLIT as u32, lost as u8, FIRST_PAGE);
    // Source 0 is gone: the rebuild must use the other eight, parity 8 included.
    range.nodes[0].take().unwrap().stop();
    let delay = Control::InjectFault {
        fault: FaultKind::Delay,
        slab_id: 0,
        delay_us: 100_000,
        fraction_ppm: 1_000_000,
        flips: 0,
        seed: 1,
    };
    assert_eq!(range.clients[1].call(&delay), Control::Ok);

    let sources = range.sources(lost);
    let spare_addr = range.spare.addr;
    let watcher = std::thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(spare_addr).unwrap();
        blocking::handshake(&mut stream, &secret(), 1).unwrap();
        let mut body = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            blocking::write_control(&mut stream, 3, &Control::NodeInfo).unwrap();
            if let (_, Control::NodeInfoReply(info)) = blocking::read_control(&mut stream, &mut body).unwrap()
            {
                if info.regenerating_slabs == 1
                    && info.regeneration_pages_done < info.regeneration_pages_total
                {
                    return Some(info);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    });
    let ((rebuilt, skipped, lost_pages), _) = regenerate(&mut target, new_slab, pages, sources);
    assert_eq!((rebuilt, skipped, lost_pages), (u64::from(pages), 0, 0));
    let info = watcher.join().unwrap().expect("progress never seen in NodeInfo");
    assert_eq!(info.regeneration_pages_total, u64::from(pages));

    let mut codec = new_codec(CodecParams::new(K, R, PAGE).unwrap());
    for slot in 0..pages {
        let page = page_bytes(FIRST_PAGE + u64::from(slot), 1);
        let expected = &splits_of(codec.as_mut(), &page)[lost];
        assert_rebuilt(&mut target, new_slab, slot, lost as u8, 1, expected);
    }
}

/// Checks slot `slot` of the rebuilt slab was left never written.
fn assert_unwritten(client: &mut Client, slab_id: u32, slot: u32) {
    let (meta, payload) = client.read_split(slab_id, slot).unwrap();
    assert_eq!(meta, SplitMeta::default(), "slot {slot} must stay never written");
    assert!(payload.iter().all(|byte| *byte == 0), "slot {slot} holds bytes");
}

#[test]
fn rebuild_of_a_partly_written_slab_skips_never_written_pages_and_loses_none_k8_r2() {
    let mut range = Range::new(64 * 1024, false);
    let pages = range.slots;
    // The first half, plus every seventh page of the second half; the others were never written.
    let written: Vec<u32> = (0..pages).filter(|slot| *slot < pages / 2 || slot % 7 == 0).collect();
    range.fill_slots(&written);
    let lost = 3;
    let mut target = range.spare.client(CLIENT);
    let (new_slab, _) = target.map_slab(SPLIT as u32, lost as u8, FIRST_PAGE);
    // A data source is gone too, so never-written pages are also judged from a parity split.
    range.nodes[0].take().unwrap().stop();

    let ((rebuilt, skipped, lost_pages), _) = regenerate(&mut target, new_slab, pages, range.sources(lost));
    let written_count = written.len() as u64;
    assert_eq!((rebuilt, skipped, lost_pages), (written_count, u64::from(pages) - written_count, 0));

    for slot in 0..pages {
        if written.contains(&slot) {
            let page = page_bytes(FIRST_PAGE + u64::from(slot), 1);
            assert_rebuilt(
                &mut target,
                new_slab,
                slot,
                lost as u8,
                1,
                &page[lost * SPLIT..(lost + 1) * SPLIT],
            );
        } else {
            assert_unwritten(&mut target, new_slab, slot);
        }
    }
}

#[test]
fn first_write_torn_below_k_is_lost_but_one_stray_split_over_k_never_written_is_empty_k8_r2() {
    let mut range = Range::new(64 * 1024, false);
    let pages = range.slots;
    range.fill_slots(&[0]);
    let mut codec = new_codec(CodecParams::new(K, R, PAGE).unwrap());
    let lost = 3;
    // Slot 1: the first write reached five splits; four sources still say never written. Neither
    // version has k = 8 splits, and the page may have been written: lost.
    let splits_1 = splits_of(codec.as_mut(), &page_bytes(FIRST_PAGE + 1, 1));
    let torn: Vec<_> =
        [0usize, 1, 2, 4, 5].iter().map(|split| (1u32, 1u8, *split, splits_1[*split].clone())).collect();
    range.write(&torn);
    // Slot 2: the first write reached split 0 only. The batch (splits 0..=8 but 3) does not
    // settle it, the spare source does: eight splits agree on never written, so it is empty.
    let splits_2 = splits_of(codec.as_mut(), &page_bytes(FIRST_PAGE + 2, 1));
    range.write(&[(2, 1, 0, splits_2[0].clone())]);
    let mut target = range.spare.client(CLIENT);
    let (new_slab, _) = target.map_slab(SPLIT as u32, lost as u8, FIRST_PAGE);

    let ((rebuilt, skipped, lost_pages), _) = regenerate(&mut target, new_slab, pages, range.sources(lost));
    assert_eq!((rebuilt, skipped, lost_pages), (1, u64::from(pages) - 2, 1));
    assert_rebuilt(
        &mut target,
        new_slab,
        0,
        lost as u8,
        1,
        &page_bytes(FIRST_PAGE, 1)[lost * SPLIT..(lost + 1) * SPLIT],
    );
    for slot in 1..pages {
        assert_unwritten(&mut target, new_slab, slot);
    }
}

#[test]
fn rebuild_with_fewer_than_k_reachable_sources_counts_every_page_lost_k8_r2() {
    let mut range = Range::new(64 * 1024, false);
    let pages = range.slots;
    range.fill_slots(&(0..pages / 2).collect::<Vec<_>>());
    let lost = 3;
    let mut target = range.spare.client(CLIENT);
    let (new_slab, _) = target.map_slab(SPLIT as u32, lost as u8, FIRST_PAGE);
    // Two of the nine sources are gone: seven are left, fewer than k. Whether a page was ever
    // written cannot be told then, so even the never-written half counts as lost.
    range.nodes[0].take().unwrap().stop();
    range.nodes[K].take().unwrap().stop();

    let ((rebuilt, skipped, lost_pages), _) = regenerate(&mut target, new_slab, pages, range.sources(lost));
    assert_eq!((rebuilt, skipped, lost_pages), (0, 0, u64::from(pages)));
    for slot in 0..pages {
        assert_unwritten(&mut target, new_slab, slot);
    }
}

#[test]
fn regenerate_refuses_bad_requests_and_keeps_the_connection() {
    let node = TestNode::start(1 << 20, 64 * 1024);
    let mut client = node.client(CLIENT);
    let (slab_id, slots) = client.map_slab(SPLIT as u32, 3, 0);
    let source = |split_index: u8| RegenerationSource {
        split_index,
        slab_id: 1,
        address: "127.0.0.1:9".parse().unwrap(),
    };
    let all_but = |lost: u8| (0..10u8).filter(|i| *i != lost).map(source).collect::<Vec<_>>();
    let request =
        |slab_id: u32, data_splits: u8, page_bytes: u32, pages: u32, sources: Vec<RegenerationSource>| {
            Control::Regenerate { slab_id, data_splits, parity_splits: 2, page_bytes, pages, sources }
        };
    for (name, message, code) in [
        ("unknown slab", request(999, 8, 4096, 1, all_but(3)), ErrorCode::UnknownSlab),
        ("split size", request(slab_id, 4, 4096, 1, all_but(3)), ErrorCode::BadSplitSize),
        ("k = 3", request(slab_id, 3, 4096, 1, all_but(3)), ErrorCode::BadSplitSize),
        ("too many pages", request(slab_id, 8, 4096, slots + 1, all_but(3)), ErrorCode::SlotOutOfRange),
        (
            "repeated source",
            request(slab_id, 8, 4096, 1, [all_but(3), vec![source(0)]].concat()),
            ErrorCode::Unsupported,
        ),
        ("too few sources", request(slab_id, 8, 4096, 1, all_but(3)[..7].to_vec()), ErrorCode::Unsupported),
    ] {
        let reply = client.call(&message);
        assert!(matches!(reply, Control::Error { code: got, .. } if got == code), "{name}: {reply:?}");
    }
    // Someone else's slab.
    let reply = node.client(CLIENT + 1).call(&request(slab_id, 8, 4096, 1, all_but(3)));
    assert!(matches!(reply, Control::Error { code: ErrorCode::NotOwner, .. }), "{reply:?}");
    // Unreachable sources: accepted, then every page lost.
    let ((rebuilt, skipped, lost), _) = regenerate(&mut client, slab_id, 4, all_but(3));
    assert_eq!((rebuilt, skipped, lost), (0, 0, 4));
    assert_eq!(client.call(&Control::Ping), Control::Pong);
}

/// Regeneration throughput: a whole slab rebuilt from nine nodes (a lost data split).
#[test]
fn regeneration_throughput_k8_r2() {
    let mib: u64 =
        std::env::var("REMEM_REGEN_BENCH_MIB").ok().and_then(|value| value.parse().ok()).unwrap_or(1);
    let mut range = Range::new(mib << 20, false);
    let pages = range.slots;
    range.fill(pages);
    let mut target = range.spare.client(CLIENT);
    let (new_slab, _) = target.map_slab(SPLIT as u32, 0, FIRST_PAGE);
    let ((rebuilt, _, _), elapsed) = regenerate(&mut target, new_slab, pages, range.sources(0));
    assert_eq!(rebuilt, u64::from(pages));
    let mib_per_second = (u64::from(pages) * SPLIT as u64) as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64();
    println!(
        "regeneration_k8_r2_{mib}MiB_slab: {pages} pages in {:.3} s, {mib_per_second:.1} MiB/s of slab",
        elapsed.as_secs_f64()
    );
    for slot in [0, pages / 2, pages - 1] {
        let page = page_bytes(FIRST_PAGE + u64::from(slot), 1);
        assert_rebuilt(&mut target, new_slab, slot, 0, 1, &page[..SPLIT]);
    }
}
