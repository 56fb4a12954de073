//! The cache, the kv's engine: index, space, work table and the tasks that move values between
//! the server and remote memory. No sockets and no protocol: operations come in as calls from
//! the protocol layer (`commands.rs`, `text.rs`, `meta.rs`), what finishes leaves as typed
//! [`Completion`]s in [`Cache::completions`] named by (connection, sequence number) for the
//! dispatcher to answer, and page I/O goes through [`PageIo`] over the page client `P` (a
//! [`PageClient`]: the poll driver, or the simulator's adapter in tests). Reads
//! (`reads.rs`), stores (`writes.rs`), transitions between schemes (`transition.rs`, tasks in the same work table),
//! the backup region's records (`durability.rs`) and the rewrite journal (`rewrites.rs`) are
//! further `impl Cache` blocks in this module's children.
//!
//! The work table (seed 003 §4.3.2) is three things here:
//! - an entry whose write is in flight keeps its value in its store task: a get is answered from
//!   it (data bypassing) instead of reading pages that are being written;
//! - one fetch per location: gets of a value that is being fetched wait for that fetch;
//! - one read-modify-write chain per key: appends, prepends, incr and decr that arrive while the
//!   value is being fetched queue behind it and are applied in order.
//!
//! Every write goes to a new place (pages and chunks are never overwritten while an entry names
//! them), and the index switches to it in arrival order, so concurrent writes of one key never
//! interleave their splits and the last one to arrive wins (docs/KV.md "Semantics").

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use remem_client::PollClient;

pub mod durability;
pub mod growth;
pub mod mirror;
pub mod open;
mod reads;
pub mod rewrites;
mod scrub;
pub mod transition;
mod writes;

use crate::chunks::ChunkCache;
use crate::completion::{Ack, ArithmeticReply, Completion, ConnRef, Render};
use crate::error::ValueError;
use crate::index::{EntryId, Index, LocationId, Released};
use crate::page_client::PageClient;
use crate::pageio::{IoDone, IoKind, PageIo, TaskId};
use crate::scheme::{EcShape, Policy, Scheme};
use crate::space::{RegionKind, Space};
use crate::stats::Stats;

/// Part numbers of an op: whole pages are 0.., the tail is [`TAIL`]; [`MAIN`] marks the EOR
/// main copy and [`FALLBACK`] a read of the data splits after the main copy failed.
pub const TAIL: u32 = 0x00ff_ffff;
pub const MAIN: u32 = 1 << 30;
pub const FALLBACK: u32 = 1 << 29;
/// A chunk page's journal copy (`crate::cache::rewrites`).
pub const JOURNAL: u32 = 1 << 28;
const PART_MASK: u32 = 0x00ff_ffff;
/// The owner of read-repair writes (their completion needs nothing).
pub const REPAIR_TASK: TaskId = 1;
/// Most items one store evicts to find room in its scheme's region.
pub(crate) const MAX_EVICTIONS_PER_STORE: usize = 256;
/// Items a store looks at from the LRU tail for expired ones to reclaim (memcached's
/// lru_pull_tail searches 5).
const RECLAIM_SEARCH: usize = 5;

#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub memory_limit_bytes: u64,
    pub max_item_bytes: usize,
    pub policy: Policy,
    pub ec: EcShape,
    pub bypass: bool,
    /// Transitions the hotness policy runs at once.
    pub max_background_transitions: usize,
}

#[derive(Debug)]
pub enum Waiter {
    Get {
        conn: ConnRef,
        seq: u64,
        render: Render,
        /// The place of the text get's `END`: a lost value's `SERVER_ERROR` ends the response,
        /// as memcached's does, so nothing of it may follow (a client reads `SERVER_ERROR` as
        /// the whole answer, and a later `END` would be taken for the next command's).
        /// `None` for a meta get, whose one line is the whole answer anyway.
        end: Option<u64>,
        /// Bytes reserved in [`Cache::budget`] for the reply (`reply::Out::reserved`).
        reserved: usize,
    },
    /// A read-modify-write chain of this key waits for the value.
    Rmw { key: Box<[u8]> },
    /// A transition waits for the value.
    Transition { task: TaskId },
    /// The scrub of EOR main copies (`scrub.rs`): the read's repair is the point, the value
    /// is dropped.
    Scrub,
}

