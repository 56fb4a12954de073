//! Shared test helpers: parse shortcuts and a reference renderer that turns a [`Request`] back
//! into the bytes a client would send (the inverse of `parse`, written independently of it).

#![allow(dead_code)]

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use remem_memcache::{parse, Limits, MetaFlags, Parse, ProtocolError, Request};

/// Parses with the default limits.
pub fn parse_default(input: &[u8]) -> Parse<'_> {
    parse(input, &Limits::default())
}

/// Parses a buffer that must hold exactly one whole request.
pub fn request(input: &[u8]) -> Request<'_> {
    match parse_default(input) {
        Parse::Request { request, consumed } => {
            assert_eq!(consumed, input.len(), "request {:?} left bytes", String::from_utf8_lossy(input));
            request
        }
        other => panic!("{:?} parsed as {other:?}", String::from_utf8_lossy(input)),
    }
}

/// What an invalid request reports.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid {
    pub error: ProtocolError,
    pub consumed: usize,
    pub swallow: usize,
    pub close: bool,
    pub noreply: bool,
}

/// Parses a buffer that must be rejected.
pub fn invalid(input: &[u8]) -> Invalid {
    invalid_with(input, &Limits::default())
}

/// Parses a buffer that must be rejected under `limits`.
pub fn invalid_with(input: &[u8], limits: &Limits) -> Invalid {
    match parse(input, limits) {
        Parse::Invalid { error, consumed, swallow, close, noreply, .. } => {
            Invalid { error, consumed, swallow, close, noreply }
        }
        other => panic!("{:?} parsed as {other:?}", String::from_utf8_lossy(input)),
    }
}

/// The key a rejected request asks the server to unlink (a too-large `set` or `ms`).
pub fn unlinked_with(input: &[u8], limits: &Limits) -> Option<Vec<u8>> {
    match parse(input, limits) {
        Parse::Invalid { unlink, .. } => unlink.map(|key| key.into_owned()),
        other => panic!("{:?} parsed as {other:?}", String::from_utf8_lossy(input)),
    }
}

/// The error of a one-line request that must be rejected, after checking that it consumed its
/// whole line, swallows nothing and keeps the connection.
pub fn line_error(input: &[u8]) -> ProtocolError {
    let invalid = invalid(input);
    assert_eq!((invalid.consumed, invalid.swallow, invalid.close), (input.len(), 0, false), "{invalid:?}");
    invalid.error
}

/// Asserts that every strict prefix of `input` is `Incomplete`.
pub fn assert_prefixes_incomplete(input: &[u8]) {
    assert_prefixes_incomplete_with(input, &Limits::default());
}

/// Asserts that every strict prefix of `input` is `Incomplete` under `limits`.
pub fn assert_prefixes_incomplete_with(input: &[u8], limits: &Limits) {
    for end in 0..input.len() {
        assert_eq!(parse(&input[..end], limits), Parse::Incomplete, "prefix of {end} bytes");
    }
}

/// Parses, under `limits`, a buffer that must hold exactly one whole request.
pub fn request_with<'a>(input: &'a [u8], limits: &Limits) -> Request<'a> {
    match parse(input, limits) {
        Parse::Request { request, consumed } => {
            assert_eq!(consumed, input.len(), "request {:?} left bytes", String::from_utf8_lossy(input));
            request
        }
        other => panic!("{:?} parsed as {other:?}", String::from_utf8_lossy(input)),
    }
}

fn push_number(out: &mut Vec<u8>, number: impl ToString) {
    out.push(b' ');
    out.extend_from_slice(number.to_string().as_bytes());
}

fn push_token(out: &mut Vec<u8>, token: &[u8]) {
    out.push(b' ');
    out.extend_from_slice(token);
}

fn push_noreply(out: &mut Vec<u8>, noreply: bool) {
    if noreply {
        out.extend_from_slice(b" noreply");
    }
}

fn push_meta_key(out: &mut Vec<u8>, key: &[u8], base64_key: bool) {
    if base64_key {
        push_token(out, STANDARD.encode(key).as_bytes());
    } else {
        push_token(out, key);
    }
}

