//! Data-plane framing: fixed prefixes of the payload-carrying messages, their frame encoders,
//! the end-to-end split checksum and version arithmetic.
//!
//! Invariant: payload bytes are never interpreted here. The decoders check only the prefix; the
//! receiver knows the slab's `split_bytes` and checks the payload length against it.

use crate::error::DecodeError;
use crate::frame::{FrameHeader, Kind};
use crate::sizes::{
    MAX_BODY_BYTES, READ_SPLITS_COUNT_BYTES, READ_SPLITS_MAX_COUNT, SPLIT_META_BYTES,
    WRITE_SPLIT_PREFIX_BYTES,
};

/// The fixed prefix of a `WriteSplit` body; `split_bytes` of payload follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSplitPrefix {
    pub slab_id: u32,
    pub slot: u32,
    /// 1..=255; 0 ("never written") is rejected.
    pub version: u8,
    pub checksum: u32,
}

impl WriteSplitPrefix {
    /// Panics on version 0, which only a buggy writer would send.
    pub fn encode(&self) -> [u8; WRITE_SPLIT_PREFIX_BYTES] {
        assert_ne!(self.version, 0, "WriteSplit version 0 means never written");
        let mut bytes = [0u8; WRITE_SPLIT_PREFIX_BYTES];
        bytes[0..4].copy_from_slice(&self.slab_id.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.slot.to_le_bytes());
        bytes[8] = self.version;
        bytes[12..16].copy_from_slice(&self.checksum.to_le_bytes());
        bytes
    }

    /// Rejects non-zero reserved bytes and version 0.
    pub fn decode(bytes: &[u8; WRITE_SPLIT_PREFIX_BYTES]) -> Result<WriteSplitPrefix, DecodeError> {
        if bytes[9..12] != [0, 0, 0] {
            return Err(DecodeError::ReservedNotZero { kind: Kind::WriteSplit });
        }
        if bytes[8] == 0 {
            return Err(DecodeError::ZeroVersion);
        }
        Ok(WriteSplitPrefix {
            slab_id: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            slot: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            version: bytes[8],
            checksum: u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]),
        })
    }
}

/// What a node stores beside each slot and returns in front of each payload it reads:
/// the `ReadSplitReply` prefix and the prefix of every `ReadSplitsReply` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SplitMeta {
    /// 0 for a slot never written.
    pub version: u8,
    pub checksum: u32,
}

impl SplitMeta {
    pub fn encode(&self) -> [u8; SPLIT_META_BYTES] {
        let mut bytes = [0u8; SPLIT_META_BYTES];
        bytes[0] = self.version;
        bytes[4..8].copy_from_slice(&self.checksum.to_le_bytes());
        bytes
    }

    /// Rejects non-zero reserved bytes.
    pub fn decode(bytes: &[u8; SPLIT_META_BYTES]) -> Result<SplitMeta, DecodeError> {
        if bytes[1..4] != [0, 0, 0] {
            return Err(DecodeError::ReservedNotZero { kind: Kind::ReadSplitReply });
        }
        Ok(SplitMeta {
            version: bytes[0],
            checksum: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        })
    }
}

fn payload_body_len(prefix_bytes: usize, payload_len: usize) -> u32 {
    let body_len = prefix_bytes + payload_len;
    assert!(body_len <= MAX_BODY_BYTES as usize, "payload of {payload_len} bytes does not fit in one frame");
    body_len as u32
}

/// Appends a whole `WriteSplit` frame (header, prefix, payload) to `out`.
///
/// Panics if the payload does not fit in one frame or the version is 0.
pub fn encode_write_split(request_id: u64, prefix: &WriteSplitPrefix, payload: &[u8], out: &mut Vec<u8>) {
    let header = FrameHeader {
        kind: Kind::WriteSplit,
        body_len: payload_body_len(WRITE_SPLIT_PREFIX_BYTES, payload.len()),
        request_id,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&prefix.encode());
    out.extend_from_slice(payload);
}

/// Appends a whole `ReadSplitReply` frame (header, meta, payload) to `out`.
pub fn encode_read_split_reply(request_id: u64, meta: SplitMeta, payload: &[u8], out: &mut Vec<u8>) {
    let header = FrameHeader {
        kind: Kind::ReadSplitReply,
        body_len: payload_body_len(SPLIT_META_BYTES, payload.len()),
        request_id,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&meta.encode());
    out.extend_from_slice(payload);
}

