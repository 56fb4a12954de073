//! The meta commands (mg, ms, md, ma, mn, me) over the same cache as the text ones. Replies
//! are rendered with remem-memcache's meta writer; a reply that waits for remote memory is
//! rendered up front without its value (its `HD` line becomes `VA <size>` when the value
//! arrives), so no request bytes are kept.
//!
//! Not done (memcached's stale-while-revalidate features): vivify on miss (`N`) for mg and ms,
//! recache (`R`), invalidation (`I`) and win flags; `N` works for ma.

use std::rc::Rc;

use remem_memcache::response::meta::{self, DebugInfo, MetaCommand, MetaItem, MetaStatus};
use remem_memcache::{MetaFlags, MetaSetMode, Request, StoreMode};

use crate::cache::{Cache, RmwKind, RmwOp, Waiter};
use crate::commands::{self, deadline, StoreReplies};
use crate::completion::{Ack, ArithmeticReply, ConnRef, Render};
use crate::reply::{arithmetic_reply, Outbox};
use crate::scheme::Scheme;
use crate::text::After;

fn item_of(cache: &Cache, id: crate::index::EntryId, now: u64) -> MetaItem {
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
fn hint(cache: &Cache, flags: &MetaFlags<'_>) -> Result<Option<Scheme>, crate::scheme::SchemeError> {
    match flags.scheme_hint {
        None => Ok(None),
        Some(token) => Scheme::parse(token, cache.config().ec).map(Some),
    }
}

pub fn execute(
    cache: &mut Cache,
    out: &mut Outbox,
    conn: ConnRef,
    next_seq: &mut u64,
    request: Request<'_>,
    now: u64,
) -> After {
    let seq = *next_seq;
    *next_seq += 1;
    match request {
        Request::MetaGet { key, flags } => meta_get(cache, out, conn, seq, &key, &flags, now),
        Request::MetaSet { key, data, flags } => {
            cache.stats_mut().cmd_set += 1;
            let hint = match hint(cache, &flags) {
                Ok(hint) => hint,
                Err(error) => {
                    out.reply(conn, seq, format!("CLIENT_ERROR {error}\r\n").into_bytes());
                    return After::Continue;
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
            let predicted =
                MetaItem { cas: cache.peek_next_cas(), size: data.len() as u64, ..MetaItem::default() };
            let replies = StoreReplies {
                stored: line(MetaCommand::Set, MetaStatus::Hd, &flags, &key, &predicted),
                not_stored: line(MetaCommand::Set, MetaStatus::Ns, &flags, &key, &predicted),
                exists: line(MetaCommand::Set, MetaStatus::Ex, &flags, &key, &predicted),
                not_found: line(MetaCommand::Set, MetaStatus::Nf, &flags, &key, &predicted),
            };
            let exptime = flags.exptime.unwrap_or(0);
            let client_flags = flags.client_flags.unwrap_or(0);
            let cas = flags.compare_cas.unwrap_or(0);
            commands::store_command(
                cache,
                out,
                conn,
                seq,
                mode,
                &key,
                client_flags,
                exptime,
                data,
                cas,
                false,
                replies,
                hint,
                now,
            );
        }
        Request::MetaDelete { key, flags } => {
            cache.stats_mut().prefixes.record(&key, crate::stats::PrefixEvent::Delete);
            let status = match cache.live(&key, now) {
                None => {
                    cache.stats_mut().delete_misses += 1;
                    MetaStatus::Nf
                }
                Some(id) if flags.compare_cas.is_some_and(|cas| cas != cache.index().entry(id).cas) => {
                    MetaStatus::Ex
                }
                Some(id) => {
                    cache.remove_entry(id);
                    cache.stats_mut().delete_hits += 1;
                    MetaStatus::Hd
                }
            };
            let bytes = line(MetaCommand::Delete, status, &flags, &key, &MetaItem::default());
            out.reply(conn, seq, bytes);
        }
        Request::MetaArithmetic { key, flags } => meta_arithmetic(cache, out, conn, seq, &key, &flags, now),
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

fn meta_get(
    cache: &mut Cache,
    out: &mut Outbox,
    conn: ConnRef,
    seq: u64,
    key: &[u8],
    flags: &MetaFlags<'_>,
    now: u64,
) {
    cache.stats_mut().cmd_get += 1;
    let found = cache.live(key, now);
    cache.stats_mut().prefixes.record(key, crate::stats::PrefixEvent::Get { hit: found.is_some() });
    let Some(id) = found else {
        cache.stats_mut().get_misses += 1;
        let bytes = line(MetaCommand::Get, MetaStatus::En, flags, key, &MetaItem::default());
        return out.reply(conn, seq, bytes);
    };
    cache.stats_mut().get_hits += 1;
    let item = item_of(cache, id, now);
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
        if !flags.no_lru_bump {
            cache.index_mut().touch_lru(id);
        }
        cache.index_mut().entry_mut(id).fetched = true;
        return out.reply(conn, seq, hd_line);
    }
    // The reply: the HD line as `VA <size> <flags>`, the value and its `\r\n`.
    let reserved = item.size as usize + hd_line.len() + 32;
    cache.budget_mut().hold(conn, reserved);
    let render = Render::Meta { head: hd_line.into(), return_value: true };
    cache.read_entry(id, Waiter::Get { conn, seq, render, end: None, reserved }, now);
}

fn meta_arithmetic(
    cache: &mut Cache,
    out: &mut Outbox,
    conn: ConnRef,
    seq: u64,
    key: &[u8],
    flags: &MetaFlags<'_>,
    now: u64,
) {
    let increment = !flags.decrement();
    let delta = flags.delta_or_default();
    let hd_line = line(
        MetaCommand::Arithmetic,
        MetaStatus::Hd,
        flags,
        key,
        &MetaItem { ttl_seconds: -1, ..MetaItem::default() },
    );
    let reply = ArithmeticReply { hd_line, return_value: flags.return_value };
    if cache.live(key, now).is_none() {
        let Some(vivify) = flags.vivify_exptime else {
            if increment {
                cache.stats_mut().incr_misses += 1;
            } else {
                cache.stats_mut().decr_misses += 1;
            }
            let bytes = line(MetaCommand::Arithmetic, MetaStatus::Nf, flags, key, &MetaItem::default());
            return out.reply(conn, seq, bytes);
        };
        // Vivify: the item starts at the initial value (the delta is not applied).
        let initial = flags.initial_value.unwrap_or(0);
        let Ok(expires_at) = deadline(vivify, now) else {
            return out.reply(conn, seq, arithmetic_reply(&reply, initial));
        };
        let value: Rc<[u8]> = Rc::from(initial.to_string().into_bytes());
        let scheme = cache.config().policy.choose(key, value.len(), None);
        let scheme = if cache.space().offers(scheme) { scheme } else { commands::fallback_scheme(cache) };
        let ack = Ack { conn, seq, ok: arithmetic_reply(&reply, initial), noreply: false };
        if let Err(error) = cache.store(key, value, 0, expires_at, scheme, false, None, vec![ack]) {
            out.reply(conn, seq, crate::reply::refused(error));
        }
        return;
    }
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
