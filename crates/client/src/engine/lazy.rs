//! Ranges mapped when first needed: a region's pages exist from its creation, but a range of it
//! may hold no slabs yet (a front end that grows with what it stores, as `remem kv` does, maps a
//! range before it writes there and gives it back when it holds nothing).
//!
//! A range without slabs has an empty `slabs` list and its pages carry only `PAGE_UNMAPPED`: it
//! is never read or written (an op on one of its pages fails with `PageError::Unmapped`, found by
//! the flag byte every op reads anyway), never rebuilt and never exported. Mapping a
//! range gives it fresh slabs, whose pages are all at version 0 (never written); releasing it
//! unmaps them and forgets its pages' versions.
//!
//! A region laid beside another ([`super::Engine::nodes_beside`]) keeps that rule range by range:
//! its range goes on the node of the chosen split of the other region's range holding its first
//! page, which must be mapped first; and a range of the other region mapped later avoids the
//! nodes of beside ranges already holding its pages, so that no data split shares a node with
//! the copy beside it.

use super::{BesideError, Engine, NodeId, Region, SlabRef, MAX_SPLITS, PAGE_UNMAPPED};

/// Where a range about to be mapped must go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangePlacement {
    /// Its one slab on this node (a range of a region laid beside another).
    Pinned(NodeId),
    /// Wherever the placement policy says, but on none of these nodes.
    Avoiding(Vec<NodeId>),
}

impl Engine {
    /// Whether range `range` has its slabs.
    pub fn range_mapped(&self, range: usize) -> bool {
        !self.ranges[range].slabs.is_empty()
    }

    /// Records that region `region` is laid beside region `beside` at split `split` (what
    /// [`Engine::placement_of_range`] keeps for its ranges mapped later).
    pub fn set_region_beside(&mut self, region: usize, beside: usize, split: usize) {
        assert!(beside < region, "a region is laid beside an earlier one");
        self.regions[region].beside = Some((beside, split));
    }

    /// The region and split region `region` is laid beside, if any.
    pub fn region_beside(&self, region: usize) -> Option<(usize, usize)> {
        self.regions[region].beside
    }

    /// Where unmapped range `range` must go. Errors for a range of a region laid beside another
    /// when the other's range holding its first page is not mapped or its split is unavailable,
    /// or when a mapped range of the other would share a data node with it.
    pub fn placement_of_range(&self, range: usize) -> Result<RangePlacement, BesideError> {
        let region = &self.regions[self.ranges[range].region];
        if let Some((beside, split)) = region.beside {
            let (first_offset, last_offset) = self.range_offsets(range);
            let last_offset = last_offset.min(self.regions[beside].page_count - 1);
            let local_range = (range - region.first_range) as u64;
            return self
                .beside_node(beside, split, (first_offset, last_offset), local_range)
                .map(RangePlacement::Pinned);
        }
        // Ranges of regions laid beside this one that hold pages of this range.
        Ok(RangePlacement::Avoiding(self.nodes_beside_range(range)))
    }

    /// The nodes a new slab of split `split` of mapped range `range` must not go to because of
    /// regions laid beside one another (EOR's main copies beside its EC pages): for a range of a
    /// region laid beside another, the nodes of the data splits of the other's ranges that hold
    /// its pages; for a data split of a range that a region is laid beside, the nodes of that
    /// region's ranges holding its pages. A page's main copy and its data splits on one node
    /// would be lost together with it: one failure, within EOR's tolerance, losing the page.
    pub fn beside_conflicts(&self, range: usize, split: usize) -> Vec<NodeId> {
        let region = &self.regions[self.ranges[range].region];
        match region.beside {
            Some((beside, _)) => {
                let beside = &self.regions[beside];
                self.nodes_holding(beside, self.range_offsets(range), beside.shape.data_splits)
            }
            None if split < region.shape.data_splits => self.nodes_beside_range(range),
            None => Vec::new(),
        }
    }

    /// The first and last page offsets of `range` within its region.
    pub(super) fn range_offsets(&self, range: usize) -> (u64, u64) {
        let region = &self.regions[self.ranges[range].region];
        let first = (range - region.first_range) as u64 * region.pages_per_range;
        (first, (first + region.pages_per_range).min(region.page_count) - 1)
    }

