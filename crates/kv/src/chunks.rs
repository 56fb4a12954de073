//! Pages of small values (chunks) being filled or written, kept in the server's memory so
//! that a small set writes its page without reading it first, and sets that arrive while the
//! page is being written go out together in the next write (group commit).
//!
//! A chunk page is cached while it is its class's open page (the one new chunks go to) or has
//! a write in flight; a page that is not cached is read once before its first patch (its other
//! chunks must survive), unless it holds no live chunk. Invariant: every write of a chunk page
//! goes through here, so a cached page's bytes are what remote memory holds or is about to.

use std::collections::HashMap;
use std::rc::Rc;

use crate::error::ValueError;
use crate::pageio::TaskId;
use crate::scheme::Scheme;
use crate::space::PAGE_BYTES;

/// A small value's bytes to put at `offset` of a page, on behalf of a store task.
#[derive(Debug)]
pub struct Patch {
    pub offset: usize,
    pub value: Rc<[u8]>,
    pub start: usize,
    pub len: usize,
    pub task: TaskId,
}

#[derive(Debug)]
pub struct CachedPage {
    pub data: Box<[u8]>,
    pub scheme: Scheme,
    pub class: u8,
    /// The task id that owns this page's I/O.
    pub io_task: TaskId,
    pub loading: bool,
    /// Writes of this page in flight (2 for EOR: data splits and main copy).
    pub writing: u32,
    pub write_error: Option<ValueError>,
    /// Stores acknowledged by the write in flight, and those waiting for the next one.
    pub current: Vec<TaskId>,
    pub next: Vec<TaskId>,
    /// Patches that arrived while the page was loading.
    pub held: Vec<Patch>,
    /// A value in the page was acknowledged (or may have been): a rewrite of an EC page must not
    /// be able to tear it (`crate::cache::rewrites`).
    pub holds_acknowledged: bool,
    /// The journal slot of the write in flight, when it was journaled.
    pub journal: Option<u32>,
    /// The page's next write waits for a free journal slot.
    pub waiting_journal: bool,
}

#[derive(Debug, Default)]
pub struct ChunkCache {
    pub pages: HashMap<u64, CachedPage>,
    /// Page of each I/O task id.
    pub by_task: HashMap<TaskId, u64>,
    open: HashMap<(Scheme, u8), u64>,
}

/// A page's write, all of its parts finished.
#[derive(Debug)]
pub struct WriteDone {
    /// The stores it acknowledges (or fails).
    pub stores: Vec<TaskId>,
    pub error: Option<ValueError>,
    /// Patches wait: another write should start.
    pub again: bool,
    /// The journal slot it held, to clear and free.
    pub journal: Option<u32>,
}

/// What the caller must do after a patch.
#[derive(Debug, PartialEq, Eq)]
pub enum PatchStep {
    /// Read the page (it is loading); patches wait.
    Load { io_task: TaskId },
    /// Write the page now.
    Write,
    /// A write is in flight; this patch goes out with the next one.
    Queued,
}

impl ChunkCache {
    /// Puts a patch into the page's cached copy (creating it: zeros when `fresh`, else loading).
    pub fn patch(
        &mut self,
        page: u64,
        scheme: Scheme,
        class: u8,
        fresh: bool,
        patch: Patch,
        new_task: impl FnOnce() -> TaskId,
    ) -> PatchStep {
        let mut step = None;
        if !self.pages.contains_key(&page) {
            let io_task = new_task();
            self.by_task.insert(io_task, page);
            self.pages.insert(
                page,
                CachedPage {
                    data: vec![0; PAGE_BYTES].into_boxed_slice(),
                    scheme,
                    class,
                    io_task,
                    loading: !fresh,
                    writing: 0,
                    write_error: None,
                    current: Vec::new(),
                    next: Vec::new(),
                    held: Vec::new(),
                    holds_acknowledged: !fresh,
                    journal: None,
                    waiting_journal: false,
                },
            );
            if !fresh {
                step = Some(PatchStep::Load { io_task });
            }
        }
        if let Some(previous) = self.open.insert((scheme, class), page) {
            if previous != page {
                self.drop_if_idle(previous);
            }
        }
        let cached = self.pages.get_mut(&page).expect("inserted above");
        cached.scheme = scheme;
        cached.class = class;
        cached.next.push(patch.task);
        if cached.loading {
            cached.held.push(patch);
            return step.unwrap_or(PatchStep::Queued);
        }
        if fresh && cached.writing == 0 && cached.current.is_empty() && cached.next.len() == 1 {
            cached.data.fill(0);
        }
        cached.data[patch.offset..patch.offset + patch.len]
            .copy_from_slice(&patch.value[patch.start..patch.start + patch.len]);
        if cached.writing == 0 && !cached.waiting_journal {
            PatchStep::Write
        } else {
            PatchStep::Queued
        }
    }

