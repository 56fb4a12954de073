//! Splits on shared memory: slabs a same-host node exported are read and written by the
//! engine with loads and stores (`crate::shm`, docs/SHM.md). The mappings are memory the engine
//! holds, not I/O: mapping and unmapping them is the driver's job.

use remem_proto::{judge_split_crc, payload_crcs, SplitMeta, SplitVerdict};

use super::{Engine, MAX_SPLITS, PAGE_UNREADABLE};
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

    /// Names the page the caller will read right after the op it submits next (None: unknown
    /// or not a read). A read served from shared memory starts loading that page's lines once
    /// its own copies are done, so their cache misses overlap its checksums and bookkeeping
    /// instead of competing with its own misses.
    pub fn hint_next_read(&mut self, page: Option<u64>) {
        self.next_read = page;
    }

    /// Starts loading the data splits of page `page` from shared memory.
    fn prefetch_read(&self, page: u64) {
        if !self.shm_in_use {
            return;
        }
        let Some(region_index) = self.region_of(page) else { return };
        let data = self.regions[region_index].shape.data_mask();
        let (range_index, slot_in_range) = self.locate(region_index, page);
        self.prefetch_shm(range_index, slot_in_range, data);
    }

    /// Reads page `page` at `version` straight from the shared-memory slabs of its k data
    /// splits, when all of them are mapped and available: one loop of copies and checks, no
    /// per-split event or state-machine step (an EC(8,2) read is eight of them). False when
    /// anything is not as expected (a split unmapped or unavailable, a write overlapping a copy,
    /// another version, a checksum that fails, an unreadable page): the caller then reads the
    /// page the general way, which copies the splits again and accounts for what it finds. So
    /// this path decides nothing the general path would decide otherwise; it only skips its
    /// bookkeeping when every data split is what a read at this version would accept.
    pub(super) fn read_shared_data_splits(&mut self, page: u64, version: u8, target: &mut [u8]) -> bool {
        if !self.shm_in_use || self.page_flags[page as usize] & PAGE_UNREADABLE != 0 {
            return false;
        }
        let Some(region_index) = self.region_of(page) else { return false };
        let (shape, split_bytes) = (self.regions[region_index].shape, self.regions[region_index].split_bytes);
        let (range_index, slot_in_range) = self.locate(region_index, page);
        let range = &self.ranges[range_index];
        let data = shape.data_mask();
        if range.unavailable & !range.previous & data != 0 || target.len() != shape.data_splits * split_bytes
        {
            return false;
        }
        self.prefetch_shm(range_index, slot_in_range, data);
        let mut nodes = [0; MAX_SPLITS];
        let mut metas = [SplitMeta::default(); MAX_SPLITS];
        for (split, target) in target.chunks_exact_mut(split_bytes).enumerate() {
            let Some(mapping) = self.live_shm(range_index, split) else { return false };
            let Some(meta) = mapping.read_split(slot_in_range, target) else { return false };
            if meta.version != version {
                return false;
            }
            (nodes[split], metas[split]) = (mapping.node, meta);
        }
        if let Some(next) = self.next_read.take() {
            self.prefetch_read(next);
        }
        // The k copies checksummed together, four chains at a time: one by one, the CRCs were
        // a quarter of an EC(8,2) read.
        let mut splits: [&[u8]; MAX_SPLITS] = [&[]; MAX_SPLITS];
        for (slot, split) in splits.iter_mut().zip(target.chunks_exact(split_bytes)) {
            *slot = split;
        }
        let mut crcs = [0u32; MAX_SPLITS];
        payload_crcs(&splits[..shape.data_splits], &mut crcs);
        for (split, (crc, meta)) in crcs.iter().zip(&metas).take(shape.data_splits).enumerate() {
            if judge_split_crc(*crc, *meta, page, split as u8) != (SplitVerdict::Valid { version }) {
                return false;
            }
        }
        for &node in &nodes[..shape.data_splits] {
            self.record_split_read(node);
        }
        self.range_accesses[range_index] = self.range_accesses[range_index].wrapping_add(1);
        true
    }
}
