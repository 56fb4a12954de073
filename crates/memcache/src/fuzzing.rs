//! The body of the `memcache_requests` fuzz target (`fuzz/`), kept here so that a
//! stable-toolchain test runs the same code on thousands of generated inputs
//! (`tests/integration/fuzzing.rs`).
//!
//! The first input byte picks the limits (memcached's defaults, or small ones that inputs reach
//! easily); the rest is what a client sent, parsed request after request as the server does
//! (an error's `consumed` and `swallow` bytes dropped).
//!
//! Oracle: [`crate::parse`] never panics; a request consumes between 1 byte and the input's
//! length, its keys and data are within the limits, every slice it borrows lies inside the bytes
//! it consumed, and any shorter prefix of those bytes is [`Parse::Incomplete`] (a request split
//! at any byte boundary waits for the rest); an error consumes between 1 byte and the input's
//! length, and the key it asks to unlink is a valid key borrowed from the bytes it consumed.

use crate::{parse as parse_one, Key, Limits, Parse, Request};

/// Small limits, so that generated inputs cross them.
const SMALL: Limits =
    Limits { max_key_bytes: 16, max_item_bytes: 64, max_line_bytes: 128, max_get_line_bytes: 512 };

/// Parses `data` (see the module's description); returns how many requests it held. Panics
/// only when a parse breaks the oracle.
pub fn parse(data: &[u8]) -> usize {
    let Some((&choice, mut input)) = data.split_first() else { return 0 };
    let limits = if choice & 1 == 0 { Limits::default() } else { SMALL };
    let mut requests = 0;
    loop {
        match parse_one(input, &limits) {
            Parse::Incomplete => return requests,
            Parse::Request { request, consumed } => {
                assert!(consumed > 0 && consumed <= input.len(), "consumed {consumed} of {}", input.len());
                check_request(&request, &input[..consumed], &limits);
                // Shorter prefixes wait for the rest (the last byte, and half of the request).
                for prefix in [consumed - 1, consumed / 2] {
                    let verdict = parse_one(&input[..prefix], &limits);
                    assert!(
                        verdict == Parse::Incomplete,
                        "a prefix of {prefix} bytes of {request:?}: {verdict:?}"
                    );
                }
                requests += 1;
                input = &input[consumed..];
            }
            Parse::Invalid { consumed, swallow, unlink, .. } => {
                assert!(consumed > 0 && consumed <= input.len(), "consumed {consumed} of {}", input.len());
                if let Some(key) = &unlink {
                    assert!(
                        !key.is_empty() && key.len() <= limits.max_key_bytes,
                        "unlink of {} bytes",
                        key.len()
                    );
                    if let Key::Borrowed(key) = key {
                        assert!(within(key, &input[..consumed]), "an unlinked key outside the request");
                    }
                }
                input = &input[consumed..];
                input = &input[swallow.min(input.len())..];
            }
        }
    }
}

/// Whether `slice` lies inside `bytes` (it borrows from them).
fn within(slice: &[u8], bytes: &[u8]) -> bool {
    let range = bytes.as_ptr_range();
    let slice_range = slice.as_ptr_range();
    slice.is_empty() || (range.start <= slice_range.start && slice_range.end <= range.end)
}

/// The oracle of one request parsed from `bytes`.
fn check_request(request: &Request<'_>, bytes: &[u8], limits: &Limits) {
    let mut keys: Vec<&Key<'_>> = Vec::new();
    let mut data: Option<&[u8]> = None;
    match request {
        Request::Get { keys: all, .. } => {
            assert!(!all.is_empty(), "a get without keys");
            keys.extend(all);
        }
        Request::Store { key, data: block, .. } | Request::MetaSet { key, data: block, .. } => {
            keys.push(key);
            data = Some(block);
        }
        Request::Arithmetic { key, .. }
        | Request::Delete { key, .. }
        | Request::Touch { key, .. }
        | Request::MetaGet { key, .. }
        | Request::MetaDelete { key, .. }
        | Request::MetaArithmetic { key, .. }
        | Request::MetaDebug { key, .. } => keys.push(key),
        Request::Transition { key, scheme, .. } => {
            keys.push(key);
            assert!(within(scheme, bytes), "a scheme outside the request");
        }
        Request::Stats { group: Some(group) } => {
            assert!(within(group, bytes), "a stats group outside the request")
        }
        _ => {}
    }
    for key in keys {
        assert!(!key.is_empty() && key.len() <= limits.max_key_bytes, "a key of {} bytes", key.len());
        if let Key::Borrowed(key) = key {
            assert!(within(key, bytes), "a key outside the request");
        }
    }
    if let Some(data) = data {
        assert!(data.len() <= limits.max_item_bytes, "a data block of {} bytes", data.len());
        assert!(within(data, bytes), "a data block outside the request");
    }
}
