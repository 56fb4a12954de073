//! Where each managed page of the process is, and which page to evict next: no I/O, so the
//! policy is tested on its own.
//!
//! A page is **resident** (in the process; clean when its bytes are also in its remem slot and
//! it is write-protected, so the first write is seen), a **victim** (moved out of the process
//! into a staging page of the pager: still local, so a refault costs a move back, not a
//! fetch) or **remote** (only in its slot). A page the table does not know was never written:
//! it reads as zeros.
//!
//! Eviction approximates LRU without the kernel's access bits, as CLOCK over a victim set
//! (VMS's segmented FIFO): resident pages leave in the order they came in, but into the victim
//! set first; a victim that is touched again comes back cheaply, one that is not is written
//! back (when dirty) and dropped.
//!
//! Resident pages are in two segments (SLRU, 2Q): a page fetched or new enters the
//! **probation** queue; a victim touched again (a page used twice, the only sign of use there
//! is without access bits) goes to the **protected** queue. Eviction takes the probation queue's
//! oldest; the protected queue is kept to a cap (set by the pager, `with_protected_cap`) by
//! moving its oldest to the end of probation, where it gets one more pass before it can become
//! a victim. Pages used once leave after one pass; pages used again stay about a cap longer.
//!
//! Queues hold `(page, generation)`: an entry whose page changed state since it was queued is
//! stale and skipped, so leaving a state never searches a queue.

use std::collections::{BTreeMap, VecDeque};

/// Table changes at most between two pages of a sequential run (`PageTable::sequential_run`):
/// a page that came in, the eviction it made room by, a victim dropped.
const SEQUENTIAL_GAP: u32 = 8;

/// A page's slot in the remem region; `NO_SLOT` before its first write-back.
pub const NO_SLOT: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Resident {
        dirty: bool,
    },
    Victim {
        staging: u32,
        dirty: bool,
    },
    /// Only in remem; `written` when writes were seen in its last two stays (it is fetched
    /// writable then).
    Remote {
        written: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub state: State,
    pub slot: u32,
    generation: u32,
    /// A write was seen since the page last came from remem (a write-protect fault, a write
    /// that faulted it in, or a page that started as zeros), kept while it is a victim: it is
    /// fetched writable next time (`State::Remote::written`).
    seen_write: bool,
    /// Stays in a row in which a write was seen, up to 2: a page is fetched writable on a guess
    /// after two (`State::Remote::written`). One is not enough: memory written once and then
    /// only read (a table loaded, then queried) would be fetched writable and written back,
    /// unchanged, once per page. A stay on a guess (`guessed`) sees no writes, so it counts one
    /// less: a page written at every stay alternates, guessed and then protected, and one no
    /// longer written is protected by the second stay; a protected stay without a write ends
    /// the run.
    written_stays: u8,
    /// Fetched writable on a guess this stay (`Dirt::Assumed`): whether it was written is not
    /// known.
    guessed: bool,
    /// Resident in the protected queue (else in probation).
    protected: bool,
}

/// How dirty a page is as it becomes resident, and what is known of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dirt {
    /// Write-protected, the same as its slot.
    Clean,
    /// Written, or about to be (zeros, a write access, adopted as found).
    Written,
    /// Writable, so dirty for the write-back, but no write was seen: a fetch on a guess.
    Assumed,
    /// Back from the victim set: writable and dirty, with what was seen before it left.
    MovedBack,
    /// Back from the victim set as it left it, clean: write-protected, the same as its slot
    /// (used again since it came in, as `MovedBack`).
    CopiedBackClean,
}

/// What a missing fault on a page needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Never written (or freed): zeros.
    Zero,
    /// A victim: copy its staging page back (see `Pager::copy_back`).
    MoveBack { staging: u32 },
    /// Only in remem: fetch the slot. `written`: the page was dirty when it left, so it is
    /// likely written again (see `Pager::fetch`).
    Fetch { slot: u32, written: bool },
    /// The table says resident, yet the process faulted: the page was dropped behind the
    /// pager's back (MADV_FREE reclaimed by the kernel). Its slot, when clean, still has it.
    Stale { slot: u32, dirty: bool },
}

/// What leaving a range (munmap, MADV_DONTNEED/FREE) frees.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Freed {
    pub slots: Vec<u32>,
    pub staging: Vec<u32>,
}

