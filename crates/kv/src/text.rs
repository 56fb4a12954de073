//! The text protocol's commands: what each does, in terms of the operations both protocols
//! share (`commands.rs`); meta commands are in `meta.rs`, the choice between them in
//! `dispatch.rs`. Every request takes one place per reply in its connection's reply order
//! (`next_seq`), so replies that finish later still go out in order. A multi-key get streams
//! its values as the connection's output budget admits them ([`continue_get`]).

use remem_memcache::{response, Request};

use crate::cache::{transition, Cache, RmwKind, RmwOp, Waiter};
use crate::commands::{deadline, delete, rmw, store_command, text, touch, AlreadyExpired, StoreReplies};
use crate::completion::{ConnRef, Render};
use crate::error::StartError;
use crate::page_client::PageClient;
use crate::reply::Outbox;
use crate::scheme::Scheme;
use crate::stats::PrefixEvent;

/// What the connection does after a request.
#[derive(Debug, PartialEq, Eq)]
pub enum After {
    Continue,
    Close,
    /// A multi-key get whose keys are started as the budget admits them ([`continue_get`]); the
    /// connection takes no other request until every key is started.
    Get(MultiGet),
}

/// Bytes of a text get's reply beyond its key and value: the rest of `VALUE <key> <flags>
/// <bytes> <cas>\r\n` and the data block's `\r\n`, with room to spare.
const VALUE_LINE_BYTES: usize = 64;

/// A get, gets, gat or gats of several keys being answered. Every key has its place in the
/// connection's reply order from the start (so replies stay in request order), but a key is
/// looked up and fetched only when the connection's output budget admits another value: a get
/// of thousands of large values streams, a bounded number of them held at a time.
#[derive(Debug, PartialEq, Eq)]
pub struct MultiGet {
    /// The keys, each followed by one space (a text key holds no space): one buffer the size
    /// of the line's keys, not an allocation per key, so a get line of 100,000 keys holds its
    /// line's bytes while it streams.
    keys: Box<[u8]>,
    /// Where the next key to start begins in `keys`.
    cursor: usize,
    /// The place of the next key's reply.
    next_seq: u64,
    /// The place of the `END`.
    end: u64,
    with_cas: bool,
    touch_exptime: Option<i64>,
}

impl MultiGet {
    /// The place of its `END`: once the connection sent past it (a lost value's
    /// `SERVER_ERROR` ended the answer), the keys left are not worth fetching.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Places not started yet (the keys left and the `END`): they hold nothing.
    pub fn unstarted(&self) -> u64 {
        self.end + 1 - self.next_seq
    }
}

/// Page ops waiting for an engine slot beyond which a connection that holds bytes already
/// starts no more values: four times the ops in flight keeps the engine busy, and a client
/// that holds nothing (one get) never waits behind more than this of another's multi-gets.
const STREAMING_WAITING_PAGE_OPS: usize = 4 * crate::pageio::PAGE_OPS_IN_FLIGHT;

/// Whether `conn` may start another value now: its output budget admits one (`crate::budget`),
/// and it holds nothing or the page-op queue is short (each waiting op holds a 4 KiB buffer).
pub fn may_start_value<P: PageClient>(cache: &Cache<P>, conn: ConnRef) -> bool {
    cache.budget().admits(conn)
        && (cache.budget().held_by(conn) == 0 || cache.io().waiting() <= STREAMING_WAITING_PAGE_OPS)
}

/// Starts the keys of `get` while [`may_start_value`] allows, in order; the `END` goes with the
/// last. True when the whole get is started.
pub fn continue_get<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    conn: ConnRef,
    get: &mut MultiGet,
) -> bool {
    let now = cache.now_unix();
    while get.cursor < get.keys.len() {
        if !may_start_value(cache, conn) {
            if !cache.budget().admits(conn) {
                cache.budget_mut().waits += 1;
            }
            return false;
        }
        let start = get.cursor;
        let length =
            get.keys[start..].iter().position(|&byte| byte == b' ').expect("every key ends in a space");
        get.cursor = start + length + 1;
        let seq = get.next_seq;
        get.next_seq += 1;
        let key = &get.keys[start..start + length];
        get_one(cache, out, conn, (seq, get.end), key, get.with_cas, get.touch_exptime, now);
    }
    assert_eq!(get.next_seq, get.end, "every key had its place before the END");
    out.reply(conn, get.end, text("END\r\n"));
    true
}