fn push_meta_flags(out: &mut Vec<u8>, flags: &MetaFlags<'_>) {
    for &letter in flags.order.as_slice() {
        out.push(b' ');
        out.push(letter);
        match letter {
            b'O' => out.extend_from_slice(flags.opaque.unwrap()),
            b'P' | b'L' => out.extend_from_slice(flags.scheme_hint.unwrap()),
            b'C' => out.extend_from_slice(flags.compare_cas.unwrap().to_string().as_bytes()),
            b'E' => out.extend_from_slice(flags.new_cas.unwrap().to_string().as_bytes()),
            b'F' => out.extend_from_slice(flags.client_flags.unwrap().to_string().as_bytes()),
            b'N' => out.extend_from_slice(flags.vivify_exptime.unwrap().to_string().as_bytes()),
            b'R' => out.extend_from_slice(flags.recache_exptime.unwrap().to_string().as_bytes()),
            b'T' => out.extend_from_slice(flags.exptime.unwrap().to_string().as_bytes()),
            b'J' => out.extend_from_slice(flags.initial_value.unwrap().to_string().as_bytes()),
            b'D' => out.extend_from_slice(flags.delta.unwrap().to_string().as_bytes()),
            b'M' => out.push(flags.mode.unwrap()),
            _ => {}
        }
    }
}

/// The wire form of a request, with "\r\n" line ends.
pub fn render(request: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut data = None;
    match request {
        Request::Get { keys, with_cas, touch_exptime } => {
            let command = match (with_cas, touch_exptime.is_some()) {
                (false, false) => "get",
                (true, false) => "gets",
                (false, true) => "gat",
                (true, true) => "gats",
            };
            out.extend_from_slice(command.as_bytes());
            if let Some(exptime) = touch_exptime {
                push_number(&mut out, exptime);
            }
            for key in keys {
                push_token(&mut out, key);
            }
        }
        Request::Store { mode, key, flags, exptime, data: block, cas_unique, noreply } => {
            out.extend_from_slice(mode.command().as_bytes());
            push_token(&mut out, key);
            push_number(&mut out, flags);
            push_number(&mut out, exptime);
            push_number(&mut out, block.len());
            if *mode == remem_memcache::StoreMode::Cas {
                push_number(&mut out, cas_unique);
            }
            push_noreply(&mut out, *noreply);
            data = Some(*block);
        }
        Request::Arithmetic { increment, key, delta, noreply } => {
            out.extend_from_slice(if *increment { b"incr" } else { b"decr" });
            push_token(&mut out, key);
            push_number(&mut out, delta);
            push_noreply(&mut out, *noreply);
        }
        Request::Delete { key, noreply } => {
            out.extend_from_slice(b"delete");
            push_token(&mut out, key);
            push_noreply(&mut out, *noreply);
        }
        Request::Touch { key, exptime, noreply } => {
            out.extend_from_slice(b"touch");
            push_token(&mut out, key);
            push_number(&mut out, exptime);
            push_noreply(&mut out, *noreply);
        }
        Request::FlushAll { delay, noreply } => {
            out.extend_from_slice(b"flush_all");
            push_number(&mut out, delay);
            push_noreply(&mut out, *noreply);
        }
        Request::Stats { group } => {
            out.extend_from_slice(b"stats");
            if let Some(group) = group {
                push_token(&mut out, group);
            }
        }
        Request::Version => out.extend_from_slice(b"version"),
        Request::Verbosity { level, noreply } => {
            out.extend_from_slice(b"verbosity");
            push_number(&mut out, level);
            push_noreply(&mut out, *noreply);
        }
        Request::Quit => out.extend_from_slice(b"quit"),
        Request::SlabsAutomove { noreply } => {
            out.extend_from_slice(b"slabs automove 1");
            if *noreply {
                out.extend_from_slice(b" noreply");
            }
        }
        Request::MetaGet { key, flags }
        | Request::MetaDelete { key, flags }
        | Request::MetaArithmetic { key, flags } => {
            out.extend_from_slice(match request {
                Request::MetaGet { .. } => b"mg",
                Request::MetaDelete { .. } => b"md",
                _ => b"ma",
            });
            push_meta_key(&mut out, key, flags.base64_key);
            push_meta_flags(&mut out, flags);
        }
        Request::MetaSet { key, data: block, flags } => {
            out.extend_from_slice(b"ms");
            push_meta_key(&mut out, key, flags.base64_key);
            push_number(&mut out, block.len());
            push_meta_flags(&mut out, flags);
            data = Some(*block);
        }
        Request::MetaNoop => out.extend_from_slice(b"mn"),
        Request::MetaDebug { key, base64_key } => {
            out.extend_from_slice(b"me");
            push_meta_key(&mut out, key, *base64_key);
            if *base64_key {
                out.extend_from_slice(b" b");
            }
        }
        Request::Transition { key, scheme, naive } => {
            out.extend_from_slice(b"transition");
            push_token(&mut out, key);
            push_token(&mut out, scheme);
            if *naive {
                out.extend_from_slice(b" naive");
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    if let Some(block) = data {
        out.extend_from_slice(block);
        out.extend_from_slice(b"\r\n");
    }
    out
}
