//! The meta commands of memcached 1.6: `mg`, `ms`, `md`, `ma`, `mn`, `me`.
//!
//! A meta line is `<cm> <key> <flags>*` (`ms <key> <datalen> <flags>*`). Each flag is one token
//! whose first byte is the flag letter, optionally followed by its argument. The checks and their
//! error texts follow memcached's `_meta_flag_preparse`, in its order:
//! 1. the key token longer than the key limit: `CLIENT_ERROR bad command line format`;
//! 2. more than [`MAX_META_FLAGS`] flags: `CLIENT_ERROR options flags are too long`;
//! 3. per flag, in order: a repeated letter (or a byte >= 127) stops at once with "duplicate
//!    flag", an unknown letter stops at once with "invalid flag"; a bad argument records its
//!    error and parsing goes on, the last recorded error wins (an `F` error records the generic
//!    text only if nothing was recorded before, as memcached leaves its error string alone there);
//! 4. after the flags: an `O` token over 32 bytes, then an invalid `M` mode for ms or ma.
//!
//! `md` and `ma` report every error of step 3 as "invalid or duplicate flag", like memcached.
//! Errors of `ms` after its length parsed swallow the data block; meta errors are never hidden by
//! the `q` flag. remem's one addition: a key without `b`, and the `O`, `P`, `L` tokens that are
//! echoed or kept, must not contain control characters (`bad command line format` for the key,
//! `bad token` for the others).

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

use crate::error::ProtocolError;
use crate::line::{is_control, parse_data_length, parse_exptime, parse_u32, parse_u64, text_key, Tokens};
use crate::request::{Key, MetaFlags, Request, MAX_META_FLAGS};
use crate::{Limits, Parsed, Pending};

/// The longest `O` token memcached echoes, its `O` included.
const MAX_OPAQUE_TOKEN_BYTES: usize = 32;

/// Standard base64 alphabet, padding accepted but not required (clients differ; memcached's own
/// decoder is similarly lenient). Encoding pads, as memcached does.
pub(crate) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Which meta command the flags belong to: the error texts and valid modes differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Get,
    Set,
    Delete,
    Arithmetic,
}

/// Parses a meta command line whose first token is `command`. Returns `None` when `command` is
/// not a meta command (memcached answers `ERROR`).
pub(crate) fn parse_meta<'a>(
    command: &[u8],
    mut arguments: Tokens<'a>,
    limits: &Limits,
) -> Option<Parsed<'a>> {
    let kind = match command {
        b"mg" => Kind::Get,
        b"ms" => Kind::Set,
        b"md" => Kind::Delete,
        b"ma" => Kind::Arithmetic,
        b"mn" => return Some(Parsed::Request(Request::MetaNoop)),
        b"me" => return Some(debug(arguments, limits)),
        _ => return None,
    };
    let Some(key_token) = arguments.next() else {
        return Some(Parsed::Invalid {
            error: ProtocolError::UnknownCommand,
            data_length: None,
            noreply: false,
        });
    };
    if kind == Kind::Set {
        return Some(set(key_token, arguments, limits));
    }
    let parsed = match parse_flags(kind, key_token, arguments, limits) {
        Ok((key, flags)) => Parsed::Request(match kind {
            Kind::Get => Request::MetaGet { key, flags },
            Kind::Delete => Request::MetaDelete { key, flags },
            _ => Request::MetaArithmetic { key, flags },
        }),
        Err(error) => Parsed::Invalid { error, data_length: None, noreply: false },
    };
    Some(parsed)
}

/// `ms <key> <datalen> <flags>*`.
fn set<'a>(key_token: &'a [u8], mut arguments: Tokens<'a>, limits: &Limits) -> Parsed<'a> {
    let Some(length) = arguments.next().and_then(parse_data_length) else {
        return Parsed::Invalid {
            error: ProtocolError::BadCommandLineFormat,
            data_length: None,
            noreply: false,
        };
    };
    match parse_flags(Kind::Set, key_token, arguments, limits) {
        Ok((key, flags)) => Parsed::WithData { length, pending: Pending::MetaSet { key, flags } },
        Err(error) => Parsed::Invalid { error, data_length: Some(length), noreply: false },
    }
}

/// `me <key> [b]`.
fn debug<'a>(mut arguments: Tokens<'a>, limits: &Limits) -> Parsed<'a> {
    let bad =
        Parsed::Invalid { error: ProtocolError::BadCommandLineFormat, data_length: None, noreply: false };
    let Some(key_token) = arguments.next() else {
        return bad;
    };
    if key_token.len() > limits.max_key_bytes {
        return bad;
    }
    let base64_key = arguments.next() == Some(b"b");
    let key = if base64_key { decode_key(key_token) } else { text_key(key_token, limits.max_key_bytes) };
    match key {
        Some(key) => Parsed::Request(Request::MetaDebug { key, base64_key }),
        None => bad,
    }
}

/// Decodes a base64 key token; `None` when it is not base64 or decodes to nothing.
fn decode_key(token: &[u8]) -> Option<Key<'static>> {
    // Decoding needs at most 3/4 of the token, and the token is already within the key limit.
    let decoded = BASE64.decode(token).ok()?;
    (!decoded.is_empty()).then_some(Key::Owned(decoded))
}

