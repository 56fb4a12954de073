//! The meta commands (mg, ms, md, ma, mn, me) over the same cache as the text ones. Replies
//! are rendered with remem-memcache's meta writer; a reply that waits for remote memory is
//! rendered up front without its value (its `HD` line becomes `VA <size>` when the value
//! arrives), so no request bytes are kept.
//!
//! Stale-while-revalidate as memcached does it: `mg` vivifies a miss with `N` and hands out the
//! recache win (`W`) once, for a vivified, stale (`md ... I`) or nearly expired (`R`) item;
//! later gets see `Z`, stale items `X`; `ms ... I` with an older cas stores a stale value. The
//! marks live in the index only (a restart forgets them). Not done: `N` on `ms` (append mode).

use std::rc::Rc;

use remem_memcache::response::meta::{self, DebugInfo, MetaCommand, MetaItem, MetaStatus};
use remem_memcache::{MetaFlags, MetaSetMode, Request, StoreMode};

use crate::cache::{Cache, RmwKind, RmwOp, Waiter};
use crate::commands::{self, deadline, StoreReplies};
use crate::completion::{Ack, ArithmeticReply, ConnRef, Render};
use crate::page_client::PageClient;
use crate::reply::{arithmetic_reply, Outbox};
use crate::scheme::Scheme;
use crate::text::After;

fn item_of<P: PageClient>(cache: &Cache<P>, id: crate::index::EntryId, now: u64) -> MetaItem {
    let entry = cache.index().entry(id);
    MetaItem {
        cas: entry.cas,
        client_flags: entry.flags,
        ttl_seconds: if entry.expires_at == 0 { -1 } else { entry.expires_at.saturating_sub(now) as i64 },
        size: entry.value_bytes as u64,
        hit_before: entry.fetched,
        last_access_seconds: now.saturating_sub(entry.last_access),
        ..MetaItem::default()
    }
}

fn line(
    command: MetaCommand,
    status: MetaStatus,
    flags: &MetaFlags<'_>,
    key: &[u8],
    item: &MetaItem,
) -> Vec<u8> {
    let mut out = Vec::new();
    meta::reply(&mut out, command, status, flags, key, item, None);
    out
}

/// The client's scheme hint (`P` or `L` token), if it names a scheme this server has.
fn hint<P: PageClient>(
    cache: &Cache<P>,
    flags: &MetaFlags<'_>,
) -> Result<Option<Scheme>, crate::scheme::SchemeError> {
    match flags.scheme_hint {
        None => Ok(None),
        Some(token) => Scheme::parse(token, cache.config().ec).map(Some),
    }
}

/// One meta request as its handlers see it: where its reply goes (connection and place), its
/// key and flags, and the time it is served at.
#[derive(Clone, Copy)]
struct Call<'a> {
    conn: ConnRef,
    seq: u64,
    key: &'a [u8],
    flags: &'a MetaFlags<'a>,
    now: u64,
}

pub fn execute<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    conn: ConnRef,
    next_seq: &mut u64,
    request: Request<'_>,
    now: u64,
) -> After {
    let seq = *next_seq;
    *next_seq += 1;
    let call = |key, flags| Call { conn, seq, key, flags, now };
    match request {
        Request::MetaGet { key, flags } => meta_get(cache, out, call(&key, &flags)),
        Request::MetaSet { key, data, flags } => meta_set(cache, out, call(&key, &flags), data),
        Request::MetaDelete { key, flags } => meta_delete(cache, out, call(&key, &flags)),
        Request::MetaArithmetic { key, flags } => meta_arithmetic(cache, out, call(&key, &flags)),
        Request::MetaNoop => {
            let mut bytes = Vec::new();
            meta::noop(&mut bytes);
            out.reply(conn, seq, bytes);
        }
        Request::MetaDebug { key, base64_key } => {
            let mut bytes = Vec::new();
            match cache.live(&key, now) {
                None => meta::miss(&mut bytes),
                Some(id) => {
                    let item = item_of(cache, id, now);
                    let scheme = cache.index().location(cache.index().entry(id).location).scheme;
                    let info = DebugInfo {
                        exptime_seconds: item.ttl_seconds,
                        last_access_seconds: item.last_access_seconds,
                        cas: item.cas,
                        fetched: item.hit_before,
                        class: scheme.index() as u32,
                        size: item.size,
                    };
                    meta::debug(&mut bytes, &key, base64_key, &info);
                }
            }
            out.reply(conn, seq, bytes);
        }
        other => {
            tracing::error!(?other, "a text command reached the meta handler");
            out.reply(conn, seq, b"ERROR\r\n".to_vec());
        }
    }
    After::Continue
}

