//! Every size, limit and fixed value of the wire protocol (`docs/PROTOCOL.md`), in one place.
//!
//! Job: be the leaf of the crate. The frame header's length rules need the sizes of the control
//! and data bodies, and those modules need the frame header, so the numbers live here where all
//! of them can import them and this module imports nothing of the crate. That keeps the module
//! graph free of cycles through constants.
//!
//! Invariants: this module uses nothing from the crate. The compile-time assertions at the end
//! hold: one split of the largest size, with its prefix, always fits in one frame.

/// The protocol version carried in every frame header; anything else is rejected.
pub const PROTOCOL_VERSION: u8 = 2;
/// Size of the fixed frame header.
pub const HEADER_BYTES: usize = 16;
/// Largest `body_len` any frame may declare: one 1 MiB split plus its prefix, with slack.
pub const MAX_BODY_BYTES: u32 = 1024 * 1024 + 64;
/// The two magic bytes `R`, `M` read as a little-endian u16.
pub const MAGIC: u16 = u16::from_le_bytes(*b"RM");

/// Longest `failure_domain` in a NodeInfoReply, in UTF-8 bytes.
pub const MAX_FAILURE_DOMAIN_BYTES: usize = 64;
/// Longest message in an `Error` frame, in UTF-8 bytes; longer messages are truncated on encode.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 256;
/// Most sources one `Regenerate` may name: every other split of the widest code (k + r <= 20).
pub const MAX_REGENERATION_SOURCES: usize = 19;
/// Size of one source entry of `Regenerate`: split_index u8, reserved \[3\], slab_id u32, ip \[16\],
/// port u16, reserved \[2\].
pub const REGENERATION_SOURCE_BYTES: usize = 1 + 3 + 4 + 16 + 2 + 2;
/// `InjectFault.fraction_ppm` of a fault that hits every reply.
pub const MAX_FRACTION_PPM: u32 = 1_000_000;

/// Fixed part of the NodeInfoReply body, up to and including `domain_len`.
pub(crate) const NODE_INFO_FIXED_BYTES: u32 = 8 * 4 + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 8 + 4 + 4 + 1;
/// Fixed part of the Regenerate body, before its source entries.
pub(crate) const REGENERATE_FIXED_BYTES: u32 = 4 + 1 + 1 + 1 + 1 + 4 + 4;
/// Fixed part of the Error body: code u16 and message_len u16.
pub(crate) const ERROR_FIXED_BYTES: u32 = 4;

/// Size of the `WriteSplit` prefix: slab_id u32, slot u32, version u8, reserved \[3\], checksum u32.
pub const WRITE_SPLIT_PREFIX_BYTES: usize = 16;
/// Size of `SplitMeta` on the wire: version u8, reserved \[3\], checksum u32.
pub const SPLIT_META_BYTES: usize = 8;
/// Size of the `count` field that opens a `ReadSplitsReply` body.
pub const READ_SPLITS_COUNT_BYTES: usize = 4;
/// Most slots one `ReadSplits` may ask for.
pub const READ_SPLITS_MAX_COUNT: u32 = 256;
/// Smallest split a slab may be mapped with.
pub const MIN_SPLIT_BYTES: u32 = 64;
/// Largest split a slab may be mapped with, so that one split always fits in one frame.
pub const MAX_SPLIT_BYTES: u32 = 1024 * 1024;

// A `WriteSplit` and a one-entry `ReadSplitsReply` of the largest split must fit in one frame,
// or a slab mapped with that split size could not be written or read.
const _: () = assert!(WRITE_SPLIT_PREFIX_BYTES as u32 + MAX_SPLIT_BYTES <= MAX_BODY_BYTES);
const _: () =
    assert!((READ_SPLITS_COUNT_BYTES + SPLIT_META_BYTES) as u32 + MAX_SPLIT_BYTES <= MAX_BODY_BYTES);