/// Body length of a `ReadSplitsReply` carrying `count` splits of `split_bytes`, or `None` if it
/// would exceed [`MAX_BODY_BYTES`].
pub fn read_splits_reply_body_len(count: u32, split_bytes: u32) -> Option<u32> {
    let entry = u64::from(split_bytes) + SPLIT_META_BYTES as u64;
    let body_len = READ_SPLITS_COUNT_BYTES as u64 + u64::from(count) * entry;
    u32::try_from(body_len).ok().filter(|len| *len <= MAX_BODY_BYTES)
}

/// The most slots one `ReadSplits` may ask for at this split size: 256, or fewer when 256 replies
/// would not fit in one frame. At least 1 for every split size up to
/// [`MAX_SPLIT_BYTES`](crate::MAX_SPLIT_BYTES).
pub fn max_read_splits_count(split_bytes: u32) -> u32 {
    let entry = u64::from(split_bytes) + SPLIT_META_BYTES as u64;
    let fit = (u64::from(MAX_BODY_BYTES) - READ_SPLITS_COUNT_BYTES as u64) / entry;
    fit.min(u64::from(READ_SPLITS_MAX_COUNT)) as u32
}

/// Appends the header and the `count` field of a `ReadSplitsReply`; the caller then appends (or
/// writes) `count` entries of [`SplitMeta`] and `split_bytes` of payload each.
///
/// Panics if `count` is outside 1..=256 or the reply would not fit in one frame.
pub fn encode_read_splits_reply_head(request_id: u64, count: u32, split_bytes: u32, out: &mut Vec<u8>) {
    assert!((1..=READ_SPLITS_MAX_COUNT).contains(&count));
    let body_len =
        read_splits_reply_body_len(count, split_bytes).expect("ReadSplitsReply must fit in one frame");
    let header = FrameHeader { kind: Kind::ReadSplitsReply, body_len, request_id };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&count.to_le_bytes());
}

/// Decodes the `count` field of a `ReadSplitsReply`, which must be 1..=256.
pub fn decode_read_splits_count(bytes: &[u8; READ_SPLITS_COUNT_BYTES]) -> Result<u32, DecodeError> {
    let count = u32::from_le_bytes(*bytes);
    if !(1..=READ_SPLITS_MAX_COUNT).contains(&count) {
        return Err(DecodeError::CountOutOfRange { kind: Kind::ReadSplitsReply, count });
    }
    Ok(count)
}

/// The end-to-end checksum of one split:
/// `crc32c(payload || version || page u64 LE || split_index)`.
///
/// Binding the page and split index means a split returned from the wrong slot, slab or node is
/// detected as corrupt, not silently decoded into the wrong page.
pub fn split_checksum(payload: &[u8], version: u8, page: u64, split_index: u8) -> u32 {
    finish_split_checksum(crc32c::crc32c(payload), version, page, split_index)
}

/// [`split_checksum`] from `crc32c(payload)` computed beforehand (several at once:
/// [`crate::payload_crcs`]).
pub fn finish_split_checksum(payload_crc: u32, version: u8, page: u64, split_index: u8) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return unsafe { crate::checksums::append_trailer(payload_crc, version, page, split_index) };
    }
    let mut trailer = [0u8; 10];
    trailer[0] = version;
    trailer[1..9].copy_from_slice(&page.to_le_bytes());
    trailer[9] = split_index;
    crc32c::crc32c_append(payload_crc, &trailer)
}

/// Whether version `candidate` is newer than `than`, in RFC 1982 serial-number arithmetic over the
/// written versions 1..=255 (a cycle of 255 values). Version 0 means never written: it is older
/// than every written version and newer than none.
///
/// With an odd cycle no pair is ambiguous: `candidate` is newer when it is 1..=127 steps ahead.
pub fn version_is_newer(candidate: u8, than: u8) -> bool {
    match (candidate, than) {
        (0, _) => false,
        (_, 0) => true,
        _ => {
            let ahead = (u16::from(candidate) + 255 - u16::from(than)) % 255;
            (1..=127).contains(&ahead)
        }
    }
}

/// The version after `v`: 0 -> 1, 255 -> 1, otherwise v + 1.
pub fn next_version(v: u8) -> u8 {
    if v == 255 {
        1
    } else {
        v + 1
    }
}
