//! Regions and their ranges: where each page lives, with which shape.
//!
//! A region is a run of consecutive pages of the client's page space with one coding shape
//! (none, rep(n), EC(k,r)) and its own codec; it is cut into ranges of `pages_per_range` pages,
//! each on k+r slabs. Page numbers are global, so the checksum of a split binds the page
//! whatever region it is in, and a node's rebuild computes the same page numbers.
//!
//! A region without redundancy can be laid beside another page for page ([`Engine::nodes_beside`]):
//! page `i` of it is page `i` of the other, and each of its ranges lives on the node of one
//! chosen split of the other region's range that holds the same pages. EC-oriented replication
//! keeps an object's main copy there, on the node of its first parity, never on a node of its
//! data splits. Only the placement is pinned: a slab of it that is lost is replaced wherever the
//! placement policy says.

use std::net::SocketAddr;

use remem_codec::CodecParams;
use remem_placement::Placement;

use super::{
    Engine, NodeId, Range, Region, RegionInfo, SlabRef, MAX_SPLITS, PAGE_DISCARDED, PAGE_UNREADABLE,
    PAGE_VERSION_UNKNOWN,
};
use crate::core::{Shape, SplitMask};
use crate::error::PageError;

/// Why a region cannot be laid beside another ([`Engine::nodes_beside`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BesideError {
    #[error("a region laid beside another has one split per range (k = 1, r = 0), not {data_splits}+{parity_splits}")]
    Shape { data_splits: usize, parity_splits: usize },
    #[error("region {region} does not exist")]
    NoRegion { region: usize },
    #[error("split {split} does not exist in a range of {total_splits} splits")]
    NoSplit { split: usize, total_splits: usize },
    #[error("{page_count} pages do not fit beside a region of {beside_page_count}")]
    TooLarge { page_count: u64, beside_page_count: u64 },
    #[error(
        "split {split} of range {beside_range} is unavailable (its node failed, or it is being rebuilt)"
    )]
    Unavailable { beside_range: usize, split: usize },
    #[error("range {local_range} would hold pages of range {beside_range}, a data split of which is on node {node}, the node of split {split} of the range before it")]
    SharesDataNode { local_range: u64, beside_range: usize, split: usize, node: NodeId },
}

impl Engine {
    /// The nodes of a region of `page_count` pages in ranges of `pages_per_range`, laid page for
    /// page beside region `beside`: per range, the node of split `split` of the range of
    /// `beside` holding its first page. Ranges of different shapes hold different page counts
    /// (an EC(8,2) range eight times those of a range without redundancy), so the
    /// correspondence is by page offset within the regions; a range that holds pages of two
    /// ranges of `beside` must not land on a node holding a data split of either.
    ///
    /// `split` is usually k, the first parity: then no range shares a node with a data split of
    /// its pages (a range's slabs are on distinct nodes).
    ///
    /// Errors: `beside` or `split` does not exist, `page_count` exceeds `beside`'s, the chosen
    /// split is unavailable now, or a range would share a node with data splits of its pages.
    /// (The driver checks the new region's shape: [`BesideError::Shape`].)
    pub fn nodes_beside(
        &self,
        beside: usize,
        split: usize,
        pages_per_range: u64,
        page_count: u64,
    ) -> Result<Vec<NodeId>, BesideError> {
        assert!(pages_per_range > 0 && page_count > 0);
        let region = self.regions.get(beside).ok_or(BesideError::NoRegion { region: beside })?;
        let total_splits = region.shape.total_splits();
        if split >= total_splits {
            return Err(BesideError::NoSplit { split, total_splits });
        }
        if page_count > region.page_count {
            return Err(BesideError::TooLarge { page_count, beside_page_count: region.page_count });
        }
        let mut nodes = Vec::with_capacity(page_count.div_ceil(pages_per_range) as usize);
        for local_range in 0..page_count.div_ceil(pages_per_range) {
            let first_offset = local_range * pages_per_range;
            let last_offset = (first_offset + pages_per_range).min(page_count) - 1;
            nodes.push(self.beside_node(beside, split, (first_offset, last_offset), local_range)?);
        }
        Ok(nodes)
    }

