//! The NBD wire format (NetworkBlockDevice/nbd, doc/proto.md): constants, decoders of what a
//! client sends, encoders of what the server sends. No I/O.
//!
//! Invariants: every decoder is total (any byte string gives a value or a structured error, never
//! a panic), and no decoder allocates from a length it read; callers bound lengths before they
//! read the bytes a length announces. All integers are big-endian on the wire.

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic, also the prefix of every option the client sends.
pub const OPTION_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server, 16 bits).
pub const HANDSHAKE_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const HANDSHAKE_NO_ZEROES: u16 = 1 << 1;
/// Client flags (32 bits): anything else makes the server drop the connection.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags (16 bits).
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
const REP_ERROR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR_BIT + 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR_BIT + 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR_BIT + 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR_BIT + 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR_BIT + 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERROR_BIT + 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR_BIT + 9;

/// Information types of `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured replies.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

pub const OPTION_HEADER_BYTES: usize = 16;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const STRUCTURED_HEADER_BYTES: usize = 20;
/// Strings (export names, messages) are at most this long (the spec's MUST).
pub const MAX_STRING_BYTES: usize = 4096;

/// The error values a reply may carry (the spec's list; the numbers are Linux errno values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    NotPermitted = 1,
    Io = 5,
    NoMemory = 12,
    Invalid = 22,
    NoSpace = 28,
    Overflow = 75,
    NotSupported = 95,
    Shutdown = 108,
}

impl ErrorCode {
    pub fn value(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NotPermitted => "EPERM",
            ErrorCode::Io => "EIO",
            ErrorCode::NoMemory => "ENOMEM",
            ErrorCode::Invalid => "EINVAL",
            ErrorCode::NoSpace => "ENOSPC",
            ErrorCode::Overflow => "EOVERFLOW",
            ErrorCode::NotSupported => "ENOTSUP",
            ErrorCode::Shutdown => "ESHUTDOWN",
        }
    }
}

/// The fixed part of an option the client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("bad option magic {magic:#x}")]
    BadOptionMagic { magic: u64 },
    #[error("bad request magic {magic:#x}")]
    BadRequestMagic { magic: u32 },
}

pub fn decode_option_header(bytes: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, DecodeError> {
    let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 bytes"));
    if magic != OPTION_MAGIC {
        return Err(DecodeError::BadOptionMagic { magic });
    }
    Ok(OptionHeader {
        option: u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")),
        length: u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes")),
    })
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`: an export name and the information asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub name: &'a [u8],
    pub wants_name: bool,
    pub wants_description: bool,
    pub wants_block_size: bool,
}

/// Why the data of an option is not valid (answered with `NBD_REP_ERR_INVALID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionDataError {
    #[error("option data of {length} bytes is too short")]
    TooShort { length: usize },
    #[error("export name of {name_bytes} bytes does not fit in {length} bytes of option data")]
    NameOverrun { name_bytes: u64, length: usize },
    #[error("export name of {name_bytes} bytes is longer than {MAX_STRING_BYTES}")]
    NameTooLong { name_bytes: usize },
    #[error("{count} information requests need {needed} bytes, {given} given")]
    InfoCountMismatch { count: u16, needed: usize, given: usize },
}

/// Decodes the data of `NBD_OPT_INFO` / `NBD_OPT_GO`: u32 name length, name, u16 count,
/// count x u16 information types. Unknown information types are ignored (the spec's MUST).
pub fn decode_info_request(data: &[u8]) -> Result<InfoRequest<'_>, OptionDataError> {
    if data.len() < 6 {
        return Err(OptionDataError::TooShort { length: data.len() });
    }
    let name_bytes = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as u64;
    if name_bytes > (data.len() - 6) as u64 {
        return Err(OptionDataError::NameOverrun { name_bytes, length: data.len() });
    }
    let name_end = 4 + name_bytes as usize;
    if name_bytes as usize > MAX_STRING_BYTES {
        return Err(OptionDataError::NameTooLong { name_bytes: name_bytes as usize });
    }
    let name = &data[4..name_end];
    let count = u16::from_be_bytes(data[name_end..name_end + 2].try_into().expect("2 bytes"));
    let list = &data[name_end + 2..];
    if list.len() != 2 * count as usize {
        return Err(OptionDataError::InfoCountMismatch {
            count,
            needed: 2 * count as usize,
            given: list.len(),
        });
    }
    let mut request =
        InfoRequest { name, wants_name: false, wants_description: false, wants_block_size: false };
    for pair in list.chunks_exact(2) {
        match u16::from_be_bytes([pair[0], pair[1]]) {
            INFO_NAME => request.wants_name = true,
            INFO_DESCRIPTION => request.wants_description = true,
            INFO_BLOCK_SIZE => request.wants_block_size = true,
            _ => {}
        }
    }
    Ok(request)
}

/// A transmission-phase request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn decode_request(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, DecodeError> {
    let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(DecodeError::BadRequestMagic { magic });
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes(bytes[4..6].try_into().expect("2 bytes")),
        command: u16::from_be_bytes(bytes[6..8].try_into().expect("2 bytes")),
        handle: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")),
        length: u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")),
    })
}

