//! The classic text commands: get/gets/gat/gats, the six storage commands, incr/decr, delete,
//! touch, flush_all, stats, version, verbosity, quit, `slabs automove`, and remem's `transition`.
//!
//! Error rules follow memcached 1.6 (`proto_text.c`, `proto_parser.c`):
//! - a wrong number of arguments is `ERROR`, as for an unknown command;
//! - a storage line whose length does not parse is `CLIENT_ERROR bad command line format` and
//!   nothing is swallowed (the length is unknown); any later error on a storage line (key, flags,
//!   exptime, cas, too large) swallows the announced data block and its "\r\n";
//! - on a command whose last token is `noreply`, every error after the argument count check is
//!   silent (memcached marks the reply skipped), except a storage line with a bad length.

use crate::error::ProtocolError;
use crate::line::{at_most, parse_data_length, parse_exptime, parse_u32, parse_u64, text_key, Tokens};
use crate::request::{Request, StoreMode};
use crate::{Limits, Parsed, Pending};

const NOREPLY: &[u8] = b"noreply";

fn invalid(error: ProtocolError, noreply: bool) -> Parsed<'static> {
    Parsed::Invalid { error, data_length: None, noreply }
}

/// Whether the last of the `count` arguments is `noreply` (memcached looks only there).
fn ends_with_noreply(arguments: &[&[u8]], count: usize) -> bool {
    count > 0 && arguments[count - 1] == NOREPLY
}

/// Parses a text command line whose first token is `command` and whose remaining tokens are
/// `arguments`. Returns `None` when `command` is not a text command.
pub(crate) fn parse_text<'a>(command: &[u8], arguments: Tokens<'a>, limits: &Limits) -> Option<Parsed<'a>> {
    let parsed = match command {
        b"get" => retrieval(arguments, limits, false, false),
        b"gets" => retrieval(arguments, limits, true, false),
        b"gat" => retrieval(arguments, limits, false, true),
        b"gats" => retrieval(arguments, limits, true, true),
        b"set" => storage(arguments, limits, StoreMode::Set),
        b"add" => storage(arguments, limits, StoreMode::Add),
        b"replace" => storage(arguments, limits, StoreMode::Replace),
        b"append" => storage(arguments, limits, StoreMode::Append),
        b"prepend" => storage(arguments, limits, StoreMode::Prepend),
        b"cas" => storage(arguments, limits, StoreMode::Cas),
        b"incr" => arithmetic(arguments, limits, true),
        b"decr" => arithmetic(arguments, limits, false),
        b"delete" => delete(arguments, limits),
        b"touch" => touch(arguments, limits),
        b"flush_all" => flush_all(arguments),
        b"stats" => {
            let rest = arguments.remainder();
            let end = rest.iter().rposition(|&byte| byte != b' ').map_or(0, |last| last + 1);
            let group = (end > 0).then(|| &rest[..end]);
            Parsed::Request(Request::Stats { group })
        }
        b"version" => Parsed::Request(Request::Version),
        b"quit" => Parsed::Request(Request::Quit),
        b"verbosity" => verbosity(arguments),
        b"slabs" => slabs(arguments),
        b"transition" => transition(arguments, limits),
        _ => return None,
    };
    Some(parsed)
}

/// `get <key>+`, `gets <key>+`, `gat <exptime> <key>+`, `gats <exptime> <key>+`.
fn retrieval<'a>(mut arguments: Tokens<'a>, limits: &Limits, with_cas: bool, touch: bool) -> Parsed<'a> {
    let touch_exptime = if touch {
        let Some(exptime) = arguments.next() else {
            return invalid(ProtocolError::UnknownCommand, false);
        };
        if arguments.clone().next().is_none() {
            return invalid(ProtocolError::UnknownCommand, false);
        }
        match parse_exptime(exptime) {
            Some(exptime) => Some(exptime),
            None => return invalid(ProtocolError::InvalidExptime, false),
        }
    } else {
        None
    };
    // The keys are bounded by the line length, so this grows with bytes already received.
    let mut keys = Vec::new();
    for token in arguments {
        match text_key(token, limits.max_key_bytes) {
            Some(key) => keys.push(key),
            None => return invalid(ProtocolError::BadCommandLineFormat, false),
        }
    }
    if keys.is_empty() {
        return invalid(ProtocolError::UnknownCommand, false);
    }
    Parsed::Request(Request::Get { keys, with_cas, touch_exptime })
}

