//! Validation of one transmission request: what it asks, or which NBD error it earns.
//!
//! Pure functions, so every rule is unit-tested. The rules follow the spec's SHOULDs: unknown
//! commands and flags are `EINVAL`; reads and trims past the end are `EINVAL`, writes and
//! write-zeroes past the end `ENOSPC`; a read longer than the maximum block size is `EINVAL`.

use crate::protocol::*;

/// A valid request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read { offset: u64, length: u32 },
    Write { offset: u64, length: u32 },
    WriteZeroes { offset: u64, length: u32, fast: bool },
    Trim { offset: u64, length: u32 },
    Flush,
    Disconnect,
}

impl Command {
    /// Commands that run in a batch of their own, after everything before them has replied:
    /// their page discards cannot overlap a batch's in-flight operations, and a disconnect
    /// must find every earlier request answered.
    pub fn is_barrier(&self) -> bool {
        matches!(
            self,
            Command::WriteZeroes { .. } | Command::Trim { .. } | Command::Flush | Command::Disconnect
        )
    }
}

/// Checks one request header against the export.
pub fn validate(
    header: &RequestHeader,
    export_size_bytes: u64,
    page_bytes: u32,
    max_request_bytes: u32,
    structured_replies: bool,
) -> Result<Command, ErrorCode> {
    let allowed_flags = match header.command {
        CMD_READ if structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        _ => CMD_FLAG_FUA,
    };
    if header.flags & !allowed_flags != 0 {
        return Err(ErrorCode::Invalid);
    }
    let (offset, length) = (header.offset, header.length);
    let in_bounds = offset.checked_add(length as u64).is_some_and(|end| end <= export_size_bytes);
    match header.command {
        CMD_READ => {
            if length > max_request_bytes || !in_bounds {
                return Err(ErrorCode::Invalid);
            }
            Ok(Command::Read { offset, length })
        }
        CMD_WRITE => {
            if length > max_request_bytes {
                return Err(ErrorCode::Invalid);
            }
            if !in_bounds {
                return Err(ErrorCode::NoSpace);
            }
            Ok(Command::Write { offset, length })
        }
        CMD_WRITE_ZEROES => {
            if !in_bounds {
                return Err(ErrorCode::NoSpace);
            }
            let fast = header.flags & CMD_FLAG_FAST_ZERO != 0;
            // Whole pages are zeroed by forgetting them (no I/O); partial pages need a
            // read-modify-write, which is not faster than a write.
            let page = page_bytes as u64;
            if fast && !(offset.is_multiple_of(page) && (length as u64).is_multiple_of(page)) {
                return Err(ErrorCode::NotSupported);
            }
            Ok(Command::WriteZeroes { offset, length, fast })
        }
        CMD_TRIM => {
            if !in_bounds {
                return Err(ErrorCode::Invalid);
            }
            Ok(Command::Trim { offset, length })
        }
        CMD_FLUSH => {
            if offset != 0 || length != 0 {
                return Err(ErrorCode::Invalid);
            }
            Ok(Command::Flush)
        }
        CMD_DISC => Ok(Command::Disconnect),
        _ => Err(ErrorCode::Invalid),
    }
}

/// Pages `[first, last]` that the byte range touches; `None` for an empty range.
pub fn page_span(offset: u64, length: u32, page_bytes: u32) -> Option<(u64, u64)> {
    if length == 0 {
        return None;
    }
    let page = page_bytes as u64;
    Some((offset / page, (offset + length as u64 - 1) / page))
}

/// The part of page `page` that the byte range covers, as (start within the page, length).
pub fn page_cover(offset: u64, length: u32, page_bytes: u32, page: u64) -> (usize, usize) {
    let page_size = page_bytes as u64;
    let page_start = page * page_size;
    let start = offset.max(page_start);
    let end = (offset + length as u64).min(page_start + page_size);
    assert!(start < end, "page {page} is outside the range");
    ((start - page_start) as usize, (end - start) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SIZE: u64 = 1 << 20;
    const MAX: u32 = 1 << 25;

    fn request(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader { flags, command, handle: 1, offset, length }
    }

    fn check(header: RequestHeader) -> Result<Command, ErrorCode> {
        validate(&header, SIZE, 4096, MAX, false)
    }

    #[test]
    fn bounds_give_the_spec_errors() {
        assert_eq!(check(request(CMD_READ, 0, SIZE - 1, 2)), Err(ErrorCode::Invalid));
        assert_eq!(check(request(CMD_WRITE, 0, SIZE - 1, 2)), Err(ErrorCode::NoSpace));
        assert_eq!(check(request(CMD_WRITE_ZEROES, 0, SIZE, 1)), Err(ErrorCode::NoSpace));
        assert_eq!(check(request(CMD_TRIM, 0, u64::MAX, 2)), Err(ErrorCode::Invalid));
        assert_eq!(check(request(CMD_READ, 0, u64::MAX, u32::MAX)), Err(ErrorCode::Invalid));
        assert_eq!(
            check(request(CMD_READ, 0, SIZE - 1, 1)),
            Ok(Command::Read { offset: SIZE - 1, length: 1 })
        );
        assert_eq!(check(request(CMD_READ, 0, SIZE, 0)), Ok(Command::Read { offset: SIZE, length: 0 }));
    }

    #[test]
    fn flags_not_documented_for_a_command_are_invalid() {
        assert_eq!(check(request(CMD_READ, CMD_FLAG_DF, 0, 1)), Err(ErrorCode::Invalid));
        assert!(validate(&request(CMD_READ, CMD_FLAG_DF, 0, 1), SIZE, 4096, MAX, true).is_ok());
        assert_eq!(check(request(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 1)), Err(ErrorCode::Invalid));
        assert!(check(request(CMD_WRITE, CMD_FLAG_FUA, 0, 1)).is_ok());
        assert_eq!(check(request(CMD_FLUSH, 1 << 9, 0, 0)), Err(ErrorCode::Invalid));
        assert_eq!(check(request(77, 0, 0, 0)), Err(ErrorCode::Invalid));
    }

    #[test]
    fn fast_zero_only_for_whole_pages() {
        assert_eq!(
            check(request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 512, 4096)),
            Err(ErrorCode::NotSupported)
        );
        assert!(check(request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 8192, 4096)).is_ok());
    }

    #[test]
    fn spans_and_covers() {
        assert_eq!(page_span(4095, 2, 4096), Some((0, 1)));
        assert_eq!(page_span(0, 0, 4096), None);
        assert_eq!(page_cover(4095, 2, 4096, 0), (4095, 1));
        assert_eq!(page_cover(4095, 2, 4096, 1), (0, 1));
        assert_eq!(page_cover(0, 8192, 4096, 1), (0, 4096));
    }

    proptest! {
        #[test]
        fn validate_is_total(flags: u16, command in 0u16..10, offset: u64, length: u32, structured: bool) {
            let header = RequestHeader { flags, command, handle: 0, offset, length };
            if let Ok(Command::Read { offset, length } | Command::Write { offset, length }) =
                validate(&header, SIZE, 4096, MAX, structured)
            {
                prop_assert!(offset + length as u64 <= SIZE && length <= MAX);
            }
        }
    }
}