#[derive(Debug)]
pub struct Fetch {
    key: Box<[u8]>,
    location: LocationId,
    scheme: Scheme,
    value: Rc<[u8]>,
    outstanding: u32,
    error: Option<ValueError>,
    waiters: Vec<Waiter>,
    shared: bool,
    /// An EOR value read again from its data splits: its main copy's bytes did not match the
    /// restored record (a main copy on a replaced node reads as a never-written page after a
    /// restart, since the client that knew it lost lived in the previous process).
    from_data_splits: bool,
}

impl Fetch {
    /// The value being assembled: the fetch's own until it is delivered.
    fn value_mut(&mut self) -> &mut [u8] {
        Rc::get_mut(&mut self.value).expect("a fetch's value is shared only once delivered")
    }
}

#[derive(Debug)]
pub struct Store {
    key: Box<[u8]>,
    location: LocationId,
    value: Rc<[u8]>,
    outstanding: u32,
    error: Option<ValueError>,
    acks: Vec<Ack>,
    /// Gets that wait for the write to finish (bypassing off).
    after: Vec<Waiter>,
    /// The store is a transition's rewrite: the entry is switched by the transition.
    transition: Option<TaskId>,
    /// Flags, expiry and cas the item had when this write arrived (for its backup record if
    /// a newer write of the key is still in flight when this one completes).
    fields: (u32, u64, u64),
}

#[derive(Debug)]
pub enum Task {
    Fetch(Fetch),
    Store(Store),
    /// I/O of a cached chunk page (see [`ChunkCache`]).
    ChunkPage,
    Transition(Transition),
}

/// A move of one object to another scheme in flight (`transition.rs`).
#[derive(Debug)]
pub struct Transition {
    key: Box<[u8]>,
    from: LocationId,
    from_scheme: Scheme,
    to: Scheme,
    started: Instant,
    bytes_read: u64,
    bytes_written: u64,
    reply: Option<(ConnRef, u64)>,
    outstanding: u32,
    error: Option<ValueError>,
    background: bool,
    /// Same pages, new scheme (EOR <-> EC).
    in_place: bool,
}

/// A queued read-modify-write.
#[derive(Debug)]
pub struct RmwOp {
    pub kind: RmwKind,
    pub conn: ConnRef,
    pub seq: u64,
    pub noreply: bool,
    /// Meta arithmetic: how to render the result.
    pub meta: Option<ArithmeticReply>,
    /// The reply of an append or prepend that succeeds.
    pub ok: Vec<u8>,
}

#[derive(Debug, Clone)]
pub enum RmwKind {
    Append(Vec<u8>),
    Prepend(Vec<u8>),
    Incr(u64),
    Decr(u64),
}

#[derive(Debug)]
pub struct RmwChain {
    location: LocationId,
    ops: Vec<RmwOp>,
}

pub struct Cache<P: PageClient = PollClient> {
    client: P,
    io: PageIo,
    index: Index,
    space: Space,
    chunks: ChunkCache,
    tasks: HashMap<TaskId, Task>,
    next_task: TaskId,
    fetch_of_location: HashMap<LocationId, TaskId>,
    rmw: HashMap<Box<[u8]>, RmwChain>,
    config: CacheConfig,
    stats: Stats,
    next_cas: u64,
    /// What finished, for the dispatcher to answer (`dispatch::settle`): the engine hands
    /// completions up, it never calls up.
    completions: std::collections::VecDeque<Completion>,
    /// First page of the EC region and of the EOR main copies (same offsets).
    ec_first_page: u64,
    main_first_page: Option<u64>,
    /// EC pages of EOR values whose main copy's last write failed (its node down, not yet
    /// replaced): the main copy may hold an earlier value's bytes, so reads go to the data
    /// splits (`read_source`) until a write of the main copy succeeds (a store or a read repair).
    /// Empty but during failures; a restart forgets it, and restored values are checked against
    /// their records instead.
    stale_main: std::collections::HashSet<u64>,
    /// The walk that writes back main copies lost or stale since a failure (`scrub.rs`).
    scrub: scrub::Scrub,
    background_transitions: usize,
    /// `flush_all` with a delay: at this unix second every item stored before it goes.
    flush_at: Option<u64>,
    started: Instant,
    done_buffer: Vec<IoDone>,
    /// Where acknowledged items are recorded for a restart (`crate::cache::durability`); none with
    /// `remem kv --ephemeral`.
    backup: Option<crate::backup::Backup>,
    /// Rewrites of EC chunk pages go through a journal page first (`crate::cache::rewrites`): the
    /// first of the EC region's journal pages, the free journal slots, the pages waiting for
    /// one, and the intents file (none with `--ephemeral`: nothing outlives a kill then).
    journal_first_page: u64,
    journal_free: Vec<u32>,
    journal_waiting: std::collections::VecDeque<u64>,
    rewrites: Option<crate::cache::rewrites::RewriteLog>,
    /// Bytes held for replies, per connection and in all (`crate::budget`): gets reserve their
    /// value here before they fetch it, the server counts what waits to be written.
    budget: crate::budget::OutputBudget,
    /// Ranges mapped as values need them and given back when empty (`growth.rs`).
    growth: growth::Growth,
    /// The backup region and rewrites log copied to a remem region (`mirror.rs`, `--etcd`).
    mirror: Option<mirror::StateMirror>,
}