    /// The node of split `split` of the range of region `beside` that holds page offset
    /// `first_offset`, for range `local_range` of a region laid beside it whose pages reach
    /// `last_offset` (within `beside`): that range must be mapped and the split available, and
    /// no later mapped range of `beside` up to `last_offset` may hold a data split there.
    pub(super) fn beside_node(
        &self,
        beside: usize,
        split: usize,
        (first_offset, last_offset): (u64, u64),
        local_range: u64,
    ) -> Result<NodeId, BesideError> {
        let region = &self.regions[beside];
        let range_of = |offset: u64| region.first_range + (offset / region.pages_per_range) as usize;
        let first = range_of(first_offset);
        if !self.range_mapped(first) || self.ranges[first].unavailable & (1 << split) != 0 {
            return Err(BesideError::Unavailable { beside_range: first, split });
        }
        let node = self.ranges[first].slabs[split].node;
        for beside_range in first + 1..=range_of(last_offset) {
            // An unmapped range has no slabs: it holds no data split anywhere yet.
            let mut data = self.ranges[beside_range].slabs.iter().take(region.shape.data_splits);
            if data.any(|slab| slab.node == node) {
                return Err(BesideError::SharesDataNode { local_range, beside_range, split, node });
            }
        }
        Ok(node)
    }

    /// Adds a region of `page_count` pages coded with `shape` over `ranges` (already mapped by
    /// the driver, `pages_per_range` pages each). Returns where its pages are.
    pub fn add_region(
        &mut self,
        shape: Shape,
        page_count: u64,
        pages_per_range: u64,
        ranges: Vec<Vec<SlabRef>>,
        versions_known: bool,
    ) -> RegionInfo {
        let params = CodecParams::new(shape.data_splits, shape.parity_splits, self.config.page_bytes)
            .expect("the driver checked the shape");
        assert!(shape.total_splits() <= MAX_SPLITS && shape.extra_reads <= shape.parity_splits);
        assert_eq!(ranges.len() as u64, page_count.div_ceil(pages_per_range));
        let first_page = self.versions.len() as u64;
        let index = self.regions.len();
        let first_range = self.ranges.len();
        for slabs in ranges {
            // No slabs: a range mapped later (`Engine::set_range_slabs`).
            assert!(slabs.is_empty() || slabs.len() == shape.total_splits());
            self.ranges.push(Range {
                region: index,
                slabs,
                unavailable: 0,
                rebuilding: 0,
                unreadable_pages: 0,
                parity_stale_pages: 0,
                previous: 0,
                missed: 0,
            });
            self.range_accesses.push(0);
        }
        if !self.shm.is_empty() || self.shm_in_use {
            self.shm.resize_with(self.ranges.len() * MAX_SPLITS, || None);
        }
        let flags = if versions_known { 0 } else { PAGE_VERSION_UNKNOWN };
        self.versions_exact &= versions_known;
        self.versions.resize((first_page + page_count) as usize, 0);
        self.page_flags.resize((first_page + page_count) as usize, flags);
        for slot in &mut self.slots {
            if slot.parity.len() < params.parity_bytes() {
                slot.parity.resize(params.parity_bytes(), 0);
            }
        }
        self.regions.push(Region {
            shape,
            first_page,
            page_count,
            first_range,
            range_count: self.ranges.len() - first_range,
            pages_per_range,
            split_bytes: params.split_bytes(),
            beside: None,
            codec: remem_codec::new_codec(params),
        });
        for range in first_range..self.ranges.len() {
            if !self.range_mapped(range) {
                self.mark_range_unmapped(range);
            }
        }
        self.region_info(index)
    }

    pub fn region_info(&self, index: usize) -> RegionInfo {
        let region = &self.regions[index];
        RegionInfo {
            index,
            shape: region.shape,
            first_page: region.first_page,
            page_count: region.page_count,
            pages_per_range: region.pages_per_range,
        }
    }

