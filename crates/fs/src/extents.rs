//! Where a file's pages live: the page allocator of the remem address space and the extent map
//! of one file (file page -> remem page, in runs).
//!
//! Invariants: a remem page belongs to at most one extent of one file, or to the allocator's
//! free list, never both (checked by `assert!` on every free); free runs never overlap or touch
//! (they are merged); extents of one file never overlap. Nothing here does I/O: the caller
//! discards freed pages in remem (so they read as zeros when they are handed out again).

use std::collections::BTreeMap;

/// Free runs of remem pages, first fit.
#[derive(Debug)]
pub struct Allocator {
    /// Run start -> run length (pages), never empty, never overlapping or adjacent.
    free: BTreeMap<u64, u64>,
    free_pages: u64,
    total_pages: u64,
}

impl Allocator {
    /// An allocator of pages `0..total_pages`, all free.
    pub fn new(total_pages: u64) -> Allocator {
        let mut free = BTreeMap::new();
        if total_pages > 0 {
            free.insert(0, total_pages);
        }
        Allocator { free, free_pages: total_pages, total_pages }
    }

    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    pub fn total_pages(&self) -> u64 {
        self.total_pages
    }

    /// Takes a run of at most `want` pages (> 0): the first run that holds them all, else the
    /// first run there is. `None` when nothing is free.
    pub fn allocate(&mut self, want: u64) -> Option<(u64, u64)> {
        assert!(want > 0, "allocate asks for at least one page");
        let (&start, &len) =
            self.free.iter().find(|(_, &len)| len >= want).or_else(|| self.free.iter().next())?;
        let taken = len.min(want);
        self.free.remove(&start);
        if taken < len {
            self.free.insert(start + taken, len - taken);
        }
        self.free_pages -= taken;
        Some((start, taken))
    }

    /// Takes exactly the pages `start..start + len` if all of them are free (replaying a
    /// journal or loading a snapshot, where the pages are named). False, and nothing taken,
    /// otherwise.
    pub fn take(&mut self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else { return false };
        if len == 0 || end > self.total_pages {
            return false;
        }
        let Some((&run, &run_len)) = self.free.range(..=start).next_back() else { return false };
        if run + run_len < end {
            return false;
        }
        self.free.remove(&run);
        if run < start {
            self.free.insert(run, start - run);
        }
        if end < run + run_len {
            self.free.insert(end, run + run_len - end);
        }
        self.free_pages -= len;
        true
    }

    /// Whether a page of `start..end` is free.
    pub fn intersects_free(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        let before = self.free.range(..start).next_back().is_some_and(|(&first, &len)| first + len > start);
        before || self.free.range(start..end).next().is_some()
    }

    /// The free runs, in order: (first page, length).
    pub fn free_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&start, &len)| (start, len))
    }

    /// Returns a run to the free list, merging it with its neighbours.
    pub fn release(&mut self, start: u64, len: u64) {
        assert!(len > 0 && start.checked_add(len).is_some_and(|end| end <= self.total_pages), "run in range");
        let mut new_start = start;
        let mut new_len = len;
        if let Some((&before, &before_len)) = self.free.range(..start).next_back() {
            assert!(before + before_len <= start, "double free of page {start}");
            if before + before_len == start {
                self.free.remove(&before);
                new_start = before;
                new_len += before_len;
            }
        }
        if let Some((&after, &after_len)) = self.free.range(start..).next() {
            assert!(start + len <= after, "double free of page {after}");
            if start + len == after {
                self.free.remove(&after);
                new_len += after_len;
            }
        }
        self.free.insert(new_start, new_len);
        self.free_pages += len;
    }
}

/// The extent map of one file: file page -> remem page, in runs.
#[derive(Debug, Default)]
pub struct ExtentMap {
    /// First file page of a run -> (first remem page, length in pages).
    runs: BTreeMap<u64, (u64, u64)>,
    mapped_pages: u64,
}

/// Not enough free remem pages for an allocation; nothing was allocated.
#[derive(Debug, PartialEq, Eq)]
pub struct NoSpace {
    pub needed_pages: u64,
    pub free_pages: u64,
}

