//! Page operations in flight: op slots, the splits they send, the replies they take, and their
//! completion (decode included).
//!
//! Late binding and in-place safety: a request id names its op slot and the slot's generation.
//! Once an op is done its slot's generation moves on, so a late reply is copied nowhere. Within
//! one op each split is asked once, so no reply can overwrite a split the decoder counted on.
//!
//! Copies: a write's splits are copied once into the node's outbox; a read's split is copied
//! once from the frame into its place (a data split into the caller's page, a parity into the
//! slot's parity buffer); decoding writes the missing data splits into the page in place.
//!
//! Writes (whole, data-only, parity-only) are started and finished in `writes.rs`. A read of a
//! parity-stale page asks its data splits only (`ReadState::start_data_only`); a discovery read
//! learns whether a page is parity-stale from its parities' versions (`parity_stale.rs`).

use std::time::Instant;

use remem_proto::Control;

use super::writes::WriteMode;
use super::{
    Engine, NodeId, OpBuffers, OpDone, Submit, MAX_SPLITS, PAGE_ABSENT_IS_LOST, PAGE_DISCARDED,
    PAGE_PARITY_STALE, PAGE_UNMAPPED, PAGE_VERSION_UNKNOWN, PAGE_WRITE_DISCOVERS,
};
use crate::core::{ReadState, ReadStep, SplitMask, SplitOutcome, WriteState};
use crate::error::PageError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotKind {
    Free,
    Write,
    Read,
    Probe,
}

pub(super) struct OpSlot {
    pub(super) kind: SlotKind,
    pub(super) generation: u32,
    pub(super) tag: usize,
    pub(super) page: u64,
    pub(super) region: usize,
    pub(super) range: usize,
    pub(super) slot_in_range: u32,
    pub(super) version: u8,
    pub(super) read: Option<ReadState>,
    pub(super) write: Option<WriteState>,
    /// Which splits a write slot writes.
    pub(super) write_mode: WriteMode,
    pub(super) probe: usize,
    pub(super) probe_replies: usize,
    pub(super) probe_asked: u32,
    pub(super) parity: Vec<u8>,
    /// A write whose page version is unknown: its data (first page_bytes) while the page's
    /// newest version is found out, and room for one split read meanwhile (second half).
    pub(super) staging: Vec<u8>,
    /// The node each split was sent to.
    pub(super) asked_nodes: [NodeId; MAX_SPLITS],
    pub(super) started: Instant,
}

impl OpSlot {
    pub(super) fn new(now: Instant, page_bytes: usize) -> OpSlot {
        OpSlot {
            kind: SlotKind::Free,
            generation: 0,
            tag: 0,
            page: 0,
            region: 0,
            range: 0,
            slot_in_range: 0,
            version: 0,
            read: None,
            write: None,
            write_mode: WriteMode::Whole,
            probe: 0,
            probe_replies: 0,
            probe_asked: 0,
            parity: Vec::new(),
            staging: vec![0; 2 * page_bytes],
            asked_nodes: [0; MAX_SPLITS],
            started: now,
        }
    }

    pub(super) fn in_use(&self) -> bool {
        self.kind != SlotKind::Free
    }

    /// Splits asked and not answered yet.
    pub(super) fn pending(&self) -> SplitMask {
        match (self.kind, &self.read, &self.write) {
            (SlotKind::Read | SlotKind::Write, Some(read), _) => read.pending(),
            (SlotKind::Write, None, Some(write)) => write.pending(),
            (SlotKind::Probe, _, _) => self.probe_asked,
            _ => 0,
        }
    }

    /// True while the op reads splits: a read, or a write finding out its page's version.
    pub(super) fn reading(&self) -> bool {
        self.read.is_some()
    }