/// `ms`: a store in the mode its `M` and `C` flags give (`I` with an older cas stores a stale
/// value, see the module's description).
fn meta_set<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, call: Call<'_>, data: &[u8]) {
    let Call { conn, seq, key, flags, now } = call;
    cache.stats_mut().cmd_set += 1;
    let hint = match hint(cache, flags) {
        Ok(hint) => hint,
        Err(error) => {
            out.reply(conn, seq, format!("CLIENT_ERROR {error}\r\n").into_bytes());
            return;
        }
    };
    let mode = match (flags.set_mode(), flags.compare_cas.is_some()) {
        (MetaSetMode::Set | MetaSetMode::Replace, true) => StoreMode::Cas,
        (MetaSetMode::Set, false) => StoreMode::Set,
        (MetaSetMode::Add, _) => StoreMode::Add,
        (MetaSetMode::Append, _) => StoreMode::Append,
        (MetaSetMode::Prepend, _) => StoreMode::Prepend,
        (MetaSetMode::Replace, false) => StoreMode::Replace,
    };
    let predicted = MetaItem { cas: cache.peek_next_cas(), size: data.len() as u64, ..MetaItem::default() };
    // A set that stores nothing returns cas 0, as memcached does (`EX c0`).
    let nothing = MetaItem { size: data.len() as u64, ..MetaItem::default() };
    let replies = StoreReplies {
        stored: line(MetaCommand::Set, MetaStatus::Hd, flags, key, &predicted),
        not_stored: line(MetaCommand::Set, MetaStatus::Ns, flags, key, &nothing),
        exists: line(MetaCommand::Set, MetaStatus::Ex, flags, key, &nothing),
        not_found: line(MetaCommand::Set, MetaStatus::Nf, flags, key, &nothing),
    };
    let mut exptime = flags.exptime.unwrap_or(0);
    // `N<ttl>` in append or prepend mode: a miss is vivified, the data stored as a new item
    // with that TTL (an add, so an item that arrives first is appended to by nobody).
    let vivify = matches!(mode, StoreMode::Append | StoreMode::Prepend) && cache.live(key, now).is_none();
    let mode = match flags.vivify_exptime {
        Some(ttl) if vivify => {
            exptime = ttl;
            StoreMode::Add
        }
        _ => mode,
    };
    let client_flags = flags.client_flags.unwrap_or(0);
    let cas = flags.compare_cas.unwrap_or(0);
    // `I` with a cas older than the item's: the value is stored, but stays stale, with
    // the old item's TTL and win token (memcached's CAS_STALE).
    let stale_of = cache.live(key, now).filter(|&id| {
        let entry = cache.index().entry(id);
        flags.invalidate && flags.compare_cas.is_some_and(|cas| cas < entry.cas)
    });
    let mode = match stale_of {
        Some(id) => {
            // An absolute deadline is a valid raw exptime (beyond 30 days: unix time).
            exptime = i64::try_from(cache.index().entry(id).expires_at).unwrap_or(0);
            StoreMode::Set
        }
        None => mode,
    };
    let win_sent = stale_of.is_some_and(|id| cache.index().entry(id).win_sent);
    commands::store_command(
        cache,
        out,
        conn,
        seq,
        mode,
        key,
        client_flags,
        exptime,
        data,
        cas,
        false,
        replies,
        hint,
        now,
    );
    if stale_of.is_some() {
        if let Some(id) = cache.live(key, now) {
            let entry = cache.index_mut().entry_mut(id);
            entry.stale = true;
            entry.win_sent = win_sent;
        }
    }
}

/// `md`: removes the item, or with `I` marks it stale.
fn meta_delete<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, call: Call<'_>) {
    let Call { conn, seq, key, flags, now } = call;
    cache.stats_mut().prefixes.record(key, crate::stats::PrefixEvent::Delete);
    let status = match cache.live(key, now) {
        None => {
            cache.stats_mut().delete_misses += 1;
            MetaStatus::Nf
        }
        Some(id) if flags.compare_cas.is_some_and(|cas| cas != cache.index().entry(id).cas) => MetaStatus::Ex,
        Some(id) if flags.invalidate => {
            invalidate(cache, id, flags, now);
            MetaStatus::Hd
        }
        Some(id) => {
            cache.remove_entry(id);
            cache.stats_mut().delete_hits += 1;
            MetaStatus::Hd
        }
    };
    let bytes = line(MetaCommand::Delete, status, flags, key, &MetaItem::default());
    out.reply(conn, seq, bytes);
}