impl ExtentMap {
    /// Pages of this file that hold remem pages.
    pub fn mapped_pages(&self) -> u64 {
        self.mapped_pages
    }

    /// The remem page of file page `page`, if it has one.
    pub fn lookup(&self, page: u64) -> Option<u64> {
        let (&first, &(remote, len)) = self.runs.range(..=page).next_back()?;
        (page < first + len).then(|| remote + (page - first))
    }

    /// Pages of `start..end` without a remem page.
    pub fn unmapped_in(&self, start: u64, end: u64) -> u64 {
        let mut mapped = 0;
        self.for_each_run_in(start, end, |first, _, len| {
            mapped += len.min(end - first);
        });
        (end - start) - mapped
    }

    /// The runs, in file order: (first file page, first remem page, length).
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.runs.iter().map(|(&first, &(remote, len))| (first, remote, len))
    }

    /// Maps `first..first + len` to `remote..remote + len` (replay and snapshot load, where
    /// the remem pages were already taken from the allocator). False, and nothing changed, if
    /// a page of the range is mapped already or the range overflows.
    pub fn insert_mapping(&mut self, first: u64, remote: u64, len: u64) -> bool {
        if len == 0 || first.checked_add(len).is_none() || remote.checked_add(len).is_none() {
            return false;
        }
        if self.lookup(first).is_some() || self.runs.range(first..first + len).next().is_some() {
            return false;
        }
        self.insert_run(first, remote, len);
        true
    }

    /// Calls `visit(file_page, remem_page, len)` for each mapped run clipped to `start..end`.
    pub fn for_each_run_in(&self, start: u64, end: u64, mut visit: impl FnMut(u64, u64, u64)) {
        if start >= end {
            return;
        }
        if let Some((&first, &(remote, len))) = self.runs.range(..start).next_back() {
            if first + len > start {
                let clipped_end = (first + len).min(end);
                visit(start, remote + (start - first), clipped_end - start);
            }
        }
        for (&first, &(remote, len)) in self.runs.range(start..end) {
            visit(first, remote, len.min(end - first));
        }
    }

    /// Gives every page of `start..end` a remem page, taking new ones from `allocator`.
    /// All or nothing: with too few free pages nothing is allocated. Returns how many pages
    /// were newly mapped; `new_run(file_page, remem_page, len)` hears of each new run.
    pub fn map_range(
        &mut self,
        start: u64,
        end: u64,
        allocator: &mut Allocator,
        mut new_run: impl FnMut(u64, u64, u64),
    ) -> Result<u64, NoSpace> {
        let needed = self.unmapped_in(start, end);
        if needed > allocator.free_pages() {
            return Err(NoSpace { needed_pages: needed, free_pages: allocator.free_pages() });
        }
        let mut page = start;
        while page < end {
            if self.lookup(page).is_some() {
                page += 1;
                continue;
            }
            // The hole runs to the next mapped run or `end`.
            let hole_end = self.runs.range(page..end).next().map_or(end, |(&first, _)| first);
            let mut at = page;
            while at < hole_end {
                let (remote, len) = allocator.allocate(hole_end - at).expect("free pages were counted");
                self.insert_run(at, remote, len);
                new_run(at, remote, len);
                at += len;
            }
            page = hole_end;
        }
        Ok(needed)
    }

    /// Adds a run, merged with the runs before and after it when they are contiguous with it in
    /// file and remem pages: the map is the same, run for run, whatever order its pages were
    /// mapped in (a replay maps them in journal order, the live file system in another).
    fn insert_run(&mut self, first: u64, remote: u64, len: u64) {
        self.mapped_pages += len;
        let (mut first, mut remote, mut len) = (first, remote, len);
        if let Some((&before, &(before_remote, before_len))) = self.runs.range(..first).next_back() {
            if before + before_len == first && before_remote + before_len == remote {
                (first, remote, len) = (before, before_remote, before_len + len);
            }
        }
        if let Some(&(after_remote, after_len)) = self.runs.get(&(first + len)) {
            if after_remote == remote + len {
                self.runs.remove(&(first + len));
                len += after_len;
            }
        }
        self.runs.insert(first, (remote, len));
    }

    /// Removes every mapping of `start..end` (end may be `u64::MAX`) and hands each freed remem
    /// run to `freed(remote, len)`.
    pub fn unmap_range(&mut self, start: u64, end: u64, mut freed: impl FnMut(u64, u64)) {
        if start >= end {
            return;
        }
        // Split a run that straddles `start` or `end`, so whole runs lie inside.
        self.split_at(start);
        self.split_at(end);
        let inside: Vec<u64> = self.runs.range(start..end).map(|(&first, _)| first).collect();
        for first in inside {
            let (remote, len) = self.runs.remove(&first).expect("listed just now");
            self.mapped_pages -= len;
            freed(remote, len);
        }
    }

    /// Makes `page` the first page of a run if a run covers it.
    fn split_at(&mut self, page: u64) {
        let Some((&first, &(remote, len))) = self.runs.range(..page).next_back() else { return };
        if page < first + len {
            self.runs.insert(first, (remote, page - first));
            self.runs.insert(page, (remote + (page - first), first + len - page));
        }
    }

    /// Removes every mapping, handing each run to `freed`.
    pub fn clear(&mut self, freed: impl FnMut(u64, u64)) {
        self.unmap_range(0, u64::MAX, freed);
    }
}

