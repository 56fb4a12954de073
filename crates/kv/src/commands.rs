//! Requests in, replies out: what each memcached command does to the cache (text protocol
//! here, meta commands in `meta.rs`). Every request takes one place per reply in its
//! connection's reply order (`next_seq`), so replies that finish later still go out in order.
//!
//! Error texts are memcached's; a value remote memory lost gives `SERVER_ERROR`, never other
//! bytes (docs/KV.md "Semantics").

use std::rc::Rc;

use remem_memcache::{expiry_deadline, response, Expiry, Request, StoreMode};

use crate::cache::{Ack, Cache, ConnRef, Render, RmwChain, RmwKind, RmwOp, Task, Waiter};
use crate::scheme::Scheme;

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
    keys: std::collections::VecDeque<Box<[u8]>>,
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
const STREAMING_WAITING_PAGE_OPS: usize = 4 * crate::PAGE_OPS_IN_FLIGHT;

/// Whether `conn` may start another value now: its output budget admits one (`crate::budget`),
/// and it holds nothing or the page-op queue is short (each waiting op holds a 4 KiB buffer).
pub fn may_start_value(cache: &Cache, conn: ConnRef) -> bool {
    cache.budget.admits(conn)
        && (cache.budget.held_by(conn) == 0 || cache.io.waiting() <= STREAMING_WAITING_PAGE_OPS)
}

/// Starts the keys of `get` while [`may_start_value`] allows, in order; the `END` goes with the
/// last. True when the whole get is started.
pub fn continue_get(cache: &mut Cache, conn: ConnRef, get: &mut MultiGet) -> bool {
    let now = crate::now_unix();
    while !get.keys.is_empty() {
        if !may_start_value(cache, conn) {
            if !cache.budget.admits(conn) {
                cache.budget.waits += 1;
            }
            return false;
        }
        let key = get.keys.pop_front().expect("not empty");
        let seq = get.next_seq;
        get.next_seq += 1;
        get_one(cache, conn, (seq, get.end), &key, get.with_cas, get.touch_exptime, now);
    }
    assert_eq!(get.next_seq, get.end, "every key had its place before the END");
    cache.reply(conn, get.end, text("END\r\n"));
    true
}

/// An exptime that is already past.
#[derive(Debug)]
pub struct AlreadyExpired;

/// The deadline of a raw exptime: 0 (never), or unix seconds.
pub fn deadline(exptime: i64, now: u64) -> Result<u64, AlreadyExpired> {
    match expiry_deadline(exptime, now) {
        Expiry::Never => Ok(0),
        Expiry::At(at) => Ok(at),
        Expiry::Expired => Err(AlreadyExpired),
    }
}

fn take_seq(seq: &mut u64) -> u64 {
    *seq += 1;
    *seq - 1
}

fn text(bytes: &str) -> Vec<u8> {
    bytes.as_bytes().to_vec()
}

