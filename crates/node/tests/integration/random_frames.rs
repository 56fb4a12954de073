//! Throws random and half-valid frames at a live node and checks that it survives: every
//! connection ends with either well-formed replies or a close, and a fresh client is still served.

use crate::common;

use common::*;
use proptest::prelude::*;
use remem_proto::blocking::{self, FrameError};
use remem_proto::*;
use std::io::Write;
use std::net::Shutdown;

const SLAB: u64 = 16 * 1024;
const SPLIT: u32 = 256;

/// One frame: a valid-looking request with random fields, or raw bytes.
#[derive(Clone, Debug)]
enum Piece {
    Raw(Vec<u8>),
    /// A header of `kind` with a random body length, then random body bytes (maybe short).
    Header {
        kind: u8,
        body_len: u32,
        body: Vec<u8>,
    },
    Control(Control),
    Write {
        slab: u32,
        slot: u32,
        version: u8,
        payload_len: u32,
    },
}

fn piece() -> impl Strategy<Value = Piece> {
    let slab = prop_oneof![Just(1u32), Just(2), any::<u32>()];
    let slot = prop_oneof![0u32..70, any::<u32>()];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Piece::Raw),
        (
            prop_oneof![1u8..=40, any::<u8>()],
            prop_oneof![0u32..300, any::<u32>()],
            proptest::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(kind, body_len, body)| Piece::Header { kind, body_len, body }),
        (slab.clone(), slot.clone(), 1u32..=300).prop_map(|(slab_id, first_slot, count)| {
            Piece::Control(Control::ReadSplits {
                slab_id,
                first_slot,
                count: count.min(READ_SPLITS_MAX_COUNT),
            })
        }),
        (slab.clone(), slot.clone())
            .prop_map(|(slab_id, slot)| Piece::Control(Control::ReadSplit { slab_id, slot })),
        slab.clone().prop_map(|slab_id| Piece::Control(Control::UnmapSlab { slab_id })),
        (prop_oneof![Just(SPLIT), any::<u32>()], any::<u8>()).prop_map(|(split_bytes, split_index)| {
            Piece::Control(Control::MapSlab { split_bytes, split_index, first_page: 0, range_id: 0 })
        }),
        Just(Piece::Control(Control::Ping)),
        Just(Piece::Control(Control::NodeInfo)),
        (slab, slot, any::<u8>(), prop_oneof![Just(SPLIT), 0u32..600]).prop_map(
            |(slab, slot, version, payload_len)| Piece::Write {
                slab,
                slot,
                version: version.max(1),
                payload_len
            }
        ),
    ]
}

fn encode(piece: &Piece, out: &mut Vec<u8>) {
    match piece {
        Piece::Raw(bytes) => out.extend_from_slice(bytes),
        Piece::Header { kind, body_len, body } => {
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.push(PROTOCOL_VERSION);
            out.push(*kind);
            out.extend_from_slice(&body_len.to_le_bytes());
            out.extend_from_slice(&7u64.to_le_bytes());
            out.extend_from_slice(&body[..body.len().min(*body_len as usize)]);
        }
        Piece::Control(control) => control.encode(3, out),
        Piece::Write { slab, slot, version, payload_len } => {
            let prefix = WriteSplitPrefix { slab_id: *slab, slot: *slot, version: *version, checksum: 0 };
            encode_write_split(4, &prefix, &vec![0x5A; *payload_len as usize], out);
        }
    }
}

/// Reads replies until the node closes; each must be a valid frame.
fn drain_replies(client: &mut Client) {
    loop {
        match blocking::read_frame(&mut client.stream, &mut client.body) {
            Ok(header) => {
                if !header.kind.carries_payload() {
                    Control::decode_body(header.kind, &client.body)
                        .expect("node sent a malformed control body");
                }
            }
            Err(FrameError::Closed) => return,
            Err(FrameError::Io(error)) if error.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(error) => panic!("node reply stream broken: {error:?}"),
        }
    }
}

/// One node for all cases, so the run also checks that state left by earlier cases does no harm.
#[test]
fn node_survives_random_frames() {
    detect_connection_panics();
    let node = TestNode::start(64 * SLAB, SLAB);
    let config = ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (any::<bool>(), any::<bool>(), proptest::collection::vec(piece(), 1..8));
    runner
        .run(&strategy, |(authenticate, map_first, pieces)| {
            let mut client = node.client(1);
            if authenticate {
                if map_first {
                    // Earlier cases may have used up the capacity; either answer is fine.
                    let reply = client.call(&Control::MapSlab {
                        split_bytes: SPLIT,
                        split_index: 0,
                        first_page: 0,
                        range_id: 0,
                    });
                    prop_assert!(
                        matches!(
                            reply,
                            Control::SlabMapped { .. } | Control::Error { code: ErrorCode::NoCapacity, .. }
                        ),
                        "{:?}",
                        reply
                    );
                }
            } else {
                client.stream = node.connect_raw();
            }
            let mut bytes = Vec::new();
            for piece in &pieces {
                encode(piece, &mut bytes);
            }
            // The node may close early and stop reading; a failed write is part of the game.
            let _ = client.stream.write_all(&bytes);
            let _ = client.stream.shutdown(Shutdown::Write);
            drain_replies(&mut client);
            let mut fresh = node.client(2);
            prop_assert_eq!(fresh.call(&Control::Ping), Control::Pong);
            Ok(())
        })
        .unwrap();
    node.stop();
    assert_no_connection_panicked();
}
