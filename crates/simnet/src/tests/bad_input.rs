//! Any bytes from a client get valid frames back (an `Error` where refused), never a panic.

use super::*;
use crate::Delivery;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_proto::{ErrorCode, RegenerationSource};

/// One valid frame of every request kind (and some kinds a node does not accept).
fn valid_frames(slab_id: u32) -> Vec<Vec<u8>> {
    let controls = [
        Control::MapSlab { split_bytes: 512, split_index: 1, first_page: 0, range_id: 3 },
        Control::UnmapSlab { slab_id },
        Control::NodeInfo,
        Control::Ping,
        Control::Pong,
        Control::ReadSplit { slab_id, slot: 3 },
        Control::ReadSplits { slab_id, first_slot: 0, count: 4 },
        Control::AnswerActivity,
        Control::SlabActivity { slab_id, accesses: 9 },
        Control::ExportSlab { slab_id },
        Control::Regenerate {
            slab_id,
            data_splits: 8,
            parity_splits: 2,
            page_bytes: 4096,
            pages: 4,
            sources: (0..9)
                .map(|split| RegenerationSource {
                    split_index: split + 1,
                    slab_id: 1,
                    address: crate::regeneration::node_address(0),
                })
                .collect(),
        },
        Control::Hello { client_id: 1, client_nonce: [0; 32], session: 0 },
        Control::SlabMapped { slab_id, slots: 4 },
        Control::Error { code: ErrorCode::Internal, message: "x".to_owned() },
    ];
    let mut frames: Vec<Vec<u8>> = controls
        .iter()
        .map(|control| {
            let mut frame = Vec::new();
            control.encode(7, &mut frame);
            frame
        })
        .collect();
    let mut write = Vec::new();
    let prefix = WriteSplitPrefix { slab_id, slot: 1, version: 3, checksum: 4 };
    encode_write_split(8, &prefix, &[6; 512], &mut write);
    frames.push(write);
    frames
}

/// Checks what came back: whole, valid frames only, and a lost connection only right after an
/// `Error`.
fn check_deliveries(deliveries: &[Delivery]) {
    let mut last_was_error = false;
    for delivery in deliveries {
        match delivery {
            Delivery::Bytes { bytes, .. } => {
                let replies = parse(bytes);
                last_was_error =
                    matches!(replies.last(), Some(Reply::Control { message: Control::Error { .. }, .. }));
            }
            Delivery::ConnectionLost { .. } => {
                assert!(last_was_error, "closed without an Error: {deliveries:?}")
            }
        }
    }
}

/// Sends `bytes` to a node with one slab mapped, then a ping; returns what came back.
fn feed(harness: &mut Harness, bytes: &[u8]) -> Vec<Delivery> {
    if !harness.cluster.is_connected(0, CLIENT) {
        harness.cluster.connect(harness.now, 0, CLIENT).unwrap();
    }
    harness.cluster.send(harness.now, 0, CLIENT, bytes);
    harness.settle()
}

#[test]
fn random_and_mutated_frames_get_errors_never_panics() {
    let mut rng = StdRng::seed_from_u64(2024);
    let mut harness = Harness::new(50, 1);
    let (slab_id, _) = harness.map(0, 512, 0, 0);
    let frames = valid_frames(slab_id);
    let mut errors = 0;
    for round in 0..3000 {
        let bytes = match round % 3 {
            // Pure noise, sometimes with a valid magic and version in front.
            0 => {
                let mut bytes: Vec<u8> = (0..rng.gen_range(1..200)).map(|_| rng.gen()).collect();
                if rng.gen_bool(0.5) && bytes.len() >= 3 {
                    bytes[..3].copy_from_slice(&[b'R', b'M', 1]);
                }
                bytes
            }
            // A valid frame with a few bytes changed.
            1 => {
                let mut bytes = frames[rng.gen_range(0..frames.len())].clone();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..bytes.len());
                    bytes[at] = rng.gen();
                }
                bytes
            }
            // Valid frames, cut short or run together.
            _ => {
                let mut bytes = Vec::new();
                for _ in 0..rng.gen_range(1..4) {
                    bytes.extend_from_slice(&frames[rng.gen_range(0..frames.len())]);
                }
                bytes.truncate(rng.gen_range(1..=bytes.len()));
                bytes
            }
        };
        let deliveries = feed(&mut harness, &bytes);
        check_deliveries(&deliveries);
        errors += replies_from(&deliveries, 0)
            .iter()
            .filter(|reply| matches!(reply, Reply::Control { message: Control::Error { .. }, .. }))
            .count();
        // A partial frame left on a connection would swallow the next round: start clean.
        harness.cluster.disconnect(harness.now, 0, CLIENT);
        if harness.cluster.slabs_of(0).is_empty() {
            harness.map_after_reconnect();
        }
    }
    assert!(errors > 1000, "most rounds are refused ({errors})");
}

impl Harness {
    fn map_after_reconnect(&mut self) {
        if !self.cluster.is_connected(0, CLIENT) {
            self.cluster.connect(self.now, 0, CLIENT).unwrap();
        }
        self.map(0, 512, 0, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_bytes_get_valid_frames_back(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut harness = Harness::new(51, 1);
        harness.map(0, 512, 0, 0);
        let deliveries = feed(&mut harness, &bytes);
        check_deliveries(&deliveries);
    }
}