pub fn execute(cache: &mut Cache, conn: ConnRef, next_seq: &mut u64, request: Request<'_>) -> After {
    let now = crate::now_unix();
    match request {
        Request::Get { keys, with_cas, touch_exptime } => {
            // Every key takes its place now, the `END` the place after the keys'; the keys are
            // looked up as the budget admits them.
            let first = *next_seq;
            let end = first + keys.len() as u64;
            *next_seq = end + 1;
            let keys = keys.into_iter().map(|key| Box::from(key.as_ref())).collect();
            let mut get = MultiGet { keys, next_seq: first, end, with_cas, touch_exptime };
            if !continue_get(cache, conn, &mut get) {
                return After::Get(get);
            }
        }
        Request::Store { mode, key, flags, exptime, data, cas_unique, noreply } => {
            let seq = take_seq(next_seq);
            cache.stats.cmd_set += 1;
            let replies = StoreReplies::text();
            store_command(
                cache, conn, seq, mode, &key, flags, exptime, data, cas_unique, noreply, replies, None, now,
            );
        }
        Request::Arithmetic { increment, key, delta, noreply } => {
            let seq = take_seq(next_seq);
            let kind = if increment { RmwKind::Incr(delta) } else { RmwKind::Decr(delta) };
            arithmetic(cache, conn, seq, &key, kind, noreply, now);
        }
        Request::Delete { key, noreply } => {
            let seq = take_seq(next_seq);
            let found = delete(cache, &key, now);
            let reply = if found { "DELETED\r\n" } else { "NOT_FOUND\r\n" };
            cache.reply(conn, seq, if noreply { Vec::new() } else { text(reply) });
        }
        Request::Touch { key, exptime, noreply } => {
            let seq = take_seq(next_seq);
            cache.stats.cmd_touch += 1;
            let found = touch(cache, &key, exptime, now);
            if found {
                cache.stats.touch_hits += 1;
            } else {
                cache.stats.touch_misses += 1;
            }
            let reply = if found { "TOUCHED\r\n" } else { "NOT_FOUND\r\n" };
            cache.reply(conn, seq, if noreply { Vec::new() } else { text(reply) });
        }
        Request::FlushAll { delay, noreply } => {
            let seq = take_seq(next_seq);
            cache.stats.cmd_flush += 1;
            if delay <= 0 {
                cache.flush_all();
            } else {
                cache.flush_at = deadline(delay, now).ok().filter(|&at| at != 0);
            }
            cache.reply(conn, seq, if noreply { Vec::new() } else { text("OK\r\n") });
        }
        Request::Stats { group } => {
            let seq = take_seq(next_seq);
            let bytes = crate::report::stats(cache, group);
            cache.reply(conn, seq, bytes);
        }
        Request::Version => {
            let seq = take_seq(next_seq);
            let mut out = Vec::new();
            response::version(&mut out, crate::VERSION);
            cache.reply(conn, seq, out);
        }
        Request::Verbosity { noreply, .. } => {
            let seq = take_seq(next_seq);
            cache.reply(conn, seq, if noreply { Vec::new() } else { text("OK\r\n") });
        }
        Request::Quit => return After::Close,
        Request::Transition { key, scheme, naive } => {
            let seq = take_seq(next_seq);
            let scheme = match Scheme::parse(scheme, cache.config.ec) {
                Ok(scheme) => scheme,
                Err(error) => {
                    cache.reply(conn, seq, format!("CLIENT_ERROR {error}\r\n").into_bytes());
                    return After::Continue;
                }
            };
            let result = crate::transition::start(cache, &key, scheme, naive, Some((conn, seq)));
            let error = match result {
                Ok(()) => None,
                Err(crate::transition::StartError::NotFound) => Some("NOT_FOUND\r\n"),
                Err(crate::transition::StartError::Busy) => {
                    Some("SERVER_ERROR the object is being written or moved; try again\r\n")
                }
                Err(crate::transition::StartError::NotOffered) => {
                    Some("SERVER_ERROR this server does not offer that scheme\r\n")
                }
            };
            if let Some(error) = error {
                cache.reply(conn, seq, text(error));
            }
        }
        meta => return crate::meta::execute(cache, conn, next_seq, meta, now),
    }
    After::Continue
}

/// One key of a get: a miss, a value from a write in flight, or a fetch.
#[allow(clippy::too_many_arguments)]
fn get_one(
    cache: &mut Cache,
    conn: ConnRef,
    (seq, end): (u64, u64),
    key: &[u8],
    with_cas: bool,
    touch_exptime: Option<i64>,
    now: u64,
) {
    cache.stats.cmd_get += 1;
    if touch_exptime.is_some() {
        cache.stats.cmd_touch += 1;
    }
    let Some(id) = cache.live(key, now) else {
        cache.stats.get_misses += 1;
        if touch_exptime.is_some() {
            cache.stats.touch_misses += 1;
        }
        cache.reply(conn, seq, Vec::new());
        return;
    };
    if let Some(exptime) = touch_exptime {
        cache.stats.touch_hits += 1;
        match deadline(exptime, now) {
            Ok(at) => cache.index.entry_mut(id).expires_at = at,
            Err(AlreadyExpired) => {
                // gat with a past time: memcached returns the item, then it is gone.
                cache.index.entry_mut(id).expires_at = 1;
            }
        }
        cache.rerecord(id);
    }
    cache.stats.get_hits += 1;
    let entry = cache.index.entry(id);
    let render = Render::Text { key: key.into(), flags: entry.flags, cas: with_cas.then_some(entry.cas) };
    let reserved = entry.value_bytes + key.len() + VALUE_LINE_BYTES;
    cache.budget.hold(conn, reserved);
    let waiter = Waiter::Get { conn, seq, render, end: Some(end), reserved };
    read_entry(cache, id, waiter, now);
}

