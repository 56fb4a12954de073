//! The handler: one thread of the process that reads the userfaultfd, serves every fault of
//! the managed memory from the page table, keeps the pages within the local budget, and runs
//! the remem client (run to completion on this thread: no lock shared with the program).
//!
//! Eviction moves a page out of the program with UFFDIO_MOVE into a staging page of the pager
//! (registered with a second userfaultfd that asks for no events, so the pager may discard its
//! own staging pages without waiting on itself). A move never faults and never races a write of
//! the program: the page leaves atomically, and a write after it faults and is served from
//! staging. Clean pages are write-protected, so the first write after a fetch is seen.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use remem_client::{Client, PageOp};

use crate::buffer::{own_pidfd, Buffer, StagingFree};
use crate::maps::{self, Managed};
use crate::pages::{Dirt, Entry, Fault, PageTable, Slots, State, NO_SLOT};
use crate::stats::STATS;
use crate::uffd::{self, Message, Uffd};

pub const PAGE: u64 = 4096;
/// Most victims written back (and dropped) together, as one batch of the engine. A fault that
/// arrives meanwhile waits for the batch: over shared memory 32 gave a read p99 of 200 us and 8
/// gives 80 us at the same throughput, over TCP 8 costs a quarter more time than 32 (the
/// batch's fan-outs overlap): see `Setup::write_back_batch` and docs/PAGING.md.
const WRITE_BACK_BATCH: usize = 32;
/// Staging pages given up together (one process_madvise: one TLB flush for all of them).
pub const DISCARD_BATCH: usize = 32;
/// Most pages evicted by one move (`Pager::evict_run`); staging has room for a run beyond the
/// victim target (WRITE_BACK_BATCH pages of slack).
const EVICT_RUN_MAX: usize = 16;
/// Most pages fetched for one fault (the fault's own and those a sequential trend predicts).
const PREFETCH_MAX: usize = 16;
/// How often the process's mappings are looked at for new memory to manage.
/// (Reading /proc/self/maps costs tens of microseconds; memory the program fills before the
/// next look is adopted then, and the budget is exceeded until it is evicted.)
const SCAN_INTERVAL: Duration = Duration::from_millis(5);

/// The protected segment's cap for a budget of `budget_pages` with `victim_target` victims:
/// `percent` (at most 90, `Config::from_env`) of the resident pages.
fn protected_cap(budget_pages: usize, victim_target: usize, percent: u64) -> usize {
    budget_pages.saturating_sub(victim_target) * percent as usize / 100
}

/// How a fetched page comes in: writable and dirty when its access was a write (`write`, seen) or
/// a write was seen in its last stay (`written`, assumed), else write-protected and clean.
fn fetched_dirt(write: bool, written: bool) -> Dirt {
    match (write, written) {
        (true, _) => Dirt::Written,
        (false, true) => Dirt::Assumed,
        (false, false) => Dirt::Clean,
    }
}

/// A fault served later (the kernel said EAGAIN: an event it has queued comes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// A missing page, and whether its access was a write.
    Missing { write: bool },
    /// A write to a write-protected page.
    Protect,
}

pub struct Pager {
    uffd: Uffd,
    staging_uffd: Uffd,
    staging: Buffer,
    free_staging: StagingFree,
    fetch_buffer: Buffer,
    table: PageTable,
    slots: Slots,
    client: Option<Client>,
    connect: Connect,
    managed: Managed,
    /// Managed ranges where write-protection could not be registered: always dirty.
    no_write_protect: Managed,
    excluded: Vec<(u64, u64)>,
    /// Managed memory the pager itself may touch: never evicted (see `Setup::pinned`, and
    /// `maps::STACK_TOP_PINNED`).
    pinned: Managed,
    budget_pages: usize,
    victim_target: usize,
    min_bytes: u64,
    spin: Duration,
    pagemap: Option<std::fs::File>,
    messages: Box<[Message; 64]>,
    /// Faults to serve again once the pending event is read (their ioctl answered EAGAIN):
    /// (page, a write-protect fault). Their threads are not woken meanwhile: a woken thread
    /// faults again at once, and the kernel hands out pending faults before events, so waking
    /// them could starve the event (and the thread waiting on it) for ever.
    retry: Vec<(u64, Retry)>,
    last_fetch: u64,
    prefetch_window: usize,
    last_scan: Instant,
    /// Eviction is off while the program forks (everything was brought home).
    paused: bool,
    map_path: Option<std::path::PathBuf>,
    write_back_batch: usize,
    warned_full: bool,
    victims: Vec<(u64, u32, bool)>,
    /// One page of zeros (never written) that write faults of never-written pages copy.
    zeros: Buffer,
    /// This process, for discarding staging pages in batches (`Buffer::discard_many`).
    pidfd: Option<OwnedFd>,
    /// Staging pages no longer used whose memory is not given back yet (`discard_later`).
    to_discard: Vec<u32>,
}