/// Parses the key and flags of mg, ms, md, ma (see the module documentation for the order).
fn parse_flags<'a>(
    kind: Kind,
    key_token: &'a [u8],
    tokens: Tokens<'a>,
    limits: &Limits,
) -> Result<(Key<'a>, MetaFlags<'a>), ProtocolError> {
    if key_token.len() > limits.max_key_bytes {
        return Err(ProtocolError::BadCommandLineFormat);
    }
    if tokens.clone().nth(MAX_META_FLAGS).is_some() {
        return Err(ProtocolError::TooManyFlags);
    }
    let preparse = |error| {
        if matches!(kind, Kind::Delete | Kind::Arithmetic) {
            ProtocolError::InvalidOrDuplicateFlag
        } else {
            error
        }
    };
    let (flags, decoded_key, opaque_too_long) = preparse_flags(key_token, tokens).map_err(preparse)?;
    if opaque_too_long {
        return Err(ProtocolError::OpaqueTooLong);
    }
    match (kind, flags.mode) {
        (Kind::Set, Some(mode)) if !b"EAPRS".contains(&mode) => return Err(ProtocolError::InvalidSetMode),
        (Kind::Arithmetic, Some(mode)) if !b"I+D-".contains(&mode) => {
            return Err(ProtocolError::InvalidArithmeticMode)
        }
        _ => {}
    }
    let key = match decoded_key {
        Some(key) => key,
        None => text_key(key_token, limits.max_key_bytes).ok_or(ProtocolError::BadCommandLineFormat)?,
    };
    Ok((key, flags))
}

/// memcached's flag pre-parse: returns the flags, the decoded key if `b` was given, and whether
/// the opaque token is too long (reported only after the pre-parse succeeded).
fn preparse_flags<'a>(
    key_token: &[u8],
    tokens: Tokens<'a>,
) -> Result<(MetaFlags<'a>, Option<Key<'static>>, bool), ProtocolError> {
    let mut flags = MetaFlags::default();
    let mut seen = [false; 128];
    let mut recorded: Option<ProtocolError> = None;
    let mut decoded_key = None;
    let mut opaque_too_long = false;
    let mut hint_p = None;
    let mut hint_l = None;
    for token in tokens {
        let letter = token[0];
        let argument = &token[1..];
        if letter >= 127 || seen[usize::from(letter)] {
            return Err(ProtocolError::DuplicateFlag);
        }
        seen[usize::from(letter)] = true;
        let mut record = |error| recorded = Some(error);
        match letter {
            b'b' => {
                flags.base64_key = true;
                decoded_key = decode_key(key_token);
                if decoded_key.is_none() {
                    record(ProtocolError::KeyDecoding);
                }
            }
            b'N' | b'T' | b'R' => match parse_exptime(argument) {
                Some(exptime) if letter == b'N' => flags.vivify_exptime = Some(exptime),
                Some(exptime) if letter == b'T' => flags.exptime = Some(exptime),
                Some(exptime) => flags.recache_exptime = Some(exptime),
                None => record(ProtocolError::BadToken),
            },
            b'O' | b'P' | b'L' => {
                if argument.iter().any(|&byte| is_control(byte)) {
                    record(ProtocolError::BadToken);
                }
                match letter {
                    b'O' => {
                        opaque_too_long = token.len() > MAX_OPAQUE_TOKEN_BYTES;
                        flags.opaque = Some(argument);
                    }
                    b'P' => hint_p = Some(argument),
                    _ => hint_l = Some(argument),
                }
            }
            b'c' => flags.return_cas = true,
            b'f' => flags.return_client_flags = true,
            b'h' => flags.return_hit_before = true,
            b'k' => flags.return_key = true,
            b'l' => flags.return_last_access = true,
            b's' => flags.return_size = true,
            b't' => flags.return_ttl = true,
            b'v' => flags.return_value = true,
            b'q' => flags.quiet = true,
            b'u' => flags.no_lru_bump = true,
            b'x' => flags.remove_value = true,
            b'I' => flags.invalidate = true,
            b'F' => match parse_u32(argument) {
                Some(client_flags) => flags.client_flags = Some(client_flags),
                // memcached sets its error bit here but leaves the error text as it was.
                None => {
                    recorded.get_or_insert(ProtocolError::BadCommandLineFormat);
                }
            },
            b'C' | b'E' => match parse_u64(argument) {
                Some(cas) if letter == b'C' => flags.compare_cas = Some(cas),
                Some(cas) => flags.new_cas = Some(cas),
                None => record(ProtocolError::BadToken),
            },
            b'M' => match argument {
                [mode] => flags.mode = Some(*mode),
                _ => record(ProtocolError::ModeTokenLength),
            },
            b'J' => match parse_u64(argument) {
                Some(initial) => flags.initial_value = Some(initial),
                None => record(ProtocolError::InvalidInitialValue),
            },
            b'D' => match parse_u64(argument) {
                Some(delta) => flags.delta = Some(delta),
                None => record(ProtocolError::InvalidDeltaValue),
            },
            _ => return Err(ProtocolError::InvalidFlag),
        }
        flags.order.push(letter);
    }
    if let Some(error) = recorded {
        return Err(error);
    }
    flags.scheme_hint = hint_p.or(hint_l);
    Ok((flags, decoded_key, opaque_too_long))
}