/// Gives an entry's value to a waiter: from its write in flight (bypassing), after that write
/// (bypassing off), or by a fetch.
pub fn read_entry(cache: &mut Cache, id: crate::index::EntryId, waiter: Waiter, now: u64) {
    cache.index.touch_lru(id);
    let entry = cache.index.entry_mut(id);
    entry.fetched = true;
    let (pending, location, key) = (entry.pending, entry.location, entry.key.clone());
    crate::transition::on_read(cache, id, now);
    if let Some(task) = pending {
        if let Some(Task::Store(store)) = cache.tasks.get_mut(&task) {
            if cache.config.bypass {
                let value = store.value.clone();
                cache.stats.bypassed_gets += 1;
                cache.deliver(waiter, Ok(value));
            } else {
                store.after.push(waiter);
            }
            return;
        }
    }
    cache.fetch(&key, location, waiter);
}

/// The text of a value for its waiter.
pub fn render_value(render: &Render, value: &[u8]) -> Vec<u8> {
    match render {
        Render::Text { key, flags, cas } => {
            let mut out = Vec::with_capacity(value.len() + key.len() + 48);
            response::value(&mut out, key, *flags, value, *cas);
            out
        }
        Render::Meta { head, opaque_and_key, return_value } => {
            crate::meta::render(head, opaque_and_key, *return_value, value)
        }
    }
}

/// The replies of a storage command: memcached's text words, or meta's HD/NS/EX/NF lines.
#[derive(Clone, Debug)]
pub struct StoreReplies {
    pub stored: Vec<u8>,
    pub not_stored: Vec<u8>,
    pub exists: Vec<u8>,
    pub not_found: Vec<u8>,
}

impl StoreReplies {
    pub fn text() -> StoreReplies {
        StoreReplies {
            stored: text("STORED\r\n"),
            not_stored: text("NOT_STORED\r\n"),
            exists: text("EXISTS\r\n"),
            not_found: text("NOT_FOUND\r\n"),
        }
    }
}

