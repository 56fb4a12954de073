//! Moving one object to another scheme (seed 003 §2.4, §4.2, Table 1), by command or by the
//! hotness policy.
//!
//! - EOR -> EC in place: read the main copy, write only the m parities of each page (the data
//!   splits are already the page's EC data splits): (k+m)/k S of I/O instead of (2k+m)/k S.
//! - EC -> EOR in place: read the data splits, write the main copy: 2S (r S, r = 2).
//! - Everything else, and `naive`: read the value, write it whole to a new place in the new
//!   scheme, switch the entry.
//!
//! Values with a chunk tail always move naively: a chunk page is shared with other objects.
//!
//! A transition holds a reference to the location it reads, so nothing it reads is reused
//! under it. It switches the entry only if the entry still names that location when it ends: a
//! write that arrived meanwhile wins and the transition's work is dropped (seed 003 §4.3.3 lets
//! the later one fail; a cache's last writer should win).

use crate::cache::{Cache, Store, Task, Transition, Waiter, FALLBACK, MAIN};
use crate::completion::{Ack, Completion, ConnRef, Fetched, Moved};
use crate::error::{StartError, ValueError};
use crate::index::Released;
use crate::page_client::PageClient;
use crate::pageio::{IoDone, IoKind, IoOwner, TaskId};
use crate::scheme::Scheme;
use crate::space::PAGE_BYTES;

impl<P: PageClient> Cache<P> {
    /// A page op of an in-place transition finished (the engine's completion loop).
    pub(crate) fn transition_io_done(&mut self, task: TaskId, done: &mut IoDone) {
        io_done(self, task, done);
    }

    /// The value a naive transition waited for arrived (or could not be read).
    pub(crate) fn transition_fetched(&mut self, task: TaskId, value: Fetched) {
        fetched(self, task, value);
    }

    /// A read of an entry: counts toward its hotness, which may move it out of EC.
    pub(crate) fn count_read(&mut self, id: crate::index::EntryId, now: u64) {
        on_read(self, id, now);
    }

    /// Housekeeping: cold objects near the LRU tail move to EC.
    pub(crate) fn cool_down(&mut self, now: u64) {
        cool_down(self, now);
    }
}

/// Starts moving `key` to `to`, as a task of the work table. `reply`: where the
/// [`Completion::Transitioned`] goes (none for the hotness policy's moves).
pub fn start<P: PageClient>(
    cache: &mut Cache<P>,
    key: &[u8],
    to: Scheme,
    naive: bool,
    reply: Option<(ConnRef, u64)>,
) -> Result<(), StartError> {
    let now = cache.now_unix();
    let id = cache.live(key, now).ok_or(StartError::NotFound)?;
    let entry = cache.index.entry(id);
    if entry.pending.is_some() || entry.moving {
        return Err(StartError::Busy);
    }
    if !cache.space.offers(to) {
        return Err(StartError::NotOffered);
    }
    let from = entry.location;
    let (from_scheme, extent) = {
        let location = cache.index.location(from);
        (location.scheme, location.extent.clone())
    };
    let task = cache.new_task_id();
    let mut transition = Transition {
        key: key.into(),
        from,
        from_scheme,
        to,
        started: cache.client.now(),
        bytes_read: 0,
        bytes_written: 0,
        reply,
        outstanding: 0,
        error: None,
        background: reply.is_none(),
        in_place: false,
    };
    if from_scheme == to {
        cache.tasks.insert(task, Task::Transition(transition));
        finish(cache, task);
        return Ok(());
    }
    cache.index.retain(from);
    cache.index.entry_mut(id).moving = true;
    let in_place = !naive
        && extent.tail.is_none()
        && matches!((from_scheme, to), (Scheme::Eor, Scheme::Ec) | (Scheme::Ec, Scheme::Eor));
    if transition.background {
        cache.background_transitions += 1;
    }
    transition.in_place = in_place;
    if in_place {
        transition.outstanding = extent.pages.len() as u32;
        cache.tasks.insert(task, Task::Transition(transition));
        for (index, &page) in extent.pages.iter().enumerate() {
            // EOR -> EC reads the main copy; EC -> EOR reads the data splits.
            let (read_page, part) = if from_scheme == Scheme::Eor {
                let (source, part) = cache.read_source(Scheme::Eor, page);
                (source, index as u32 | part)
            } else {
                (page, index as u32)
            };
            cache.io.read(&mut cache.client, read_page, IoOwner { task, part });
        }
        if extent.pages.is_empty() {
            finish(cache, task);
        }
    } else {
        cache.tasks.insert(task, Task::Transition(transition));
        cache.fetch(key, from, Waiter::Transition { task });
    }
    Ok(())
}

