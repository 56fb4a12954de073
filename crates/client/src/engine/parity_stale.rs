//! Parity-stale pages: the engine's side of EC-oriented replication (seed 003 §4.2, EOR(2,k)).
//!
//! A front end keeps an object's main copy whole in a region without redundancy and one replica
//! as the k data splits of its future EC(k,r) page: [`super::Submit::WriteData`] writes the data
//! splits at a new version and leaves the parities as they were, and
//! [`super::Submit::WriteParity`] later encodes the same content and writes only the r parities
//! at that version, so the transition to EC costs r splits of I/O instead of k+r.
//!
//! Fault model of a parity-stale page: it survives no data-slab loss on its own (its parities
//! are of an older version or none), the main copy elsewhere does. So:
//! - it is read from its k data splits only, and the read fails (`Lost`) at once when one is
//!   unavailable, failed, corrupt or stale; it never asks or decodes with a parity;
//! - when a data slab of its range is lost (unavailable for any reason, a rebuild target that
//!   took its writes included) it is marked unreadable, so a rebuild that cannot bring it back
//!   is still complete (`pages_lost` within `unreadable_pages`) instead of retried forever; a
//!   later whole or data-only write makes it readable again;
//! - losing a parity slab changes nothing for it. The rebuild of that slab judges every source
//!   with `judge_split` and keeps the newest version k splits agree on (`newest_with_k`): with the
//!   k data splits at the page's version v and the parities older, that is v, and the rebuilt
//!   parity is encoded from the k data splits of v: a correct parity of v, which a later
//!   `WriteParity` (same content, same version) rewrites byte for byte. With a data split
//!   corrupt (flipped bits nobody has read yet) no version has k votes and that parity cannot be
//!   rebuilt: nothing is lost (the old parity held nothing the page needs), so a parity rebuild
//!   whose losses stay within the range's parity-stale pages and do not shrink on a retry is
//!   complete (`regeneration.rs`). With k <= r (rep(n)) and a data slab lost as well, the older
//!   parities may win instead and the rebuilt split carries their older version: the client,
//!   which expects v, never takes it;
//! - a data split stored by a data-only write on a slab lost before the write completed is gone
//!   as surely as one lost afterwards: the write succeeds (every split was stored) and the page is
//!   marked unreadable at once.
//!
//! The caller's word is part of the model: `WriteParity` must be given the bytes of the last
//! `WriteData`. Parities of other bytes at the same version would be decoded with the data splits
//! into wrong data, and the engine cannot tell (it would have to read the k data splits back).
//!
//! A region without redundancy (r = 0, k = 1: the main copies) has nothing to rebuild from but
//! the slab it replaces. When that slab cannot be read (its node died), every page of the range
//! that was or may have been written is marked unreadable and the replacement slab is complete
//! at once, empty: reads of those pages fail (the empty slot's version 0 is not theirs), writes
//! work again, and no rebuild waits forever for a source that cannot exist.

use super::{
    Engine, NodeId, PAGE_ABSENT_IS_LOST, PAGE_DISCARDED, PAGE_PARITY_STALE, PAGE_UNMAPPED, PAGE_UNREADABLE,
    PAGE_VERSION_UNKNOWN, PAGE_WRITE_DISCOVERS,
};

impl Engine {
    /// Whether `page` is parity-stale: written data splits only since its last whole or parity
    /// write, so it is read from its data splits alone and survives no data-slab loss. False
    /// for a page out of range.
    pub fn page_is_parity_stale(&self, page: u64) -> bool {
        self.page_flags.get(page as usize).is_some_and(|flags| flags & PAGE_PARITY_STALE != 0)
    }

    /// Whether the client knows `page` cannot be read until it is written again (its last write
    /// failed, or a data slab of it was lost while it was parity-stale, or its range lost the
    /// only slab it had). False for a page out of range.
    pub fn page_is_unreadable(&self, page: u64) -> bool {
        self.page_flags.get(page as usize).is_some_and(|flags| flags & PAGE_UNREADABLE != 0)
    }

    /// The node holding split `split` of the range of `page` (the slab writes go to), if the
    /// page and split exist.
    pub fn split_node(&self, page: u64, split: usize) -> Option<NodeId> {
        let region = self.region_of(page)?;
        let (range, _) = self.locate(region, page);
        self.ranges[range].slabs.get(split).map(|slab| slab.node)
    }

    /// Sets or clears a page's [`PAGE_PARITY_STALE`] flag, keeping its range's count.
    pub(super) fn set_parity_stale(&mut self, page: u64, parity_stale: bool) {
        let flags = &mut self.page_flags[page as usize];
        if (*flags & PAGE_PARITY_STALE != 0) == parity_stale {
            return;
        }
        *flags ^= PAGE_PARITY_STALE;
        let region = self.region_of(page).expect("a page of a region");
        let (range, _) = self.locate(region, page);
        if parity_stale {
            self.ranges[range].parity_stale_pages += 1;
        } else {
            self.ranges[range].parity_stale_pages -= 1;
        }
    }

    /// A whole or data-only write stored what it needed: the page is at `version`, readable,
    /// known exactly, and parity-stale exactly when only its data splits were written.
    pub(super) fn page_written(&mut self, page: u64, version: u8, parity_stale: bool) {
        let old = self.versions[page as usize];
        // Versions only move on: a write's version is the next of the newest known (or found
        // out), so a read taking the newest version with k splits never goes back in time.
        debug_assert!(
            old == 0 || remem_proto::version_is_newer(version, old),
            "page {page} written at version {version}, not newer than {old}"
        );
        self.versions[page as usize] = version;
        self.set_unreadable(page, false);
        self.set_parity_stale(page, parity_stale);
        self.page_flags[page as usize] &=
            !(PAGE_DISCARDED | PAGE_VERSION_UNKNOWN | PAGE_WRITE_DISCOVERS | PAGE_ABSENT_IS_LOST);
    }