    /// What a split in flight becomes when its node fails.
    pub(super) fn failure_outcome(&self) -> Outcome {
        match self.kind {
            _ if self.reading() => Outcome::Read(SplitOutcome::Failed),
            SlotKind::Write => Outcome::Write(false),
            _ => Outcome::ProbeFailed,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct SplitEvent {
    pub(super) slot: usize,
    pub(super) generation: u32,
    pub(super) split: usize,
    pub(super) outcome: Outcome,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Outcome {
    Read(SplitOutcome),
    Write(bool),
    ProbeReply,
    ProbeFailed,
    /// A split of a shared-memory slab to read: done (synchronously) in `process_events`, where
    /// the destination page is at hand.
    ShmRead,
}

/// `Engine::slot_pages` of a free slot (or a probe's): no page is that large.
pub(super) const NO_PAGE: u64 = u64::MAX;

pub(super) fn request_id(slot: usize, generation: u32, split: usize) -> u64 {
    ((generation as u64) << 32) | ((slot as u64) << 8) | split as u64
}

/// (slot, generation, split) of a data request id.
pub(super) fn parse_request_id(id: u64) -> (usize, u32, usize) {
    (((id >> 8) & 0xff_ffff) as usize, (id >> 32) as u32, (id & 0xff) as usize)
}

impl Engine {
    /// Starts an op tagged `tag`. Returns false if no slot is free or an op on the same page is
    /// in flight (ops on one page run one at a time, in order): submit it again after a
    /// completion. An op that needs no I/O (bad arguments, a never-written page) completes at
    /// once. Completions come out of [`Engine::take_completions`].
    pub fn submit(&mut self, now: Instant, tag: usize, op: Submit<'_>, buffers: &mut dyn OpBuffers) -> bool {
        self.now = now;
        if self.active == self.slots.len() {
            return false;
        }
        let page = match op {
            Submit::Write { page, .. }
            | Submit::WriteData { page, .. }
            | Submit::WriteParity { page, .. }
            | Submit::Read { page } => Some(page),
            Submit::Probe { .. } => None,
        };
        // (`NO_PAGE` is out of range: it fails its check below instead of looking busy.)
        if page.is_some_and(|page| page != NO_PAGE && self.page_in_flight(page)) {
            return false;
        }
        let finished_now: Option<Result<(), PageError>> = match op {
            Submit::Write { page, data } => self
                .check_page(page, data.len())
                .and_then(|()| self.start_write(tag, page, data, WriteMode::Whole))
                .err()
                .map(Err),
            Submit::WriteData { page, data } => self
                .check_page(page, data.len())
                .and_then(|()| self.start_write(tag, page, data, WriteMode::DataOnly))
                .err()
                .map(Err),
            Submit::WriteParity { page, data } => {
                match self
                    .check_page(page, data.len())
                    .and_then(|()| self.start_write_parity(tag, page, data))
                {
                    Ok(true) => None,
                    Ok(false) => Some(Ok(())),
                    Err(error) => Some(Err(error)),
                }
            }
            Submit::Read { page } => {
                let buffer_len = buffers.read_buffer(tag).len();
                match self.check_page(page, buffer_len) {
                    Err(error) => Some(Err(error)),
                    Ok(()) => {
                        let flags = self.page_flags[page as usize];
                        if flags & PAGE_DISCARDED != 0 {
                            // Discarded since its last write (also by a reopened client that
                            // does not know the page's version yet): zeros, no remote read.
                            buffers.read_buffer(tag).fill(0);
                            Some(Ok(()))
                        } else if flags & PAGE_VERSION_UNKNOWN != 0 {
                            self.start_read(tag, page, None).err().map(Err)
                        } else if self.versions[page as usize] == 0 {
                            // Never written by this client: zeros, no remote read.
                            buffers.read_buffer(tag).fill(0);
                            Some(Ok(()))
                        } else {
                            let version = self.versions[page as usize];
                            if self.read_shared_data_splits(page, version, buffers.read_buffer(tag)) {
                                Some(Ok(()))
                            } else {
                                self.start_read(tag, page, Some(version)).err().map(Err)
                            }
                        }
                    }
                }
            }
            Submit::Probe { probe } => {
                assert!(probe < self.probes.len(), "probe {probe} was not prepared");
                self.start_probe(tag, probe);
                None
            }
        };
        if let Some(result) = finished_now {
            self.completions.push(OpDone {
                index: tag,
                result,
                latency: std::time::Duration::ZERO,
                decoded: false,
                degraded: false,
                started: now,
            });
        }
        // Splits on shared memory are done already: finish what they finish.
        if !self.events.is_empty() {
            self.process_events(buffers);
        }
        true
    }

    /// Forgets every op in flight without completing it (the caller is going away: their
    /// buffers may be gone). Late replies are dropped by generation.
    pub fn abandon_ops(&mut self) {
        for slot_index in 0..self.slots.len() {
            if self.slots[slot_index].in_use() {
                self.release_slot(slot_index);
            }
        }
        self.events.clear();
    }

    pub(super) fn page_in_flight(&self, page: u64) -> bool {
        // A compact copy of the slots' pages: one cache line or two, not every slot.
        self.slot_pages.contains(&page)
    }

    pub(super) fn check_page(&self, page: u64, len: usize) -> Result<(), PageError> {
        // Regions cover the page space from page 0 without gaps: a page with flags is in one.
        let Some(&flags) = self.page_flags.get(page as usize) else {
            return Err(PageError::OutOfRange { page, page_count: self.page_count() });
        };
        if flags & PAGE_UNMAPPED != 0 {
            let (range, _) = self.locate(self.region_of(page).expect("a page of a region"), page);
            return Err(PageError::Unmapped { page, range });
        }
        if len != self.config.page_bytes {
            return Err(PageError::BadBuffer { len, page_bytes: self.config.page_bytes });
        }
        Ok(())
    }

    pub(super) fn claim_slot(&mut self, kind: SlotKind, tag: usize, page: u64) -> usize {
        let slot_index = self.free_slots.pop().expect("active < slots");
        assert!(!self.slots[slot_index].in_use(), "slot {slot_index} was on the free list while in use");
        if kind != SlotKind::Probe {
            // One op per page at a time: ops on a page run in order, and a read never meets a
            // write of its own page half done (`page_in_flight` refuses the second).
            debug_assert!(!self.page_in_flight(page), "a second op on page {page}");
            self.slot_pages[slot_index] = page;
        }
        let (region, range, slot_in_range) = match kind {
            SlotKind::Probe => (0, 0, 0),
            _ => {
                let region = self.region_of(page).expect("page checked");
                let (range, slot_in_range) = self.locate(region, page);
                (region, range, slot_in_range)
            }
        };
        let now = self.now;
        let timeout = self.config.request_timeout;
        let slot = &mut self.slots[slot_index];
        slot.kind = kind;
        slot.generation = slot.generation.wrapping_add(1) & 0x7fff_ffff;
        slot.tag = tag;
        slot.page = page;
        slot.region = region;
        slot.range = range;
        slot.slot_in_range = slot_in_range;
        slot.started = now;
        self.slot_deadlines[slot_index] = Some(now + timeout);
        self.active += 1;
        slot_index
    }

    pub(super) fn release_slot(&mut self, slot_index: usize) {
        let slot = &mut self.slots[slot_index];
        assert!(slot.in_use(), "slot {slot_index} released twice");
        slot.kind = SlotKind::Free;
        slot.read = None;
        slot.write = None;
        slot.write_mode = WriteMode::Whole;
        // Late replies carry the old generation and are dropped.
        slot.generation = slot.generation.wrapping_add(1) & 0x7fff_ffff;
        self.slot_pages[slot_index] = NO_PAGE;
        self.slot_deadlines[slot_index] = None;
        self.free_slots.push(slot_index);
        self.active -= 1;
        debug_assert_eq!(
            self.active + self.free_slots.len(),
            self.slots.len(),
            "every slot is free or active"
        );
    }

    fn start_read(&mut self, tag: usize, page: u64, version: Option<u8>) -> Result<(), PageError> {
        let region_index = self.region_of(page).expect("page checked");
        let shape = self.regions[region_index].shape;
        let (range_index, _) = self.locate(region_index, page);
        self.range_accesses[range_index] = self.range_accesses[range_index].wrapping_add(1);
        let range = &self.ranges[range_index];
        let unavailable = range.unavailable & !range.previous;
        let parity_stale = self.page_flags[page as usize] & PAGE_PARITY_STALE != 0;
        let (state, step) = match version {
            // Its parities do not hold this version: only the data splits can serve it.
            Some(version) if parity_stale => ReadState::start_data_only(shape, version, unavailable),
            Some(version) => {
                // Ranges with a node that corrupts often start with one more split, so a bad
                // split rarely costs a second round trip (seed 000 §4.2 "Corruption").
                let suspect = self.range_has_suspect_node(range_index);
                let mut extra = (shape.extra_reads + suspect as usize).min(shape.parity_splits);
                // Shared-memory splits complete at once and in order, so an extra split cannot
                // beat a data split: when every data split is shared, ask no more than k.
                let data = shape.data_mask();
                if self.shm_in_use && self.shared_memory_splits(range_index) & data == data {
                    extra = 0;
                }
                ReadState::start(shape, version, unavailable, extra)
            }
            None => ReadState::discover(shape, unavailable),
        };
        if let ReadStep::Lost { valid, failed } = step {
            return Err(self.lost_error(page, range_index, valid, failed));
        }
        let slot_index = self.claim_slot(SlotKind::Read, tag, page);
        self.slots[slot_index].version = version.unwrap_or(0);
        self.slots[slot_index].read = Some(state);
        if let ReadStep::Ask(mask) = step {
            self.queue_reads(slot_index, mask);
        }
        Ok(())
    }

    pub(super) fn queue_reads(&mut self, slot_index: usize, mask: SplitMask) {
        let slot = &self.slots[slot_index];
        let (range, slot_in_range, generation) = (slot.range, slot.slot_in_range, slot.generation);
        self.prefetch_shm(range, slot_in_range, mask);
        for split in 0..self.ranges[range].slabs.len() {
            if mask & (1 << split) == 0 {
                continue;
            }
            let slab = self.read_slab(range, split);
            self.slots[slot_index].asked_nodes[split] = slab.node;
            if self.live_shm(range, split).is_some() {
                self.events.push(SplitEvent {
                    slot: slot_index,
                    generation,
                    split,
                    outcome: Outcome::ShmRead,
                });
                continue;
            }
            if !self.nodes[slab.node].connected {
                let outcome = Outcome::Read(SplitOutcome::Failed);
                self.events.push(SplitEvent { slot: slot_index, generation, split, outcome });
                continue;
            }
            let message = Control::ReadSplit { slab_id: slab.slab_id, slot: slot_in_range };
            message.encode(request_id(slot_index, generation, split), &mut self.nodes[slab.node].out);
            self.mark_queued(slab.node);
        }
    }

    fn start_probe(&mut self, tag: usize, probe: usize) {
        let slot_index = self.claim_slot(SlotKind::Probe, tag, 0);
        let generation = self.slots[slot_index].generation;
        let slot = &mut self.slots[slot_index];
        slot.probe = probe;
        slot.probe_replies = 0;
        slot.probe_asked = 0;
        for split in 0..self.probes[probe].targets.len() {
            let (node, slab_id) = self.probes[probe].targets[split];
            self.slots[slot_index].asked_nodes[split] = node;
            self.slots[slot_index].probe_asked |= 1 << split;
            if !self.nodes[node].connected {
                let event = SplitEvent { slot: slot_index, generation, split, outcome: Outcome::ProbeFailed };
                self.events.push(event);
                continue;
            }
            let message = Control::ReadSplit { slab_id, slot: 0 };
            message.encode(request_id(slot_index, generation, split), &mut self.nodes[node].out);
            self.mark_queued(node);
        }
    }

    fn lost_error(&self, page: u64, range: usize, valid: SplitMask, failed: SplitMask) -> PageError {
        PageError::Lost {
            page,
            range,
            valid_splits: valid.count_ones() as usize,
            needed_splits: self.shape_of_range(range).data_splits,
            failed_nodes: self.nodes_of(range, failed),
        }
    }

    /// Feeds queued split events to the state machines and finishes ops.
    pub(super) fn process_events(&mut self, buffers: &mut dyn OpBuffers) {
        let mut cursor = 0;
        // Handling an event can queue more (a dead connection found while asking more splits).
        while cursor < self.events.len() {
            let mut event = self.events[cursor];
            cursor += 1;
            let slot = &self.slots[event.slot];
            if slot.generation != event.generation || !slot.in_use() {
                continue;
            }
            if let Outcome::ShmRead = event.outcome {
                event.outcome = Outcome::Read(self.read_shm_split(event.slot, event.split, buffers));
            }
            match event.outcome {
                Outcome::Read(outcome) => self.read_outcome(event, outcome, buffers),
                Outcome::Write(stored) => self.write_outcome(event, stored),
                Outcome::ProbeFailed => {
                    let slot = &self.slots[event.slot];
                    let address = self.nodes[self.probes[slot.probe].targets[event.split].0].address;
                    self.finish(event.slot, Err(PageError::NodeDown { address }));
                }
                Outcome::ProbeReply => {
                    let slot = &mut self.slots[event.slot];
                    slot.probe_asked &= !(1 << event.split);
                    slot.probe_replies += 1;
                    if slot.probe_replies == self.probes[slot.probe].need {
                        self.finish(event.slot, Ok(()));
                    }
                }
                Outcome::ShmRead => unreachable!("turned into a read outcome above"),
            }
        }
        self.events.clear();
    }

    fn read_outcome(&mut self, event: SplitEvent, outcome: SplitOutcome, buffers: &mut dyn OpBuffers) {
        let slot = &mut self.slots[event.slot];
        let step = slot.read.as_mut().expect("read slot has a read state").on_reply(event.split, outcome);
        if slot.kind == SlotKind::Write {
            // A write finding out its page's version.
            match step {
                ReadStep::Wait => {}
                ReadStep::Ask(mask) => self.queue_reads(event.slot, mask),
                ReadStep::Done { .. } | ReadStep::Lost { .. } => self.finish_discovery(event.slot),
            }
            return;
        }
        match step {
            ReadStep::Wait => {}
            ReadStep::Ask(mask) => self.queue_reads(event.slot, mask),
            ReadStep::Done { version: 0, present, .. }
                if self.page_flags[slot.page as usize] & (PAGE_VERSION_UNKNOWN | PAGE_ABSENT_IS_LOST)
                    == PAGE_VERSION_UNKNOWN | PAGE_ABSENT_IS_LOST =>
            {
                // No split has a version of a page lost before the map was saved: its slabs are
                // empty replacements, and it reads as lost, never as zeros.
                let (page, range) = (slot.page, slot.range);
                self.versions[page as usize] = 1;
                self.page_flags[page as usize] &= !PAGE_VERSION_UNKNOWN;
                self.set_unreadable(page, true);
                let error = self.lost_error(page, range, present, 0);
                self.finish(event.slot, Err(error));
            }
            ReadStep::Done { present, needs_decode, version } => {
                let (page, tag, region) = (slot.page as usize, slot.tag, slot.region);
                if self.page_flags[page] & PAGE_VERSION_UNKNOWN != 0 {
                    self.versions[page] = version;
                    self.page_flags[page] &= !PAGE_VERSION_UNKNOWN;
                    let read = slot.read.as_ref().expect("read slot has a read state");
                    let seen = read.newest_version_seen();
                    if seen.is_some_and(|seen| seen != version) {
                        self.page_flags[page] |= PAGE_WRITE_DISCOVERS;
                    }
                    // A version that parities answered for with another one is a parity-stale
                    // page (a reopened client does not remember which pages are): from now on
                    // it is read from its data splits and a lost data slab marks it unreadable,
                    // as before the restart. A parity of the version makes it an ordinary page;
                    // no parity answering (their slabs down) tells nothing.
                    let parities = self.regions[region].shape.parity_mask();
                    let answered = read.valid() & parities;
                    if version != 0 && answered != 0 {
                        let vouched = read.valid_at(version) & parities != 0;
                        self.set_parity_stale(page as u64, !vouched);
                    }
                }
                let result = if version == 0 {
                    // Discovery found the page never written: zeros.
                    buffers.read_buffer(tag).fill(0);
                    Ok(())
                } else if needs_decode {
                    let slot = &self.slots[event.slot];
                    let parity_bytes =
                        self.regions[region].shape.parity_splits * self.regions[region].split_bytes;
                    self.regions[region]
                        .codec
                        .decode(buffers.read_buffer(tag), &slot.parity[..parity_bytes], present)
                        .map_err(|error| PageError::Decode { page: page as u64, message: error.to_string() })
                } else {
                    Ok(())
                };
                // Degraded: a data split is neither here nor coming (its slab is down, or it
                // answered failed, corrupt or of another version), not merely later than a parity.
                let read = self.slots[event.slot].read.as_ref().expect("read slot has a read state");
                let degraded = needs_decode && read.missing_data_splits(present) != 0;
                self.finish_read(event.slot, result, needs_decode, degraded);
            }
            ReadStep::Lost { valid, failed } => {
                let page = slot.page as usize;
                if self.page_flags[page] & PAGE_VERSION_UNKNOWN != 0 {
                    // No version has k splits (a torn write, or too many losses): the page stays
                    // unreadable until rewritten, and the next write must be newer than every
                    // split seen.
                    let newest = slot.read.as_ref().and_then(|read| read.newest_version_seen());
                    self.versions[page] = newest.unwrap_or(0).max(1);
                    self.page_flags[page] &= !PAGE_VERSION_UNKNOWN;
                    self.set_unreadable(page as u64, true);
                }
                let slot = &self.slots[event.slot];
                let error = self.lost_error(slot.page, slot.range, valid, failed);
                self.finish(event.slot, Err(error));
            }
        }
    }

    /// Completes the op in `slot_index` (anything but a read that found k splits).
    pub(super) fn finish(&mut self, slot_index: usize, result: Result<(), PageError>) {
        self.finish_read(slot_index, result, false, false);
    }

    /// Completes the op in `slot_index`, a read that `decoded` (and was `degraded`: see
    /// [`OpDone::degraded`]).
    fn finish_read(
        &mut self,
        slot_index: usize,
        result: Result<(), PageError>,
        decoded: bool,
        degraded: bool,
    ) {
        let slot = &self.slots[slot_index];
        let done = OpDone {
            index: slot.tag,
            result,
            latency: self.now - slot.started,
            started: slot.started,
            decoded,
            degraded,
        };
        self.release_slot(slot_index);
        self.completions.push(done);
    }

    /// Fails the splits in flight on one slab (evicted): the ops fall back to other splits.
    pub(super) fn fail_pending_on(&mut self, range: usize, split: usize) {
        for slot_index in 0..self.slots.len() {
            let slot = &self.slots[slot_index];
            if slot.kind == SlotKind::Probe || slot.range != range || slot.pending() & (1 << split) == 0 {
                continue;
            }
            let outcome = slot.failure_outcome();
            self.events.push(SplitEvent { slot: slot_index, generation: slot.generation, split, outcome });
        }
    }

    /// Fails every split in flight on `node`.
    pub(super) fn fail_pending_on_node(&mut self, node: usize) {
        for slot_index in 0..self.slots.len() {
            let slot = &self.slots[slot_index];
            let pending = slot.pending();
            if pending == 0 {
                continue;
            }
            let generation = slot.generation;
            for split in 0..MAX_SPLITS {
                if pending & (1 << split) == 0 {
                    continue;
                }
                if slot.kind == SlotKind::Free {
                    continue;
                }
                let outcome = slot.failure_outcome();
                let target = self.slot_split_node(slot, split);
                if target == node {
                    self.events.push(SplitEvent { slot: slot_index, generation, split, outcome });
                }
            }
        }
    }
}