/// Connects the pager's client (see `Pager::connect_now`).
pub type Connect = Box<dyn FnMut() -> Result<Client, String> + Send>;

pub struct Setup {
    pub connect: Connect,
    pub limit_bytes: u64,
    pub remote_pages: u32,
    pub min_bytes: u64,
    /// Percent of the resident pages the protected segment holds at most.
    pub protected_percent: u64,
    pub spin: Duration,
    pub excluded: Vec<(u64, u64)>,
    /// Managed memory the handler itself reads (glibc's thread vector): never evicted.
    pub pinned: Vec<(u64, u64)>,
    /// Where the slab map is saved (see `save_map`).
    pub map_path: Option<std::path::PathBuf>,
    /// Victims written back per batch, at most `WRITE_BACK_BATCH`: 8 over shared memory, 32
    /// over TCP.
    pub write_back_batch: usize,
}

impl Pager {
    pub fn new(setup: Setup) -> io::Result<Pager> {
        let wanted = uffd::FEATURE_PAGEFAULT_FLAG_WP
            | uffd::FEATURE_EVENT_REMAP
            | uffd::FEATURE_EVENT_REMOVE
            | uffd::FEATURE_EVENT_UNMAP
            | uffd::FEATURE_POISON
            | uffd::FEATURE_MOVE;
        let uffd = Uffd::open(wanted)?;
        let needed = uffd::FEATURE_EVENT_REMAP | uffd::FEATURE_EVENT_REMOVE | uffd::FEATURE_EVENT_UNMAP;
        if uffd.features() & needed != needed {
            return Err(io::Error::other(
                "this kernel's userfaultfd lacks the remap, remove or unmap events",
            ));
        }
        let staging_uffd = Uffd::open(uffd::FEATURE_MOVE)?;
        let budget_pages = (setup.limit_bytes / PAGE) as usize;
        let victim_target = (budget_pages / 8).clamp(16, 16384);
        let staging_pages = victim_target + WRITE_BACK_BATCH + 1 + DISCARD_BATCH;
        let staging = Buffer::new(staging_pages * PAGE as usize)?;
        staging_uffd.register(staging.range().0, staging.range().1 - staging.range().0, false)?;
        let fetch_buffer = Buffer::new(PREFETCH_MAX * PAGE as usize)?;
        let zeros = Buffer::new(PAGE as usize)?;
        let mut excluded = setup.excluded;
        excluded.extend([staging.range(), fetch_buffer.range(), zeros.range()]);
        let pinned = setup.pinned;
        let mut pager = Pager {
            uffd,
            staging_uffd,
            free_staging: StagingFree::new(staging_pages),
            staging,
            fetch_buffer,
            table: PageTable::with_protected_cap(protected_cap(
                budget_pages,
                victim_target,
                setup.protected_percent,
            )),
            slots: Slots::new(setup.remote_pages),
            client: None,
            connect: setup.connect,
            managed: Managed::default(),
            no_write_protect: Managed::default(),
            excluded,
            pinned: Managed::default(),
            budget_pages,
            victim_target,
            min_bytes: setup.min_bytes,
            spin: setup.spin,
            pagemap: std::fs::File::open("/proc/self/pagemap").ok(),
            messages: Box::new([Message::default(); 64]),
            retry: Vec::new(),
            last_fetch: 0,
            prefetch_window: 1,
            last_scan: Instant::now(),
            paused: false,
            map_path: setup.map_path,
            write_back_batch: setup.write_back_batch.clamp(1, WRITE_BACK_BATCH),
            warned_full: false,
            victims: Vec::with_capacity(WRITE_BACK_BATCH),
            zeros,
            pidfd: own_pidfd(),
            to_discard: Vec::with_capacity(DISCARD_BATCH),
        };
        for (start, end) in pinned {
            pager.pin(start, end);
        }
        Ok(pager)
    }

