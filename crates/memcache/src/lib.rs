//! remem-memcache: the memcached 1.6 protocol (text commands and meta commands) as pure
//! functions: [`parse`] turns the bytes a client sent into one [`Request`] at a time, and
//! [`response`] appends memcached's replies to a buffer. [`fuzzing`] drives [`parse`] with
//! arbitrary bytes against its invariants (the fuzz target's body, also run by a stable test).
//!
//! Invariants:
//! - No I/O, no clock, no threads: the embedding server owns sockets, buffers and time (it passes
//!   "now" to [`expiry_deadline`]).
//! - [`parse`] is total: any byte string gives [`Parse::Incomplete`], one request, or one error
//!   with exactly how many bytes to drop; it never panics, never reports more bytes than it was
//!   given as consumed, and never allocates from a number it has not checked (the only
//!   allocations are the key list of a `get`, which grows with the keys actually present on a line
//!   bounded by [`Limits::max_get_line_bytes`], and a decoded base64 key, at most 3/4 of
//!   [`Limits::max_key_bytes`]).
//! - A request split at any byte boundary parses as [`Parse::Incomplete`] until all of it (its
//!   command line and, for storage commands, its data block and "\r\n") is in the input; the
//!   verdict never depends on how the bytes were split.
//! - Replies and error texts are byte-for-byte memcached's (see [`ProtocolError`] and
//!   [`response`]), so existing clients (pymemcache, libmemcached, ...) work unchanged.
//!
//! What the server must do around it (memcached's behaviour, kept):
//! - On [`Parse::Invalid`]: unless `noreply`, write `error` (see [`ProtocolError::write_to`]);
//!   drop `consumed` bytes, then discard the next `swallow` bytes as they arrive (they may not
//!   have arrived yet); remove the item of `unlink` if it names one (a `set` or `ms` refused as
//!   too large leaves no stale value behind); close the connection after the reply when `close`
//!   is set (silently, with `noreply`, for a line that looks like HTTP).
//! - `noreply` hides every reply of a text command, errors included: a client that sent
//!   `noreply` does not read a reply, so a stray error line would be taken as the answer to its
//!   next command.
//! - Meta `q` hides only the uninteresting outcome (see [`response::meta`]); errors always go out.
//! - Buffering: a complete request can be up to [`Limits::max_request_bytes`] bytes (a storage
//!   line and its data block, or a long multi-key get line), so the server's read buffer must
//!   grow to that before [`parse`] can return it.

#![warn(missing_docs)]

mod error;
mod expiry;
pub mod fuzzing;
mod line;
mod meta;
mod request;
pub mod response;
mod text;

pub use error::ProtocolError;
pub use expiry::{expiry_deadline, Expiry, MAX_RELATIVE_EXPTIME_SECONDS};
pub use request::{FlagOrder, Key, MetaFlags, MetaSetMode, Request, StoreMode, MAX_META_FLAGS};

use line::{split_line, Line, Tokens};

/// The bounds [`parse`] enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key in bytes (memcached: 250). For meta commands with `b` it bounds the base64
    /// form, as in memcached.
    pub max_key_bytes: usize,
    /// Longest data block in bytes; longer is [`ProtocolError::ObjectTooLarge`] (memcached's
    /// default item size limit is 1 MiB, which there also covers the item's header).
    pub max_item_bytes: usize,
    /// Longest command line in bytes, without its "\r\n", except the lines of `get`, `gets`,
    /// `gat` and `gats` ([`Limits::max_get_line_bytes`]). memcached reads lines in a 2 KiB buffer
    /// and closes a connection that sends more without a newline; remem allows 64 KiB, and
    /// answers [`ProtocolError::LineTooLong`] and closes beyond it.
    pub max_line_bytes: usize,
    /// Longest line of a multi-key retrieval (`get`, `gets`, `gat`, `gats`). memcached accepts
    /// these at any length (its t/getset.t sends a 187 KB `get`); remem bounds them at 1 MiB by
    /// default (100,000 keys of 10 bytes), the size of the largest storage request's data
    /// block, so a connection still buffers at most one request of about `-I` bytes. Beyond it,
    /// [`ProtocolError::LineTooLong`] and the connection closes. The line's command word must
    /// come within its first [`MAX_LEADING_SPACES`] + 5 bytes (memcached's rule too).
    pub max_get_line_bytes: usize,
}