/// A set of remem pages as merged runs (the pages mapped to a file but never written since:
/// fallocated, so they must read as zeros, also after a restart).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunSet {
    /// Run start -> length, never empty, never overlapping or adjacent.
    runs: BTreeMap<u64, u64>,
}

impl RunSet {
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().map(|(&start, &len)| (start, len))
    }

    /// Adds `start..start + len` (pages already in the set stay).
    pub fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut new_start = start;
        let mut new_end = start.saturating_add(len);
        if let Some((&before, &before_len)) = self.runs.range(..=start).next_back() {
            if before + before_len >= start {
                new_start = before;
                new_end = new_end.max(before + before_len);
                self.runs.remove(&before);
            }
        }
        while let Some((&after, &after_len)) = self.runs.range(new_start..=new_end).next() {
            self.runs.remove(&after);
            new_end = new_end.max(after + after_len);
        }
        self.runs.insert(new_start, new_end - new_start);
    }

    /// Removes `start..start + len`; true if any page of it was in the set.
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        if len == 0 || !self.intersects(start, end) {
            return false;
        }
        if let Some((&before, &before_len)) = self.runs.range(..start).next_back() {
            if before + before_len > start {
                self.runs.insert(before, start - before);
                if before + before_len > end {
                    self.runs.insert(end, before + before_len - end);
                }
            }
        }
        let inside: Vec<(u64, u64)> =
            self.runs.range(start..end).map(|(&first, &run_len)| (first, run_len)).collect();
        for (first, run_len) in inside {
            self.runs.remove(&first);
            if first + run_len > end {
                self.runs.insert(end, first + run_len - end);
            }
        }
        true
    }

    /// Whether a page of `start..end` is in the set.
    pub fn intersects(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        let before = self.runs.range(..start).next_back().is_some_and(|(&first, &len)| first + len > start);
        before || self.runs.range(start..end).next().is_some()
    }

    /// Whether every page of `start..end` is in the set.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        self.runs.range(..=start).next_back().is_some_and(|(&first, &len)| first + len >= end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn allocator_merges_released_runs() {
        let mut allocator = Allocator::new(10);
        assert_eq!(allocator.allocate(4), Some((0, 4)));
        assert_eq!(allocator.allocate(4), Some((4, 4)));
        allocator.release(0, 4);
        allocator.release(4, 4);
        assert_eq!(allocator.allocate(10), Some((0, 10)));
        assert_eq!(allocator.allocate(1), None);
    }

    #[test]
    fn map_range_is_all_or_nothing() {
        let mut allocator = Allocator::new(8);
        let mut map = ExtentMap::default();
        assert_eq!(
            map.map_range(0, 9, &mut allocator, |_, _, _| ()),
            Err(NoSpace { needed_pages: 9, free_pages: 8 })
        );
        assert_eq!(allocator.free_pages(), 8);
        assert_eq!(map.map_range(100, 104, &mut allocator, |_, _, _| ()), Ok(4));
        assert_eq!(map.map_range(102, 108, &mut allocator, |_, _, _| ()), Ok(4));
        assert_eq!(map.lookup(105), Some(5));
        assert_eq!(map.lookup(99), None);
    }

    #[test]
    fn tib_offsets_map_lazily() {
        let mut allocator = Allocator::new(16);
        let mut map = ExtentMap::default();
        let far = (1u64 << 40) / 4096 * 3;
        assert_eq!(map.map_range(far, far + 2, &mut allocator, |_, _, _| ()), Ok(2));
        assert_eq!(map.mapped_pages(), 2);
        assert_eq!(map.unmapped_in(0, far + 2), far);
    }

    #[test]
    fn allocator_takes_named_runs_only_when_free() {
        let mut allocator = Allocator::new(10);
        assert!(allocator.take(3, 4));
        assert!(!allocator.take(2, 2), "page 3 is taken");
        assert!(!allocator.take(9, 2), "beyond the end");
        assert!(!allocator.take(u64::MAX, 2), "overflow");
        assert_eq!(allocator.free_runs().collect::<Vec<_>>(), vec![(0, 3), (7, 3)]);
        assert_eq!(allocator.free_pages(), 6);
    }

    proptest! {
        /// A run set against a set of pages.
        #[test]
        fn run_set_matches_a_page_set(ops in prop::collection::vec((any::<bool>(), 0u64..64, 1u64..12), 1..60)) {
            let mut set = RunSet::default();
            let mut model = std::collections::BTreeSet::new();
            for (add, start, len) in ops {
                if add {
                    set.insert(start, len);
                    model.extend(start..start + len);
                } else {
                    let had = (start..start + len).any(|page| model.contains(&page));
                    prop_assert_eq!(set.remove(start, len), had);
                    for page in start..start + len {
                        model.remove(&page);
                    }
                }
                let pages: std::collections::BTreeSet<u64> =
                    set.runs().flat_map(|(start, len)| start..start + len).collect();
                prop_assert_eq!(&pages, &model);
                let runs: Vec<(u64, u64)> = set.runs().collect();
                for pair in runs.windows(2) {
                    prop_assert!(pair[0].0 + pair[0].1 < pair[1].0, "runs merged");
                }
            }
        }

        /// Random maps, unmaps and lookups against a HashMap model: no remem page is ever given
        /// to two file pages, freed pages come back, and counts agree.
        #[test]
        fn extent_map_matches_a_page_model(ops in prop::collection::vec((0u8..3, 0u64..64, 1u64..16), 1..80)) {
            let mut allocator = Allocator::new(256);
            let mut map = ExtentMap::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for (kind, start, len) in ops {
                let end = start + len;
                match kind {
                    0 => {
                        if map.map_range(start, end, &mut allocator, |_, _, _| ()).is_ok() {
                            for page in start..end {
                                let remote = map.lookup(page).expect("mapped");
                                if let Some(&old) = model.get(&page) {
                                    prop_assert_eq!(old, remote, "a mapped page moved");
                                }
                                model.insert(page, remote);
                            }
                        }
                    }
                    1 => {
                        map.unmap_range(start, end, |remote, len| allocator.release(remote, len));
                        for page in start..end {
                            model.remove(&page);
                        }
                    }
                    _ => {
                        for page in start..end {
                            prop_assert_eq!(map.lookup(page), model.get(&page).copied());
                        }
                    }
                }
                let mut seen = std::collections::HashSet::new();
                for remote in model.values() {
                    prop_assert!(seen.insert(*remote), "remem page {} given twice", remote);
                }
                prop_assert_eq!(map.mapped_pages(), model.len() as u64);
                prop_assert_eq!(allocator.free_pages() + model.len() as u64, 256);
            }
        }
    }
}
