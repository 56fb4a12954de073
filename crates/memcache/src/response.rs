//! memcached's replies, appended to a caller-owned `Vec<u8>`: the text protocol here, the meta
//! protocol in [`meta`].
//!
//! Contract: every function appends one complete reply element ending in "\r\n" and nothing
//! else; none allocates beyond growing `out`. Which reply a request gets is the server's choice;
//! the [`crate::Request`] documentation lists memcached's. `noreply` is the server's to honour:
//! these functions always write.

pub mod meta;

use crate::error::ProtocolError;

/// Appends the decimal digits of `value` (no allocation).
pub(crate) fn push_u64(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

/// Appends the decimal digits of `value`, with a `-` when negative.
pub(crate) fn push_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    push_u64(out, value.unsigned_abs());
}

fn line(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

/// One hit of a get: `VALUE <key> <flags> <bytes> [<cas unique>]\r\n<data>\r\n`. `cas` is given
/// for `gets` and `gats`. After the last hit, append [`end`].
pub fn value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_u64(out, data.len() as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    line(out, data);
}

/// `END`: closes a get's values and a stats listing.
pub fn end(out: &mut Vec<u8>) {
    line(out, b"END");
}

/// `STORED`.
pub fn stored(out: &mut Vec<u8>) {
    line(out, b"STORED");
}

/// `NOT_STORED`: add on an existing key, replace/append/prepend on a missing one.
pub fn not_stored(out: &mut Vec<u8>) {
    line(out, b"NOT_STORED");
}

/// `EXISTS`: cas on an item modified since it was fetched.
pub fn exists(out: &mut Vec<u8>) {
    line(out, b"EXISTS");
}

/// `NOT_FOUND`: cas, delete, incr, decr, touch on a missing key.
pub fn not_found(out: &mut Vec<u8>) {
    line(out, b"NOT_FOUND");
}

/// `DELETED`.
pub fn deleted(out: &mut Vec<u8>) {
    line(out, b"DELETED");
}

/// `TOUCHED`.
pub fn touched(out: &mut Vec<u8>) {
    line(out, b"TOUCHED");
}

/// `OK`: flush_all, verbosity.
pub fn ok(out: &mut Vec<u8>) {
    line(out, b"OK");
}

/// The new value after incr/decr, as a decimal line.
pub fn number(out: &mut Vec<u8>, value: u64) {
    push_u64(out, value);
    out.extend_from_slice(b"\r\n");
}

/// `VERSION <version>`. Panics if `version` holds a line break (a programmer error).
pub fn version(out: &mut Vec<u8>, version: &str) {
    assert!(!version.contains(['\r', '\n']), "a version string is one line");
    out.extend_from_slice(b"VERSION ");
    line(out, version.as_bytes());
}

/// `ERROR`: unknown command.
pub fn error(out: &mut Vec<u8>) {
    line(out, b"ERROR");
}

/// `CLIENT_ERROR <message>`. Panics if `message` holds a line break (a programmer error).
pub fn client_error(out: &mut Vec<u8>, message: &str) {
    assert!(!message.contains(['\r', '\n']), "an error message is one line");
    out.extend_from_slice(b"CLIENT_ERROR ");
    line(out, message.as_bytes());
}

/// `SERVER_ERROR <message>`. Panics if `message` holds a line break (a programmer error).
pub fn server_error(out: &mut Vec<u8>, message: &str) {
    assert!(!message.contains(['\r', '\n']), "an error message is one line");
    out.extend_from_slice(b"SERVER_ERROR ");
    line(out, message.as_bytes());
}

/// The reply line of a protocol error, with memcached's exact text.
pub fn protocol_error(out: &mut Vec<u8>, error: &ProtocolError) {
    error.write_to(out);
}

/// One statistic: `STAT <name> <value>`. End the listing with [`end`]. Panics if `name` holds a
/// space or either holds a line break (a programmer error).
pub fn stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    use std::io::Write;
    assert!(!name.contains([' ', '\r', '\n']), "a stat name is one token");
    let start = out.len();
    write!(out, "STAT {name} {value}").expect("writing to a Vec cannot fail");
    assert!(!out[start..].iter().any(|&byte| byte == b'\r' || byte == b'\n'), "a stat value is one line");
    out.extend_from_slice(b"\r\n");
}
