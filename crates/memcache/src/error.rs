//! The error lines of the memcached protocol, one variant per distinct text memcached 1.6 sends.
//!
//! Invariant: `Display` and [`ProtocolError::response`] give exactly the bytes memcached writes
//! (without the trailing "\r\n"), so a client that matches on error text sees what it would see
//! from memcached. The texts come from memcached's `proto_text.c` and `proto_parser.c`, including
//! their oddities (the two spaces in the `delete` usage line, "options flags are too long").

use thiserror::Error;

/// One error reply of the memcached protocol.
///
/// Most variants are produced by [`crate::parse`]; the ones marked "server" are never produced
/// by the parser and exist so that the server answers with memcached's exact text.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq, Hash)]
pub enum ProtocolError {
    /// Unknown command, or a known command with the wrong number of arguments.
    #[error("ERROR")]
    UnknownCommand,
    /// A malformed argument: a key too long or with control characters, a number that does not
    /// parse or is out of range, a missing key or length.
    #[error("CLIENT_ERROR bad command line format")]
    BadCommandLineFormat,
    /// `delete` with arguments other than the legacy `0` and `noreply`.
    #[error("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]")]
    DeleteUsage,
    /// The data block of a storage command is not followed by "\r\n".
    #[error("CLIENT_ERROR bad data chunk")]
    BadDataChunk,
    /// A data block longer than [`crate::Limits::max_item_bytes`].
    #[error("SERVER_ERROR object too large for cache")]
    ObjectTooLarge,
    /// A command line longer than [`crate::Limits::max_line_bytes`]. memcached 1.6 closes the
    /// connection without a reply in this case; remem sends this line first, then closes.
    #[error("CLIENT_ERROR line too long")]
    LineTooLong,
    /// `touch`, `gat`, `gats` or `flush_all` with an exptime that is not a 32-bit integer.
    #[error("CLIENT_ERROR invalid exptime argument")]
    InvalidExptime,
    /// `incr`/`decr` with a delta that is not an unsigned 64-bit integer.
    #[error("CLIENT_ERROR invalid numeric delta argument")]
    InvalidDeltaArgument,
    /// Meta: the same flag letter twice (or a flag byte >= 127, which memcached reports the same way).
    #[error("CLIENT_ERROR duplicate flag")]
    DuplicateFlag,
    /// Meta: an unknown flag letter.
    #[error("CLIENT_ERROR invalid flag")]
    InvalidFlag,
    /// Meta `md` and `ma`: any flag error (memcached reports them all with this one text).
    #[error("CLIENT_ERROR invalid or duplicate flag")]
    InvalidOrDuplicateFlag,
    /// Meta: a numeric flag token (N, T, R, C, E) that does not parse.
    #[error("CLIENT_ERROR bad token in command line format")]
    BadToken,
    /// Meta: the `b` flag was given and the key is not valid base64.
    #[error("CLIENT_ERROR error decoding key")]
    KeyDecoding,
    /// Meta: an `M` token that is not exactly one mode character.
    #[error("CLIENT_ERROR incorrect length for M token")]
    ModeTokenLength,
    /// Meta `ms`: a mode other than E, A, P, R, S.
    #[error("CLIENT_ERROR invalid mode for ms M token")]
    InvalidSetMode,
    /// Meta `ma`: a mode other than I, +, D, -.
    #[error("CLIENT_ERROR invalid mode for ma M token")]
    InvalidArithmeticMode,
    /// Meta `ma`: a `J` token that is not an unsigned 64-bit integer.
    #[error("CLIENT_ERROR invalid numeric initial value")]
    InvalidInitialValue,
    /// Meta `ma`: a `D` token that is not an unsigned 64-bit integer.
    #[error("CLIENT_ERROR invalid numeric delta value")]
    InvalidDeltaValue,
    /// Meta: an `O` token longer than 32 bytes (the `O` included).
    #[error("CLIENT_ERROR opaque token too long")]
    OpaqueTooLong,
    /// Meta: more than [`crate::MAX_META_FLAGS`] flag tokens.
    #[error("CLIENT_ERROR options flags are too long")]
    TooManyFlags,
    /// Server: `incr`, `decr` or `ma` on a value that is not a decimal u64.
    #[error("CLIENT_ERROR cannot increment or decrement non-numeric value")]
    NonNumericValue,
    /// Server: no memory to store an item that is within the size limit.
    #[error("SERVER_ERROR out of memory storing object")]
    OutOfMemoryStoring,
    /// Server: no memory for an `incr`/`decr`/`ma` result.
    #[error("SERVER_ERROR out of memory")]
    OutOfMemory,
}

impl ProtocolError {
    /// The exact reply text memcached sends for this error, without the trailing "\r\n".
    pub fn response(&self) -> &'static str {
        match self {
            Self::UnknownCommand => "ERROR",
            Self::BadCommandLineFormat => "CLIENT_ERROR bad command line format",
            Self::DeleteUsage => "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
            Self::BadDataChunk => "CLIENT_ERROR bad data chunk",
            Self::ObjectTooLarge => "SERVER_ERROR object too large for cache",
            Self::LineTooLong => "CLIENT_ERROR line too long",
            Self::InvalidExptime => "CLIENT_ERROR invalid exptime argument",
            Self::InvalidDeltaArgument => "CLIENT_ERROR invalid numeric delta argument",
            Self::DuplicateFlag => "CLIENT_ERROR duplicate flag",
            Self::InvalidFlag => "CLIENT_ERROR invalid flag",
            Self::InvalidOrDuplicateFlag => "CLIENT_ERROR invalid or duplicate flag",
            Self::BadToken => "CLIENT_ERROR bad token in command line format",
            Self::KeyDecoding => "CLIENT_ERROR error decoding key",
            Self::ModeTokenLength => "CLIENT_ERROR incorrect length for M token",
            Self::InvalidSetMode => "CLIENT_ERROR invalid mode for ms M token",
            Self::InvalidArithmeticMode => "CLIENT_ERROR invalid mode for ma M token",
            Self::InvalidInitialValue => "CLIENT_ERROR invalid numeric initial value",
            Self::InvalidDeltaValue => "CLIENT_ERROR invalid numeric delta value",
            Self::OpaqueTooLong => "CLIENT_ERROR opaque token too long",
            Self::TooManyFlags => "CLIENT_ERROR options flags are too long",
            Self::NonNumericValue => "CLIENT_ERROR cannot increment or decrement non-numeric value",
            Self::OutOfMemoryStoring => "SERVER_ERROR out of memory storing object",
            Self::OutOfMemory => "SERVER_ERROR out of memory",
        }
    }

    /// Appends the reply line (text and "\r\n") to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.response().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}