/// set, add, replace, append, prepend, cas (and ms in `meta.rs`). The reply is queued at once
/// or when the write is done. `hint`: the client's scheme for this object.
#[allow(clippy::too_many_arguments)]
pub fn store_command(
    cache: &mut Cache,
    conn: ConnRef,
    seq: u64,
    mode: StoreMode,
    key: &[u8],
    flags: u32,
    exptime: i64,
    data: &[u8],
    cas_unique: u64,
    noreply: bool,
    replies: StoreReplies,
    hint: Option<Scheme>,
    now: u64,
) {
    let StoreReplies { stored: stored_text, not_stored, exists, not_found } = replies;
    let answer =
        |cache: &mut Cache, bytes: Vec<u8>| cache.reply(conn, seq, if noreply { Vec::new() } else { bytes });
    let current = cache.live(key, now);
    match mode {
        StoreMode::Add if current.is_some() => {
            // memcached bumps the existing item in the LRU on a failed add.
            cache.index.touch_lru(current.expect("checked"));
            return answer(cache, not_stored);
        }
        StoreMode::Replace if current.is_none() => return answer(cache, not_stored),
        StoreMode::Cas => match current {
            None => {
                cache.stats.cas_misses += 1;
                return answer(cache, not_found);
            }
            Some(id) if cache.index.entry(id).cas != cas_unique => {
                cache.stats.cas_badval += 1;
                return answer(cache, exists);
            }
            Some(_) => cache.stats.cas_hits += 1,
        },
        StoreMode::Append | StoreMode::Prepend => {
            let Some(_) = current else { return answer(cache, not_stored) };
            let kind = if mode == StoreMode::Append {
                RmwKind::Append(data.to_vec())
            } else {
                RmwKind::Prepend(data.to_vec())
            };
            let op = RmwOp { kind, conn, seq, noreply, meta: None, ok: stored_text };
            return rmw(cache, key, op, now);
        }
        _ => {}
    }
    let Ok(expires_at) = deadline(exptime, now) else {
        // Stored already expired: memcached answers STORED and the item is gone.
        if let Some(id) = current {
            cache.remove_entry(id);
        }
        return answer(cache, stored_text);
    };
    let pinned_scheme = hint.or_else(|| cache.config.policy.prefix_rule(key));
    let scheme = cache.config.policy.choose(key, data.len(), hint);
    let scheme = if cache.space.offers(scheme) { scheme } else { fallback_scheme(cache) };
    let ack = Ack { conn, seq, ok: stored_text, noreply };
    if let Err(error) =
        cache.store(key, Rc::from(data), flags, expires_at, scheme, pinned_scheme.is_some(), None, vec![ack])
    {
        if let Some(id) = cache.live(key, now) {
            // memcached drops the old item when a set fails for size or memory.
            if mode != StoreMode::Add {
                cache.remove_entry(id);
            }
        }
        answer(cache, format!("{error}\r\n").into_bytes());
    }
}

/// A scheme this server has, for policies that name one it does not.
pub fn fallback_scheme(cache: &Cache) -> Scheme {
    for scheme in [Scheme::Ec, Scheme::Rep2, Scheme::Rep3, Scheme::Eor, Scheme::None] {
        if cache.space.offers(scheme) {
            return scheme;
        }
    }
    unreachable!("a server offers at least one scheme")
}

fn arithmetic(
    cache: &mut Cache,
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
            cache.stats.incr_misses += 1;
        } else {
            cache.stats.decr_misses += 1;
        }
        return cache.reply(conn, seq, if noreply { Vec::new() } else { text("NOT_FOUND\r\n") });
    }
    if increment {
        cache.stats.incr_hits += 1;
    } else {
        cache.stats.decr_hits += 1;
    }
    rmw(cache, key, RmwOp { kind, conn, seq, noreply, meta: None, ok: Vec::new() }, now);
}

/// Queues a read-modify-write of `key`: at once on a value in the work table, behind the
/// chain in flight, or after a new fetch.
pub fn rmw(cache: &mut Cache, key: &[u8], op: RmwOp, now: u64) {
    if let Some(chain) = cache.rmw.get_mut(key) {
        chain.ops.push(op);
        return;
    }
    let id = cache.live(key, now).expect("the caller checked the key");
    let entry = cache.index.entry(id);
    if let Some(task) = entry.pending {
        if let Some(Task::Store(store)) = cache.tasks.get(&task) {
            let value = store.value.clone();
            return apply_rmw(cache, key, value, vec![op], true, now);
        }
    }
    let location = entry.location;
    cache.rmw.insert(key.into(), RmwChain { location, ops: vec![op] });
    cache.fetch(key, location, Waiter::Rmw { key: key.into() });
}

/// The value a read-modify-write chain waited for arrived.
pub fn rmw_fetched(cache: &mut Cache, key: &[u8], value: Result<Rc<[u8]>, String>) {
    let Some(chain) = cache.rmw.remove(key) else { return };
    let now = crate::now_unix();
    match value {
        Err(error) => {
            for op in chain.ops {
                let bytes = format!("SERVER_ERROR remote memory lost the value: {error}\r\n").into_bytes();
                cache.reply(op.conn, op.seq, if op.noreply { Vec::new() } else { bytes });
            }
        }
        Ok(value) => {
            // Still the value the chain read? Else a write that came after these ops replaced
            // it: they happened before it, and their results are answered without a write.
            let current =
                cache.live(key, now).is_some_and(|id| cache.index.entry(id).location == chain.location);
            apply_rmw(cache, key, value, chain.ops, current, now);
        }
    }
}

