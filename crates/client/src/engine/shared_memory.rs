//! Splits on shared memory: slabs a same-host node exported are read and written by the
//! engine with loads and stores (`crate::shm`, docs/SHM.md). The mappings are memory the engine
//! holds, not I/O: mapping and unmapping them is the driver's job.

use super::{Engine, MAX_SPLITS};
use crate::core::SplitMask;
use crate::shm::ShmSlab;

impl Engine {
    /// Hands the engine a shared mapping of split `split` of range `range` (exported by its
    /// node); splits there are then loads and stores.
    pub fn set_shared_mapping(&mut self, range: usize, split: usize, mapping: ShmSlab) {
        if self.shm.len() < self.ranges.len() * MAX_SPLITS {
            self.shm.resize_with(self.ranges.len() * MAX_SPLITS, || None);
        }
        self.shm[range * MAX_SPLITS + split] = Some(mapping);
        self.shm_in_use = true;
    }

    pub fn shm_in_use(&self) -> bool {
        self.shm_in_use
    }

    /// Slabs rebuilt on a node with a Unix socket since the last call, to export.
    pub fn take_pending_exports(&mut self) -> Vec<(usize, usize)> {
        std::mem::take(&mut self.pending_exports)
    }

    /// The shared mapping of split `split` of range `range`, if exported and still the slab the
    /// range names (a rebuilt or replaced slab never reuses an old mapping).
    pub(super) fn live_shm(&self, range: usize, split: usize) -> Option<&ShmSlab> {
        let mapping = self.shm.get(range * MAX_SPLITS + split)?.as_ref()?;
        let slab = self.ranges[range].slabs[split];
        (mapping.node == slab.node && mapping.slab_id == slab.slab_id).then_some(mapping)
    }

    /// Forgets the shared mapping of one split (revoked, evicted, its node lost, or replaced).
    pub(super) fn drop_shm(&mut self, range: usize, split: usize) {
        if let Some(mapping) = self.shm.get_mut(range * MAX_SPLITS + split) {
            *mapping = None;
        }
    }

    /// The splits of range `range` read and written through shared memory.
    pub fn shared_memory_splits(&self, range: usize) -> SplitMask {
        if !self.shm_in_use {
            return 0;
        }
        (0..self.ranges[range].slabs.len())
            .filter(|&split| self.live_shm(range, split).is_some())
            .fold(0, |mask, split| mask | (1 << split))
    }

    /// Starts loading the shared-memory slots of `mask` (see [`ShmSlab::prefetch`]).
    pub(super) fn prefetch_shm(&self, range: usize, slot_in_range: u32, mask: SplitMask) {
        if !self.shm_in_use {
            return;
        }
        for split in (0..self.ranges[range].slabs.len()).filter(|split| mask & (1 << split) != 0) {
            if let Some(mapping) = self.live_shm(range, split) {
                mapping.prefetch(slot_in_range);
            }
        }
    }
}
