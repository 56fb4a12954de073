//! The operations both protocols share (`text.rs`, `meta.rs`): stores, read-modify-writes,
//! deletes and touches, each answering in its place of the connection's reply order. Values
//! the engine fetched for a read-modify-write come back up as completions, which the
//! dispatcher (`dispatch::settle`) hands to [`rmw_fetched`]: the engine never calls into this
//! layer.
//!
//! Error texts are memcached's; a value remote memory lost gives `SERVER_ERROR`, never other
//! bytes (docs/KV.md "Semantics").

use std::rc::Rc;

use remem_memcache::{expiry_deadline, Expiry, StoreMode};

use crate::cache::{Cache, RmwKind, RmwOp};
use crate::completion::{Ack, ConnRef, Fetched};
use crate::page_client::PageClient;
use crate::reply::{self, Outbox};
use crate::scheme::Scheme;

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

pub(crate) fn text(bytes: &str) -> Vec<u8> {
    bytes.as_bytes().to_vec()
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
pub fn store_command<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
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
    let answer = |out: &mut Outbox, bytes: Vec<u8>| out.reply_unless(noreply, conn, seq, bytes);
    cache.stats_mut().prefixes.record(key, crate::stats::PrefixEvent::Set);
    let current = cache.live_for_store(key, now);
    match mode {
        StoreMode::Add if current.is_some() => {
            // memcached bumps the existing item in the LRU on a failed add.
            cache.index_mut().touch_lru(current.expect("checked"));
            return answer(out, not_stored);
        }
        StoreMode::Replace if current.is_none() => return answer(out, not_stored),
        StoreMode::Cas => match current {
            None => {
                cache.stats_mut().cas_misses += 1;
                return answer(out, not_found);
            }
            Some(id) if cache.index().entry(id).cas != cas_unique => {
                cache.stats_mut().cas_badval += 1;
                return answer(out, exists);
            }
            Some(_) => cache.stats_mut().cas_hits += 1,
        },
        StoreMode::Append | StoreMode::Prepend => {
            let Some(_) = current else { return answer(out, not_stored) };
            let kind = if mode == StoreMode::Append {
                RmwKind::Append(data.to_vec())
            } else {
                RmwKind::Prepend(data.to_vec())
            };
            let op = RmwOp { kind, conn, seq, noreply, meta: None, ok: stored_text };
            return rmw(cache, out, key, op, now);
        }
        _ => {}
    }
    let Ok(expires_at) = deadline(exptime, now) else {
        // Stored already expired: memcached answers STORED and the item is gone.
        if let Some(id) = current {
            cache.remove_entry(id);
        }
        return answer(out, stored_text);
    };
    let pinned_scheme = hint.or_else(|| cache.config().policy.prefix_rule(key));
    let scheme = cache.config().policy.choose(key, data.len(), hint);
    let scheme = if cache.space().offers(scheme) { scheme } else { fallback_scheme(cache) };
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
        answer(out, reply::refused(error));
    }
}

/// A scheme this server has, for policies that name one it does not.
pub fn fallback_scheme<P: PageClient>(cache: &Cache<P>) -> Scheme {
    for scheme in [Scheme::Ec, Scheme::Rep2, Scheme::Rep3, Scheme::Eor, Scheme::None] {
        if cache.space().offers(scheme) {
            return scheme;
        }
    }
    unreachable!("a server offers at least one scheme")
}

/// Queues a read-modify-write of `key`: at once on a value in the work table, behind the
/// chain in flight, or after a new fetch.
pub fn rmw<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, key: &[u8], op: RmwOp, now: u64) {
    if let Some((value, op)) = cache.rmw_value(key, op, now) {
        apply_rmw(cache, out, key, value, vec![op], true, now);
    }
}

/// The value a read-modify-write chain waited for arrived (the dispatcher hands it over from
/// the engine's completions, before the next request is looked at).
pub fn rmw_fetched<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, key: &[u8], value: Fetched) {
    let now = cache.now_unix();
    let Some((ops, current)) = cache.take_rmw_chain(key, now) else { return };
    match value {
        Err(error) => {
            for op in ops {
                out.reply_unless(op.noreply, op.conn, op.seq, reply::lost_value(&error));
            }
        }
        Ok(value) => {
            // Not the key's value any more: a write that came after these ops replaced it. They
            // happened before it, and their results are answered without a write.
            apply_rmw(cache, out, key, value, ops, current, now);
        }
    }
}

/// Applies ops in order to `value`; when `write`, stores the result and answers when it is
/// stored.
fn apply_rmw<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    key: &[u8],
    value: Rc<[u8]>,
    ops: Vec<RmwOp>,
    write: bool,
    now: u64,
) {
    let mut value: Vec<u8> = value.to_vec();
    let mut acks = Vec::new();
    let mut changed = false;
    let mut cas = None;
    for op in ops {
        cas = op.meta.as_ref().and_then(|meta| meta.cas).or(cas);
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
                    out.reply_unless(op.noreply, op.conn, op.seq, bytes);
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
                        Some(meta) => reply::arithmetic_reply(meta, result),
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
            out.reply_unless(ack.noreply, ack.conn, ack.seq, ack.ok);
        }
        return;
    }
    let id = id.expect("checked");
    let entry = cache.index().entry(id);
    let (flags, expires_at, pinned) = (entry.flags, entry.expires_at, entry.pinned);
    let scheme = cache.index().location(entry.location).scheme;
    let scheme = if pinned { scheme } else { cache.config().policy.choose(key, value.len(), None) };
    let scheme = if cache.space().offers(scheme) { scheme } else { fallback_scheme(cache) };
    let replies: Vec<(ConnRef, u64, bool)> =
        acks.iter().map(|ack| (ack.conn, ack.seq, ack.noreply)).collect();
    if let Err(error) = cache.store(key, Rc::from(value), flags, expires_at, scheme, pinned, cas, acks) {
        for (conn, seq, noreply) in replies {
            out.reply_unless(noreply, conn, seq, reply::refused(error));
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

pub fn delete<P: PageClient>(cache: &mut Cache<P>, key: &[u8], now: u64) -> bool {
    cache.stats_mut().prefixes.record(key, crate::stats::PrefixEvent::Delete);
    match cache.live(key, now) {
        Some(id) => {
            cache.remove_entry(id);
            cache.stats_mut().delete_hits += 1;
            true
        }
        None => {
            cache.stats_mut().delete_misses += 1;
            false
        }
    }
}

/// Removes the item of `key`, if any, counting no delete: what memcached does to the old
/// item of a `set` (or `ms`) it refuses as too large, so that no stale value outlives it.
pub fn unlink<P: PageClient>(cache: &mut Cache<P>, key: &[u8], now: u64) {
    if let Some(id) = cache.live(key, now) {
        cache.remove_entry(id);
    }
}

pub fn touch<P: PageClient>(cache: &mut Cache<P>, key: &[u8], exptime: i64, now: u64) -> bool {
    let Some(id) = cache.live(key, now) else { return false };
    match deadline(exptime, now) {
        Ok(at) => {
            cache.index_mut().entry_mut(id).expires_at = at;
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
