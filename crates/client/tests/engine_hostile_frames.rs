//! Frames from nodes are hostile: whatever a node sends (any kind, any request id, any body,
//! from any node, at any time), the engine answers with an error for the driver (which drops
//! the connection) or handles it, and never panics, hangs or writes outside a buffer. Ops in
//! flight still end: every submitted op completes once, with data that is right or an error.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_client::engine::{Engine, EngineConfig, OpBuffers, SlabRef, Submit};
use remem_client::Shape;
use remem_placement::LeastLoaded;
use remem_proto::{FrameHeader, Kind, NodeInfo};

struct Pages(Vec<Vec<u8>>);

impl OpBuffers for Pages {
    fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
        &mut self.0[tag]
    }
}

fn info() -> NodeInfo {
    NodeInfo {
        node_id: 1,
        capacity_bytes: 1 << 30,
        free_bytes: 1 << 30,
        slab_size_bytes: 1 << 20,
        slabs_mapped: 0,
        metadata_bytes: 0,
        requests_served: 0,
        regenerating_slabs: 0,
        regeneration_pages_done: 0,
        regeneration_pages_total: 0,
        clients_live: 0,
        clients_in_grace: 0,
        slabs_in_grace: 0,
        failure_domain: String::new(),
    }
}

/// An engine on 12 pretend nodes with one EC(8,2) region of two ranges, a few writes (whole and
/// data-only) and reads in flight (their frames are never answered by a real node here).
fn engine_with_ops_in_flight(now: Instant, pages: &mut Pages) -> Engine {
    let mut config = EngineConfig::new(7, 4096);
    config.max_in_flight = 8;
    let mut engine = Engine::new(config, Box::new(LeastLoaded::new(StdRng::seed_from_u64(1))), now);
    for node in 0..12u16 {
        let address = SocketAddr::from(([127, 0, 0, 1], 7000 + node));
        engine.add_node(now, address, None, info(), true);
    }
    let shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
    let ranges = (0..2)
        .map(|range| {
            (0..10).map(|split| SlabRef { node: (range + split) % 12, slab_id: split as u32 }).collect()
        })
        .collect();
    engine.add_region(shape, 4096, 2048, ranges, true);
    let data = vec![0x5a; 4096];
    for tag in 0..4 {
        let page = tag as u64 * 700;
        // Half whole writes, half data-only ones (EC-oriented replication).
        let op = if tag < 2 {
            Submit::Write { page, data: &data }
        } else {
            Submit::WriteData { page, data: &data }
        };
        assert!(engine.submit(now, tag, op, pages));
    }
    for tag in 4..8 {
        assert!(engine.submit(now, tag, Submit::Read { page: tag as u64 * 500 }, pages));
    }
    engine
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_frames_from_any_node_never_panic(
        frames in proptest::collection::vec(
            (0usize..13, 0u8..40, any::<u64>(), 0u32..64, proptest::collection::vec(any::<u8>(), 0..700), any::<bool>()),
            1..12,
        ),
    ) {
        let start = Instant::now();
        let mut pages = Pages(vec![vec![0; 4096]; 8]);
        let mut engine = engine_with_ops_in_flight(start, &mut pages);
        let mut completed = 0;
        for (index, (node, kind, request_id, slot_and_split, body, plausible_id)) in frames.into_iter().enumerate() {
            let Some(kind) = Kind::from_u8(kind) else { continue };
            // Half the frames name an op slot and split that exist, so they reach deep paths.
            let request_id = if plausible_id {
                ((request_id & 0x7fff_ffff) << 32) | (u64::from(slot_and_split % 8) << 8) | u64::from(slot_and_split % 12)
            } else {
                request_id
            };
            let node = node.min(11);
            // Split replies of the right length get past the length check to the checksum.
            let mut body = body;
            if plausible_id && kind == Kind::ReadSplitReply {
                body.resize(remem_proto::SPLIT_META_BYTES + 512, 0);
            }
            let header = FrameHeader { kind, body_len: body.len() as u32, request_id };
            let now = start + Duration::from_millis(index as u64);
            if engine.on_frame(now, node, header, &body, &mut pages).is_err() {
                engine.connection_lost(now, node, "protocol error", &mut pages);
            }
            completed += engine.take_completions().count();
        }
        // Time passes: every op still in flight ends (its nodes time out).
        for step in 1..=6 {
            engine.tick(start + Duration::from_secs(3 * step), &mut pages);
            completed += engine.take_completions().count();
        }
        prop_assert_eq!(completed, 8, "every op completes exactly once");
        prop_assert_eq!(engine.active(), 0);
    }
}