/// `<cmd> <key> <flags> <exptime> <bytes> [noreply]` and
/// `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`.
fn storage<'a>(arguments: Tokens<'a>, limits: &Limits, mode: StoreMode) -> Parsed<'a> {
    let (required, allowed) = if mode == StoreMode::Cas { (5, 6) } else { (4, 5) };
    let Some((tokens, count)) = at_most::<6>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    if count < required || count > allowed {
        return invalid(ProtocolError::UnknownCommand, false);
    }
    // memcached reads the length before anything else and reports a bad one without swallowing.
    let Some(length) = parse_data_length(tokens[3]) else {
        return invalid(ProtocolError::BadCommandLineFormat, false);
    };
    let noreply = count == allowed && tokens[count - 1] == NOREPLY;
    let swallow = |error| Parsed::Invalid { error, data_length: Some(length), noreply };
    let Some(key) = text_key(tokens[0], limits.max_key_bytes) else {
        return swallow(ProtocolError::BadCommandLineFormat);
    };
    let (Some(flags), Some(exptime)) = (parse_u32(tokens[1]), parse_exptime(tokens[2])) else {
        return swallow(ProtocolError::BadCommandLineFormat);
    };
    let cas_unique = if mode == StoreMode::Cas {
        match parse_u64(tokens[4]) {
            Some(cas_unique) => cas_unique,
            None => return swallow(ProtocolError::BadCommandLineFormat),
        }
    } else {
        0
    };
    Parsed::WithData { length, pending: Pending::Store { mode, key, flags, exptime, cas_unique, noreply } }
}

/// `incr <key> <delta> [noreply]`, `decr <key> <delta> [noreply]`.
fn arithmetic<'a>(arguments: Tokens<'a>, limits: &Limits, increment: bool) -> Parsed<'a> {
    let Some((tokens, count @ 2..=3)) = at_most::<3>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    let noreply = ends_with_noreply(&tokens, count);
    let Some(key) = text_key(tokens[0], limits.max_key_bytes) else {
        return invalid(ProtocolError::BadCommandLineFormat, noreply);
    };
    let Some(delta) = parse_u64(tokens[1]) else {
        return invalid(ProtocolError::InvalidDeltaArgument, noreply);
    };
    Parsed::Request(Request::Arithmetic { increment, key, delta, noreply })
}

/// `delete <key> [0] [noreply]`: the `0` is a legacy hold time that old PHP clients still send.
fn delete<'a>(arguments: Tokens<'a>, limits: &Limits) -> Parsed<'a> {
    let Some((tokens, count @ 1..=3)) = at_most::<3>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    let noreply = count > 1 && ends_with_noreply(&tokens, count);
    if count > 1 {
        let hold_is_zero = tokens[1] == b"0";
        let valid = (count == 2 && (hold_is_zero || noreply)) || (count == 3 && hold_is_zero && noreply);
        if !valid {
            return invalid(ProtocolError::DeleteUsage, noreply);
        }
    }
    let Some(key) = text_key(tokens[0], limits.max_key_bytes) else {
        return invalid(ProtocolError::BadCommandLineFormat, noreply);
    };
    Parsed::Request(Request::Delete { key, noreply })
}