/// memcached's stale-while-revalidate on a hit: the win (`W`) goes to the first get that finds
/// the item stale (`X`) or, with `R<seconds>`, with less TTL left than that; every later get
/// sees `Z` until a store replaces the item.
fn win_flags<P: PageClient>(
    cache: &mut Cache<P>,
    id: crate::index::EntryId,
    flags: &MetaFlags<'_>,
    now: u64,
) -> (bool, bool, bool) {
    let entry = cache.index().entry(id);
    let ttl_left = entry.expires_at.saturating_sub(now);
    let recache = flags.recache_exptime.is_some_and(|seconds| {
        entry.expires_at != 0 && i64::try_from(ttl_left).unwrap_or(i64::MAX) < seconds
    });
    let (stale, sent) = (entry.stale, entry.win_sent);
    let won = (recache || stale) && !sent;
    if won {
        cache.index_mut().entry_mut(id).win_sent = true;
    }
    (won, stale, sent)
}

/// `mg` of a missing key with `N<ttl>`: an empty item is created with that TTL and this client
/// wins its recache (`W`); gets until it is stored see it empty, with `Z`.
fn vivify_on_miss<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, call: Call<'_>, vivify: i64) {
    let Call { conn, seq, key, flags, now } = call;
    // Vivified already expired: the item is gone at once; the win is still this client's.
    let expires_at = deadline(vivify, now).unwrap_or(1);
    let cas = cache.next_cas();
    let ttl_seconds = if expires_at == 0 { -1 } else { expires_at.saturating_sub(now) as i64 };
    let item = MetaItem { cas, ttl_seconds, won: true, ..MetaItem::default() };
    let hd_line = line(MetaCommand::Get, MetaStatus::Hd, flags, key, &item);
    let reply = crate::reply::meta_value(&hd_line, flags.return_value, b"");
    let scheme = cache.config().policy.choose(key, 0, None);
    let scheme = if cache.space().offers(scheme) { scheme } else { commands::fallback_scheme(cache) };
    let ack = Ack { conn, seq, ok: reply, noreply: false };
    if let Err(error) =
        cache.store(key, Rc::from(&[][..]), 0, expires_at, scheme, false, Some(cas), vec![ack])
    {
        return out.reply(conn, seq, crate::reply::refused(error));
    }
    if let Some(id) = cache.index().find(key) {
        cache.index_mut().entry_mut(id).win_sent = true;
    }
}

/// `md <key> I [T<ttl>]`: the item stays, marked stale, with a new cas (and TTL); the next get
/// wins its recache.
fn invalidate<P: PageClient>(
    cache: &mut Cache<P>,
    id: crate::index::EntryId,
    flags: &MetaFlags<'_>,
    now: u64,
) {
    let cas = cache.next_cas();
    let entry = cache.index_mut().entry_mut(id);
    entry.stale = true;
    entry.win_sent = false;
    entry.cas = cas;
    if let Some(exptime) = flags.exptime {
        entry.expires_at = deadline(exptime, now).unwrap_or(1);
    }
    cache.rerecord(id);
}

fn meta_get<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, call: Call<'_>) {
    let Call { conn, seq, key, flags, now } = call;
    cache.stats_mut().cmd_get += 1;
    let found = cache.live(key, now);
    cache.stats_mut().prefixes.record(key, crate::stats::PrefixEvent::Get { hit: found.is_some() });
    let Some(id) = found else {
        cache.stats_mut().get_misses += 1;
        if let Some(vivify) = flags.vivify_exptime {
            return vivify_on_miss(cache, out, call, vivify);
        }
        let bytes = line(MetaCommand::Get, MetaStatus::En, flags, key, &MetaItem::default());
        return out.reply(conn, seq, bytes);
    };
    cache.stats_mut().get_hits += 1;
    let (won, stale, win_already_sent) = win_flags(cache, id, flags, now);
    let item = MetaItem { won, stale, win_already_sent, ..item_of(cache, id, now) };
    if let Some(exptime) = flags.exptime {
        cache.stats_mut().cmd_touch += 1;
        cache.stats_mut().touch_hits += 1;
        match deadline(exptime, now) {
            Ok(at) => cache.index_mut().entry_mut(id).expires_at = at,
            Err(commands::AlreadyExpired) => cache.index_mut().entry_mut(id).expires_at = 1,
        }
        cache.rerecord(id);
    }
    let item = if flags.exptime.is_some() {
        MetaItem { ttl_seconds: item_of(cache, id, now).ttl_seconds, ..item }
    } else {
        item
    };
    let hd_line = line(MetaCommand::Get, MetaStatus::Hd, flags, key, &item);
    if !flags.return_value {
        // `u`: neither bumped in the LRU nor marked fetched (memcached skips the item's bump).
        if !flags.no_lru_bump {
            cache.index_mut().touch_lru(id);
            cache.index_mut().entry_mut(id).fetched = true;
        }
        return out.reply(conn, seq, hd_line);
    }
    // The reply: the HD line as `VA <size> <flags>`, the value and its `\r\n`.
    let reserved = item.size as usize + hd_line.len() + 32;
    cache.budget_mut().hold(conn, reserved);
    let render = Render::Meta { head: hd_line.into(), return_value: true };
    cache.read_entry(id, Waiter::Get { conn, seq, render, end: None, reserved }, now);
}

