//! Writes: a whole page (k data splits and r parities at a new version), its data splits only
//! (a new version whose parities are left stale), or its parities only (completing a
//! parity-stale page at the version its data splits carry).
//!
//! Versions: a whole or data-only write takes the next version of the page; when the page's
//! version is not known exactly, it first asks every reachable split and goes one past the newest
//! any valid split carries (versions are never reused, docs/FAILURES.md). A parity-only write
//! takes no version: it writes the current one, and is refused when that is unknown.
//!
//! What a write leaves behind: a whole write that stores k splits makes an ordinary page; a
//! data-only write that stores all k makes a parity-stale page; a parity-only write whose every
//! parity was stored, or is on a slab down and waiting for its rebuild, makes the page ordinary
//! again. A failed whole or data-only write leaves the page's version unknown and the page
//! unreadable until written again; a failed parity-only write leaves it parity-stale (the
//! parities it did store hold the same content at the same version: harmless).

use remem_proto::{SplitMeta, WriteSplitPrefix};

use super::ops::{request_id, Outcome, SlotKind, SplitEvent};
use super::{
    Engine, PAGE_DISCARDED, PAGE_PARITY_STALE, PAGE_UNREADABLE, PAGE_VERSION_UNKNOWN, PAGE_WRITE_DISCOVERS,
};
use crate::core::{ReadState, ReadStep, SplitMask, WriteState, WriteStep};
use crate::error::PageError;

/// Which splits of the page a write slot writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteMode {
    /// Every split, at the next version.
    Whole,
    /// The k data splits, at the next version: the page becomes parity-stale.
    DataOnly,
    /// The r parities, at the current version: the page stops being parity-stale.
    ParityOnly,
}

impl Engine {
    /// Starts a whole or data-only write (a data-only write of a shape without parities is a
    /// whole one).
    pub(super) fn start_write(
        &mut self,
        tag: usize,
        page: u64,
        data: &[u8],
        mode: WriteMode,
    ) -> Result<(), PageError> {
        let region_index = self.region_of(page).expect("page checked");
        let shape = self.regions[region_index].shape;
        let mode = if shape.parity_splits == 0 { WriteMode::Whole } else { mode };
        assert_ne!(mode, WriteMode::ParityOnly, "parity-only writes start in start_write_parity");
        let (range_index, _) = self.locate(region_index, page);
        self.range_accesses[range_index] = self.range_accesses[range_index].wrapping_add(1);
        let range = &self.ranges[range_index];
        if self.page_flags[page as usize] & (PAGE_VERSION_UNKNOWN | PAGE_WRITE_DISCOVERS) != 0 {
            // The page's version is unknown (a reopened client, or its last write failed): find
            // the newest version on its splits first. Writing the next version of a guess could
            // reuse a number that splits of other contents already carry, and a rebuild would
            // then decode a mix of the two with valid checksums.
            let (state, step) = ReadState::discover(shape, range.unavailable & !range.previous);
            let ReadStep::Ask(mask) = step else {
                let (valid, failed) = match step {
                    ReadStep::Lost { valid, failed } => (valid, failed),
                    _ => (0, range.unavailable),
                };
                return Err(self.write_failed(page, range_index, valid, failed));
            };
            let slot_index = self.claim_slot(SlotKind::Write, tag, page);
            let slot = &mut self.slots[slot_index];
            slot.write_mode = mode;
            slot.staging[..data.len()].copy_from_slice(data);
            slot.read = Some(state);
            self.queue_reads(slot_index, mask);
            return Ok(());
        }
        let slot_index = self.claim_slot(SlotKind::Write, tag, page);
        self.slots[slot_index].write_mode = mode;
        let launched = self.launch_write(slot_index, data);
        if launched.is_err() {
            self.release_slot(slot_index);
        }
        launched
    }

