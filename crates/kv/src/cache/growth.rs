//! Node memory in proportion to what is stored: a region's ranges are mapped on the nodes when
//! values first need their room and given back when they hold nothing, so `-m` is a limit, not
//! a reservation (docs/KV.md "Memory").
//!
//! Ranges are mapped from each region's first up (the allocator hands out the lowest free page,
//! so values gather there) and released from the last down by housekeeping (once a second, up to
//! [`MAX_RELEASES_PER_PASS`] per region), never the first: the mapped ranges are a prefix, and a region holds at most
//! one partly used range beyond what its values fill. The EOR main copies' ranges (laid beside
//! the EC region page for page, on the node of the first parity) are mapped when an EOR value
//! first takes pages they hold, and given back with the EC range they lie beside.
//!
//! The slab map is saved (durably) after every change, before a value is written into a new
//! range: a restarted server finds every range its records point into. A range the cluster
//! cannot map (no node has a free slab) counts as a full region, and growth is not tried again
//! for [`GROWTH_RETRY`]: the LRU evicts instead.

use std::time::{Duration, Instant};

use super::Cache;
use crate::page_client::PageClient;
use crate::space::RegionKind;

/// After a range could not be mapped, the region counts as full this long.
pub const GROWTH_RETRY: Duration = Duration::from_secs(1);

/// Ranges a region gives back per housekeeping pass at most (the slab map is saved once).
const MAX_RELEASES_PER_PASS: usize = 64;

/// The EOR main copies' place in [`Growth::refused_at`], after the four region kinds.
const MAIN_COPIES: usize = 4;

/// Where the EOR main copies' region is cut into ranges.
#[derive(Clone, Copy, Debug)]
pub struct MainRanges {
    pub first_range: usize,
    pub pages_per_range: u64,
    pub range_count: usize,
}

impl<P: PageClient> Cache<P> {
    /// Maps the next range of `kind`'s region and saves the slab map. False when it cannot now
    /// (logged once per [`GROWTH_RETRY`]).
    pub(crate) fn grow(&mut self, kind: RegionKind) -> bool {
        let Some(range) = self.space.next_range(kind) else { return false };
        if !self.map_ranges(kind as usize, &[range]) {
            return false;
        }
        self.space.range_mapped(kind);
        true
    }

    /// Maps the ranges of the EOR main copies that hold pages of `extent` (of an EOR value in
    /// the EC region) and are not mapped yet. False when it cannot now: the caller gives the
    /// extent back and counts the region as full.
    pub(crate) fn map_main_copies(&mut self, extent: &crate::space::Extent) -> bool {
        let Some(main) = self.growth.main else { return true };
        // Nothing is collected (no allocation per store) unless a range is missing.
        let engine = self.client.engine();
        let pages = extent.pages.iter().chain(extent.tail.as_ref().map(|chunk| &chunk.page));
        let mut wanted: Vec<usize> = pages
            .map(|&page| main.first_range + ((page - self.ec_first_page) / main.pages_per_range) as usize)
            .filter(|&range| !engine.range_mapped(range))
            .collect();
        wanted.dedup();
        wanted.is_empty() || self.map_ranges(MAIN_COPIES, &wanted)
    }

    /// Maps `ranges` (of the region counted at `refusal`) and saves the slab map; on a failure
    /// gives back what it mapped and refuses growth there for [`GROWTH_RETRY`].
    fn map_ranges(&mut self, refusal: usize, ranges: &[usize]) -> bool {
        let now = self.client.now();
        if self.growth.refused_at[refusal].is_some_and(|at| now.saturating_duration_since(at) < GROWTH_RETRY)
        {
            return false;
        }
        let mut mapped = Vec::with_capacity(ranges.len());
        let mut result = Ok(());
        for &range in ranges {
            let (client, buffers) = (&mut self.client, &mut self.io);
            match buffers.with_buffers(|buffers| client.map_range(range, buffers)) {
                Ok(()) => mapped.push(range),
                Err(error) => {
                    result = Err(error.to_string());
                    break;
                }
            }
        }
        // Replies that came while mapping wait in the client: the loop collects them at once.
        self.growth.collect_now = true;
        if let Err(error) = result.and_then(|()| self.save_map()) {
            for &range in mapped.iter().rev() {
                self.client.release_range(range);
            }
            tracing::warn!(?ranges, %error, "cannot map a range: its region counts as full for a while");
            self.growth.refused_at[refusal] = Some(self.client.now());
            return false;
        }
        self.growth.ranges_mapped += mapped.len() as u64;
        true
    }