#[derive(Default)]
pub struct PageTable {
    pages: BTreeMap<u64, Entry>,
    /// The probation queue of resident pages.
    resident: VecDeque<(u64, u32)>,
    protected: VecDeque<(u64, u32)>,
    victims: VecDeque<(u64, u32)>,
    resident_count: usize,
    protected_count: usize,
    protected_cap: usize,
    victim_count: usize,
    next_generation: u32,
}

impl PageTable {
    pub fn resident_count(&self) -> usize {
        self.resident_count
    }

    pub fn victim_count(&self) -> usize {
        self.victim_count
    }

    pub fn get(&self, page: u64) -> Option<Entry> {
        self.pages.get(&page).copied()
    }

    pub fn fault(&self, page: u64) -> Fault {
        match self.pages.get(&page) {
            None => Fault::Zero,
            Some(entry) => match entry.state {
                State::Victim { staging, .. } => Fault::MoveBack { staging },
                State::Remote { written } => Fault::Fetch { slot: entry.slot, written },
                State::Resident { dirty } => Fault::Stale { slot: entry.slot, dirty },
            },
        }
    }

    fn generation(&mut self) -> u32 {
        self.next_generation = self.next_generation.wrapping_add(1);
        self.next_generation
    }

    /// Leaves the page's current state (its counts), keeping its slot.
    fn leave(&mut self, page: u64) -> Option<Entry> {
        let entry = self.pages.get(&page).copied()?;
        match entry.state {
            State::Resident { .. } => {
                self.resident_count -= 1;
                if entry.protected {
                    self.protected_count -= 1;
                }
            }
            State::Victim { .. } => self.victim_count -= 1,
            State::Remote { .. } => {}
        }
        Some(entry)
    }

    /// The page is in the process now (a fault served, or found present), at the end of the
    /// eviction queue.
    pub fn make_resident(&mut self, page: u64, dirt: Dirt) {
        let before = self.leave(page);
        let slot = before.map_or(NO_SLOT, |entry| entry.slot);
        // A page with no slot has no copy anywhere else: it is dirty whatever was asked.
        let dirty = !matches!(dirt, Dirt::Clean | Dirt::CopiedBackClean) || slot == NO_SLOT;
        let seen_write = match dirt {
            Dirt::Clean | Dirt::Assumed => false,
            Dirt::Written => true,
            Dirt::MovedBack | Dirt::CopiedBackClean => before.is_some_and(|entry| entry.seen_write),
        };
        let guessed = match dirt {
            Dirt::Assumed => true,
            Dirt::Clean | Dirt::Written => false,
            Dirt::MovedBack | Dirt::CopiedBackClean => before.is_some_and(|entry| entry.guessed),
        };
        let written_stays = before.map_or(0, |entry| entry.written_stays);
        let generation = self.generation();
        let state = State::Resident { dirty };
        // Back from the victim set: the page was used again since it came in.
        let protected = matches!(dirt, Dirt::MovedBack | Dirt::CopiedBackClean) && self.protected_cap > 0;
        self.pages
            .insert(page, Entry { state, slot, generation, seen_write, written_stays, guessed, protected });
        if protected {
            self.protected.push_back((page, generation));
            self.protected_count += 1;
        } else {
            self.resident.push_back((page, generation));
        }
        self.resident_count += 1;
    }

    /// A write-protect fault: the resident page differs from its slot from now on.
    pub fn mark_dirty(&mut self, page: u64) -> bool {
        match self.pages.get_mut(&page) {
            Some(Entry { state: State::Resident { dirty }, seen_write, .. }) => {
                *dirty = true;
                *seen_write = true;
                true
            }
            _ => false,
        }
    }

    /// The resident page that has been in longest (skipping stale queue entries), without
    /// taking it off the queue.
    pub fn oldest_resident(&mut self) -> Option<(u64, bool)> {
        self.demote_protected();
        loop {
            if let Some(found) = self.oldest_in_probation() {
                return Some(found);
            }
            // Probation is empty: every resident page is protected; the oldest goes first.
            if !self.demote_oldest_protected() {
                return None;
            }
        }
    }

    /// A table whose protected queue holds at most `pages` pages (0 turns it off, as
    /// `default()` has it).
    pub fn with_protected_cap(pages: usize) -> PageTable {
        PageTable { protected_cap: pages, ..PageTable::default() }
    }

    pub fn protected_count(&self) -> usize {
        self.protected_count
    }