    /// Starts a parity-only write of a parity-stale page. Returns true if splits are in flight,
    /// false if it is already done (no parity slab takes writes now: each is waiting for a
    /// rebuild, which computes its parity from the data splits). Nothing is sent when it is
    /// refused.
    pub(super) fn start_write_parity(
        &mut self,
        tag: usize,
        page: u64,
        data: &[u8],
    ) -> Result<bool, PageError> {
        let flags = self.page_flags[page as usize];
        if flags & PAGE_PARITY_STALE == 0 {
            return Err(PageError::NotParityStale { page });
        }
        if flags & (PAGE_VERSION_UNKNOWN | PAGE_UNREADABLE | PAGE_DISCARDED) != 0
            || self.versions[page as usize] == 0
        {
            // A data split may be gone (its slab was lost), or the version the parities would
            // carry is not known: parities written now could complete nothing, or the wrong
            // version.
            return Err(PageError::ParityStaleLost { page });
        }
        let region_index = self.region_of(page).expect("page checked");
        let shape = self.regions[region_index].shape;
        let (range_index, _) = self.locate(region_index, page);
        self.range_accesses[range_index] = self.range_accesses[range_index].wrapping_add(1);
        let range = &self.ranges[range_index];
        let (state, step) = WriteState::start_parity_only(shape, range.unavailable & !range.rebuilding);
        if let WriteStep::Done { .. } = step {
            self.set_parity_stale(page, false);
            return Ok(false);
        }
        let slot_index = self.claim_slot(SlotKind::Write, tag, page);
        let targets = state.targets();
        let slot = &mut self.slots[slot_index];
        slot.write_mode = WriteMode::ParityOnly;
        slot.version = self.versions[page as usize];
        slot.write = Some(state);
        self.prefetch_shm(range_index, self.slots[slot_index].slot_in_range, targets);
        self.queue_parities(slot_index, data, targets);
        Ok(true)
    }

    /// A write that was finding out its page's version knows it now: the newest version any
    /// valid split carries. The write goes on from its staged data.
    pub(super) fn finish_discovery(&mut self, slot_index: usize) {
        let slot = &mut self.slots[slot_index];
        let read = slot.read.take().expect("a discovering write has a read state");
        let page = slot.page as usize;
        let known = self.versions[page];
        if let Some(seen) = read.newest_version_seen() {
            if known == 0 || remem_proto::version_is_newer(seen, known) {
                self.versions[page] = seen;
            }
        }
        self.page_flags[page] &= !(PAGE_VERSION_UNKNOWN | PAGE_WRITE_DISCOVERS);
        let staging = std::mem::take(&mut self.slots[slot_index].staging);
        let result = self.launch_write(slot_index, &staging[..self.config.page_bytes]);
        self.slots[slot_index].staging = staging;
        if let Err(error) = result {
            self.finish(slot_index, Err(error));
        }
    }

    /// Sends a write's k data splits and, for a whole write, encodes its r parities and sends
    /// them: the next version of the page, on every slab that takes writes.
    fn launch_write(&mut self, slot_index: usize, data: &[u8]) -> Result<(), PageError> {
        let slot = &self.slots[slot_index];
        let (page, region_index, range_index, mode) = (slot.page, slot.region, slot.range, slot.write_mode);
        let shape = self.regions[region_index].shape;
        let range = &self.ranges[range_index];
        // Slabs being rebuilt take writes: the rebuild skips pages written since it began.
        let unavailable = range.unavailable & !range.rebuilding;
        let (state, step) = match mode {
            WriteMode::Whole => WriteState::start(shape, unavailable),
            WriteMode::DataOnly => WriteState::start_data_only(shape, unavailable),
            WriteMode::ParityOnly => unreachable!("parity-only writes are launched by start_write_parity"),
        };
        if let WriteStep::Failed { stored, failed } = step {
            return Err(self.write_failed(page, range_index, stored, failed));
        }
        let version = remem_proto::next_version(self.versions[page as usize]);
        let targets = state.targets();
        let slot = &mut self.slots[slot_index];
        slot.version = version;
        slot.write = Some(state);
        let split_bytes = self.regions[region_index].split_bytes;
        self.prefetch_shm(range_index, self.slots[slot_index].slot_in_range, targets);
        // Data splits are queued first, parities after them, so they leave first (seed 000
        // §4.1.1). The old socket client flushed the data splits of a lone write before encoding;
        // the engine hands everything over at once: the encode (60-90 ns at (8,2)) is far below
        // one system call, and the benchmark shows no loss (docs/BENCHMARKS.md).
        if shape.data_splits == 1 {
            // Replication: a (1, r) code's parities are copies of the data (the generator
            // matrix's k = 1 rows are ones), so every split is the page itself: one checksum of
            // it, finished per split, and no copy into the parity buffer.
            let payload = &data[..split_bytes];
            let mut crc = [0u32];
            remem_proto::payload_crcs(&[payload], &mut crc);
            let splits = if mode == WriteMode::Whole { shape.data_splits + shape.parity_splits } else { 1 };
            for split in 0..splits {
                if targets & (1 << split) != 0 {
                    self.queue_write_split(slot_index, split, payload, Some(crc[0]));
                }
            }
            return Ok(());
        }
        // Each split is checksummed just before it is written, while its bytes are in cache
        // (checksumming all of them first with `payload_crcs`, interleaved, measured slower:
        // EC(8,2) write p50 3.3-3.6 us against 3.1-3.3 over shared memory).
        for split in 0..shape.data_splits {
            if targets & (1 << split) != 0 {
                let payload = &data[split * split_bytes..(split + 1) * split_bytes];
                self.queue_write_split(slot_index, split, payload, None);
            }
        }
        if mode == WriteMode::Whole && shape.parity_splits > 0 {
            self.queue_parities(slot_index, data, targets);
        }
        Ok(())
    }