/// Applies ops in order to `value`; when `write`, stores the result and answers when it is
/// stored.
fn apply_rmw(cache: &mut Cache, key: &[u8], value: Rc<[u8]>, ops: Vec<RmwOp>, write: bool, now: u64) {
    let mut value: Vec<u8> = value.to_vec();
    let mut acks = Vec::new();
    let mut changed = false;
    for op in ops {
        let reply = match &op.kind {
            RmwKind::Append(data) => {
                value.extend_from_slice(data);
                changed = true;
                op.ok.clone()
            }
            RmwKind::Prepend(data) => {
                let mut joined = data.clone();
                joined.extend_from_slice(&value);
                value = joined;
                changed = true;
                op.ok.clone()
            }
            RmwKind::Incr(delta) | RmwKind::Decr(delta) => match parse_counter(&value) {
                None => {
                    let bytes = text("CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
                    cache.reply(op.conn, op.seq, if op.noreply { Vec::new() } else { bytes });
                    continue;
                }
                Some(number) => {
                    let result = match op.kind {
                        RmwKind::Incr(_) => number.wrapping_add(*delta),
                        _ => number.saturating_sub(*delta),
                    };
                    value = result.to_string().into_bytes();
                    changed = true;
                    match &op.meta {
                        Some(meta) => crate::meta::arithmetic_reply(meta, result),
                        None => format!("{result}\r\n").into_bytes(),
                    }
                }
            },
        };
        acks.push(Ack { conn: op.conn, seq: op.seq, ok: reply, noreply: op.noreply });
    }
    let id = cache.live(key, now);
    if !write || !changed || id.is_none() {
        for ack in acks {
            cache.reply(ack.conn, ack.seq, if ack.noreply { Vec::new() } else { ack.ok });
        }
        return;
    }
    let id = id.expect("checked");
    let entry = cache.index.entry(id);
    let (flags, expires_at, pinned) = (entry.flags, entry.expires_at, entry.pinned);
    let scheme = cache.index.location(entry.location).scheme;
    let scheme = if pinned { scheme } else { cache.config.policy.choose(key, value.len(), None) };
    let scheme = if cache.space.offers(scheme) { scheme } else { fallback_scheme(cache) };
    let replies: Vec<(ConnRef, u64, bool)> =
        acks.iter().map(|ack| (ack.conn, ack.seq, ack.noreply)).collect();
    if let Err(error) = cache.store(key, Rc::from(value), flags, expires_at, scheme, pinned, None, acks) {
        for (conn, seq, noreply) in replies {
            cache.reply(conn, seq, if noreply { Vec::new() } else { format!("{error}\r\n").into_bytes() });
        }
    }
}

/// memcached's counters: decimal digits only, at most 20, fitting a u64.
fn parse_counter(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

pub fn delete(cache: &mut Cache, key: &[u8], now: u64) -> bool {
    match cache.live(key, now) {
        Some(id) => {
            cache.remove_entry(id);
            cache.stats.delete_hits += 1;
            true
        }
        None => {
            cache.stats.delete_misses += 1;
            false
        }
    }
}

pub fn touch(cache: &mut Cache, key: &[u8], exptime: i64, now: u64) -> bool {
    let Some(id) = cache.live(key, now) else { return false };
    match deadline(exptime, now) {
        Ok(at) => {
            cache.index.entry_mut(id).expires_at = at;
            cache.rerecord(id);
        }
        Err(AlreadyExpired) => cache.remove_entry(id),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_decimal_u64_only() {
        assert_eq!(parse_counter(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_counter(b"18446744073709551616"), None);
        assert_eq!(parse_counter(b"12a"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b" 1"), None);
    }
}
