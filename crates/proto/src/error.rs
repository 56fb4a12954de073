//! Decode errors and the error codes carried by `Error` frames.

use crate::frame::{Kind, LengthRule};
use crate::sizes::{MAGIC, PROTOCOL_VERSION, READ_SPLITS_MAX_COUNT};

/// Why received bytes are not a valid frame or message. Every variant names what was found so a
/// log line is enough to tell a peer's bug from line noise.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("bad magic {found:#06x}, expected {expected:#06x}", expected = MAGIC)]
    BadMagic { found: u16 },
    #[error("unsupported protocol version {found}, expected {expected}", expected = PROTOCOL_VERSION)]
    BadVersion { found: u8 },
    #[error("unknown message kind {found}")]
    UnknownKind { found: u8 },
    #[error("{kind:?} body of {body_len} bytes exceeds the limit of {max} bytes")]
    BodyTooLong { kind: Kind, body_len: u32, max: u32 },
    #[error("{kind:?} body must be {expected} bytes, got {actual}")]
    BadLength { kind: Kind, expected: LengthRule, actual: u32 },
    #[error("{kind:?} has non-zero reserved bytes")]
    ReservedNotZero { kind: Kind },
    #[error("{kind:?} declares {field} = {declared} but {available} bytes follow")]
    InnerLength { kind: Kind, field: &'static str, declared: u32, available: u32 },
    #[error("{kind:?} carries text that is not UTF-8")]
    BadUtf8 { kind: Kind },
    #[error("unknown error code {found}")]
    UnknownErrorCode { found: u16 },
    #[error("{kind:?} count {count} is outside 1..={max}", max = READ_SPLITS_MAX_COUNT)]
    CountOutOfRange { kind: Kind, count: u32 },
    #[error("WriteSplit with version 0 (0 means never written)")]
    ZeroVersion,
    #[error("{kind:?} carries a split payload and is not a control message")]
    NotControl { kind: Kind },
    #[error("unknown fault {found}")]
    UnknownFault { found: u8 },
    #[error("{kind:?} {field} = {value} is outside {min}..={max}")]
    FieldOutOfRange { kind: Kind, field: &'static str, value: u64, min: u64, max: u64 },
    #[error("{kind:?} describes a shared-memory layout other than the one its sizes give")]
    BadLayout { kind: Kind },
}

/// Error codes of the `Error` frame (`docs/PROTOCOL.md`, "Error codes").
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Malformed = 1,
    NotAuthenticated = 2,
    AuthFailed = 3,
    UnknownSlab = 4,
    NotOwner = 5,
    SlotOutOfRange = 6,
    NoCapacity = 7,
    BadSplitSize = 8,
    Unsupported = 9,
    Internal = 10,
    /// The client id is held by another session whose lease is live (`Hello::session`): the
    /// newcomer is fenced off and must stop, never write.
    ClientIdInUse = 11,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::Malformed,
        ErrorCode::NotAuthenticated,
        ErrorCode::AuthFailed,
        ErrorCode::UnknownSlab,
        ErrorCode::NotOwner,
        ErrorCode::SlotOutOfRange,
        ErrorCode::NoCapacity,
        ErrorCode::BadSplitSize,
        ErrorCode::Unsupported,
        ErrorCode::Internal,
        ErrorCode::ClientIdInUse,
    ];

    /// The code for a wire value, or `None` for a value this version does not define.
    pub fn from_u16(value: u16) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|code| *code as u16 == value)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