/// The keys of a get as one buffer, each followed by a space ([`MultiGet::keys`]).
fn join_keys(keys: Vec<remem_memcache::Key<'_>>) -> Box<[u8]> {
    let mut joined = Vec::with_capacity(keys.iter().map(|key| key.len() + 1).sum());
    for key in &keys {
        assert!(!key.contains(&b' '), "the parser splits text keys at spaces");
        joined.extend_from_slice(key);
        joined.push(b' ');
    }
    joined.into_boxed_slice()
}

fn take_seq(seq: &mut u64) -> u64 {
    *seq += 1;
    *seq - 1
}

/// A text command; a meta command is handed back (`Err`) for `meta.rs`.
// The `Err` is not an error but the request passed on by value, as the caller gave it.
#[allow(clippy::result_large_err)]
pub fn execute<'a, P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    conn: ConnRef,
    next_seq: &mut u64,
    request: Request<'a>,
) -> Result<After, Request<'a>> {
    let now = cache.now_unix();
    match request {
        Request::Get { keys, with_cas, touch_exptime } => {
            // Every key takes its place now, the `END` the place after the keys'; the keys are
            // looked up as the budget admits them.
            let first = *next_seq;
            let end = first + keys.len() as u64;
            *next_seq = end + 1;
            let mut get =
                MultiGet { keys: join_keys(keys), cursor: 0, next_seq: first, end, with_cas, touch_exptime };
            if !continue_get(cache, out, conn, &mut get) {
                return Ok(After::Get(get));
            }
        }
        Request::Store { mode, key, flags, exptime, data, cas_unique, noreply } => {
            let seq = take_seq(next_seq);
            cache.stats_mut().cmd_set += 1;
            let replies = StoreReplies::text();
            store_command(
                cache, out, conn, seq, mode, &key, flags, exptime, data, cas_unique, noreply, replies, None,
                now,
            );
        }
        Request::Arithmetic { increment, key, delta, noreply } => {
            let seq = take_seq(next_seq);
            let kind = if increment { RmwKind::Incr(delta) } else { RmwKind::Decr(delta) };
            arithmetic(cache, out, conn, seq, &key, kind, noreply, now);
        }
        Request::Delete { key, noreply } => {
            let seq = take_seq(next_seq);
            let found = delete(cache, &key, now);
            let reply = if found { "DELETED\r\n" } else { "NOT_FOUND\r\n" };
            out.reply_unless(noreply, conn, seq, text(reply));
        }
        Request::Touch { key, exptime, noreply } => {
            let seq = take_seq(next_seq);
            cache.stats_mut().cmd_touch += 1;
            let found = touch(cache, &key, exptime, now);
            if found {
                cache.stats_mut().touch_hits += 1;
            } else {
                cache.stats_mut().touch_misses += 1;
            }
            let reply = if found { "TOUCHED\r\n" } else { "NOT_FOUND\r\n" };
            out.reply_unless(noreply, conn, seq, text(reply));
        }
        Request::FlushAll { delay, noreply } => {
            let seq = take_seq(next_seq);
            cache.stats_mut().cmd_flush += 1;
            if delay <= 0 {
                cache.flush_all();
            } else {
                cache.flush_at(deadline(delay, now).ok().filter(|&at| at != 0));
            }
            out.reply_unless(noreply, conn, seq, text("OK\r\n"));
        }
        Request::Stats { group } => {
            let seq = take_seq(next_seq);
            let bytes = crate::report::stats(cache, group);
            out.reply(conn, seq, bytes);
        }
        Request::Version => {
            let seq = take_seq(next_seq);
            let mut bytes = Vec::new();
            response::version(&mut bytes, crate::report::VERSION);
            out.reply(conn, seq, bytes);
        }
        Request::Verbosity { noreply, .. } => {
            let seq = take_seq(next_seq);
            out.reply_unless(noreply, conn, seq, text("OK\r\n"));
        }
        Request::Quit => return Ok(After::Close),
        Request::SlabsAutomove { noreply } => {
            // remem's pages take any size class as needed: there is no slab page to move.
            let seq = take_seq(next_seq);
            out.reply_unless(noreply, conn, seq, text("OK\r\n"));
        }
        Request::Transition { key, scheme, naive } => {
            let seq = take_seq(next_seq);
            let scheme = match Scheme::parse(scheme, cache.config().ec) {
                Ok(scheme) => scheme,
                Err(error) => {
                    out.reply(conn, seq, format!("CLIENT_ERROR {error}\r\n").into_bytes());
                    return Ok(After::Continue);
                }
            };
            match transition::start(cache, &key, scheme, naive, Some((conn, seq))) {
                Ok(()) => {}
                Err(StartError::NotFound) => out.reply(conn, seq, text("NOT_FOUND\r\n")),
                Err(error @ (StartError::Busy | StartError::NotOffered)) => {
                    out.reply(conn, seq, format!("SERVER_ERROR {error}\r\n").into_bytes())
                }
            }
        }
        meta => return Err(meta),
    }
    Ok(After::Continue)
}

