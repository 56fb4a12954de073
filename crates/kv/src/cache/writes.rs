//! Storing values: room under the memory limit (LRU eviction), space in the scheme's region,
//! the index switched at arrival, and the page writes (whole pages directly, chunks through the
//! chunk cache; EOR pages as data splits plus the main copy), then the acknowledgements.

use std::rc::Rc;

use super::transition;
use crate::cache::{Cache, Store, Task, FALLBACK, JOURNAL, MAIN, MAX_EVICTIONS_PER_STORE};
use crate::chunks::{Patch, PatchStep};
use crate::completion::{Ack, Completion};
use crate::error::{StoreError, ValueError};
use crate::index::{Entry, LocationId, Released};
use crate::page_client::PageClient;
use crate::pageio::{IoDone, IoKind, IoOwner, TaskId};
use crate::scheme::Scheme;
use crate::space::{class_bytes, RegionKind, SpaceError, PAGE_BYTES};

impl<P: PageClient> Cache<P> {
    // ---- storing a value -----------------------------------------------------------------

    /// Makes room for an item of `bytes`: evicts from the LRU tail while the memory limit
    /// would be passed.
    fn make_room(&mut self, item_bytes: u64) {
        while self.index.bytes_used() + item_bytes > self.config.memory_limit_bytes && self.evict_one() {}
    }

    /// Evicts the least recently used item whose value is in `kind`'s region (looking at most
    /// 1024 items up from the LRU tail).
    fn evict_one_of(&mut self, kind: RegionKind) -> bool {
        let mut candidate = self.index.lru_tail();
        for _ in 0..1024 {
            let Some(id) = candidate else { return false };
            let scheme = self.index.location(self.index.entry(id).location).scheme;
            if RegionKind::of(scheme) == kind {
                self.evict(id);
                return true;
            }
            candidate = self.index.newer(id);
        }
        false
    }

    pub(crate) fn evict_one(&mut self) -> bool {
        let Some(id) = self.index.lru_tail() else { return false };
        self.evict(id);
        true
    }

    fn evict(&mut self, id: crate::index::EntryId) {
        let entry = self.index.entry(id);
        let bytes = crate::index::item_bytes(entry.key.len(), entry.value_bytes);
        crate::stats::Stats::count_in_class(&mut self.stats.evicted_by_class, bytes);
        self.remove_entry(id);
        self.stats.evictions += 1;
    }

    /// Allocates space for a value, evicting while the scheme's region is full. Errors when
    /// nothing more can be evicted or the server has no region for `scheme`.
    pub fn allocate(
        &mut self,
        scheme: Scheme,
        bytes: usize,
    ) -> Result<(crate::space::Extent, bool), StoreError> {
        // Evicted values whose pages are still being read free their space only later: give
        // up after a bounded number of evictions rather than empty the cache. A region grows a
        // range at a time, at most once per range it has.
        let mut evictions = 0;
        loop {
            let full = match self.space.allocate(scheme, bytes) {
                Ok((extent, _)) if scheme == Scheme::Eor && !self.map_main_copies(&extent) => {
                    self.space.free_extent(scheme, &extent);
                    true
                }
                Ok(allocated) => return Ok(allocated),
                Err(SpaceError::NotOffered) => return Err(StoreError::NotOffered),
                Err(SpaceError::NeedsRange(kind)) => !self.grow(kind),
                Err(SpaceError::Full) => true,
            };
            if full {
                evictions += 1;
                if evictions > MAX_EVICTIONS_PER_STORE || !self.evict_one_of(RegionKind::of(scheme)) {
                    return Err(StoreError::OutOfMemory);
                }
            }
        }
    }