/// A page op of an in-place transition finished.
fn io_done<P: PageClient>(cache: &mut Cache<P>, task: TaskId, done: &mut IoDone) {
    let Some(Task::Transition(transition)) = cache.tasks.get_mut(&task) else { return };
    let index = (done.owner.part & 0x00ff_ffff) as usize;
    let page = cache.index.location(transition.from).extent.pages[index];
    match (&done.result, done.kind) {
        (Err(_), IoKind::Read) if done.owner.part & MAIN != 0 => {
            // The main copy is gone: read the data splits instead.
            cache.io.read(&mut cache.client, page, IoOwner { task, part: index as u32 | FALLBACK });
            return;
        }
        (Err(_), _) => {
            let error = ValueError::take_page(&mut done.result);
            if transition.error.is_none() {
                transition.error = error;
            }
            transition.outstanding -= 1;
        }
        (Ok(()), IoKind::Read) => {
            transition.bytes_read += PAGE_BYTES as u64;
            let bytes = cache.io.buffer(done.slot).to_vec();
            let main = cache.main_first_page.map(|first| first + (page - cache.ec_first_page));
            let write = match transition.to {
                // EOR -> EC: the parities, or the whole page if its data splits were lost.
                Scheme::Ec if cache.client.engine().page_is_unreadable(page) => Some((IoKind::Write, page)),
                Scheme::Ec if cache.client.engine().page_is_parity_stale(page) => {
                    Some((IoKind::WriteParity, page))
                }
                Scheme::Ec => None,
                // EC -> EOR: the main copy.
                _ => Some((IoKind::Write, main.expect("EOR is offered"))),
            };
            match write {
                None => transition.outstanding -= 1,
                Some((kind, target)) => {
                    let written = match kind {
                        IoKind::Write if transition.to == Scheme::Ec => {
                            cache.io_bytes(IoKind::Write, Scheme::Ec)
                        }
                        IoKind::Write => PAGE_BYTES,
                        kind => cache.io_bytes(kind, Scheme::Ec),
                    };
                    if let Some(Task::Transition(transition)) = cache.tasks.get_mut(&task) {
                        transition.bytes_written += written as u64;
                    }
                    let part = index as u32
                        | if kind == IoKind::Write && transition_to(cache, task) != Scheme::Ec {
                            MAIN
                        } else {
                            0
                        };
                    cache.io.write(&mut cache.client, kind, target, &bytes, IoOwner { task, part });
                }
            }
        }
        (Ok(()), _) => transition.outstanding -= 1,
    }
    if let Some(Task::Transition(transition)) = cache.tasks.get(&task) {
        if transition.outstanding == 0 {
            finish(cache, task);
        }
    }
}

fn transition_to<P: PageClient>(cache: &Cache<P>, task: TaskId) -> Scheme {
    match cache.tasks.get(&task) {
        Some(Task::Transition(transition)) => transition.to,
        _ => Scheme::Ec,
    }
}

/// The value of a naive transition was read: write it in the new scheme.
fn fetched<P: PageClient>(cache: &mut Cache<P>, task: TaskId, value: Fetched) {
    let Some(Task::Transition(transition)) = cache.tasks.get_mut(&task) else { return };
    let value = match value {
        Ok(value) => value,
        Err(error) => {
            transition.error = Some(error);
            return finish(cache, task);
        }
    };
    let pages = value.len().div_ceil(PAGE_BYTES) as u64;
    transition.bytes_read += pages * PAGE_BYTES as u64;
    let to = transition.to;
    let key = transition.key.clone();
    let (extent, fresh) = match cache.allocate(to, value.len()) {
        Ok(allocated) => allocated,
        Err(error) => {
            if let Some(Task::Transition(transition)) = cache.tasks.get_mut(&task) {
                transition.error = Some(ValueError::NoRoom(error));
            }
            return finish(cache, task);
        }
    };
    let value_crc = cache.value_crc(&key, &value);
    let location = cache.index.new_location(to, extent, value.len(), value_crc);
    let written = match to {
        Scheme::Eor => 2 * pages * PAGE_BYTES as u64,
        _ => pages * cache.io_bytes(IoKind::Write, to) as u64,
    };
    if let Some(Task::Transition(transition)) = cache.tasks.get_mut(&task) {
        transition.bytes_written += written;
    }
    let store_task = cache.new_task_id();
    let store = Store {
        key,
        location,
        value,
        outstanding: 0,
        error: None,
        acks: Vec::<Ack>::new(),
        after: Vec::new(),
        transition: Some(task),
        fields: (0, 0, 0),
    };
    cache.tasks.insert(store_task, Task::Store(store));
    cache.write_location(store_task, location, fresh);
}