    /// Moves the protected queue's oldest pages to the end of probation until it is within
    /// its cap.
    fn demote_protected(&mut self) {
        while self.protected_count > self.protected_cap {
            if !self.demote_oldest_protected() {
                break;
            }
        }
    }

    /// Moves the oldest protected page (skipping stale entries) to the end of probation.
    fn demote_oldest_protected(&mut self) -> bool {
        while let Some((page, generation)) = self.protected.pop_front() {
            let current =
                self.pages.get(&page).is_some_and(|entry| entry.generation == generation && entry.protected);
            if !current {
                continue;
            }
            let fresh = self.generation();
            let entry = self.pages.get_mut(&page).expect("found above");
            entry.protected = false;
            entry.generation = fresh;
            self.protected_count -= 1;
            self.resident.push_back((page, fresh));
            return true;
        }
        false
    }

    fn oldest_in_probation(&mut self) -> Option<(u64, bool)> {
        while let Some(&(page, generation)) = self.resident.front() {
            match self.pages.get(&page) {
                Some(entry) if entry.generation == generation => {
                    if let State::Resident { dirty } = entry.state {
                        return Some((page, dirty));
                    }
                }
                _ => {}
            }
            self.resident.pop_front();
        }
        None
    }

    /// The oldest resident page could not be moved out now (shared with a forked child,
    /// pinned): it goes to the end of the queue.
    pub fn requeue_oldest_resident(&mut self) {
        if let Some(front) = self.resident.pop_front() {
            self.resident.push_back(front);
        }
    }

    /// How many pages from `page` on (at most `max`) are resident in probation and came in one
    /// after the other, each within a few table changes of the one before (a sequential fill
    /// or a prefetch batch): a run the pager evicts with one move. 1 when `page` alone.
    pub fn sequential_run(&self, page: u64, max: usize) -> usize {
        let Some(first) = self.pages.get(&page) else { return 1 };
        let mut generation = first.generation;
        let mut count = 1;
        while count < max {
            let next = page + count as u64 * crate::pager::PAGE;
            match self.pages.get(&next) {
                Some(entry)
                    if matches!(entry.state, State::Resident { .. })
                        && !entry.protected
                        && (1..=SEQUENTIAL_GAP).contains(&entry.generation.wrapping_sub(generation)) =>
                {
                    generation = entry.generation;
                    count += 1;
                }
                _ => break,
            }
        }
        count
    }

    /// The resident page moved into staging page `staging`.
    pub fn make_victim(&mut self, page: u64, staging: u32) {
        let Some(entry) = self.leave(page) else { return };
        let dirty = match entry.state {
            State::Resident { dirty } => dirty,
            State::Victim { dirty, .. } => dirty,
            State::Remote { .. } => false,
        };
        let generation = self.generation();
        let state = State::Victim { staging, dirty };
        self.pages.insert(page, Entry { state, generation, protected: false, ..entry });
        self.victims.push_back((page, generation));
        self.victim_count += 1;
    }

    /// The victim that has waited longest: (page, staging page, dirty).
    pub fn oldest_victim(&mut self) -> Option<(u64, u32, bool)> {
        while let Some(&(page, generation)) = self.victims.front() {
            match self.pages.get(&page) {
                Some(entry) if entry.generation == generation => {
                    if let State::Victim { staging, dirty } = entry.state {
                        return Some((page, staging, dirty));
                    }
                }
                _ => {}
            }
            self.victims.pop_front();
        }
        None
    }

    /// The oldest `count` victims, oldest first (stale entries skipped, none taken off).
    pub fn oldest_victims(&mut self, count: usize, into: &mut Vec<(u64, u32, bool)>) {
        into.clear();
        self.oldest_victim();
        for &(page, generation) in &self.victims {
            if into.len() == count {
                break;
            }
            if let Some(entry) = self.pages.get(&page) {
                if let (true, State::Victim { staging, dirty }) =
                    (entry.generation == generation, entry.state)
                {
                    into.push((page, staging, dirty));
                }
            }
        }
    }

    /// The victim's bytes are in `slot` now: it is clean.
    pub fn written_back(&mut self, page: u64, slot: u32) {
        if let Some(entry) = self.pages.get_mut(&page) {
            entry.slot = slot;
            if let State::Victim { dirty, .. } = &mut entry.state {
                *dirty = false;
            }
        }
    }