    /// Never evicts the pages of `[start, end)` (whole pages: the pager reads those bytes).
    fn pin(&mut self, start: u64, end: u64) {
        self.pinned.add(start & !(PAGE - 1), end.next_multiple_of(PAGE));
    }

    /// Starts managing the process's memory as it is now (see `maps`).
    pub fn scan(&mut self) {
        self.last_scan = Instant::now();
        if self.client.is_none() {
            return;
        }
        let Ok(text) = std::fs::read_to_string("/proc/self/maps") else { return };
        let mappings = maps::anonymous_mappings(&text);
        // glibc moves the thread vector when it grows (a module with thread-locals loaded).
        if let Some((start, end)) = crate::thread_vector() {
            self.pin(start, end);
        }
        for mapping in mappings.iter().filter(|mapping| mapping.guarded) {
            let top = mapping.end.saturating_sub(maps::STACK_TOP_PINNED).max(mapping.start);
            self.pin(top, mapping.end);
        }
        for (start, end) in maps::to_manage(&mappings, &self.managed, &self.excluded, self.min_bytes) {
            if self.uffd.register(start, end - start, true).is_err() {
                if self.uffd.register(start, end - start, false).is_err() {
                    continue;
                }
                self.no_write_protect.add(start, end);
            }
            self.managed.add(start, end);
            self.adopt_present(start, end);
        }
        STATS.managed_bytes.store(self.managed.total_bytes(), Relaxed);
    }

    /// Pages of a newly managed range the program already touched are resident (and dirty:
    /// no copy of them is anywhere else).
    fn adopt_present(&mut self, start: u64, end: u64) {
        use std::os::unix::fs::FileExt;
        let Some(pagemap) = &self.pagemap else { return };
        let mut entries = [0u64; 512];
        let mut page = start;
        while page < end {
            let count = (((end - page) / PAGE) as usize).min(entries.len());
            // SAFETY: `entries` is plain u64s; viewed as bytes for the read.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(entries.as_mut_ptr().cast::<u8>(), count * 8) };
            if pagemap.read_exact_at(bytes, page / PAGE * 8).is_err() {
                return;
            }
            for (index, entry) in entries[..count].iter().enumerate() {
                // Bit 63: present in memory (a page in kernel swap is present to the program).
                if entry & (1 << 63 | 1 << 62) != 0 {
                    self.table.make_resident(page + index as u64 * PAGE, Dirt::Written);
                }
            }
            page += count as u64 * PAGE;
        }
    }

    /// Serves the program until the process ends. `control` is looked at between batches.
    pub fn run(&mut self, control: &crate::Control) -> ! {
        let mut idle_since = Instant::now();
        loop {
            let got = match self.uffd.read(&mut self.messages[..]) {
                Ok(got) => got,
                Err(error) => {
                    eprintln!("remem paging: reading the userfaultfd failed: {error}");
                    std::process::abort();
                }
            };
            let mut events = false;
            for index in 0..got {
                let message = self.messages[index];
                events |= message.event != uffd::EVENT_PAGEFAULT;
                self.on_message(message);
            }
            if !self.retry.is_empty() && (events || got == 0) {
                for (page, retry) in std::mem::take(&mut self.retry) {
                    match retry {
                        Retry::Protect => self.on_write(page),
                        Retry::Missing { write } => self.on_missing(page, write),
                    }
                }
            }
            if got > 0 {
                self.enforce_budget();
                idle_since = Instant::now();
            } else if idle_since.elapsed() >= self.spin {
                self.block(control);
                idle_since = Instant::now();
            } else {
                std::hint::spin_loop();
            }
            if self.last_scan.elapsed() >= SCAN_INTERVAL {
                self.scan();
                self.enforce_budget();
            }
            control.serve(self);
        }
    }