    /// Encodes `data` into the slot's parity buffer and queues the parities in `targets`.
    fn queue_parities(&mut self, slot_index: usize, data: &[u8], targets: SplitMask) {
        let region_index = self.slots[slot_index].region;
        let shape = self.regions[region_index].shape;
        let split_bytes = self.regions[region_index].split_bytes;
        let parity_bytes = shape.parity_splits * split_bytes;
        let mut parity = std::mem::take(&mut self.slots[slot_index].parity);
        self.regions[region_index].codec.encode(data, &mut parity[..parity_bytes]);
        for parity_index in 0..shape.parity_splits {
            let split = shape.data_splits + parity_index;
            if targets & (1 << split) != 0 {
                let payload = &parity[parity_index * split_bytes..(parity_index + 1) * split_bytes];
                self.queue_write_split(slot_index, split, payload, None);
            }
        }
        self.slots[slot_index].parity = parity;
    }

    /// Queues one split's write; `payload_crc` is `crc32c(payload)` when known (the copies of a
    /// replicated page share it), finished here into the split's checksum (version, page and
    /// split index bound in).
    fn queue_write_split(
        &mut self,
        slot_index: usize,
        split: usize,
        payload: &[u8],
        payload_crc: Option<u32>,
    ) {
        let slot = &self.slots[slot_index];
        let slab = self.ranges[slot.range].slabs[split];
        let checksum = match payload_crc {
            Some(crc) => remem_proto::finish_split_checksum(crc, slot.version, slot.page, split as u8),
            None => remem_proto::split_checksum(payload, slot.version, slot.page, split as u8),
        };
        let prefix = WriteSplitPrefix {
            slab_id: slab.slab_id,
            slot: slot.slot_in_range,
            version: slot.version,
            checksum,
        };
        let (range, generation) = (slot.range, slot.generation);
        let meta = SplitMeta { version: slot.version, checksum };
        self.slots[slot_index].asked_nodes[split] = slab.node;
        let shm_stored = self.live_shm(range, split).map(|shm| shm.write_split(prefix.slot, payload, meta));
        if let Some(stored) = shm_stored {
            self.events.push(SplitEvent {
                slot: slot_index,
                generation,
                split,
                outcome: Outcome::Write(stored),
            });
            if !stored {
                self.schedule_regeneration(range, split, "shared-memory slab revoked", false);
            }
            return;
        }
        if !self.nodes[slab.node].connected {
            self.events.push(SplitEvent {
                slot: slot_index,
                generation,
                split,
                outcome: Outcome::Write(false),
            });
            return;
        }
        let id = request_id(slot_index, generation, split);
        remem_proto::encode_write_split(id, &prefix, payload, &mut self.nodes[slab.node].out);
        self.mark_queued(slab.node);
    }

    pub(super) fn write_failed(
        &self,
        page: u64,
        range: usize,
        stored: SplitMask,
        failed: SplitMask,
    ) -> PageError {
        PageError::WriteFailed {
            page,
            range,
            stored_splits: stored.count_ones() as usize,
            needed_splits: self.shape_of_range(range).data_splits,
            failed_nodes: self.nodes_of(range, failed),
        }
    }

