//! Message kinds and the 16-byte frame header.
//!
//! Invariant: a header that decodes has a body length its kind admits, and at most
//! [`MAX_BODY_BYTES`](crate::MAX_BODY_BYTES), so receivers can allocate from it.

use crate::error::DecodeError;
use crate::sizes::{
    ERROR_FIXED_BYTES, HEADER_BYTES, MAGIC, MAX_BODY_BYTES, MAX_ERROR_MESSAGE_BYTES,
    MAX_FAILURE_DOMAIN_BYTES, MAX_REGENERATION_SOURCES, NODE_INFO_FIXED_BYTES, PROTOCOL_VERSION,
    READ_SPLITS_COUNT_BYTES, REGENERATE_FIXED_BYTES, REGENERATION_SOURCE_BYTES, SPLIT_META_BYTES,
    WRITE_SPLIT_PREFIX_BYTES,
};

/// Message kinds: control plane 1..=31, data plane 32..=63.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Hello = 1,
    Challenge = 2,
    Auth = 3,
    AuthOk = 4,
    MapSlab = 5,
    SlabMapped = 6,
    UnmapSlab = 7,
    Ok = 8,
    NodeInfo = 9,
    NodeInfoReply = 10,
    Ping = 11,
    Pong = 12,
    Error = 13,
    InjectFault = 14,
    SlabEvicted = 15,
    Regenerate = 16,
    RegenerationDone = 17,
    ExportSlab = 18,
    SlabExported = 19,
    AnswerActivity = 20,
    SlabActivityQuery = 21,
    SlabActivity = 22,
    WriteSplit = 32,
    WriteSplitOk = 33,
    ReadSplit = 34,
    ReadSplitReply = 35,
    ReadSplits = 36,
    ReadSplitsReply = 37,
}

/// Which body lengths a kind admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthRule {
    /// Exactly this many bytes.
    Exact(u32),
    /// A fixed part plus a bounded variable part: `min..=max` bytes.
    Between { min: u32, max: u32 },
    /// A fixed prefix followed by payload; the upper bound is `MAX_BODY_BYTES`.
    AtLeast(u32),
}

impl LengthRule {
    pub fn admits(self, body_len: u32) -> bool {
        match self {
            LengthRule::Exact(n) => body_len == n,
            LengthRule::Between { min, max } => (min..=max).contains(&body_len),
            LengthRule::AtLeast(min) => (min..=MAX_BODY_BYTES).contains(&body_len),
        }
    }

    /// The largest length this rule admits.
    pub fn max(self) -> u32 {
        match self {
            LengthRule::Exact(n) => n,
            LengthRule::Between { max, .. } => max,
            LengthRule::AtLeast(_) => MAX_BODY_BYTES,
        }
    }
}

impl std::fmt::Display for LengthRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LengthRule::Exact(n) => write!(f, "exactly {n}"),
            LengthRule::Between { min, max } => write!(f, "{min}..={max}"),
            LengthRule::AtLeast(min) => write!(f, "{min}..={MAX_BODY_BYTES}"),
        }
    }
}

impl Kind {
    pub const ALL: [Kind; 28] = [
        Kind::Hello,
        Kind::Challenge,
        Kind::Auth,
        Kind::AuthOk,
        Kind::MapSlab,
        Kind::SlabMapped,
        Kind::UnmapSlab,
        Kind::Ok,
        Kind::NodeInfo,
        Kind::NodeInfoReply,
        Kind::Ping,
        Kind::Pong,
        Kind::Error,
        Kind::InjectFault,
        Kind::SlabEvicted,
        Kind::Regenerate,
        Kind::RegenerationDone,
        Kind::ExportSlab,
        Kind::SlabExported,
        Kind::AnswerActivity,
        Kind::SlabActivityQuery,
        Kind::SlabActivity,
        Kind::WriteSplit,
        Kind::WriteSplitOk,
        Kind::ReadSplit,
        Kind::ReadSplitReply,
        Kind::ReadSplits,
        Kind::ReadSplitsReply,
    ];