    /// The clean victim's staging page is given up: the page is remote, fetched writable next
    /// time if writes were seen in its last two stays (`Entry::written_stays`).
    pub fn make_remote(&mut self, page: u64) {
        let Some(entry) = self.leave(page) else { return };
        assert_ne!(entry.slot, NO_SLOT, "page {page:#x} dropped with no copy in remem");
        let written_stays = match (entry.seen_write, entry.guessed) {
            (true, _) => (entry.written_stays + 1).min(2),
            (false, true) => entry.written_stays.saturating_sub(1),
            (false, false) => 0,
        };
        let state = State::Remote { written: written_stays >= 2 };
        self.pages.insert(
            page,
            Entry { state, seen_write: false, guessed: false, written_stays, protected: false, ..entry },
        );
    }

    /// The pages `[first, end)` are gone from the process (unmapped, or discarded: they read
    /// as zeros next): forgets them and returns their slots and staging pages.
    pub fn forget(&mut self, first: u64, end: u64) -> Freed {
        let mut freed = Freed::default();
        let gone: Vec<u64> = self.pages.range(first..end).map(|(&page, _)| page).collect();
        for page in gone {
            let entry = self.leave(page).expect("listed above");
            self.pages.remove(&page);
            if entry.slot != NO_SLOT {
                freed.slots.push(entry.slot);
            }
            if let State::Victim { staging, .. } = entry.state {
                freed.staging.push(staging);
            }
        }
        freed
    }

    /// mremap moved `[from, from + bytes)` to `to`: every page's state moves with it. The
    /// queues follow through fresh generations (the old entries go stale). Returns what the
    /// move made free.
    ///
    /// A target page the table knows already wins over the entry that moves onto it when that
    /// entry is resident: the kernel moved the page before the pager read this event, and a scan
    /// in between found the new range and adopted its present pages (as resident: they are
    /// these same pages), after which the pager may have moved one out as a victim. The entry
    /// from before the move is older news; taking it instead once left a victim's staging page
    /// (its bytes) behind a "resident" entry, and the next access read zeros. The target keeps
    /// the moved entry's slot if it has none (the page's copy in remem).
    pub fn remap(&mut self, from: u64, to: u64, bytes: u64) -> Freed {
        let mut freed = Freed::default();
        let moved: Vec<(u64, Entry)> =
            self.pages.range(from..from + bytes).map(|(&page, &entry)| (page, entry)).collect();
        for &(page, _) in &moved {
            self.leave(page);
            self.pages.remove(&page);
        }
        for (page, entry) in moved {
            let target = page - from + to;
            if let Some(known) = self.pages.get_mut(&target) {
                if let State::Resident { .. } = entry.state {
                    if known.slot == NO_SLOT {
                        known.slot = entry.slot;
                    } else if entry.slot != NO_SLOT {
                        freed.slots.push(entry.slot);
                    }
                    continue;
                }
                // Not present at the source, so nothing could have adopted it at the target:
                // the moved entry (the only copy of its bytes) wins.
                let known = self.leave(target).expect("known above");
                freed.slots.extend(Some(known.slot).filter(|&slot| slot != NO_SLOT));
                if let State::Victim { staging, .. } = known.state {
                    freed.staging.push(staging);
                }
            }
            self.admit(target, entry);
        }
        freed
    }

    /// Puts `entry` (from elsewhere in the table) at `page` with a fresh generation, counted and
    /// queued for its state.
    fn admit(&mut self, page: u64, entry: Entry) {
        let generation = self.generation();
        self.pages.insert(page, Entry { generation, ..entry });
        match entry.state {
            State::Resident { .. } => {
                self.resident_count += 1;
                if entry.protected {
                    self.protected_count += 1;
                    self.protected.push_back((page, generation));
                } else {
                    self.resident.push_back((page, generation));
                }
            }
            State::Victim { .. } => {
                self.victim_count += 1;
                self.victims.push_back((page, generation));
            }
            State::Remote { .. } => {}
        }
    }

    /// Pages not resident (victims and remote), for bringing everything home before a fork.
    pub fn not_resident(&self) -> Vec<u64> {
        self.pages
            .iter()
            .filter(|(_, entry)| !matches!(entry.state, State::Resident { .. }))
            .map(|(&page, _)| page)
            .collect()
    }