/// Spaces a long retrieval line may start with (memcached closes a long line whose command does
/// not come within its first 100 bytes).
pub const MAX_LEADING_SPACES: usize = 100;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: 250,
            max_item_bytes: 1024 * 1024,
            max_line_bytes: 64 * 1024,
            max_get_line_bytes: 1024 * 1024,
        }
    }
}

impl Limits {
    /// The longest complete request [`parse`] can return: a storage line with its data block,
    /// or a retrieval line. A server's read buffer must hold this much before it may conclude
    /// that a request cannot complete.
    pub fn max_request_bytes(&self) -> usize {
        let storage = self.max_line_bytes.saturating_add(self.max_item_bytes).saturating_add(4);
        storage.max(self.max_get_line_bytes.max(self.max_line_bytes).saturating_add(2))
    }
}

/// The result of [`parse`].
// A request (mostly its meta flags) is ~240 bytes against ~20 for the other variants. The value
// lives for one call on the stack and is never stored in bulk; boxing it would cost an allocation
// per request on the server's hot path to save stack bytes nobody keeps.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// More bytes needed (nothing consumed).
    Incomplete,
    /// One whole request (command line and its data block) in the first `consumed` bytes.
    Request {
        /// The request; its slices borrow from the input.
        request: Request<'a>,
        /// Bytes to drop from the front of the input.
        consumed: usize,
    },
    /// A bad request: answer `error` (its exact memcached text via `error.response()`), drop
    /// `consumed` bytes, then also discard the next `swallow` bytes (memcached swallows the data
    /// block of a rejected storage command: value too large, bad key, flags, exptime or cas).
    Invalid {
        /// What went wrong.
        error: ProtocolError,
        /// Bytes to drop from the front of the input; at most the input's length.
        consumed: usize,
        /// Further bytes to discard after `consumed`, counted from the end of `consumed`; they
        /// need not have arrived yet.
        swallow: usize,
        /// memcached closes the connection after this error (a command line too long).
        close: bool,
        /// memcached sends no reply for this error: the text command ended in `noreply`, or the
        /// line looked like an HTTP request (memcached hangs up on those without a word).
        noreply: bool,
        /// The key whose item the server must remove: memcached unlinks the old item of a `set`
        /// (and of any `ms`) it refuses as too large, so no stale value outlives the failed
        /// write. `None` for every other error.
        unlink: Option<Key<'a>>,
    },
}

/// What a command parser found, before the data block (if any) is looked at.
#[allow(clippy::large_enum_variant)] // Transient, like `Parse`.
pub(crate) enum Parsed<'a> {
    /// A complete request without a data block.
    Request(Request<'a>),
    /// A valid storage line announcing a data block of `length` bytes plus "\r\n".
    WithData { length: usize, pending: Pending<'a> },
    /// An error; `data_length` is the announced data block to swallow, when the line had one.
    Invalid { error: ProtocolError, data_length: Option<usize>, noreply: bool },
}

/// A storage request waiting for its data block.
pub(crate) enum Pending<'a> {
    /// A text storage command.
    Store { mode: StoreMode, key: Key<'a>, flags: u32, exptime: i64, cas_unique: u64, noreply: bool },
    /// A meta set.
    MetaSet { key: Key<'a>, flags: MetaFlags<'a> },
}

impl<'a> Pending<'a> {
    /// Errors about the data block are silent for a text `noreply`; meta errors always go out.
    fn noreply(&self) -> bool {
        match self {
            Self::Store { noreply, .. } => *noreply,
            Self::MetaSet { .. } => false,
        }
    }

    /// The key memcached unlinks when it refuses this storage request as too large: a text
    /// `set`'s ("unacceptable for SET", memcached's proto_text.c), and any `ms`'s.
    fn unlinked_when_too_large(self) -> Option<Key<'a>> {
        match self {
            Self::Store { mode: StoreMode::Set, key, .. } | Self::MetaSet { key, .. } => Some(key),
            Self::Store { .. } => None,
        }
    }

    fn with_data(self, data: &'a [u8]) -> Request<'a> {
        match self {
            Self::Store { mode, key, flags, exptime, cas_unique, noreply } => {
                Request::Store { mode, key, flags, exptime, data, cas_unique, noreply }
            }
            Self::MetaSet { key, flags } => Request::MetaSet { key, data, flags },
        }
    }
}

/// Parses the first request in `input` (the bytes a client sent, from the start of a request).
///
/// Returns [`Parse::Incomplete`] when `input` holds only part of a request, the request and the
/// number of bytes it used, or [`Parse::Invalid`] with memcached's error and how many bytes to
/// drop. Unknown commands and an empty line are `ERROR`, as in memcached; a line may end in
/// "\r\n" or a bare "\n" (memcached accepts both), a data block only in "\r\n".
pub fn parse<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    let parse = parse_request(input, limits);
    if let Parse::Request { consumed, .. } | Parse::Invalid { consumed, .. } = &parse {
        assert!(*consumed <= input.len(), "parse consumed {consumed} of {} bytes", input.len());
        assert!(*consumed > 0, "a complete request or error always consumes its line");
    }
    parse
}