impl<P: PageClient> Cache<P> {
    pub fn new(client: P, space: Space, config: CacheConfig, main_first_page: Option<u64>) -> Cache<P> {
        // EOR's main copies lie beside the EC region page for page from its first page.
        let client_now = client.now();
        let ec_first_page = space.grid(RegionKind::Ec).map(|grid| grid.origin).unwrap_or(0);
        Cache {
            client,
            io: PageIo::new(),
            index: Index::new(),
            space,
            chunks: ChunkCache::default(),
            tasks: HashMap::new(),
            next_task: 1,
            fetch_of_location: HashMap::new(),
            rmw: HashMap::new(),
            config,
            stats: Stats::default(),
            next_cas: 1,
            completions: Default::default(),
            ec_first_page,
            main_first_page,
            stale_main: Default::default(),
            scrub: Default::default(),
            background_transitions: 0,
            flush_at: None,
            started: client_now,
            done_buffer: Vec::new(),
            backup: None,
            journal_first_page: 0,
            journal_free: Vec::new(),
            journal_waiting: Default::default(),
            rewrites: None,
            budget: crate::budget::OutputBudget::new(crate::budget::DEFAULT_OUTPUT_BUDGET_BYTES),
            growth: growth::Growth::default(),
            mirror: None,
        }
    }

    // ---- what the layers above read and change -------------------------------------------

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The index, to change an entry's fields or its LRU place (the protocol layer's gets,
    /// touches and failed adds).
    pub fn index_mut(&mut self) -> &mut Index {
        &mut self.index
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }

    pub fn budget(&self) -> &crate::budget::OutputBudget {
        &self.budget
    }