/// `touch <key> <exptime> [noreply]`.
fn touch<'a>(arguments: Tokens<'a>, limits: &Limits) -> Parsed<'a> {
    let Some((tokens, count @ 2..=3)) = at_most::<3>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    let noreply = ends_with_noreply(&tokens, count);
    let Some(key) = text_key(tokens[0], limits.max_key_bytes) else {
        return invalid(ProtocolError::BadCommandLineFormat, noreply);
    };
    let Some(exptime) = parse_exptime(tokens[1]) else {
        return invalid(ProtocolError::InvalidExptime, noreply);
    };
    Parsed::Request(Request::Touch { key, exptime, noreply })
}

/// `flush_all [delay] [noreply]`.
fn flush_all(arguments: Tokens<'_>) -> Parsed<'_> {
    let Some((tokens, count)) = at_most::<2>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    let noreply = ends_with_noreply(&tokens, count);
    // Like memcached: the first argument is a delay unless it is the only one and is `noreply`.
    let delay = if count == usize::from(noreply) {
        0
    } else {
        match parse_exptime(tokens[0]) {
            Some(delay) => delay,
            None => return invalid(ProtocolError::InvalidExptime, noreply),
        }
    };
    Parsed::Request(Request::FlushAll { delay, noreply })
}

/// `verbosity <level> [noreply]`.
fn verbosity(arguments: Tokens<'_>) -> Parsed<'_> {
    let Some((tokens, count @ 1..=2)) = at_most::<2>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    let noreply = ends_with_noreply(&tokens, count);
    let Some(level) = parse_u32(tokens[0]) else {
        return invalid(ProtocolError::BadCommandLineFormat, noreply);
    };
    Parsed::Request(Request::Verbosity { level, noreply })
}

/// `slabs automove <0|1|2> [noreply]` and `slabs automove ratio <float> [noreply]`, checked as
/// memcached checks them (a level that is not a number is `CLIENT_ERROR bad command line
/// format`, a number above 2 or a bad ratio `ERROR`). `slabs reassign` is not offered: remem
/// has no slab pages to move between classes (`ERROR`, as memcached answers an unknown
/// subcommand).
fn slabs(arguments: Tokens<'_>) -> Parsed<'_> {
    let Some((tokens, count @ 2..=4)) = at_most::<4>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    if tokens[0] != b"automove" {
        return invalid(ProtocolError::UnknownCommand, false);
    }
    let noreply = ends_with_noreply(&tokens, count);
    if tokens[1] == b"ratio" {
        let ratio = std::str::from_utf8(tokens[2]).ok().and_then(|text| text.parse::<f64>().ok());
        if count < 3 || !ratio.is_some_and(f64::is_finite) {
            return invalid(ProtocolError::UnknownCommand, noreply);
        }
        return Parsed::Request(Request::SlabsAutomove { noreply });
    }
    match parse_u32(tokens[1]) {
        None => invalid(ProtocolError::BadCommandLineFormat, noreply),
        Some(0..=2) => Parsed::Request(Request::SlabsAutomove { noreply }),
        Some(_) => invalid(ProtocolError::UnknownCommand, noreply),
    }
}

/// remem: `transition <key> <scheme> [naive]`.
fn transition<'a>(arguments: Tokens<'a>, limits: &Limits) -> Parsed<'a> {
    let Some((tokens, count @ 2..=3)) = at_most::<3>(arguments) else {
        return invalid(ProtocolError::UnknownCommand, false);
    };
    let Some(key) = text_key(tokens[0], limits.max_key_bytes) else {
        return invalid(ProtocolError::BadCommandLineFormat, false);
    };
    // A scheme name follows the key rules: no control characters, bounded length.
    let scheme = tokens[1];
    if text_key(scheme, limits.max_key_bytes).is_none() {
        return invalid(ProtocolError::BadCommandLineFormat, false);
    }
    let naive = match (count, tokens[2]) {
        (2, _) => false,
        (_, b"naive") => true,
        _ => return invalid(ProtocolError::BadCommandLineFormat, false),
    };
    Parsed::Request(Request::Transition { key, scheme, naive })
}