    /// Checks the counts against the table (tests and debug builds).
    pub fn check(&self) {
        let resident =
            self.pages.values().filter(|entry| matches!(entry.state, State::Resident { .. })).count();
        let victims = self.pages.values().filter(|entry| matches!(entry.state, State::Victim { .. })).count();
        assert_eq!((resident, victims), (self.resident_count, self.victim_count), "page counts drifted");
        let protected = self
            .pages
            .values()
            .filter(|entry| entry.protected && matches!(entry.state, State::Resident { .. }))
            .count();
        assert_eq!(protected, self.protected_count, "protected count drifted");
        for entry in self.pages.values() {
            if let State::Remote { .. } = entry.state {
                assert_ne!(entry.slot, NO_SLOT, "a remote page has a slot");
            }
        }
    }
}

/// Slots of the remem region: a page takes one at its first write-back and keeps it until it
/// is forgotten.
pub struct Slots {
    free: Vec<u32>,
    next: u32,
    count: u32,
}

impl Slots {
    pub fn new(count: u32) -> Slots {
        Slots { free: Vec::new(), next: 0, count }
    }

    pub fn take(&mut self) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        (self.next < self.count).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    pub fn give_back(&mut self, slot: u32) {
        debug_assert!(slot < self.next, "slot {slot} was never taken");
        self.free.push(slot);
    }