    /// Waits for a fault, the control descriptor or the next scan; keeps the client's
    /// connections alive meanwhile (heartbeats, probes).
    fn block(&mut self, control: &crate::Control) {
        let mut fds = [
            libc::pollfd { fd: self.uffd.raw(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: control.fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the call's length.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, SCAN_INTERVAL.as_millis() as i32) };
        if let Some(client) = &mut self.client {
            client.poll_background(Duration::ZERO);
        }
    }

    fn on_message(&mut self, message: Message) {
        let [a, b, c] = message.arg;
        match message.event {
            uffd::EVENT_PAGEFAULT => {
                let page = b & !(PAGE - 1);
                if a & uffd::PAGEFAULT_FLAG_WP != 0 {
                    self.on_write(page);
                } else {
                    self.on_missing(page, a & uffd::PAGEFAULT_FLAG_WRITE != 0);
                }
            }
            uffd::EVENT_REMOVE => self.forget(a, b),
            uffd::EVENT_UNMAP => {
                self.forget(a, b);
                self.managed.remove(a, b);
                self.no_write_protect.remove(a, b);
                self.pinned.remove(a, b);
            }
            uffd::EVENT_REMAP => {
                let freed = self.table.remap(a, b, c);
                self.give_back(freed);
                self.managed.remove(a, a + c);
                self.managed.add(b, b + c);
                // What was unprotected or pinned there is so at its new place.
                self.no_write_protect.moved(a, b, c);
                self.pinned.moved(a, b, c);
                STATS.managed_bytes.store(self.managed.total_bytes(), Relaxed);
            }
            _ => {}
        }
    }

    /// `[start, end)` is gone or reads as zeros from now on.
    fn forget(&mut self, start: u64, end: u64) {
        let freed = self.table.forget(start, end);
        self.give_back(freed);
    }

    /// Returns the slots and staging pages the table no longer uses.
    fn give_back(&mut self, freed: crate::pages::Freed) {
        for slot in freed.slots {
            self.slots.give_back(slot);
        }
        for staging in freed.staging {
            self.discard_later(staging);
        }
    }

    fn on_write(&mut self, page: u64) {
        STATS.write_faults.fetch_add(1, Relaxed);
        if self.table.mark_dirty(page) {
            match self.uffd.unprotect(page, PAGE) {
                Ok(()) => return,
                Err(error) if uffd::errno(&error) == libc::EAGAIN => {
                    self.retry.push((page, Retry::Protect));
                    return;
                }
                Err(_) => {}
            }
        }
        // The page left since (evicted): the writer retries and faults it back in.
        let _ = self.uffd.wake(page, PAGE);
    }

    fn write_protects(&self, page: u64) -> bool {
        !self.no_write_protect.contains(page)
    }

    /// A missing page: `write` when the access was a write, whose page then comes in writable
    /// and dirty (protecting it would only cost a second fault at once).
    fn on_missing(&mut self, page: u64, write: bool) {
        let result = match self.table.fault(page) {
            Fault::Zero => {
                STATS.zero_faults.fetch_add(1, Relaxed);
                self.zero_fill(page, write)
            }
            Fault::MoveBack { staging } => self.copy_back(page, staging),
            Fault::Fetch { slot, written } => self.fetch(page, slot, fetched_dirt(write, written)),
            Fault::Stale { slot, dirty } if !dirty && slot != NO_SLOT => {
                self.fetch(page, slot, fetched_dirt(write, false))
            }
            Fault::Stale { .. } => self.zero_fill(page, write),
        };
        match result.as_ref().map_err(uffd::errno) {
            Ok(()) => {}
            Err(libc::EAGAIN) => self.retry.push((page, Retry::Missing { write })),
            Err(libc::EEXIST) => {
                // Already there (another thread's fault on the same page was served first).
                let _ = self.uffd.wake(page, PAGE);
            }
            Err(_) => {
                eprintln!("remem paging: serving the fault at {page:#x} failed: {:?}", result);
                let _ = self.uffd.wake(page, PAGE);
            }
        }
        let resident = self.table.resident_count() as u64;
        STATS.peak_resident_pages.fetch_max(resident + self.table.victim_count() as u64, Relaxed);
    }

    /// A page never written (or whose bytes are gone) comes in as zeros. For a read, the shared
    /// zero page (UFFDIO_ZEROPAGE: no memory until written). For a write, a page of zeros of its
    /// own (UFFDIO_COPY): the zero page would take the write as a second fault at once, whose
    /// copy-on-write replaces a present entry and so flushes the TLB of every CPU running the
    /// process, the pager's included (an interrupt to the other vCPU).
    fn zero_fill(&mut self, page: u64, write: bool) -> io::Result<()> {
        if write {
            self.uffd.copy(page, self.zeros.page(0), false, true)?;
            STATS.zero_copies.fetch_add(1, Relaxed);
        } else {
            self.uffd.zeropage(page, PAGE)?;
        }
        self.table.make_resident(page, Dirt::Written);
        Ok(())
    }

    /// A victim comes back: its staging page is copied into place (UFFDIO_COPY), as it left.
    /// A clean victim comes back write-protected and clean (the copy installs it protected, so no
    /// write of another thread goes unseen); a dirty one writable and dirty. The staging page is
    /// given up with the next batch. A copy, not a move back: a move clears the staging page's
    /// entry, a TLB flush that interrupts every CPU running the process, per fault; a copy
    /// flushes nothing (a random refault of a 15 MiB set under a 16 MiB limit took 2.27 us an
    /// access instead of 2.50, medians of 3 runs).
    fn copy_back(&mut self, page: u64, staging: u32) -> io::Result<()> {
        let started = Instant::now();
        let dirty =
            !matches!(self.table.get(page), Some(Entry { state: State::Victim { dirty: false, .. }, .. }))
                || !self.write_protects(page);
        self.uffd.copy(page, self.staging.page(staging as usize), !dirty, true)?;
        self.discard_later(staging);
        self.table.make_resident(page, if dirty { Dirt::MovedBack } else { Dirt::CopiedBackClean });
        STATS.victim_faults.fetch_add(1, Relaxed);
        STATS.move_back.record(started.elapsed());
        Ok(())
    }

    /// Fetches the page from remem (with the pages after it when faults run sequentially)
    /// and puts it in place; beyond the code's tolerance the page is poisoned: the access gets
    /// SIGBUS, never zeros or another page's bytes.
    ///
    /// A page comes in write-protected (`Dirt::Clean`: clean until its first write, a fault
    /// that marks it dirty) unless it is likely written at once (`dirt` of the faulting page,
    /// `fetched_dirt` of each prefetched one): its access was a write, or a write was seen in its
    /// last stay. Those come in writable and dirty: a write-back at their next eviction, written
    /// or not, instead of a write-protect fault of the program's now (sqlite wrote ~95% of the
    /// pages it fetched).
    fn fetch(&mut self, page: u64, slot: u32, dirt: Dirt) -> io::Result<()> {
        STATS.fetch_faults.fetch_add(1, Relaxed);
        self.prefetch_window =
            if page == self.last_fetch + PAGE { (self.prefetch_window * 2).min(PREFETCH_MAX) } else { 1 };
        self.last_fetch = page;
        let mut batch = [(page, slot, dirt); PREFETCH_MAX];
        let mut count = 1;
        while count < self.prefetch_window {
            let next = page + count as u64 * PAGE;
            match (self.managed.contains(next), self.table.fault(next)) {
                (true, Fault::Fetch { slot, written }) => {
                    batch[count] = (next, slot, fetched_dirt(false, written))
                }
                _ => break,
            }
            count += 1;
        }
        let started = Instant::now();
        let mut results: [Result<(), remem_client::PageError>; PREFETCH_MAX] =
            std::array::from_fn(|_| Ok(()));
        {
            let mut chunks = self.fetch_buffer.pages_mut(0, PREFETCH_MAX).chunks_mut(PAGE as usize);
            let mut ops: [PageOp<'_>; PREFETCH_MAX] = std::array::from_fn(|index| PageOp::Read {
                page: batch[index].1 as u64,
                buf: chunks.next().expect("PREFETCH_MAX pages"),
            });
            let client = self.client.as_mut().expect("a page is remote only after a client wrote it");
            client.execute(&mut ops[..count], |done| results[done.index] = done.result);
        }
        STATS.fetch.record(started.elapsed());
        let copied = Instant::now();
        for (index, &(target, _, dirt)) in batch[..count].iter().enumerate() {
            let dirt = if self.write_protects(target) { dirt } else { Dirt::Written };
            let write_protect = dirt == Dirt::Clean;
            let outcome = match &results[index] {
                Ok(()) => self.uffd.copy(target, self.fetch_buffer.page(index), write_protect, index == 0),
                Err(_) if index > 0 => continue,
                Err(error) => {
                    STATS.lost_pages.fetch_add(1, Relaxed);
                    eprintln!("remem paging: page {target:#x} is lost ({error}): the access gets SIGBUS");
                    self.uffd.poison(target, PAGE)
                }
            };
            match outcome {
                Ok(()) if results[index].is_ok() => {
                    self.table.make_resident(target, dirt);
                    if index > 0 {
                        STATS.prefetched.fetch_add(1, Relaxed);
                    }
                }
                Ok(()) => {}
                Err(error) if index == 0 => return Err(error),
                Err(_) => {}
            }
        }
        STATS.copy.record(copied.elapsed());
        Ok(())
    }

    /// Keeps resident pages within the budget less the victim set, and the victim set within
    /// its target, writing back dirty victims in batches.
    fn enforce_budget(&mut self) {
        if self.paused {
            return;
        }
        let resident_budget = self.budget_pages.saturating_sub(self.victim_target).max(1);
        if self.table.resident_count() > resident_budget {
            let started = Instant::now();
            self.evict_to(resident_budget);
            STATS.evict.record(started.elapsed());
        }
        while self.table.victim_count() > self.victim_target {
            if !self.drop_victims() {
                break;
            }
        }
    }

    /// Evicts the oldest resident pages (into the victim set) until at most `resident_budget`
    /// are resident, or until 64 in a row could not leave.
    fn evict_to(&mut self, resident_budget: usize) {
        let mut refused = 0;
        while self.table.resident_count() > resident_budget && refused < 64 {
            if self.table.victim_count() >= self.victim_target {
                self.drop_victims();
            }
            if self.free_staging.is_empty() {
                self.discard_now();
            }
            let Some((page, _)) = self.table.oldest_resident() else { break };
            if self.pinned.contains(page) {
                self.table.requeue_oldest_resident();
                refused += 1;
                continue;
            }
            if self.evict_run(page) {
                continue;
            }
            let Some(staging) = self.free_staging.take() else { break };
            match self.move_out(page, staging) {
                Ok(()) => {
                    self.table.make_victim(page, staging);
                    STATS.evictions.fetch_add(1, Relaxed);
                }
                Err(error) => {
                    self.free_staging.give(staging);
                    if uffd::errno(&error) == libc::ENOENT {
                        // Not present (dropped behind the pager's back, or an event is on its
                        // way): it reads as zeros next, as the program asked.
                        self.forget(page, page + PAGE);
                    } else {
                        // Shared with a forked child, pinned, or no longer writable: later.
                        self.table.requeue_oldest_resident();
                        STATS.unevictable.fetch_add(1, Relaxed);
                        refused += 1;
                    }
                }
            }
        }
    }

    /// Evicts `page`, the oldest, with the pages after it that came in one after the other (a
    /// sequential fill, a prefetch batch), by one move into consecutive staging pages: one TLB
    /// flush for the run, where a move per page made one each (a third of the pager's time
    /// filling memory). False when there is no run of two or more, or no staging run for it;
    /// `page` is then evicted alone. The run may evict a few pages more than the budget needs:
    /// the next faults fill them without an eviction.
    fn evict_run(&mut self, page: u64) -> bool {
        let longest = (self.budget_pages / 16).clamp(1, EVICT_RUN_MAX);
        let mut count = self.table.sequential_run(page, longest);
        if let Some(pinned) = (1..count).find(|&index| self.pinned.contains(page + index as u64 * PAGE)) {
            count = pinned;
        }
        if count < 2 {
            return false;
        }
        let Some(first) = self.free_staging.take_run(count) else { return false };
        let target = self.staging.address(first as usize);
        let (moved, _) = self.staging_uffd.move_pages_counted(target, page, count as u64 * PAGE, false);
        let moved = (moved / PAGE) as usize;
        for index in 0..count {
            let staging = first + index as u32;
            if index < moved {
                self.table.make_victim(page + index as u64 * PAGE, staging);
                STATS.evictions.fetch_add(1, Relaxed);
                STATS.evicted_in_runs.fetch_add(1, Relaxed);
            } else {
                // Nothing was moved into it: free as it is.
                self.free_staging.give(staging);
            }
        }
        moved > 0
    }

    /// Gives `staging`'s memory back with the next batch (one TLB flush a batch: a flush
    /// reaches every CPU running the process, the program's vCPU included); it is free then.
    fn discard_later(&mut self, staging: u32) {
        self.to_discard.push(staging);
        if self.to_discard.len() >= DISCARD_BATCH {
            self.discard_now();
        }
    }

    /// Gives back every staging page waiting for it, and frees them.
    fn discard_now(&mut self) {
        let started = Instant::now();
        self.staging.discard_many(&mut self.pidfd, &self.to_discard);
        for staging in self.to_discard.drain(..) {
            self.free_staging.give(staging);
        }
        STATS.discard.record(started.elapsed());
    }

    /// Moves a resident page into a staging page. A page still shared with a forked child
    /// (copy-on-write) cannot move (EBUSY): its copy is made the process's own first, the way a
    /// write would (MADV_POPULATE_WRITE; the bytes do not change), and the move is tried again.
    fn move_out(&mut self, page: u64, staging: u32) -> io::Result<()> {
        let target = self.staging.address(staging as usize);
        match self.staging_uffd.move_pages(target, page, PAGE, false) {
            Err(error) if uffd::errno(&error) == libc::EBUSY => {
                if let Some(Entry { state: State::Resident { dirty: false }, .. }) = self.table.get(page) {
                    // The write below must not fault on write-protection (the pager would wait
                    // on itself): unprotected, the page is dirty from now on.
                    self.uffd.unprotect(page, PAGE)?;
                    self.table.mark_dirty(page);
                }
                // SAFETY: populates one present page of the process for writing, which breaks
                // its sharing and changes no byte; it never faults into this pager, as the page
                // is present (a page the program discarded is forgotten before this runs).
                if unsafe {
                    libc::madvise(page as *mut libc::c_void, PAGE as usize, libc::MADV_POPULATE_WRITE)
                } != 0
                {
                    return Err(error);
                }
                self.staging_uffd.move_pages(target, page, PAGE, false)
            }
            other => other,
        }
    }

    /// Connects the client (before anything is registered: connecting starts threads, and
    /// glibc's thread creation takes locks that a thread of the program may hold while it waits
    /// for the pager, as in munmap of a thread's stack).
    ///
    /// Every mapping that appears while it connects is the client's own (its probe thread's
    /// stack, buffers of glibc's) and is never managed: a page of it paged out could be a fault
    /// the pager takes on behalf of its client, which only the pager itself could serve. (The
    /// client's probe thread is woken through a pipe for the same reason: see `start_prober`.)
    pub fn connect(&mut self) -> Result<(), String> {
        let mappings = || std::fs::read_to_string("/proc/self/maps").map(|text| maps::all_mappings(&text));
        let before = mappings().map_err(|error| format!("reading /proc/self/maps: {error}"))?;
        let client = (self.connect)()?;
        let after = mappings().map_err(|error| format!("reading /proc/self/maps: {error}"))?;
        self.excluded.extend(after.into_iter().filter(|mapping| !before.contains(mapping)));
        self.client = Some(client);
        self.save_map();
        Ok(())
    }

    /// [`Pager::write_back_and_drop`], timed for the report.
    fn drop_victims(&mut self) -> bool {
        let started = Instant::now();
        let dropped = self.write_back_and_drop();
        STATS.drop.record(started.elapsed());
        dropped
    }

    /// Writes back the oldest dirty victims (one engine batch) and gives up the staging pages
    /// of the oldest clean ones. False when nothing could be dropped.
    fn write_back_and_drop(&mut self) -> bool {
        let Some(client) = self.client.as_mut() else { return false };
        let mut victims = std::mem::take(&mut self.victims);
        self.table.oldest_victims(self.write_back_batch, &mut victims);
        let mut slots = [NO_SLOT; WRITE_BACK_BATCH];
        let mut fresh = [false; WRITE_BACK_BATCH];
        let mut written = [false; WRITE_BACK_BATCH];
        {
            let mut ops = Vec::with_capacity(WRITE_BACK_BATCH);
            let mut indexes = [0usize; WRITE_BACK_BATCH];
            for (index, &(page, staging, dirty)) in victims.iter().enumerate() {
                if !dirty {
                    written[index] = true;
                    continue;
                }
                slots[index] = match self.table.get(page).map(|entry| entry.slot) {
                    Some(slot) if slot != NO_SLOT => slot,
                    _ => match self.slots.take() {
                        Some(slot) => {
                            fresh[index] = true;
                            slot
                        }
                        None => {
                            if !self.warned_full {
                                eprintln!("remem paging: the remem region is full: pages stay local");
                                self.warned_full = true;
                            }
                            continue;
                        }
                    },
                };
                indexes[ops.len()] = index;
                ops.push(PageOp::Write {
                    page: slots[index] as u64,
                    data: self.staging.page(staging as usize),
                });
            }
            client.execute(&mut ops, |done| {
                written[indexes[done.index]] = done.result.is_ok();
                if done.result.is_err() {
                    STATS.write_back_errors.fetch_add(1, Relaxed);
                }
            });
        }
        let mut dropped = false;
        for (index, &(page, staging, dirty)) in victims.iter().enumerate() {
            if !written[index] {
                if fresh[index] {
                    self.slots.give_back(slots[index]);
                }
                continue;
            }
            if dirty {
                self.table.written_back(page, slots[index]);
                STATS.write_backs.fetch_add(1, Relaxed);
            }
            self.discard_later(staging);
            self.table.make_remote(page);
            dropped = true;
        }
        self.victims = victims;
        dropped
    }

    /// Brings every page home (before a fork: the child gets no userfaultfd, so a page not in
    /// the process would read as zeros there) and stops evicting until `resume`.
    pub fn bring_home(&mut self) {
        self.paused = true;
        for page in self.table.not_resident() {
            loop {
                self.on_missing(page, false);
                let retry = (page, Retry::Missing { write: false });
                if !self.retry.contains(&retry) {
                    break;
                }
                // An event is pending: read it first (the other retries stay queued).
                self.retry.retain(|&entry| entry != retry);
                let got = self.uffd.read(&mut self.messages[..]).unwrap_or(0);
                for index in 0..got {
                    let message = self.messages[index];
                    self.on_message(message);
                }
            }
        }
    }

    /// Saves the client's slab map where `remem run` reads it when the program has ended, to
    /// give the slabs back to the nodes at once (the program cannot: its last act, flushing
    /// stdio, may still read paged-out buffers).
    pub fn save_map(&self) {
        if let (Some(client), Some(path)) = (&self.client, &self.map_path) {
            if let Err(error) = client.save_map(path) {
                eprintln!("remem paging: saving the slab map to {}: {error}", path.display());
            }
        }
    }

    pub fn resume(&mut self) {
        self.paused = false;
        self.enforce_budget();
    }
}
