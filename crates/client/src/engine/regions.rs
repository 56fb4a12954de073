//! Regions and their ranges: where each page lives, with which shape.
//!
//! A region is a run of consecutive pages of the client's page space with one coding shape
//! (none, rep(n), EC(k,r)) and its own codec; it is cut into ranges of `pages_per_range` pages,
//! each on k+r slabs. Page numbers are global, so the checksum of a split binds the page
//! whatever region it is in, and a node's rebuild computes the same page numbers.

use std::net::SocketAddr;

use remem_codec::CodecParams;
use remem_placement::Placement;

use super::{
    Engine, Range, Region, RegionInfo, SlabRef, MAX_SPLITS, PAGE_DISCARDED, PAGE_UNREADABLE,
    PAGE_VERSION_UNKNOWN,
};
use crate::core::{Shape, SplitMask};
use crate::error::PageError;

impl Engine {
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
            assert_eq!(slabs.len(), shape.total_splits());
            self.ranges.push(Range {
                region: index,
                slabs,
                unavailable: 0,
                rebuilding: 0,
                unreadable_pages: 0,
                previous: 0,
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
            codec: remem_codec::new_codec(params),
        });
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