    /// Stores `value` as the new item of `key` (the index switches now; the write goes on in the
    /// background) and answers `ack` when it is in remote memory.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        key: &[u8],
        value: Rc<[u8]>,
        flags: u32,
        expires_at: u64,
        scheme: Scheme,
        pinned: bool,
        cas: Option<u64>,
        acks: Vec<Ack>,
    ) -> Result<u64, StoreError> {
        if value.len() > self.config.max_item_bytes {
            return Err(StoreError::TooLarge);
        }
        let now_unix = self.client.now_unix();
        self.reclaim_expired_tail(now_unix);
        self.make_room(crate::index::item_bytes(key.len(), value.len()));
        let (extent, fresh) = self.allocate(scheme, value.len())?;
        let value_crc = self.value_crc(key, &value);
        let location = self.index.new_location(scheme, extent, value.len(), value_crc);
        self.index.retain(location); // the store task's reference
        let cas = cas.unwrap_or_else(|| self.next_cas());
        let task = self.new_task_id();
        let mut entry = Entry::new(key, flags, expires_at, cas, value.len(), location);
        entry.pending = Some(task);
        entry.pinned = pinned;
        entry.last_access = now_unix;
        entry.window_start = entry.last_access;
        let mut released = Released::new();
        self.index.upsert(entry, &mut released);
        self.free(released);
        self.stats.count_store(scheme, value.len());
        let store = Store {
            key: key.into(),
            location,
            value,
            outstanding: 0,
            error: None,
            acks,
            after: Vec::new(),
            transition: None,
            fields: (flags, expires_at, cas),
        };
        self.tasks.insert(task, Task::Store(store));
        self.write_location(task, location, fresh);
        Ok(cas)
    }

    /// Writes the value of store task `task` to `location`'s pages and chunk.
    pub fn write_location(&mut self, task: TaskId, location: LocationId, fresh: bool) {
        let (scheme, extent) = {
            let location = self.index.location(location);
            (location.scheme, location.extent.clone())
        };
        let Some(Task::Store(store)) = self.tasks.get(&task) else { unreachable!("a store task") };
        let value = store.value.clone();
        let mut outstanding = 0;
        let mut writes: Vec<(IoKind, u64, usize, usize, u32)> = Vec::new();
        for (index, &page) in extent.pages.iter().enumerate() {
            let start = index * PAGE_BYTES;
            let end = (start + PAGE_BYTES).min(value.len());
            if scheme == Scheme::Eor {
                writes.push((IoKind::WriteData, page, start, end, index as u32));
                writes.push((IoKind::Write, self.main_page(page), start, end, index as u32 | MAIN));
            } else {
                writes.push((IoKind::Write, page, start, end, index as u32));
            }
        }
        outstanding += writes.len() as u32;
        let tail = extent.tail;
        if tail.is_some() {
            outstanding += 1;
        }
        if let Some(Task::Store(store)) = self.tasks.get_mut(&task) {
            store.outstanding = outstanding.max(1);
        }
        if outstanding == 0 {
            // An empty value has no page: it is stored as soon as the index has it.
            return self.store_part_done(task, None);
        }
        for (kind, page, start, end, part) in writes {
            self.stats.bytes_written_remote += self.io_bytes(kind, scheme) as u64;
            self.io.write(&mut self.client, kind, page, &value[start..end], IoOwner { task, part });
        }
        if let Some(chunk) = tail {
            let start = extent.pages.len() * PAGE_BYTES;
            let patch =
                Patch { offset: chunk.offset(), value: value.clone(), start, len: value.len() - start, task };
            self.write_tail(scheme, chunk, fresh, patch);
        }
    }

    /// Puts a value's tail into its chunk's page, which is read first unless `fresh`.
    fn write_tail(&mut self, scheme: Scheme, chunk: crate::space::Chunk, fresh: bool, patch: Patch) {
        debug_assert!(patch.len <= class_bytes(chunk.class) && patch.offset == chunk.offset());
        let mut ids = Vec::new();
        let step = self.chunks.patch(chunk.page, scheme, chunk.class, fresh, patch, || {
            let id = self.next_task + 1 + ids.len() as u64;
            ids.push(id);
            id
        });
        if let Some(&id) = ids.last() {
            self.next_task = id;
            self.tasks.insert(id, Task::ChunkPage);
        }
        match step {
            PatchStep::Load { io_task } => {
                let (page, part) = self.read_source(scheme, chunk.page);
                self.io.read(&mut self.client, page, IoOwner { task: io_task, part });
            }
            PatchStep::Write => self.write_chunk_page(chunk.page, scheme),
            PatchStep::Queued => {}
        }
    }

    /// A chunk page to be patched could not be read. Its other chunks' values may only be out of
    /// reach for now (a node restarting, a rebuild): the page is left as it is, and the tails
    /// that were to go into it go to chunks of other pages (or fail when there is no room).
    fn chunk_page_unreadable(&mut self, page: u64, scheme: Scheme) {
        for mut patch in self.chunks.unreadable(page) {
            let Some(Task::Store(store)) = self.tasks.get(&patch.task) else { continue };
            let location = store.location;
            let Some(old) = self.index.location(location).extent.tail else { continue };
            debug_assert_eq!(old.page, page);
            match self.space.move_chunk(scheme, old) {
                Some((chunk, fresh)) => {
                    self.index.move_tail(location, chunk);
                    patch.offset = chunk.offset();
                    self.write_tail(scheme, chunk, fresh, patch);
                }
                None => {
                    self.store_part_done(patch.task, Some(ValueError::TailPageUnreadable));
                }
            }
        }
    }

    /// Read repair of an EOR chunk page whose main copy was lost: its data splits were just
    /// read (in `slot`) for the tail of `location`; the main copy is written back through the
    /// chunk cache, so that no other write of the page can pass it. (A page in the chunk cache
    /// was not read from remote memory and needs no repair.)
    pub(crate) fn repair_eor_chunk_page(&mut self, location: LocationId, slot: usize) {
        let Some(chunk) = self.index.location(location).extent.tail else { return };
        if self.chunks.bytes(chunk.page).is_some() || self.chunks.pages.contains_key(&chunk.page) {
            return;
        }
        let io_task = self.new_task_id();
        self.tasks.insert(io_task, Task::ChunkPage);
        let data = self.io.buffer(slot).to_vec();
        self.chunks.repair(chunk.page, Scheme::Eor, chunk.class, &data, io_task);
        self.stats.repairs += 1;
        let main = self.main_page(chunk.page);
        self.io.write(&mut self.client, IoKind::Write, main, &data, IoOwner { task: io_task, part: MAIN });
    }

    /// Node bytes one page op moves (what the transition accounting counts).
    pub fn io_bytes(&self, kind: IoKind, scheme: Scheme) -> usize {
        let ec = self.config.ec;
        match kind {
            IoKind::Read | IoKind::WriteData => PAGE_BYTES,
            IoKind::WriteParity => PAGE_BYTES * ec.parity_splits / ec.data_splits,
            IoKind::Write => match RegionKind::of(scheme) {
                RegionKind::None => PAGE_BYTES,
                RegionKind::Rep2 => 2 * PAGE_BYTES,
                RegionKind::Rep3 => 3 * PAGE_BYTES,
                // An EOR value's plain writes go to its main copy (one node).
                RegionKind::Ec if scheme == Scheme::Eor => PAGE_BYTES,
                RegionKind::Ec => PAGE_BYTES * (ec.data_splits + ec.parity_splits) / ec.data_splits,
            },
        }
    }

    /// Writes a cached chunk page: in place, or first to a journal page when it is an EC or EOR
    /// page that holds acknowledged values (a torn rewrite would lose them: `crate::cache::rewrites`).
    fn write_chunk_page(&mut self, page: u64, scheme: Scheme) {
        let journaled = self.rewrites.is_some()
            && RegionKind::of(scheme) == RegionKind::Ec
            && self.chunks.pages[&page].holds_acknowledged;
        if !journaled {
            let writes = if scheme == Scheme::Eor { 2 } else { 1 };
            self.chunks.begin_write(page, writes, None);
            return self.write_chunk_page_in_place(page, scheme);
        }
        let Some(slot) = self.journal_free.pop() else {
            self.chunks.wait_for_journal(page);
            self.journal_waiting.push_back(page);
            return;
        };
        let io_task = self.chunks.pages[&page].io_task;
        let journal_page = self.journal_first_page + u64::from(slot);
        self.stats.bytes_written_remote += self.io_bytes(IoKind::Write, Scheme::Ec) as u64;
        let data = self.chunks.begin_write(page, 1, Some(slot));
        self.io.write(
            &mut self.client,
            IoKind::Write,
            journal_page,
            data,
            IoOwner { task: io_task, part: JOURNAL },
        );
    }

    /// The in-place writes of a chunk page whose write has begun (EOR: data splits and main
    /// copy). The cached page is copied once, into each write's slot.
    fn write_chunk_page_in_place(&mut self, page: u64, scheme: Scheme) {
        let io_task = self.chunks.pages[&page].io_task;
        let main = (scheme == Scheme::Eor).then(|| self.main_page(page));
        let data = &self.chunks.pages[&page].data;
        if let Some(main) = main {
            self.io.write(
                &mut self.client,
                IoKind::WriteData,
                page,
                data,
                IoOwner { task: io_task, part: 0 },
            );
            self.io.write(&mut self.client, IoKind::Write, main, data, IoOwner { task: io_task, part: MAIN });
        } else {
            self.io.write(&mut self.client, IoKind::Write, page, data, IoOwner { task: io_task, part: 0 });
        }
    }

    /// A chunk page's journal copy was written: its intent is recorded, then it goes in place.
    fn chunk_page_journaled(&mut self, page: u64, done: &mut IoDone) {
        let (scheme, slot) = {
            let cached = &self.chunks.pages[&page];
            (cached.scheme, cached.journal.expect("a journaled write holds a slot"))
        };
        let recorded = match (std::mem::replace(&mut done.result, Ok(())), self.rewrites.as_mut()) {
            (Ok(()), Some(log)) => log.record(slot, page, scheme == Scheme::Eor).map_err(|error| {
                tracing::error!(%error, "the rewrites file could not take an intent");
                ValueError::IntentNotRecorded(Rc::new(error))
            }),
            (Ok(()), None) => unreachable!("journaled only with a rewrites file"),
            (Err(error), _) => Err(ValueError::JournalNotWritten(Rc::new(error))),
        };
        // With --etcd the intent is in the state region before the page is written in place.
        let recorded = recorded.and_then(|()| {
            self.persist_rewrites().map_err(|error| {
                tracing::error!(%error, "the state region could not take an intent");
                ValueError::IntentNotRecorded(Rc::new(std::io::Error::other(error)))
            })
        });
        match recorded {
            Ok(()) => {
                let writes = if scheme == Scheme::Eor { 2 } else { 1 };
                self.chunks.journaled(page, writes);
                self.write_chunk_page_in_place(page, scheme);
            }
            // Nothing was written in place: the page holds what it held.
            Err(error) => self.chunk_page_written(page, Some(error)),
        }
    }

    /// One write of a chunk page finished (`error` if it failed); when all did, its stores are
    /// answered, its journal slot freed, and the next write starts.
    fn chunk_page_written(&mut self, page: u64, error: Option<ValueError>) {
        let Some(done) = self.chunks.write_done(page, error) else { return };
        if let Some(slot) = done.journal {
            if let Some(log) = self.rewrites.as_mut() {
                let cleared = log.clear(slot).map_err(|error| error.to_string());
                if let Err(error) = cleared.and_then(|()| self.persist_rewrites()) {
                    // Left as it is, the intent restores this same page content at a restart:
                    // harmless while the slot is not reused, so the slot stays taken.
                    tracing::error!(%error, slot, "the rewrites file could not clear an intent");
                    self.finish_stores(done.stores, done.error);
                    return;
                }
            }
            self.journal_free.push(slot);
        }
        if done.again {
            let scheme = self.chunks.pages[&page].scheme;
            self.write_chunk_page(page, scheme);
        }
        if done.journal.is_some() {
            self.start_waiting_journal();
        }
        self.finish_stores(done.stores, done.error);
    }

    fn finish_stores(&mut self, stores: Vec<TaskId>, error: Option<ValueError>) {
        for store in stores {
            self.store_part_done(store, error.clone());
        }
    }

    /// A journal slot is free: the first page still waiting for one starts its write.
    fn start_waiting_journal(&mut self) {
        while !self.journal_free.is_empty() {
            let Some(page) = self.journal_waiting.pop_front() else { return };
            if self.chunks.waits_for_journal(page) {
                let scheme = self.chunks.pages[&page].scheme;
                self.write_chunk_page(page, scheme);
            }
        }
    }

    pub(crate) fn chunk_page_done(&mut self, task: TaskId, done: &mut IoDone) {
        let Some(page) = self.chunks.page_of_task(task) else { return };
        if done.kind == IoKind::Read {
            match &done.result {
                Ok(()) => {}
                Err(error) if done.owner.part & MAIN != 0 => {
                    tracing::debug!(%error, "EOR chunk page main copy unreadable; reading the data splits");
                    self.io.read(&mut self.client, page, IoOwner { task, part: FALLBACK });
                    return;
                }
                Err(error) => {
                    tracing::warn!(page, %error, "a chunk page could not be read: new values go to other pages");
                    self.stats.unreadable_chunk_pages += 1;
                    let scheme = self.chunks.pages[&page].scheme;
                    self.chunk_page_unreadable(page, scheme);
                    return;
                }
            }
            // Copied once, from the read's slot into the cached page.
            if self.chunks.loaded(page, self.io.buffer(done.slot)) {
                let scheme = self.chunks.pages[&page].scheme;
                self.write_chunk_page(page, scheme);
            }
            return;
        }
        if done.owner.part & JOURNAL != 0 {
            return self.chunk_page_journaled(page, done);
        }
        if self.retried_as_whole_page(done) {
            return;
        }
        let error = if self.main_copy_missed(done) { None } else { ValueError::take_page(&mut done.result) };
        self.chunk_page_written(page, error);
    }

    /// An EOR page's data-only write failed (a data split's node is down and its slab not yet
    /// being rebuilt: a data-only write needs every data split). The page is written whole
    /// instead, data and parities, which needs k of k+m splits: the value is then an EC page
    /// beside its main copy, and the write succeeds within EOR's tolerance of one failure.
    /// True when the retry was started (the caller waits for it).
    fn retried_as_whole_page(&mut self, done: &IoDone) -> bool {
        if done.kind != IoKind::WriteData || done.result.is_ok() || done.owner.part & FALLBACK != 0 {
            return false;
        }
        if let Err(error) = &done.result {
            tracing::debug!(page = done.page, %error, "an EOR data-only write failed: writing the page whole");
        }
        self.stats.eor_whole_page_writes += 1;
        let data = self.io.buffer(done.slot).to_vec();
        let owner = IoOwner { task: done.owner.task, part: done.owner.part | FALLBACK };
        self.stats.bytes_written_remote += self.io_bytes(IoKind::Write, Scheme::Ec) as u64;
        self.io.write(&mut self.client, IoKind::Write, done.page, &data, owner);
        true
    }

    pub(crate) fn store_done(&mut self, task: TaskId, done: &mut IoDone) {
        if self.retried_as_whole_page(done) {
            return;
        }
        let error = if self.main_copy_missed(done) { None } else { ValueError::take_page(&mut done.result) };
        self.store_part_done(task, error);
    }

    pub(crate) fn store_part_done(&mut self, task: TaskId, error: Option<ValueError>) {
        let Some(Task::Store(store)) = self.tasks.get_mut(&task) else { return };
        if error.is_some() && store.error.is_none() {
            store.error = error;
        }
        store.outstanding -= 1;
        if store.outstanding > 0 {
            return;
        }
        let Some(Task::Store(store)) = self.tasks.remove(&task) else { unreachable!() };
        if let Some(transition) = store.transition {
            transition::rewritten(self, transition, store);
            return;
        }
        let mut store = store;
        let of_key = self.index.find(&store.key);
        let current = of_key.filter(|&id| self.index.entry(id).location == store.location);
        if store.error.is_none() {
            if let Some(id) = of_key {
                // Recorded before the reply (docs/KV.md "Restarts"): the current entry's own
                // fields, or this write's when a newer write of the key is in flight.
                let fields = match current {
                    Some(id) => {
                        let entry = self.index.entry(id);
                        (entry.flags, entry.expires_at, entry.cas)
                    }
                    None => store.fields,
                };
                if let Err(error) = self.record(id, store.location, fields) {
                    self.stats.backup_failures += 1;
                    tracing::error!(%error, "an item could not be recorded for restarts");
                    if current.is_some() {
                        store.error = Some(ValueError::NotRecorded(Rc::new(error)));
                    }
                }
            }
        }
        if let Some(id) = current {
            if store.error.is_some() {
                self.stats.failed_writes += 1;
                self.remove_entry(id);
            } else {
                self.index.entry_mut(id).pending = None;
            }
        }
        let mut released = Released::new();
        self.index.release(store.location, &mut released);
        self.free(released);
        for ack in store.acks {
            let result = match &store.error {
                None => Ok(()),
                Some(error) => Err(error.clone()),
            };
            self.completions.push_back(Completion::Stored { ack, result });
        }
        let value = match &store.error {
            None => Ok(store.value.clone()),
            Some(error) => Err(error.clone()),
        };
        for waiter in store.after {
            match (&value, current) {
                // Bypassing off: the get now reads what was written.
                (Ok(_), Some(id)) => {
                    let location = self.index.entry(id).location;
                    self.fetch(&store.key, location, waiter);
                }
                _ => self.deliver(waiter, value.clone()),
            }
        }
    }
}