    /// The nodes of the first `take` splits of the ranges of `other` that hold page offsets
    /// `first..=last` (of a region laid beside it, or it beside them: offsets match page for
    /// page).
    fn nodes_holding(&self, other: &Region, (first, last): (u64, u64), take: usize) -> Vec<NodeId> {
        if first >= other.page_count {
            return Vec::new();
        }
        let range_of = |offset: u64| other.first_range + (offset / other.pages_per_range) as usize;
        (range_of(first)..=range_of(last.min(other.page_count - 1)))
            .flat_map(|other_range| self.ranges[other_range].slabs.iter().take(take).map(|slab| slab.node))
            .collect()
    }

    /// The nodes of the ranges of regions laid beside `range`'s region that hold its pages.
    fn nodes_beside_range(&self, range: usize) -> Vec<NodeId> {
        let region_index = self.ranges[range].region;
        let offsets = self.range_offsets(range);
        self.regions
            .iter()
            .filter(|other| other.beside.is_some_and(|(of, _)| of == region_index))
            .flat_map(|other| self.nodes_holding(other, offsets, usize::MAX))
            .collect()
    }

    /// Gives unmapped range `range` the slabs the driver mapped for it, one per split: its
    /// pages are new (version 0, nothing written).
    pub fn set_range_slabs(&mut self, range: usize, slabs: Vec<SlabRef>) {
        assert!(!self.range_mapped(range), "range {range} is mapped already");
        let region = &self.regions[self.ranges[range].region];
        assert_eq!(slabs.len(), region.shape.total_splits(), "one slab per split");
        self.ranges[range].slabs = slabs;
        self.forget_range_pages(range);
    }

    /// The first page of range `range` in the client's page space.
    pub fn first_page_of_range(&self, range: usize) -> u64 {
        self.range_first_page(range)
    }

    /// Unmaps, in the background, slabs the driver mapped for a range it then could not
    /// complete, and takes them off their nodes' counts.
    pub fn release_unplaced_slabs(&mut self, slabs: Vec<SlabRef>, split_bytes: usize) {
        for slab in slabs {
            self.release_slab(slab, split_bytes);
        }
    }

    /// Releases mapped range `range`: its slabs are unmapped (in the background) and its pages
    /// forgotten. False, with nothing done, while an op or a rebuild is on the range: the caller
    /// tries again later.
    pub fn release_range(&mut self, range: usize) -> bool {
        if !self.range_mapped(range) || self.regenerations.iter().any(|task| task.range == range) {
            return false;
        }
        let (first_page, pages) = self.range_pages(range);
        if self.slot_pages.iter().any(|page| (first_page..first_page + pages).contains(page)) {
            return false;
        }
        let split_bytes = self.regions[self.ranges[range].region].split_bytes;
        let slabs = std::mem::take(&mut self.ranges[range].slabs);
        for (split, slab) in slabs.into_iter().enumerate() {
            if let Some(mapping) = self.shm.get_mut(range * MAX_SPLITS + split) {
                *mapping = None;
            }
            self.release_slab(slab, split_bytes);
        }
        self.pending_exports.retain(|&(pending, _)| pending != range);
        self.previous_slabs.retain(|&(previous, _, _)| previous != range);
        let state = &mut self.ranges[range];
        state.unavailable = 0;
        state.rebuilding = 0;
        state.previous = 0;
        self.forget_range_pages(range);
        self.mark_range_unmapped(range);
        true
    }

    /// Flags every page of range `range` [`PAGE_UNMAPPED`] (and nothing else).
    pub(super) fn mark_range_unmapped(&mut self, range: usize) {
        let (first_page, pages) = self.range_pages(range);
        self.page_flags[first_page as usize..(first_page + pages) as usize].fill(PAGE_UNMAPPED);
    }

    /// The first page and page count of range `range`.
    fn range_pages(&self, range: usize) -> (u64, u64) {
        let region = &self.regions[self.ranges[range].region];
        let first_page = self.range_first_page(range);
        let pages = region.pages_per_range.min(region.first_page + region.page_count - first_page);
        (first_page, pages)
    }

    /// Pages of range `range` back to never written: version 0, no flag.
    fn forget_range_pages(&mut self, range: usize) {
        let (first_page, pages) = self.range_pages(range);
        let pages = first_page as usize..(first_page + pages) as usize;
        self.versions[pages.clone()].fill(0);
        self.page_flags[pages].fill(0);
        let state = &mut self.ranges[range];
        state.unreadable_pages = 0;
        state.parity_stale_pages = 0;
    }
}
