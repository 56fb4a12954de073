//! The body of the `nbd_requests` fuzz target (`fuzz/`), kept here so that a stable-toolchain
//! test runs the same code on thousands of generated inputs (`tests/fuzzing.rs`).
//!
//! The input is a little export (its size and whether structured replies were negotiated, from
//! the first 9 bytes), then either a stream of transmission requests, cut as the server cuts
//! them (`Transmission::collect_batch`: a 28-byte header, a write's payload), or a stream of
//! handshake options (`read_option`: a 16-byte header, its data, `NBD_OPT_INFO`/`GO` data).
//!
//! Oracle: no panic on any input, and every request that validates stays inside the export:
//! offset + length within its size (no overflow), a read or write no longer than the maximum
//! request, its pages within the export's pages; an option's data within the option limit and
//! an export name within the string limit and its data.

use crate::command::{page_cover, page_span, validate, Command};
use crate::handshake::MAX_OPTION_BYTES;
use crate::protocol::*;

/// The page size and largest request the fuzzed export has (small, so inputs reach them).
const PAGE_BYTES: u32 = 4096;
const MAX_REQUEST_BYTES: u32 = 1 << 16;

/// Parses `data` (see the module's description); returns how many requests or options were
/// accepted. Panics only when an accepted one breaks the oracle.
pub fn parse(data: &[u8]) -> usize {
    let Some((setup, stream)) = data.split_first_chunk::<9>() else { return 0 };
    // Up to 1 TiB, so that requests at the end of the export are within reach of a u32 length.
    let export_size_bytes = u64::from_be_bytes(setup[..8].try_into().expect("8 bytes")) % (1 << 40);
    let structured_replies = setup[8] & 1 != 0;
    if setup[8] & 2 != 0 {
        options(stream)
    } else {
        requests(stream, export_size_bytes, structured_replies)
    }
}

/// Transmission requests until the first one the server would disconnect on, or the end.
fn requests(mut stream: &[u8], export_size_bytes: u64, structured_replies: bool) -> usize {
    let mut accepted = 0;
    while let Some((header_bytes, rest)) = stream.split_first_chunk::<REQUEST_HEADER_BYTES>() {
        let Ok(header) = decode_request(header_bytes) else { return accepted };
        let mut encoded = Vec::new();
        encode_request(&header, &mut encoded);
        assert_eq!(encoded, header_bytes, "a request header re-encodes differently");
        let payload_bytes = match header.command {
            CMD_WRITE if header.length > MAX_REQUEST_BYTES => return accepted,
            CMD_WRITE => header.length as usize,
            _ => 0,
        };
        let Some(rest) = rest.get(payload_bytes..) else { return accepted };
        let command = validate(&header, export_size_bytes, PAGE_BYTES, MAX_REQUEST_BYTES, structured_replies);
        if let Ok(command) = command {
            check_command(command, export_size_bytes);
            accepted += 1;
        }
        stream = rest;
    }
    accepted
}

/// The oracle of one validated request.
fn check_command(command: Command, export_size_bytes: u64) {
    let (offset, length) = match command {
        Command::Read { offset, length } | Command::Write { offset, length } => {
            assert!(length <= MAX_REQUEST_BYTES, "{command:?} is longer than the maximum request");
            (offset, length)
        }
        Command::WriteZeroes { offset, length, fast } => {
            if fast {
                let page = u64::from(PAGE_BYTES);
                assert!(
                    offset % page == 0 && u64::from(length) % page == 0,
                    "{command:?} is not whole pages"
                );
            }
            (offset, length)
        }
        Command::Trim { offset, length } => (offset, length),
        Command::Flush | Command::Disconnect => return,
    };
    let end = offset.checked_add(u64::from(length));
    assert!(end.is_some_and(|end| end <= export_size_bytes), "{command:?} ends past {export_size_bytes}");
    if let Some((first, last)) = page_span(offset, length, PAGE_BYTES) {
        assert!(first <= last && last < export_size_bytes.div_ceil(u64::from(PAGE_BYTES)), "{command:?}");
        // The edge pages are covered by at least one byte and at most a page.
        for page in [first, last] {
            let (start, covered) = page_cover(offset, length, PAGE_BYTES, page);
            assert!(covered > 0 && start + covered <= PAGE_BYTES as usize, "{command:?} page {page}");
        }
    }
}

/// Handshake options until the first one the server would disconnect on, or the end.
fn options(mut stream: &[u8]) -> usize {
    let mut accepted = 0;
    while let Some((header_bytes, rest)) = stream.split_first_chunk::<OPTION_HEADER_BYTES>() {
        let Ok(header) = decode_option_header(header_bytes) else { return accepted };
        if header.length > MAX_OPTION_BYTES {
            return accepted;
        }
        let Some((data, rest)) = rest.split_at_checked(header.length as usize) else { return accepted };
        if let Ok(request) = decode_info_request(data) {
            assert!(request.name.len() <= MAX_STRING_BYTES, "an export name of {} bytes", request.name.len());
            assert!(4 + request.name.len() + 2 <= data.len(), "the name runs past the option's data");
            accepted += 1;
        }
        stream = rest;
    }
    accepted
}