/// Encodes a request (used by tests and tools acting as a client).
pub fn encode_request(header: &RequestHeader, out: &mut Vec<u8>) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&header.flags.to_be_bytes());
    out.extend_from_slice(&header.command.to_be_bytes());
    out.extend_from_slice(&header.handle.to_be_bytes());
    out.extend_from_slice(&header.offset.to_be_bytes());
    out.extend_from_slice(&header.length.to_be_bytes());
}

/// Appends an option reply: magic, option, reply type, length, payload.
pub fn encode_option_reply(option: u32, reply_type: u32, payload: &[u8], out: &mut Vec<u8>) {
    assert!(payload.len() <= u32::MAX as usize);
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends a simple reply header; a successful read's data follows it.
pub fn encode_simple_reply(error: u32, handle: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}

/// Appends a structured reply chunk header; `length` payload bytes must follow.
pub fn encode_chunk_header(flags: u16, reply_type: u16, handle: u64, length: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
}

/// Appends a final `NBD_REPLY_TYPE_ERROR` chunk with a human-readable message (cut to fit the
/// spec's string limit, at a character boundary).
pub fn encode_error_chunk(handle: u64, error: ErrorCode, message: &str, out: &mut Vec<u8>) {
    let mut end = message.len().min(MAX_STRING_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, 6 + message.len() as u32, out);
    out.extend_from_slice(&error.value().to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_round_trips() {
        let header = RequestHeader { flags: 1, command: CMD_WRITE, handle: 7, offset: 4096, length: 512 };
        let mut bytes = Vec::new();
        encode_request(&header, &mut bytes);
        assert_eq!(decode_request(bytes.as_slice().try_into().unwrap()), Ok(header));
    }

    #[test]
    fn info_request_with_known_and_unknown_types() {
        let mut data = Vec::new();
        data.extend_from_slice(&3u32.to_be_bytes());
        data.extend_from_slice(b"abc");
        data.extend_from_slice(&3u16.to_be_bytes());
        for info in [INFO_BLOCK_SIZE, 999, INFO_NAME] {
            data.extend_from_slice(&info.to_be_bytes());
        }
        let request = decode_info_request(&data).unwrap();
        assert_eq!(request.name, b"abc");
        assert!(request.wants_block_size && request.wants_name && !request.wants_description);
    }

    #[test]
    fn info_request_name_overrun_is_invalid() {
        let mut data = Vec::new();
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        data.extend_from_slice(&[0, 0]);
        assert!(matches!(decode_info_request(&data), Err(OptionDataError::NameOverrun { .. })));
    }

    #[test]
    fn error_chunk_message_is_cut_at_a_character_boundary() {
        let message = "é".repeat(MAX_STRING_BYTES);
        let mut out = Vec::new();
        encode_error_chunk(1, ErrorCode::Io, &message, &mut out);
        let length = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert_eq!(out.len(), STRUCTURED_HEADER_BYTES + length);
        assert!(length - 6 <= MAX_STRING_BYTES);
        assert!(std::str::from_utf8(&out[26..]).is_ok());
    }

    proptest! {
        #[test]
        fn decoders_are_total(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_info_request(&bytes);
            if bytes.len() >= REQUEST_HEADER_BYTES {
                let _ = decode_request(bytes[..REQUEST_HEADER_BYTES].try_into().unwrap());
            }
            if bytes.len() >= OPTION_HEADER_BYTES {
                let _ = decode_option_header(bytes[..OPTION_HEADER_BYTES].try_into().unwrap());
            }
        }
    }
}