    /// The page was read: applies the held patches; true when a write should start.
    pub fn loaded(&mut self, page: u64, bytes: &[u8]) -> bool {
        let cached = self.pages.get_mut(&page).expect("a loading page is cached");
        cached.data.copy_from_slice(bytes);
        cached.loading = false;
        for patch in std::mem::take(&mut cached.held) {
            cached.data[patch.offset..patch.offset + patch.len]
                .copy_from_slice(&patch.value[patch.start..patch.start + patch.len]);
        }
        !cached.next.is_empty() && cached.writing == 0 && !cached.waiting_journal
    }

    /// The page could not be read: it is never written from here (its other chunks may only be
    /// out of reach, and zeros written over them would be served as their values). Forgets the
    /// page and returns the patches that waited for it, to be placed elsewhere.
    pub fn unreadable(&mut self, page: u64) -> Vec<Patch> {
        let cached = self.pages.remove(&page).expect("a loading page is cached");
        assert!(cached.loading && cached.writing == 0 && cached.current.is_empty());
        self.by_task.remove(&cached.io_task);
        self.open.retain(|_, open| *open != page);
        debug_assert_eq!(cached.next.len(), cached.held.len());
        cached.held
    }

    /// Caches a page that is not cached, with `bytes` read from remote memory, and starts a
    /// write of one half of it (an EOR page's main copy written back): patches that arrive
    /// meanwhile go out with the next write, as after any write.
    pub fn repair(&mut self, page: u64, scheme: Scheme, class: u8, bytes: &[u8], io_task: TaskId) {
        assert!(!self.pages.contains_key(&page), "a cached page is not read, so not repaired");
        self.by_task.insert(io_task, page);
        self.pages.insert(
            page,
            CachedPage {
                data: bytes.into(),
                scheme,
                class,
                io_task,
                loading: false,
                writing: 1,
                write_error: None,
                current: Vec::new(),
                next: Vec::new(),
                held: Vec::new(),
                holds_acknowledged: true,
                journal: None,
                waiting_journal: false,
            },
        );
    }

    /// Starts a write: the waiting stores ride on it. Returns the bytes to write. With
    /// `journal`, the first write is of the page's journal copy (one write), and
    /// [`ChunkCache::journaled`] starts the in-place writes after it.
    pub fn begin_write(&mut self, page: u64, writes: u32, journal: Option<u32>) -> &[u8] {
        let cached = self.pages.get_mut(&page).expect("cached");
        assert!(cached.writing == 0 && !cached.loading && cached.journal.is_none());
        cached.current = std::mem::take(&mut cached.next);
        cached.writing = writes;
        cached.write_error = None;
        cached.journal = journal;
        cached.waiting_journal = false;
        &cached.data
    }

    /// The journal copy of the page is written (and its intent recorded): the `writes` in-place
    /// writes start. Returns the bytes to write (with any patch made since: they are not
    /// acknowledged before the next write, and a restore from the journal drops only them).
    pub fn journaled(&mut self, page: u64, writes: u32) -> &[u8] {
        let cached = self.pages.get_mut(&page).expect("cached");
        assert!(cached.writing == 1 && cached.journal.is_some());
        cached.writing = writes;
        &cached.data
    }

    /// The page's next write waits for a journal slot.
    pub fn wait_for_journal(&mut self, page: u64) {
        let cached = self.pages.get_mut(&page).expect("cached");
        assert!(cached.writing == 0 && !cached.loading);
        cached.waiting_journal = true;
    }

    /// Whether `page` is cached and waits for a journal slot.
    pub fn waits_for_journal(&self, page: u64) -> bool {
        self.pages.get(&page).is_some_and(|cached| cached.waiting_journal)
    }

    /// One write of the page finished. When all did: what it carried, and whether another
    /// write should start.
    pub fn write_done(&mut self, page: u64, error: Option<ValueError>) -> Option<WriteDone> {
        let cached = self.pages.get_mut(&page).expect("cached");
        cached.writing -= 1;
        if error.is_some() {
            cached.write_error = error;
        }
        if cached.writing > 0 {
            return None;
        }
        cached.holds_acknowledged = true;
        let done = WriteDone {
            stores: std::mem::take(&mut cached.current),
            error: cached.write_error.take(),
            again: !cached.next.is_empty(),
            journal: cached.journal.take(),
        };
        if !done.again && self.open.get(&(cached.scheme, cached.class)) != Some(&page) {
            self.drop_if_idle(page);
        }
        Some(done)
    }

    /// A cached copy of the page, when it is not loading.
    pub fn bytes(&self, page: u64) -> Option<&[u8]> {
        self.pages.get(&page).filter(|cached| !cached.loading).map(|cached| &cached.data[..])
    }

    pub fn page_of_task(&self, task: TaskId) -> Option<u64> {
        self.by_task.get(&task).copied()
    }

    /// Forgets a page that holds no chunk any more (it may become a whole-value page).
    pub fn forget(&mut self, page: u64) {
        self.open.retain(|_, open| *open != page);
        self.drop_if_idle(page);
    }

    fn drop_if_idle(&mut self, page: u64) {
        if let Some(cached) = self.pages.get(&page) {
            if !cached.loading && cached.writing == 0 && cached.next.is_empty() && cached.current.is_empty() {
                let cached = self.pages.remove(&page).expect("present");
                self.by_task.remove(&cached.io_task);
            }
        }
    }

