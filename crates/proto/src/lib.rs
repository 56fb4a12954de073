//! remem-proto: the remem wire protocol, version 1 (`docs/PROTOCOL.md`), as pure encode/decode.
//!
//! Job: turn frames into typed messages and back. Every message without a split payload is a
//! [`Control`]; the three payload-carrying kinds (`WriteSplit`, `ReadSplitReply`,
//! `ReadSplitsReply`) are handled as a fixed-size prefix ([`WriteSplitPrefix`], [`SplitMeta`])
//! followed by payload bytes; a receiver validates the prefix before it applies the payload.
//!
//! Invariants:
//! - The codec does no I/O, except the small [`blocking`] helper module for control paths and
//!   tests, and `encryption`'s blocking stream.
//! - Decoders are strict and total: every byte string either decodes to exactly one message whose
//!   re-encoding is the same bytes, or is rejected with a structured [`DecodeError`]. They never
//!   panic and never allocate from a length they have not checked against its bound.
//! - [`FrameHeader::decode`] already rejects a `body_len` that its kind cannot have, so a receiver
//!   may size its body buffer from a decoded header.
//! - Encoders `assert!` their preconditions (lengths within bounds): violating them is a
//!   programmer error on the sending side, never a property of received data.

pub mod auth;
pub mod blocking;
mod checksums;
mod control;
mod data;
pub mod encryption;
mod error;
mod frame;
pub mod fuzzing;
pub mod shm;
mod sizes;
mod validity;

pub use checksums::payload_crcs;
pub use control::{Control, FaultKind, NodeInfo, RegenerationSource};
pub use data::{
    decode_read_splits_count, encode_read_split_reply, encode_read_splits_reply_head, encode_write_split,
    finish_split_checksum, max_read_splits_count, next_version, read_splits_reply_body_len, split_checksum,
    version_is_newer, SplitMeta, WriteSplitPrefix,
};
pub use error::{DecodeError, ErrorCode};
pub use frame::{FrameHeader, Kind, LengthRule};
pub use sizes::{
    HEADER_BYTES, MAGIC, MAX_BODY_BYTES, MAX_ERROR_MESSAGE_BYTES, MAX_FAILURE_DOMAIN_BYTES, MAX_FRACTION_PPM,
    MAX_REGENERATION_SOURCES, MAX_SPLIT_BYTES, MIN_SPLIT_BYTES, PROTOCOL_VERSION, READ_SPLITS_COUNT_BYTES,
    READ_SPLITS_MAX_COUNT, REGENERATION_SOURCE_BYTES, SPLIT_META_BYTES, WRITE_SPLIT_PREFIX_BYTES,
};
pub use validity::{judge_split, judge_split_crc, newest_with_k, SplitVerdict};