    pub fn regions(&self) -> impl Iterator<Item = RegionInfo> + '_ {
        (0..self.regions.len()).map(|index| self.region_info(index))
    }

    /// The region holding `page`, if any.
    pub fn region_of(&self, page: u64) -> Option<usize> {
        let index = self.regions.partition_point(|region| region.first_page <= page).checked_sub(1)?;
        (page < self.regions[index].first_page + self.regions[index].page_count).then_some(index)
    }

    /// (range, slot in range) of a page of region `region`.
    pub(super) fn locate(&self, region: usize, page: u64) -> (usize, u32) {
        let region = &self.regions[region];
        let local = page - region.first_page;
        (
            region.first_range + (local / region.pages_per_range) as usize,
            (local % region.pages_per_range) as u32,
        )
    }

    /// Sets or clears a page's [`PAGE_UNREADABLE`] flag, keeping its range's count.
    pub(super) fn set_unreadable(&mut self, page: u64, unreadable: bool) {
        let flags = &mut self.page_flags[page as usize];
        if (*flags & PAGE_UNREADABLE != 0) == unreadable {
            return;
        }
        *flags ^= PAGE_UNREADABLE;
        let region = self.region_of(page).expect("a page of a region");
        let (range, _) = self.locate(region, page);
        if unreadable {
            self.ranges[range].unreadable_pages += 1;
        } else {
            self.ranges[range].unreadable_pages -= 1;
        }
    }

    /// The first page of range `range` in the client's page space.
    pub(super) fn range_first_page(&self, range: usize) -> u64 {
        let region = &self.regions[self.ranges[range].region];
        region.first_page + (range - region.first_range) as u64 * region.pages_per_range
    }

    /// Pages of the client's page space (every region).
    pub fn page_count(&self) -> u64 {
        self.versions.len() as u64
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    pub fn split_bytes_of_range(&self, range: usize) -> usize {
        self.regions[self.ranges[range].region].split_bytes
    }

    pub fn pages_per_range_of(&self, range: usize) -> u64 {
        self.regions[self.ranges[range].region].pages_per_range
    }

    /// The placement policy (the driver places new regions with it).
    pub fn placement_mut(&mut self) -> &mut dyn Placement {
        self.placement.as_mut()
    }

    /// Counts a slab the driver mapped on `node` for a new region, as a rebuild counts its
    /// own: later placements (rebuilds above all) then see the node's load as it is, not as it
    /// was at connect, and do not try full nodes one after another.
    pub fn count_mapped_slab(&mut self, node: NodeId, split_bytes: usize) {
        let info = &mut self.nodes[node].info;
        info.slabs_mapped += 1;
        let footprint = super::slab_footprint_bytes(info.slab_size_bytes, split_bytes);
        info.free_bytes = info.free_bytes.saturating_sub(footprint);
    }

    /// Undoes [`Engine::count_mapped_slab`] for a slab this client unmapped (or whose map was
    /// refused): placement must not see a node fill up with slabs it no longer holds.
    pub(super) fn count_unmapped_slab(&mut self, node: NodeId, split_bytes: usize) {
        let info = &mut self.nodes[node].info;
        info.slabs_mapped = info.slabs_mapped.saturating_sub(1);
        let footprint = super::slab_footprint_bytes(info.slab_size_bytes, split_bytes);
        info.free_bytes = info.free_bytes.saturating_add(footprint).min(info.capacity_bytes);
    }

    pub fn shape_of_range(&self, range: usize) -> Shape {
        self.regions[self.ranges[range].region].shape
    }

    /// Forgets a page: it reads as zeros, with no remote I/O, until written again.
    pub fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.check_page(page, self.config.page_bytes)?;
        assert!(!self.page_in_flight(page), "discard between ops on the page only");
        self.page_flags[page as usize] |= PAGE_DISCARDED;
        Ok(())
    }

    /// The node addresses of the splits in `mask` of range `range` (for error reports).
    pub(super) fn nodes_of(&self, range: usize, mask: SplitMask) -> Vec<SocketAddr> {
        let slabs = &self.ranges[range].slabs;
        (0..slabs.len())
            .filter(|split| mask & (1 << split) != 0)
            .map(|split| self.nodes[slabs[split].node].address)
            .collect()
    }
}