    pub(super) fn write_outcome(&mut self, event: SplitEvent, stored: bool) {
        let slot = &mut self.slots[event.slot];
        let step = slot.write.as_mut().expect("write slot has a write state").on_ack(event.split, stored);
        let mode = slot.write_mode;
        if !matches!(step, WriteStep::Wait) {
            let range = &mut self.ranges[self.slots[event.slot].range];
            range.missed |= range.unavailable;
        }
        match step {
            WriteStep::Wait => {}
            WriteStep::Done { .. } if mode == WriteMode::ParityOnly => self.parity_write_done(event.slot),
            WriteStep::Done { degraded } => {
                let slot = &self.slots[event.slot];
                let (page, version) = (slot.page, slot.version);
                self.page_written(page, version, mode == WriteMode::DataOnly);
                if mode == WriteMode::DataOnly && self.data_split_gone_since_stored(event.slot) {
                    // Stored, then its slab was lost before the write completed: the page became
                    // parity-stale after its range's parity-stale pages were marked, and no
                    // rebuild can bring that split back.
                    self.set_unreadable(page, true);
                }
                if degraded != 0 {
                    tracing::debug!(page, degraded, "page written degraded");
                }
                self.finish(event.slot, Ok(()));
            }
            WriteStep::Failed { stored, failed } => {
                let slot = &self.slots[event.slot];
                // The new version may be on some splits: the next write must be newer still,
                // and the next read finds out which version (if any) has k splits. Whether the
                // page is parity-stale does not change: at any older version it is as it was.
                let page = slot.page;
                self.versions[page as usize] = slot.version;
                // A page lost before this write (unreadable at a known version) stays lost
                // unless this version landed: the next read asks for this version only. Finding
                // out the newest version would take "no split anywhere" for a page never
                // written, and read zeros where data was lost.
                let flags = self.page_flags[page as usize];
                let lost_before = flags & PAGE_UNREADABLE != 0 && flags & PAGE_VERSION_UNKNOWN == 0;
                if !lost_before {
                    self.page_flags[page as usize] |= PAGE_VERSION_UNKNOWN;
                }
                self.set_unreadable(page, true);
                let slot = &self.slots[event.slot];
                let error = self.write_failed(slot.page, slot.range, stored, failed);
                self.finish(event.slot, Err(error));
            }
        }
    }

    /// Whether a data split this write stored is on a slab lost since: the range names another
    /// slab for it now, or its slab is down and not (yet) being replaced by a rebuild that took
    /// the write.
    fn data_split_gone_since_stored(&self, slot_index: usize) -> bool {
        let slot = &self.slots[slot_index];
        let range = &self.ranges[slot.range];
        let down = range.unavailable & !range.rebuilding;
        let data_splits = self.regions[slot.region].shape.data_splits;
        (0..data_splits)
            .any(|split| down & (1 << split) != 0 || range.slabs[split].node != slot.asked_nodes[split])
    }

    /// Every parity of a parity-only write answered. It completed the page if each parity that
    /// was not stored is on a slab that is down and not being rebuilt yet: its rebuild will
    /// compute it from the data splits, which hold this version. A parity refused by a slab that
    /// stays available would be missing for good, and a page whose data split was lost meanwhile
    /// (marked unreadable) cannot be completed: both fail, and the page stays parity-stale.
    fn parity_write_done(&mut self, slot_index: usize) {
        let slot = &self.slots[slot_index];
        let (page, range_index) = (slot.page, slot.range);
        let write = slot.write.as_ref().expect("write slot has a write state");
        let (stored, failed) = (write.stored(), write.failed_targets());
        let range = &self.ranges[range_index];
        let waiting_for_rebuild = range.unavailable & !range.rebuilding;
        let result = if self.page_flags[page as usize] & PAGE_UNREADABLE != 0 {
            Err(PageError::ParityStaleLost { page })
        } else if failed & !waiting_for_rebuild != 0 {
            Err(PageError::WriteFailed {
                page,
                range: range_index,
                stored_splits: stored.count_ones() as usize,
                needed_splits: write.targets().count_ones() as usize,
                failed_nodes: self.nodes_of(range_index, failed & !waiting_for_rebuild),
            })
        } else {
            self.set_parity_stale(page, false);
            Ok(())
        };
        self.finish(slot_index, result);
    }
}