/// `ma` of a missing key: NF, or with `N` the item vivified at the initial value (the delta is
/// not applied), as memcached does.
fn arithmetic_miss<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, call: Call<'_>) {
    let Call { conn, seq, key, flags, now } = call;
    let Some(vivify) = flags.vivify_exptime else {
        if flags.decrement() {
            cache.stats_mut().decr_misses += 1;
        } else {
            cache.stats_mut().incr_misses += 1;
        }
        let bytes = line(MetaCommand::Arithmetic, MetaStatus::Nf, flags, key, &MetaItem::default());
        return out.reply(conn, seq, bytes);
    };
    let initial = flags.initial_value.unwrap_or(0);
    let cas = cache.next_cas();
    let (expires_at, ttl_seconds) = match deadline(vivify, now) {
        Ok(0) => (0, -1),
        Ok(at) => (at, at.saturating_sub(now) as i64),
        Err(commands::AlreadyExpired) => {
            let item = MetaItem { cas, ttl_seconds: -1, ..MetaItem::default() };
            let hd_line = line(MetaCommand::Arithmetic, MetaStatus::Hd, flags, key, &item);
            let reply = ArithmeticReply { hd_line, return_value: flags.return_value, cas: None };
            return out.reply(conn, seq, arithmetic_reply(&reply, initial));
        }
    };
    let value: Rc<[u8]> = Rc::from(initial.to_string().into_bytes());
    let item = MetaItem { cas, ttl_seconds, size: value.len() as u64, ..MetaItem::default() };
    let hd_line = line(MetaCommand::Arithmetic, MetaStatus::Hd, flags, key, &item);
    let reply = ArithmeticReply { hd_line, return_value: flags.return_value, cas: Some(cas) };
    let scheme = cache.config().policy.choose(key, value.len(), None);
    let scheme = if cache.space().offers(scheme) { scheme } else { commands::fallback_scheme(cache) };
    let ack = Ack { conn, seq, ok: arithmetic_reply(&reply, initial), noreply: false };
    if let Err(error) = cache.store(key, value, 0, expires_at, scheme, false, Some(cas), vec![ack]) {
        out.reply(conn, seq, crate::reply::refused(error));
    }
}

fn meta_arithmetic<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, call: Call<'_>) {
    let Call { conn, seq, key, flags, now } = call;
    let increment = !flags.decrement();
    let delta = flags.delta_or_default();
    let Some(id) = cache.live(key, now) else {
        return arithmetic_miss(cache, out, call);
    };
    // memcached checks C and applies T when the request arrives; the reply's c is the cas the
    // new value gets, t the TTL after T.
    if flags.compare_cas.is_some_and(|cas| cas != cache.index().entry(id).cas) {
        let bytes = line(MetaCommand::Arithmetic, MetaStatus::Ex, flags, key, &MetaItem::default());
        return out.reply(conn, seq, bytes);
    }
    if let Some(exptime) = flags.exptime {
        match deadline(exptime, now) {
            Ok(at) => cache.index_mut().entry_mut(id).expires_at = at,
            Err(commands::AlreadyExpired) => cache.index_mut().entry_mut(id).expires_at = 1,
        }
        cache.rerecord(id);
    }
    let cas = cache.next_cas();
    let item = MetaItem { cas, ..item_of(cache, id, now) };
    let hd_line = line(MetaCommand::Arithmetic, MetaStatus::Hd, flags, key, &item);
    let reply = ArithmeticReply { hd_line, return_value: flags.return_value, cas: Some(cas) };
    if increment {
        cache.stats_mut().incr_hits += 1;
    } else {
        cache.stats_mut().decr_hits += 1;
    }
    let kind = if increment { RmwKind::Incr(delta) } else { RmwKind::Decr(delta) };
    commands::rmw(
        cache,
        out,
        key,
        RmwOp { kind, conn, seq, noreply: false, meta: Some(reply), ok: Vec::new() },
        now,
    );
}