    /// Gives back the last ranges of each region while they hold nothing (housekeeping, once a
    /// second), with the main copies beside an EC range, and saves the slab map.
    pub(crate) fn shrink_regions(&mut self) {
        let mut changed = false;
        let kinds = [RegionKind::None, RegionKind::Rep2, RegionKind::Rep3, RegionKind::Ec];
        for kind in kinds.into_iter().cycle().take(kinds.len() * MAX_RELEASES_PER_PASS) {
            let Some(range) = self.space.shrinkable(kind) else { continue };
            if !self.client.release_range(range) {
                continue;
            }
            self.space.shrink(kind);
            changed = true;
            self.growth.ranges_released += 1;
            if kind == RegionKind::Ec {
                let beside: Vec<usize> =
                    self.main_ranges_after(range).filter(|&main| self.range_mapped(main)).collect();
                for main in beside {
                    self.client.release_range(main);
                }
            }
        }
        if changed {
            if let Err(error) = self.save_map() {
                tracing::warn!(%error, "cannot save the slab map after giving ranges back");
            }
        }
    }

    fn range_mapped(&mut self, range: usize) -> bool {
        self.client.engine().range_mapped(range)
    }

    /// The main copies' ranges whose pages all lie at or after EC range `range`'s first page.
    fn main_ranges_after(&self, range: usize) -> impl Iterator<Item = usize> {
        let (first, last) = match (self.growth.main, self.space.grid(RegionKind::Ec)) {
            (Some(main), Some(grid)) => {
                let start = (range - grid.first_range) as u64 * grid.pages_per_range;
                let first = start.div_ceil(main.pages_per_range) as usize;
                (main.first_range + first.min(main.range_count), main.first_range + main.range_count)
            }
            _ => (0, 0),
        };
        first..last
    }

    pub(crate) fn save_map(&mut self) -> Result<(), String> {
        let Some(saver) = self.growth.map_saver.as_mut() else { return Ok(()) };
        match self.client.slab_map() {
            Some(map) => saver(&map),
            None => Ok(()),
        }
    }

    /// Where the EOR main copies' region is cut into ranges (none without EOR).
    pub fn set_main_ranges(&mut self, main: Option<MainRanges>) {
        self.growth.main = main;
    }

    /// Saves the slab map to `path` whenever ranges are mapped or given back from now on.
    pub fn set_map_path(&mut self, path: std::path::PathBuf) {
        self.set_map_saver(Box::new(move |map| map.save(&path).map_err(|error| error.to_string())));
    }

    /// Saves the slab map through `saver` whenever ranges are mapped or given back from now on
    /// (`remem kv --etcd`: by compare-and-swap in etcd). The saver returns once the map is
    /// durable: values are written into a new range only after it returned Ok.
    pub fn set_map_saver(&mut self, saver: MapSaver) {
        self.growth.map_saver = Some(saver);
    }

    /// (ranges mapped, ranges given back) since the start.
    pub fn range_changes(&self) -> (u64, u64) {
        (self.growth.ranges_mapped, self.growth.ranges_released)
    }
}

/// Where the slab map goes after a change of the mapped ranges (see [`Cache::set_map_saver`]).
pub type MapSaver = Box<dyn FnMut(&remem_client::SlabMapFile) -> Result<(), String>>;

/// What [`Cache`] keeps for growing and shrinking its regions.
#[derive(Default)]
pub struct Growth {
    pub main: Option<MainRanges>,
    map_saver: Option<MapSaver>,
    refused_at: [Option<Instant>; 5],
    /// Ops completed while a range was being mapped: the next loop turn collects them.
    pub collect_now: bool,
    ranges_mapped: u64,
    ranges_released: u64,
}