/// The rewrite of a naive transition is in remote memory: switch the entry if it still names
/// the old place.
pub fn rewritten<P: PageClient>(cache: &mut Cache<P>, task: TaskId, store: Store) {
    let mut released = Released::new();
    let switched = match (&store.error, cache.index.find(&store.key)) {
        (None, Some(id)) => {
            let entry = cache.index.entry(id);
            let from = match cache.tasks.get(&task) {
                Some(Task::Transition(transition)) => transition.from,
                _ => 0,
            };
            if entry.location == from && entry.pending.is_none() {
                let entry = cache.index.entry_mut(id);
                entry.location = store.location;
                entry.moving = false;
                cache.index.release(from, &mut released);
                cache.rerecord(id);
                true
            } else {
                false
            }
        }
        _ => false,
    };
    if !switched {
        cache.index.release(store.location, &mut released);
    }
    cache.free(released);
    if let Some(Task::Transition(transition)) = cache.tasks.get_mut(&task) {
        if let Some(error) = store.error {
            transition.error = Some(error);
        }
    }
    finish(cache, task);
}

fn finish<P: PageClient>(cache: &mut Cache<P>, task: TaskId) {
    let Some(Task::Transition(transition)) = cache.tasks.remove(&task) else { return };
    if transition.background {
        cache.background_transitions -= 1;
    }
    if let Some(id) = cache.index.find(&transition.key) {
        if cache.index.entry(id).location == transition.from {
            cache.index.entry_mut(id).moving = false;
        }
    }
    let mut released = Released::new();
    if transition.from_scheme != transition.to {
        // In place: the same pages now carry the new scheme.
        if transition.error.is_none() {
            // Only while the pages still are the entry's: a write that arrived meanwhile won.
            if transition.in_place && cache.index.location(transition.from).scheme == transition.from_scheme {
                cache.index.set_scheme(transition.from, transition.to);
                if let Some(id) = cache.index.find(&transition.key) {
                    if cache.index.entry(id).location == transition.from {
                        cache.rerecord(id);
                    }
                }
            }
        }
        cache.index.release(transition.from, &mut released);
    }
    cache.free(released);
    let micros = cache.client.now().saturating_duration_since(transition.started).as_micros();
    match &transition.error {
        None => {
            cache.stats.count_transition(
                transition.from_scheme,
                transition.to,
                transition.bytes_read,
                transition.bytes_written,
            );
        }
        Some(error) => {
            tracing::warn!(key = %String::from_utf8_lossy(&transition.key), %error, "transition failed")
        }
    }
    if let Some((conn, seq)) = transition.reply {
        let result = match transition.error {
            None => Ok(Moved {
                bytes_read: transition.bytes_read,
                bytes_written: transition.bytes_written,
                micros,
            }),
            Some(error) => Err(error),
        };
        cache.completions.push_back(Completion::Transitioned { conn, seq, result });
    }
}

/// Hotness: an EC object read often moves back to its size's scheme.
fn on_read<P: PageClient>(cache: &mut Cache<P>, id: crate::index::EntryId, now: u64) {
    let policy = &cache.config.policy;
    let window = policy.hot_window.as_secs().max(1);
    let entry = cache.index.entry(id);
    let adaptive = policy.adaptive(&entry.key, entry.pinned);
    let hot_scheme = policy.by_size(entry.value_bytes);
    let hot_reads = policy.hot_reads;
    let entry = cache.index.entry_mut(id);
    if now >= entry.window_start + window {
        entry.window_start = now;
        entry.reads_in_window = 0;
    }
    entry.reads_in_window += 1;
    entry.last_access = now;
    let scheme = cache.index.location(cache.index.entry(id).location).scheme;
    if adaptive
        && scheme == Scheme::Ec
        && hot_scheme != Scheme::Ec
        && cache.index.entry(id).reads_in_window >= hot_reads
        && cache.background_transitions < cache.config.max_background_transitions
    {
        let key = cache.index.entry(id).key.clone();
        let _ = start(cache, &key, hot_scheme, false, None);
    }
}

/// Cold objects (not read for `cold_after`) near the LRU tail move to EC.
fn cool_down<P: PageClient>(cache: &mut Cache<P>, now: u64) {
    let policy = cache.config.policy.clone();
    if policy.hot_reads == 0 || policy.fixed.is_some() {
        return;
    }
    let cold_after = policy.cold_after.as_secs();
    let mut candidate = cache.index.lru_tail();
    let mut looked = 0;
    let mut moves = Vec::new();
    while let Some(id) = candidate {
        if looked == 64
            || cache.background_transitions + moves.len() >= cache.config.max_background_transitions
        {
            break;
        }
        looked += 1;
        let entry = cache.index.entry(id);
        let scheme = cache.index.location(entry.location).scheme;
        if scheme != Scheme::Ec
            && entry.pending.is_none()
            && policy.adaptive(&entry.key, entry.pinned)
            && now >= entry.last_access + cold_after
            && cache.space.offers(Scheme::Ec)
        {
            moves.push(entry.key.clone());
        }
        candidate = cache.index.newer(id);
    }
    for key in moves {
        let _ = start(cache, &key, Scheme::Ec, false, None);
    }
}