    /// The pages a saved map must list as lost, as runs of (first page, count): those no read
    /// can return until written again, and those a reopened map listed that no read or write
    /// has found out yet. A client reopened from the map reads them as lost when no split has a
    /// version of them ([`Engine::mark_lost_unless_found`]), not as never written.
    pub fn lost_page_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (page, &flags) in self.page_flags.iter().enumerate() {
            let lost = flags & PAGE_UNREADABLE != 0
                || flags & (PAGE_ABSENT_IS_LOST | PAGE_VERSION_UNKNOWN)
                    == PAGE_ABSENT_IS_LOST | PAGE_VERSION_UNKNOWN;
            if !lost {
                continue;
            }
            match runs.last_mut() {
                Some((first, count)) if *first + *count == page as u64 => *count += 1,
                _ => runs.push((page as u64, 1)),
            }
        }
        runs
    }

    /// Marks the pages of `runs` (a reopened map's [`Engine::lost_page_runs`]) lost unless a
    /// read finds a version of them. Runs beyond the engine's pages are ignored (the map was
    /// validated against its regions before).
    pub fn mark_lost_unless_found(&mut self, runs: &[(u64, u64)]) {
        let total = self.page_flags.len() as u64;
        for &(first, count) in runs {
            let end = first.saturating_add(count).min(total);
            for page in first.min(end)..end {
                let flags = &mut self.page_flags[page as usize];
                if *flags & PAGE_UNMAPPED == 0 {
                    *flags |= PAGE_ABSENT_IS_LOST;
                }
            }
        }
    }

    /// A slab of data split `split` of range `range` is lost (or may be): its parity-stale pages
    /// cannot be rebuilt, so they are unreadable until written again. Called for every slab that
    /// becomes unavailable; parity slabs change nothing.
    pub(super) fn data_slab_lost(&mut self, range: usize, split: usize) {
        let shape = self.shape_of_range(range);
        if split >= shape.data_splits || self.ranges[range].parity_stale_pages == 0 {
            return;
        }
        let first = self.range_first_page(range);
        let pages = self.pages_in_range(range);
        let mut marked = 0u64;
        for page in first..first + pages {
            if self.page_flags[page as usize] & (PAGE_PARITY_STALE | PAGE_UNREADABLE) == PAGE_PARITY_STALE {
                self.set_unreadable(page, true);
                marked += 1;
            }
        }
        if marked > 0 {
            tracing::info!(
                range,
                split,
                pages = marked,
                "data slab lost: its parity-stale pages are unreadable"
            );
        }
    }

    /// Range `range` has one split (no redundancy) and its slab cannot be read: every page that
    /// was or may have been written is gone. Each is marked unreadable, with a version the empty
    /// replacement slot does not carry (a page whose version was unknown gets 1: the slab that
    /// held its versions is abandoned, so no split anywhere carries one), so a read fails and
    /// never returns zeros for it.
    pub(super) fn range_contents_lost(&mut self, range: usize) {
        assert_eq!(self.shape_of_range(range).total_splits(), 1, "only a range without redundancy");
        let first = self.range_first_page(range);
        let mut lost = 0u64;
        for page in first..first + self.pages_in_range(range) {
            let flags = self.page_flags[page as usize];
            let unknown = flags & PAGE_VERSION_UNKNOWN != 0;
            if self.versions[page as usize] == 0 && !unknown {
                continue;
            }
            // A page already unreadable whose version was unknown (a write that failed) must
            // not stay unknown: finding out would read the empty replacement, find no version
            // and take the page for one never written (zeros).
            if unknown {
                self.versions[page as usize] = self.versions[page as usize].max(1);
                self.page_flags[page as usize] = flags & !(PAGE_VERSION_UNKNOWN | PAGE_WRITE_DISCOVERS);
            }
            if flags & PAGE_UNREADABLE == 0 {
                self.set_unreadable(page, true);
                lost += 1;
            }
        }
        tracing::warn!(
            range,
            pages = lost,
            "the only slab of a range without redundancy is lost, and its pages"
        );
    }

    /// Pages of range `range` that a rebuild could bring back: written (or perhaps written) and
    /// not known to be unreadable.
    pub(super) fn recoverable_pages(&self, range: usize) -> u64 {
        let first = self.range_first_page(range);
        (first..first + self.pages_in_range(range))
            .filter(|&page| {
                let flags = self.page_flags[page as usize];
                flags & PAGE_UNREADABLE == 0
                    && (self.versions[page as usize] != 0 || flags & PAGE_VERSION_UNKNOWN != 0)
            })
            .count() as u64
    }

    /// Parity-stale pages of range `range` not marked unreadable.
    pub(super) fn parity_stale_readable_pages(&self, range: usize) -> u64 {
        if self.ranges[range].parity_stale_pages == 0 {
            return 0;
        }
        let first = self.range_first_page(range);
        (first..first + self.pages_in_range(range))
            .filter(|&page| {
                self.page_flags[page as usize] & (PAGE_PARITY_STALE | PAGE_UNREADABLE) == PAGE_PARITY_STALE
            })
            .count() as u64
    }

    /// Pages of the client's page space in range `range` (the last range of a region may be
    /// short).
    fn pages_in_range(&self, range: usize) -> u64 {
        let region = &self.regions[self.ranges[range].region];
        let local_first = (range - region.first_range) as u64 * region.pages_per_range;
        region.pages_per_range.min(region.page_count - local_first)
    }
}