    pub fn cached_pages(&self) -> usize {
        self.pages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(offset: usize, byte: u8, task: TaskId) -> Patch {
        Patch { offset, value: Rc::from(vec![byte; 64]), start: 0, len: 64, task }
    }

    #[test]
    fn patches_during_a_write_go_out_together_in_the_next_one() {
        let mut cache = ChunkCache::default();
        let mut ids = 100..;
        assert_eq!(
            cache.patch(7, Scheme::Rep2, 0, true, patch(0, 1, 1), || ids.next().unwrap()),
            PatchStep::Write
        );
        assert_eq!(cache.begin_write(7, 1, None)[0], 1);
        assert_eq!(
            cache.patch(7, Scheme::Rep2, 0, false, patch(64, 2, 2), || unreachable!()),
            PatchStep::Queued
        );
        assert_eq!(
            cache.patch(7, Scheme::Rep2, 0, false, patch(128, 3, 3), || unreachable!()),
            PatchStep::Queued
        );
        let done = cache.write_done(7, None).unwrap();
        assert_eq!((done.stores, done.error.is_none(), done.again), (vec![1], true, true));
        let bytes = cache.begin_write(7, 2, None);
        assert_eq!((bytes[0], bytes[64], bytes[128]), (1, 2, 3));
        assert!(cache.write_done(7, Some(ValueError::TailPageUnreadable)).is_none());
        let done = cache.write_done(7, None).unwrap();
        assert_eq!((&done.stores, done.again), (&vec![2, 3], false));
        assert!(
            matches!(done.error, Some(ValueError::TailPageUnreadable)),
            "the first error of the write stays"
        );
        assert!(cache.bytes(7).is_some(), "the open page stays cached");
    }

    #[test]
    fn a_page_with_other_chunks_is_loaded_before_its_patches_apply() {
        let mut cache = ChunkCache::default();
        let step = cache.patch(9, Scheme::Ec, 0, false, patch(64, 5, 1), || 500);
        assert_eq!(step, PatchStep::Load { io_task: 500 });
        assert!(cache.bytes(9).is_none());
        let mut remote = vec![7u8; PAGE_BYTES];
        remote[64] = 0;
        assert!(cache.loaded(9, &remote));
        let bytes = cache.bytes(9).unwrap();
        assert_eq!((bytes[0], bytes[64], bytes[200]), (7, 5, 7));
    }

    #[test]
    fn an_unreadable_page_hands_back_its_patches_and_is_never_written() {
        let mut cache = ChunkCache::default();
        let step = cache.patch(9, Scheme::Ec, 0, false, patch(64, 5, 1), || 500);
        assert_eq!(step, PatchStep::Load { io_task: 500 });
        assert_eq!(
            cache.patch(9, Scheme::Ec, 0, false, patch(128, 6, 2), || unreachable!()),
            PatchStep::Queued
        );
        let patches = cache.unreadable(9);
        assert_eq!(patches.iter().map(|patch| patch.task).collect::<Vec<_>>(), vec![1, 2]);
        assert!(cache.bytes(9).is_none() && cache.page_of_task(500).is_none());
        assert_eq!(cache.cached_pages(), 0);
    }

    #[test]
    fn a_journaled_write_goes_in_place_after_its_journal_copy_and_frees_its_slot() {
        let mut cache = ChunkCache::default();
        let mut ids = 1..;
        cache.patch(4, Scheme::Ec, 0, true, patch(0, 1, 10), || ids.next().unwrap());
        assert!(!cache.pages[&4].holds_acknowledged, "a fresh page's first write needs no journal");
        cache.begin_write(4, 1, None);
        assert!(cache.write_done(4, None).unwrap().journal.is_none());
        assert!(cache.pages[&4].holds_acknowledged);
        assert_eq!(
            cache.patch(4, Scheme::Ec, 0, false, patch(64, 2, 11), || unreachable!()),
            PatchStep::Write
        );
        cache.wait_for_journal(4);
        assert_eq!(
            cache.patch(4, Scheme::Ec, 0, false, patch(128, 3, 12), || unreachable!()),
            PatchStep::Queued
        );
        assert!(cache.waits_for_journal(4));
        assert_eq!(cache.begin_write(4, 1, Some(6))[64], 2);
        assert!(!cache.waits_for_journal(4));
        assert_eq!(cache.journaled(4, 2)[128], 3);
        assert!(cache.write_done(4, None).is_none());
        let done = cache.write_done(4, None).unwrap();
        assert_eq!((done.stores, done.journal, done.again), (vec![11, 12], Some(6), false));
    }

    #[test]
    fn a_page_that_is_no_longer_open_is_dropped_when_its_write_ends() {
        let mut cache = ChunkCache::default();
        let mut ids = 1..;
        cache.patch(1, Scheme::None, 0, true, patch(0, 1, 10), || ids.next().unwrap());
        cache.begin_write(1, 1, None);
        cache.patch(2, Scheme::None, 0, true, patch(0, 1, 11), || ids.next().unwrap());
        cache.write_done(1, None).unwrap();
        assert!(cache.bytes(1).is_none() && cache.bytes(2).is_some());
    }
}