/// One key of a get: a miss, a value from a write in flight, or a fetch.
#[allow(clippy::too_many_arguments)]
fn get_one<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    conn: ConnRef,
    (seq, end): (u64, u64),
    key: &[u8],
    with_cas: bool,
    touch_exptime: Option<i64>,
    now: u64,
) {
    cache.stats_mut().cmd_get += 1;
    if touch_exptime.is_some() {
        cache.stats_mut().cmd_touch += 1;
    }
    let found = cache.live(key, now);
    cache.stats_mut().prefixes.record(key, PrefixEvent::Get { hit: found.is_some() });
    let Some(id) = found else {
        cache.stats_mut().get_misses += 1;
        if touch_exptime.is_some() {
            cache.stats_mut().touch_misses += 1;
        }
        out.reply(conn, seq, Vec::new());
        return;
    };
    if let Some(exptime) = touch_exptime {
        cache.stats_mut().touch_hits += 1;
        match deadline(exptime, now) {
            Ok(at) => cache.index_mut().entry_mut(id).expires_at = at,
            Err(AlreadyExpired) => {
                // gat with a past time: memcached returns the item, then it is gone.
                cache.index_mut().entry_mut(id).expires_at = 1;
            }
        }
        cache.rerecord(id);
    }
    cache.stats_mut().get_hits += 1;
    let entry = cache.index().entry(id);
    let render = Render::Text { key: key.into(), flags: entry.flags, cas: with_cas.then_some(entry.cas) };
    let reserved = entry.value_bytes + key.len() + VALUE_LINE_BYTES;
    cache.budget_mut().hold(conn, reserved);
    let waiter = Waiter::Get { conn, seq, render, end: Some(end), reserved };
    cache.read_entry(id, waiter, now);
}

#[allow(clippy::too_many_arguments)]
fn arithmetic<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    conn: ConnRef,
    seq: u64,
    key: &[u8],
    kind: RmwKind,
    noreply: bool,
    now: u64,
) {
    let increment = matches!(kind, RmwKind::Incr(_));
    if cache.live(key, now).is_none() {
        if increment {
            cache.stats_mut().incr_misses += 1;
        } else {
            cache.stats_mut().decr_misses += 1;
        }
        return out.reply_unless(noreply, conn, seq, text("NOT_FOUND\r\n"));
    }
    if increment {
        cache.stats_mut().incr_hits += 1;
    } else {
        cache.stats_mut().decr_hits += 1;
    }
    rmw(cache, out, key, RmwOp { kind, conn, seq, noreply, meta: None, ok: Vec::new() }, now);
}