    /// The kind for a wire value, or `None` for a value this version does not define.
    pub fn from_u8(value: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| *kind as u8 == value)
    }

    /// True for the kinds whose body is a prefix followed by split payload; they are not
    /// [`Control`](crate::Control) messages.
    pub fn carries_payload(self) -> bool {
        matches!(self, Kind::WriteSplit | Kind::ReadSplitReply | Kind::ReadSplitsReply)
    }

    /// The body lengths this kind admits (`docs/PROTOCOL.md`, "Kinds").
    pub fn length_rule(self) -> LengthRule {
        match self {
            Kind::Hello => LengthRule::Exact(8 + 32 + 8),
            Kind::Challenge => LengthRule::Exact(32 + 32),
            Kind::Auth => LengthRule::Exact(32),
            Kind::AuthOk => LengthRule::Exact(8),
            Kind::MapSlab => LengthRule::Exact(4 + 1 + 3 + 8 + 8),
            Kind::SlabMapped => LengthRule::Exact(4 + 4),
            Kind::UnmapSlab => LengthRule::Exact(4),
            Kind::Ok | Kind::NodeInfo | Kind::Ping | Kind::Pong | Kind::WriteSplitOk => LengthRule::Exact(0),
            Kind::NodeInfoReply => LengthRule::Between {
                min: NODE_INFO_FIXED_BYTES,
                max: NODE_INFO_FIXED_BYTES + MAX_FAILURE_DOMAIN_BYTES as u32,
            },
            Kind::Error => LengthRule::Between {
                min: ERROR_FIXED_BYTES,
                max: ERROR_FIXED_BYTES + MAX_ERROR_MESSAGE_BYTES as u32,
            },
            Kind::InjectFault => LengthRule::Exact(1 + 3 + 4 + 4 + 4 + 4 + 8),
            Kind::SlabEvicted => LengthRule::Exact(4),
            Kind::Regenerate => LengthRule::Between {
                min: REGENERATE_FIXED_BYTES + REGENERATION_SOURCE_BYTES as u32,
                max: REGENERATE_FIXED_BYTES + (MAX_REGENERATION_SOURCES * REGENERATION_SOURCE_BYTES) as u32,
            },
            Kind::RegenerationDone => LengthRule::Exact(4 + 4 + 8 + 8 + 8),
            Kind::ExportSlab => LengthRule::Exact(4),
            Kind::SlabExported => LengthRule::Exact(4 * 4 + 6 * 8),
            Kind::AnswerActivity => LengthRule::Exact(0),
            Kind::SlabActivityQuery => LengthRule::Exact(4),
            Kind::SlabActivity => LengthRule::Exact(4 + 4 + 8),
            Kind::WriteSplit => LengthRule::AtLeast(WRITE_SPLIT_PREFIX_BYTES as u32),
            Kind::ReadSplit => LengthRule::Exact(4 + 4),
            Kind::ReadSplitReply => LengthRule::AtLeast(SPLIT_META_BYTES as u32),
            Kind::ReadSplits => LengthRule::Exact(4 + 4 + 4),
            Kind::ReadSplitsReply => LengthRule::AtLeast(READ_SPLITS_COUNT_BYTES as u32),
        }
    }

    /// Checks `body_len` against [`MAX_BODY_BYTES`] and this kind's [`LengthRule`].
    pub fn check_body_len(self, body_len: u32) -> Result<(), DecodeError> {
        if body_len > MAX_BODY_BYTES {
            return Err(DecodeError::BodyTooLong { kind: self, body_len, max: MAX_BODY_BYTES });
        }
        let rule = self.length_rule();
        if !rule.admits(body_len) {
            return Err(DecodeError::BadLength { kind: self, expected: rule, actual: body_len });
        }
        Ok(())
    }
}

/// The 16-byte header in front of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: Kind,
    pub body_len: u32,
    pub request_id: u64,
}

impl FrameHeader {
    /// Encodes the header.
    ///
    /// Panics if `body_len` is not admitted by the kind: a sender must never produce such a frame.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        assert!(
            self.kind.check_body_len(self.body_len).is_ok(),
            "encoding a {:?} frame with an inadmissible body_len {}",
            self.kind,
            self.body_len
        );
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[2] = PROTOCOL_VERSION;
        bytes[3] = self.kind as u8;
        bytes[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        bytes
    }

    /// Decodes and validates a header: magic, version, kind, and `body_len` against both
    /// [`MAX_BODY_BYTES`] and the kind's [`LengthRule`], in that order.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<FrameHeader, DecodeError> {
        let magic = u16::from_le_bytes([bytes[0], bytes[1]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        if bytes[2] != PROTOCOL_VERSION {
            return Err(DecodeError::BadVersion { found: bytes[2] });
        }
        let kind = Kind::from_u8(bytes[3]).ok_or(DecodeError::UnknownKind { found: bytes[3] })?;
        let body_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        kind.check_body_len(body_len)?;
        Ok(FrameHeader { kind, body_len, request_id: FrameHeader::raw_request_id(bytes) })
    }

    /// The request id bytes of a header, decodable or not, so that an `Error` reply to a
    /// malformed frame can still echo what the peer sent.
    pub fn raw_request_id(bytes: &[u8; HEADER_BYTES]) -> u64 {
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[8..16]);
        u64::from_le_bytes(id)
    }
}