    pub fn in_use(&self) -> u32 {
        self.next - self.free.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel moves a range (mremap) before the pager reads the event; a scan in between
    /// adopts the new range's present pages and the pager moves one out. The event must not
    /// put the old "resident" entry over that victim: its staging page holds the bytes.
    #[test]
    fn a_remap_keeps_what_the_pager_did_at_the_target_before_the_event() {
        const PAGE: u64 = 4096;
        let (from, to) = (0x10_0000, 0x80_0000);
        let mut table = PageTable::default();
        for index in 0..3 {
            table.make_resident(from + index * PAGE, Dirt::Written);
        }
        table.make_victim(from + 2 * PAGE, 7);
        table.written_back(from + 2 * PAGE, 5);
        table.make_remote(from + 2 * PAGE);
        // Page 1 had a copy in remem (slot 9) before it came back.
        table.make_victim(from + PAGE, 8);
        table.written_back(from + PAGE, 9);
        table.make_resident(from + PAGE, Dirt::MovedBack);
        // The scan adopts pages 0 and 1 at the target; the pager moves page 0 out.
        table.make_resident(to, Dirt::Written);
        table.make_resident(to + PAGE, Dirt::Written);
        table.make_victim(to, 3);
        let freed = table.remap(from, to, 3 * PAGE);
        assert_eq!(freed, Freed::default());
        assert_eq!(table.fault(to), Fault::MoveBack { staging: 3 }, "the victim moved out after the move");
        assert_eq!(table.get(to + PAGE).unwrap().state, State::Resident { dirty: true });
        assert_eq!(table.get(to + PAGE).unwrap().slot, 9, "the page keeps its copy's slot");
        // Written in one stay: fetched protected (`Entry::written_stays`).
        assert_eq!(table.fault(to + 2 * PAGE), Fault::Fetch { slot: 5, written: false });
        assert!(table.get(from).is_none() && table.get(from + PAGE).is_none());
        assert_eq!((table.resident_count(), table.victim_count()), (1, 1));
        table.check();
    }

    /// Pages used once leave first; a victim touched again is protected; the protected queue
    /// over its cap gives its oldest back to probation, behind the pages there.
    #[test]
    fn pages_used_again_are_protected_and_the_oldest_go_back_to_probation_over_the_cap() {
        let mut table = PageTable::with_protected_cap(2);
        for page in 1..=6 {
            table.make_resident(page, Dirt::Written);
        }
        for page in [1, 2, 3] {
            assert_eq!(table.oldest_resident(), Some((page, true)));
            table.make_victim(page, page as u32);
        }
        // 1, 2 and 3 are used again: moved back, protected (cap 2: 1 goes back to probation).
        for page in [1, 2, 3] {
            table.make_resident(page, Dirt::MovedBack);
        }
        assert_eq!(table.protected_count(), 3);
        assert_eq!(table.oldest_resident(), Some((4, true)), "probation first");
        assert_eq!(table.protected_count(), 2, "the oldest protected page went back");
        for page in [4, 5, 6] {
            assert_eq!(table.oldest_resident(), Some((page, true)));
            table.make_victim(page, page as u32);
        }
        assert_eq!(table.oldest_resident(), Some((1, true)), "then the page demoted");
        table.make_victim(1, 1);
        // Probation is empty: the protected pages leave oldest first.
        assert_eq!(table.oldest_resident(), Some((2, true)));
        table.make_victim(2, 2);
        assert_eq!(table.oldest_resident(), Some((3, true)));
        table.check();
    }

    /// Leaves `page` (resident) through the victim set to remem, written back in slot 1.
    fn evict(table: &mut PageTable, page: u64) {
        table.make_victim(page, 0);
        table.written_back(page, 1);
        table.make_remote(page);
    }

    /// A page is fetched writable only after two stays in a row in which a write was seen (a
    /// write-protect fault or a write access that faulted it in, kept through a move back from
    /// the victim set): memory written once and then only read is fetched protected, so not
    /// written back unchanged. A writable fetch on a guess is not a write (a page once written
    /// would stay writable, and be written back, for ever): it counts one stay less.
    #[test]
    fn a_page_is_fetched_writable_after_two_stays_with_a_write_seen_and_only_then() {
        let mut table = PageTable::default();
        table.make_resident(5, Dirt::Written);
        evict(&mut table, 5);
        assert_eq!(table.fault(5), Fault::Fetch { slot: 1, written: false }, "written once");
        table.make_resident(5, Dirt::Clean);
        assert_eq!(table.get(5).unwrap().state, State::Resident { dirty: false });
        assert!(table.mark_dirty(5), "a write-protect fault");
        evict(&mut table, 5);
        assert_eq!(table.fault(5), Fault::Fetch { slot: 1, written: true }, "written twice");
        table.make_resident(5, Dirt::Assumed);
        assert_eq!(table.get(5).unwrap().state, State::Resident { dirty: true });
        evict(&mut table, 5);
        assert_eq!(table.fault(5), Fault::Fetch { slot: 1, written: false }, "a guess is not a write");
        table.make_resident(5, Dirt::Clean);
        assert!(table.mark_dirty(5), "a write-protect fault");
        table.make_victim(5, 2);
        table.make_resident(5, Dirt::MovedBack);
        evict(&mut table, 5);
        assert_eq!(table.fault(5), Fault::Fetch { slot: 1, written: true }, "kept through a move back");
        table.make_resident(5, Dirt::Assumed);
        evict(&mut table, 5);
        table.make_resident(5, Dirt::Clean);
        table.make_victim(5, 2);
        table.make_resident(5, Dirt::MovedBack);
        evict(&mut table, 5);
        assert_eq!(table.fault(5), Fault::Fetch { slot: 1, written: false }, "a move back is not a write");
        table.make_resident(5, Dirt::Clean);
        assert!(table.mark_dirty(5), "a write-protect fault");
        evict(&mut table, 5);
        assert_eq!(
            table.fault(5),
            Fault::Fetch { slot: 1, written: false },
            "a stay protected and not written ended the run"
        );
        table.check();
    }

    /// Pages that came in one after the other are a run from the oldest on; a page that came in
    /// later, a protected page, a victim or a gap in the addresses ends it.
    #[test]
    fn a_sequential_run_is_consecutive_pages_that_came_in_one_after_the_other() {
        let page = |index: u64| 0x10000 + index * crate::pager::PAGE;
        let mut table = PageTable::with_protected_cap(8);
        for index in 0..6 {
            table.make_resident(page(index), Dirt::Written);
        }
        assert_eq!(table.sequential_run(page(0), 16), 6);
        assert_eq!(table.sequential_run(page(0), 4), 4, "at most the most asked");
        table.make_victim(page(3), 1);
        assert_eq!(table.sequential_run(page(0), 16), 3, "a victim ends it");
        for _ in 0..20 {
            table.make_resident(0x90000, Dirt::Written);
        }
        table.make_resident(page(6), Dirt::Written);
        assert_eq!(table.sequential_run(page(4), 16), 2, "page 6 came in long after page 5");
        assert_eq!(table.sequential_run(page(9), 16), 1, "a page the table does not know");
        table.check();
    }

    /// A clean victim copied back is clean (write-protected, no write-back at its next
    /// eviction) and, used again, protected; one with no slot is dirty whatever was asked.
    #[test]
    fn a_clean_victim_copied_back_stays_clean_and_is_protected() {
        let mut table = PageTable::with_protected_cap(4);
        table.make_resident(5, Dirt::Written);
        evict(&mut table, 5);
        table.make_resident(5, Dirt::Clean);
        table.make_victim(5, 2);
        assert_eq!(table.fault(5), Fault::MoveBack { staging: 2 });
        table.make_resident(5, Dirt::CopiedBackClean);
        let entry = table.get(5).unwrap();
        assert_eq!(entry.state, State::Resident { dirty: false });
        assert!(entry.protected, "used again since it came in");
        assert!(!entry.seen_write, "no write was seen in its stay, nor since");
        table.make_resident(9, Dirt::Written);
        table.make_victim(9, 3);
        table.make_resident(9, Dirt::CopiedBackClean);
        assert_eq!(table.get(9).unwrap().state, State::Resident { dirty: true }, "no slot: dirty");
        table.check();
    }

    #[test]
    fn a_page_goes_resident_victim_remote_and_back_with_its_slot() {
        let mut table = PageTable::default();
        assert_eq!(table.fault(7), Fault::Zero);
        table.make_resident(7, Dirt::Clean);
        assert_eq!(table.get(7).unwrap().state, State::Resident { dirty: true }, "no slot: dirty");
        table.make_victim(7, 3);
        assert_eq!(table.fault(7), Fault::MoveBack { staging: 3 });
        table.written_back(7, 11);
        table.make_remote(7);
        assert_eq!(table.fault(7), Fault::Fetch { slot: 11, written: false }, "no write was seen");
        table.make_resident(7, Dirt::Clean);
        assert_eq!(table.get(7).unwrap().state, State::Resident { dirty: false });
        assert!(table.mark_dirty(7));
        assert_eq!(table.get(7).unwrap().state, State::Resident { dirty: true });
        table.check();
    }

    #[test]
    fn eviction_order_is_first_in_with_a_second_chance_for_victims_touched_again() {
        let mut table = PageTable::default();
        for page in 0..4 {
            table.make_resident(page, Dirt::Written);
        }
        assert_eq!(table.oldest_resident(), Some((0, true)));
        table.make_victim(0, 0);
        table.make_victim(1, 1);
        assert_eq!(table.oldest_resident(), Some((2, true)));
        // Page 0 is touched again: it comes back to the end of the resident queue.
        table.make_resident(0, Dirt::Written);
        assert_eq!(table.oldest_victim(), Some((1, 1, true)));
        table.make_victim(2, 2);
        table.make_victim(3, 3);
        assert_eq!(table.oldest_resident(), Some((0, true)));
        let mut oldest = Vec::new();
        table.oldest_victims(2, &mut oldest);
        assert_eq!(oldest, vec![(1, 1, true), (2, 2, true)]);
        assert_eq!((table.resident_count(), table.victim_count()), (1, 3));
        table.check();
    }

    #[test]
    fn forgetting_a_range_frees_its_slots_and_staging_pages_and_nothing_else() {
        let mut table = PageTable::default();
        for page in 10..16 {
            table.make_resident(page, Dirt::Written);
        }
        table.make_victim(11, 5);
        table.written_back(11, 40);
        table.make_victim(12, 6);
        table.written_back(12, 41);
        table.make_remote(12);
        let freed = table.forget(11, 13);
        assert_eq!(freed, Freed { slots: vec![40, 41], staging: vec![5] });
        assert_eq!(table.fault(11), Fault::Zero);
        assert_eq!(table.fault(12), Fault::Zero);
        assert_eq!(table.oldest_resident(), Some((10, true)));
        assert_eq!(table.oldest_victim(), None);
        assert_eq!(table.resident_count(), 4);
        table.check();
    }

    #[test]
    fn a_remap_moves_every_state_and_the_queues_follow() {
        let mut table = PageTable::default();
        table.make_resident(100, Dirt::Written);
        table.make_resident(101, Dirt::Written);
        table.make_victim(101, 9);
        table.remap(100, 500, 2);
        assert_eq!(table.fault(100), Fault::Zero);
        assert_eq!(table.fault(501), Fault::MoveBack { staging: 9 });
        assert_eq!(table.oldest_resident(), Some((500, true)));
        assert_eq!(table.oldest_victim(), Some((501, 9, true)));
        table.check();
    }

    #[test]
    fn slots_are_reused_after_they_are_given_back_and_run_out_at_the_region_size() {
        let mut slots = Slots::new(2);
        assert_eq!((slots.take(), slots.take(), slots.take()), (Some(0), Some(1), None));
        slots.give_back(0);
        assert_eq!((slots.in_use(), slots.take()), (1, Some(0)));
    }
}