    pub fn budget_mut(&mut self) -> &mut crate::budget::OutputBudget {
        &mut self.budget
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    pub fn io(&self) -> &PageIo {
        &self.io
    }

    pub fn chunks(&self) -> &ChunkCache {
        &self.chunks
    }

    pub fn client(&self) -> &P {
        &self.client
    }

    pub fn client_mut(&mut self) -> &mut P {
        &mut self.client
    }

    /// The wall clock in unix seconds, as the page client tells it (simulated time under the
    /// simulator): every expiry and hotness decision reads this.
    pub fn now_unix(&self) -> u64 {
        self.client.now_unix()
    }

    pub fn backup(&self) -> Option<&crate::backup::Backup> {
        self.backup.as_ref()
    }

    pub fn backup_mut(&mut self) -> Option<&mut crate::backup::Backup> {
        self.backup.as_mut()
    }

    /// Records acknowledged items in `backup` from now on (`durability.rs`).
    pub fn set_backup(&mut self, backup: crate::backup::Backup) {
        self.backup = Some(backup);
    }

    /// Rewrites of EC chunk pages go through `log`'s intents from now on (`rewrites.rs`).
    pub fn set_rewrites(&mut self, log: rewrites::RewriteLog) {
        self.rewrites = Some(log);
    }

    /// Transitions the hotness policy has in flight.
    pub fn background_transitions(&self) -> usize {
        self.background_transitions
    }

    /// `flush_all` with a delay: every item stored before unix second `at` goes then.
    pub fn flush_at(&mut self, at: Option<u64>) {
        self.flush_at = at;
    }

    /// The next thing the engine finished, oldest first (`dispatch::settle`).
    pub fn next_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Where a read-modify-write of `key` (a live key) gets its value: at once from a write of
    /// it in the work table (returned with the op), or later as a [`Completion::RmwValue`]: the
    /// op queues behind the chain of the key in flight, or starts one with a fetch.
    pub fn rmw_value(&mut self, key: &[u8], op: RmwOp, now: u64) -> Option<(Rc<[u8]>, RmwOp)> {
        if let Some(chain) = self.rmw.get_mut(key) {
            chain.ops.push(op);
            return None;
        }
        let id = self.live(key, now).expect("the caller checked the key");
        let entry = self.index.entry(id);
        if let Some(task) = entry.pending {
            if let Some(Task::Store(store)) = self.tasks.get(&task) {
                return Some((store.value.clone(), op));
            }
        }
        let location = entry.location;
        self.rmw.insert(key.into(), RmwChain { location, ops: vec![op] });
        self.fetch(key, location, Waiter::Rmw { key: key.into() });
        None
    }

    /// The ops of the read-modify-write chain of `key`, whose value arrived, and whether that value is
    /// still the key's (else a write that came after the chain's ops replaced it).
    pub fn take_rmw_chain(&mut self, key: &[u8], now: u64) -> Option<(Vec<RmwOp>, bool)> {
        let chain = self.rmw.remove(key)?;
        let current = self.live(key, now).is_some_and(|id| self.index.entry(id).location == chain.location);
        Some((chain.ops, current))
    }

    /// The EC region's journal pages for chunk page rewrites start at `first_page`
    /// (`rewrites.rs`); all of them are free.
    pub fn set_journal(&mut self, first_page: u64) {
        self.journal_first_page = first_page;
        self.journal_free = (0..rewrites::JOURNAL_PAGES as u32).rev().collect();
    }

    pub fn new_task_id(&mut self) -> TaskId {
        self.next_task += 1;
        self.next_task
    }

    /// The cas the next store will get (meta replies render it before the store runs).
    pub fn peek_next_cas(&self) -> u64 {
        self.next_cas + 1
    }

    pub fn next_cas(&mut self) -> u64 {
        debug_assert!(self.next_cas < u64::MAX, "cas values never wrap");
        self.next_cas += 1;
        self.next_cas
    }

    /// Cas values given later are above `cas` (a restored item's).
    pub fn raise_cas(&mut self, cas: u64) {
        self.next_cas = self.next_cas.max(cas);
    }

    /// The EOR main copy of an EC-region page.
    pub fn main_page(&self, page: u64) -> u64 {
        self.main_first_page.expect("EOR is offered") + (page - self.ec_first_page)
    }

    /// Where a read of a page of a `scheme` value goes, and the part bit that says so: for EOR
    /// its main copy ([`MAIN`]), or its data splits ([`FALLBACK`]) while the main copy is stale
    /// (its last write failed); other schemes' pages are read where they are.
    pub(crate) fn read_source(&self, scheme: Scheme, page: u64) -> (u64, u32) {
        match scheme {
            // Empty but during failures: no hashing per read then.
            Scheme::Eor if !self.stale_main.is_empty() && self.stale_main.contains(&page) => (page, FALLBACK),
            Scheme::Eor => (self.main_page(page), MAIN),
            _ => (page, 0),
        }
    }

    /// Every write of a main copy ([`MAIN`] part) says whether the main copy now holds the
    /// page's value: a failed one leaves it stale, a successful one makes it current again.
    /// Writes of one page land in the order they were issued, so the last one decides.
    fn note_main_copy_write(&mut self, op: &IoDone) {
        if op.kind != IoKind::Write || op.owner.part & MAIN == 0 {
            return;
        }
        let Some(first) = self.main_first_page else { return };
        let page = self.ec_first_page + (op.page - first);
        if op.result.is_ok() {
            if !self.stale_main.is_empty() {
                self.stale_main.remove(&page);
            }
        } else {
            self.stale_main.insert(page);
        }
    }

    /// A failed main-copy write (`done`, noted by `note_main_copy_write`) does not fail the
    /// store when the value's data splits are written: within EOR's tolerance of one failure
    /// the data splits alone hold it, and reads go to them. True when `done` was one.
    fn main_copy_missed(&mut self, done: &IoDone) -> bool {
        if done.kind != IoKind::Write || done.owner.part & MAIN == 0 {
            return false;
        }
        if let Err(error) = &done.result {
            tracing::debug!(page = done.page, %error, "an EOR main copy write failed: reading its data splits");
            self.stats.eor_main_copy_misses += 1;
            return true;
        }
        false
    }

    /// The live entry of `key`: expired items (and items older than a delayed flush) are
    /// removed on the way, as memcached does lazily.
    pub fn live(&mut self, key: &[u8], now: u64) -> Option<EntryId> {
        let id = self.index.find(key)?;
        if self.index.entry(id).expired(now) {
            self.remove_entry(id);
            self.stats.expired_unfetched += 1;
            return None;
        }
        Some(id)
    }

    /// As [`Cache::live`], for a store about to replace the item: an expired item's memory goes
    /// to the store, which memcached counts as `reclaimed` (in the item's size class).
    pub fn live_for_store(&mut self, key: &[u8], now: u64) -> Option<EntryId> {
        let id = self.index.find(key)?;
        if self.index.entry(id).expired(now) {
            self.reclaim(id);
            return None;
        }
        Some(id)
    }

    /// Removes an expired item for a store to take its memory, counting it `reclaimed`.
    fn reclaim(&mut self, id: EntryId) {
        let entry = self.index.entry(id);
        let bytes = crate::index::item_bytes(entry.key.len(), entry.value_bytes);
        crate::stats::Stats::count_in_class(&mut self.stats.reclaimed_by_class, bytes);
        self.stats.expired_unfetched += u64::from(!entry.fetched);
        self.remove_entry(id);
    }

    /// Before a store takes memory, memcached looks at the few least recently used items for an
    /// expired one to reuse; so does this, removing every expired item among the
    /// [`RECLAIM_SEARCH`] oldest. Expired items are otherwise removed only when a request
    /// names them, and would hold memory (and count against `--memory-limit`) until evicted.
    pub(crate) fn reclaim_expired_tail(&mut self, now: u64) {
        let mut candidate = self.index.lru_tail();
        for _ in 0..RECLAIM_SEARCH {
            let Some(id) = candidate else { return };
            candidate = self.index.newer(id);
            if self.index.entry(id).expired(now) {
                self.reclaim(id);
            }
        }
    }

    pub fn remove_entry(&mut self, id: EntryId) {
        let mut released = Released::new();
        let entry = self.index.remove(id, &mut released);
        // The record goes first: its pages are free only once nothing names them.
        if let Some(recorded) = entry.recorded {
            self.unrecord(recorded);
        }
        self.free(released);
    }

    pub fn free(&mut self, released: Released) {
        // With the state region (`--etcd`), a freed record is still live there until the next
        // copy-out: its pages are reused only after that, or a kill in between would leave it
        // naming another value's bytes (`mirror.rs`).
        if !released.is_empty() && !self.state_records_freed() {
            return;
        }
        for location in released {
            if !location.extent.pages.is_empty() {
                self.space.free_pages(location.scheme, &location.extent.pages);
            }
            if let Some(chunk) = location.extent.tail {
                let page = chunk.page;
                self.space.free_chunk(location.scheme, chunk);
                if !self.space.chunk_page_shared(page, chunk) && !self.space_has_chunk_page(page) {
                    self.chunks.forget(page);
                }
            }
        }
    }

    fn space_has_chunk_page(&self, page: u64) -> bool {
        self.space.is_chunk_page(page)
    }

    // ---- the event loop's calls ------------------------------------------------------------

    /// Advances every task with the page ops that finished.
    pub fn on_io(&mut self, readable: bool) {
        self.growth.collect_now = false;
        let mut done = std::mem::take(&mut self.done_buffer);
        if readable {
            self.io.on_readable(&mut self.client, &mut done);
        } else {
            self.io.on_timer(&mut self.client, &mut done);
        }
        self.complete(&mut done);
        self.done_buffer = done;
    }

    fn complete(&mut self, done: &mut Vec<IoDone>) {
        // Completions may start new ops whose completions arrive in the same call: loop.
        for _ in 0..64 {
            self.take_deferred(done);
            if done.is_empty() {
                break;
            }
            for mut op in done.drain(..) {
                self.note_main_copy_write(&op);
                match self.tasks.get(&op.owner.task) {
                    Some(Task::Fetch(_)) => self.fetch_done(op.owner.task, &mut op),
                    Some(Task::Store(_)) => self.store_done(op.owner.task, &mut op),
                    Some(Task::ChunkPage) => self.chunk_page_done(op.owner.task, &mut op),
                    Some(Task::Transition(_)) => self.transition_io_done(op.owner.task, &mut op),
                    None if op.owner.task == REPAIR_TASK => {
                        if let Err(error) = &op.result {
                            tracing::debug!(%error, page = op.page, "a read repair failed");
                        }
                    }
                    None => tracing::warn!(task = op.owner.task, "completion of an unknown task"),
                }
                self.io.finish(op.slot);
            }
            self.io.start_waiting(&mut self.client);
            let mut more = Vec::new();
            self.io.on_timer(&mut self.client, &mut more);
            done.extend(more);
        }
    }

    /// Starts waiting page ops and collects completions of ops that finished at submit
    /// (shared memory, errors).
    pub fn kick(&mut self) {
        self.growth.collect_now = false;
        self.io.start_waiting(&mut self.client);
        let mut done = std::mem::take(&mut self.done_buffer);
        self.io.on_timer(&mut self.client, &mut done);
        self.complete(&mut done);
        self.done_buffer = done;
    }

    /// When the engine wants a tick.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.growth.collect_now {
            return Some(self.client.now());
        }
        self.client.next_deadline()
    }

    /// Once a second: the delayed flush, cold objects to EC.
    pub fn housekeeping(&mut self, now_unix: u64) {
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
        if let Some(at) = self.flush_at {
            if at <= now_unix {
                self.flush_at = None;
                self.flush_all();
            }
        }
        self.cool_down(now_unix);
        self.shrink_regions();
        self.scrub_main_copies();
    }

    /// Checks the engine's counted state (debug builds' housekeeping calls it once a second, so
    /// the integration tests run it under load; it walks every entry and task): the index's
    /// counts and links, every location held by an entry, a record or a task of the work table
    /// live with at least that many references, one shared fetch per location, the output
    /// budget's totals, the journal slots each free or held once, and pages in use within each
    /// region.
    pub fn check_invariants(&self) {
        let mut held: HashMap<LocationId, u32> = HashMap::new();
        for task in self.tasks.values() {
            let location = match task {
                Task::Fetch(fetch) => Some(fetch.location),
                Task::Store(store) => Some(store.location),
                Task::Transition(transition) if transition.from_scheme != transition.to => {
                    Some(transition.from)
                }
                Task::Transition(_) | Task::ChunkPage => None,
            };
            if let Some(location) = location {
                *held.entry(location).or_default() += 1;
            }
        }
        self.index.check_invariants(&held);
        for (location, task) in &self.fetch_of_location {
            assert!(
                matches!(self.tasks.get(task), Some(Task::Fetch(fetch)) if fetch.location == *location),
                "the shared fetch of location {location} is a fetch of it"
            );
        }
        self.budget.check_invariants();
        let mut journal = self.journal_free.clone();
        journal.sort_unstable();
        journal.dedup();
        assert_eq!(journal.len(), self.journal_free.len(), "a journal slot is free once");
        for kind in [RegionKind::Ec, RegionKind::None, RegionKind::Rep2, RegionKind::Rep3] {
            if let Some((_, pages)) = self.space.region_pages(kind) {
                assert!(
                    self.space.pages_in_use(kind) <= pages,
                    "{kind:?}: more pages in use than the region has"
                );
            }
        }
    }

    /// Removes every item; their places are freed together, after their records (one
    /// copy-out for all with the state region, not one per item).
    pub fn flush_all(&mut self) {
        let mut released = Released::new();
        for id in self.index.ids() {
            let entry = self.index.remove(id, &mut released);
            if let Some(recorded) = entry.recorded {
                self.unrecord(recorded);
            }
        }
        self.free(released);
    }

    pub fn uptime(&self) -> Duration {
        self.client.now().saturating_duration_since(self.started)
    }
}