fn parse_request<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    let (line, next) = match split_line(input, line_limit(input, limits)) {
        Line::Incomplete => return Parse::Incomplete,
        Line::TooLong => {
            return Parse::Invalid {
                error: ProtocolError::LineTooLong,
                consumed: input.len(),
                swallow: 0,
                close: true,
                noreply: false,
                unlink: None,
            }
        }
        Line::Complete { line, next } => (line, next),
    };
    let mut tokens = Tokens::new(line);
    let parsed = match tokens.next() {
        Some(command) if command.len() == 2 && command[0] == b'm' => {
            meta::parse_meta(command, tokens, limits)
        }
        Some(command) => text::parse_text(command, tokens, limits),
        None => None,
    };
    let invalid = |error, swallow, noreply| Parse::Invalid {
        error,
        consumed: next,
        swallow,
        close: false,
        noreply,
        unlink: None,
    };
    let Some(parsed) = parsed else {
        // memcached hangs up, without a reply, on an unknown command whose last word starts
        // with "HTTP/" (a web client or a cross-protocol attack from a browser).
        let http = Tokens::new(line).last().is_some_and(|last| last.starts_with(b"HTTP/"));
        return Parse::Invalid {
            error: ProtocolError::UnknownCommand,
            consumed: next,
            swallow: 0,
            close: http,
            noreply: http,
            unlink: None,
        };
    };
    match parsed {
        Parsed::Request(request) => Parse::Request { request, consumed: next },
        Parsed::Invalid { error, data_length, noreply } => {
            invalid(error, data_length.map_or(0, |length| length + 2), noreply)
        }
        Parsed::WithData { length, pending } => {
            if length > limits.max_item_bytes {
                let noreply = pending.noreply();
                return Parse::Invalid {
                    error: ProtocolError::ObjectTooLarge,
                    consumed: next,
                    swallow: length + 2,
                    close: false,
                    noreply,
                    unlink: pending.unlinked_when_too_large(),
                };
            }
            // Both bounds are checked: length <= max_item_bytes and next <= input.len().
            let data_end = next + length;
            let Some(terminator) = input.get(data_end..data_end + 2) else {
                return Parse::Incomplete;
            };
            if terminator != b"\r\n" {
                // memcached reads length + 2 bytes into the item, then finds them badly terminated.
                return Parse::Invalid {
                    error: ProtocolError::BadDataChunk,
                    consumed: data_end + 2,
                    swallow: 0,
                    close: false,
                    noreply: pending.noreply(),
                    unlink: None,
                };
            }
            Parse::Request { request: pending.with_data(&input[next..data_end]), consumed: data_end + 2 }
        }
    }
}

/// The line limit of the request at the start of `input`: [`Limits::max_get_line_bytes`] for a
/// retrieval, else [`Limits::max_line_bytes`]. Only the first `max_line_bytes` bytes decide, so
/// the verdict does not depend on how the line was split into reads: a shorter input is within
/// either limit.
fn line_limit(input: &[u8], limits: &Limits) -> usize {
    let head = &input[..input.len().min(limits.max_line_bytes)];
    let spaces = head.iter().take(MAX_LEADING_SPACES + 1).take_while(|&&byte| byte == b' ').count();
    let rest = &head[spaces..];
    let retrieval = [&b"get "[..], b"gets ", b"gat ", b"gats "].iter().any(|word| rest.starts_with(word));
    if spaces <= MAX_LEADING_SPACES && retrieval {
        limits.max_get_line_bytes.max(limits.max_line_bytes)
    } else {
        limits.max_line_bytes
    }
}
