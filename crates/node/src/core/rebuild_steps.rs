//! The rebuild of one slab (`Regenerate`, seed 000 §4.2 "Background Slab Regeneration") as a
//! step machine: every decision of the rebuild, and no I/O. Two shells drive it, the threaded
//! node (`regenerate`: sockets to the sources, `ReadSplits` batches asked ahead, deadlines) and
//! the simulator (crates/simnet: the sources' slabs read through the other simulated cores, in
//! simulated time), so what a seed finds in a rebuild is a bug of the code that ships.
//!
//! The shell asks [`RebuildSteps::wants`] what to do and answers; the machine says, in order:
//!
//! - [`Want::NextBatch`]: slots `first_slot..first_slot + count` come next. Between batches the
//!   shell counts progress ([`RebuildSteps::take_progress`]), checks its own reasons to stop (the
//!   node stopping, the requester gone: [`RebuildSteps::abandon`]) and lets time pass, then calls
//!   [`RebuildSteps::begin_batch`]. A slab unmapped or evicted meanwhile ends the rebuild there;
//!   a batch whose slots the client has all written since is skipped without reading.
//! - [`Want::Batch`]: read the batch from each of these sources (the first k that have not
//!   failed, data splits first: with the k data splits a page needs no decoding). Each answers
//!   [`RebuildSteps::batch_read`] or [`RebuildSteps::source_failed`]; a failed source is replaced
//!   by the next one, and with fewer than k left the rebuild ends.
//! - [`Want::Page`]: offer each batch source's split of this slot ([`RebuildSteps::offer_split`]).
//!   Slots the client wrote since the rebuild began are skipped without asking.
//! - [`Want::Single`]: the batch's splits do not settle this page (no version has k of them):
//!   read the slot alone from every other source that has not failed, and offer or fail each.
//! - [`Want::Done`]: the rebuild ended; its [`RebuildOutcome`].
//!
//! Each split offered is judged with the protocol's rules (`remem_proto::judge_split`: valid at
//! a version, never written, corrupt; metadata that does not decode is corrupt, never "never
//! written"), and a page takes the newest version k splits agree on (`newest_with_k`, never
//! written being version 0), so splits of two versions are never mixed. Version 0: the page was
//! never written, nothing is stored and it counts as skipped. No such version: the page is lost
//! and its slot stays unwritten (it reads as an erasure, never as wrong data). Otherwise
//! [`store_rebuilt_page`] decodes or re-encodes the lost split and stores it only if the slot is
//! still unwritten (the client's newer write wins: skipped).
//!
//! Counting, which the client acts on (any lost page means the slab is not rebuilt): rebuilt +
//! skipped + lost = pages; pages the rebuild never reached (it ended early) are lost.
//!
//! Invariants: no allocation after [`RebuildSteps::new`] (the page, parity and vote buffers are
//! the machine's, reused page after page); every answer answers a question asked (asserted); a
//! source that failed is never asked again.

use super::rebuild::{store_rebuilt_page, PageStored};
use super::Admission;
use remem_codec::{new_codec, split_buffer_mut, PageCodec};
use remem_proto::{
    judge_split, judge_split_crc, max_read_splits_count, newest_with_k, RegenerationSource, SplitMeta,
    SplitVerdict,
};

/// A set of sources, by position in [`RebuildSteps::sources`] (at most 32 of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceSet(u32);

impl SourceSet {
    pub fn contains(self, position: usize) -> bool {
        position < 32 && self.0 & (1 << position) != 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The positions in the set, in order (data splits first, as the sources are sorted).
    pub fn iter(self) -> impl Iterator<Item = usize> + Clone {
        let mut left = self.0;
        std::iter::from_fn(move || {
            (left != 0).then(|| {
                let position = left.trailing_zeros() as usize;
                left &= left - 1;
                position
            })
        })
    }

    fn insert(&mut self, position: usize) {
        self.0 |= 1 << position;
    }

    fn remove(&mut self, position: usize) {
        self.0 &= !(1 << position);
    }

    fn without(self, other: SourceSet) -> SourceSet {
        SourceSet(self.0 & !other.0)
    }
}

/// What the machine needs next (see the module documentation for the answers each one takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    NextBatch {
        first_slot: u32,
        count: u32,
    },
    Batch {
        first_slot: u32,
        count: u32,
        sources: SourceSet,
    },
    /// `index` is the slot's place in its batch (`slot - first_slot`).
    Page {
        slot: u32,
        index: u32,
        sources: SourceSet,
    },
    Single {
        slot: u32,
        sources: SourceSet,
    },
    Done(RebuildOutcome),
}

/// Why a rebuild ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildEnd {
    /// Every page was handled.
    Complete,
    /// The slab being rebuilt was unmapped or evicted.
    SlabGone,
    /// Fewer than k sources were left to read a batch from.
    TooFewSources,
    /// The shell gave up ([`RebuildSteps::abandon`]).
    Abandoned,
}

/// What a rebuild came to: the numbers of `RegenerationDone`, and its source failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RebuildOutcome {
    pub pages_rebuilt: u64,
    /// Written by the client meanwhile, or never written: nothing to store.
    pub pages_skipped: u64,
    /// Written (or possibly written) and not rebuilt, pages never reached included.
    pub pages_lost: u64,
    pub sources_failed: u32,
    pub end: RebuildEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The batch at `next_slot` is next (or the rebuild is complete).
    Between,
    /// Gathering k sources that hold the batch at `next_slot`.
    Fetching,
    /// Page `index` of the batch: its batch splits asked.
    Page {
        index: u32,
    },
    /// Page `index` of the batch: the other sources asked for it.
    Single {
        index: u32,
    },
    Ended(RebuildEnd),
}

/// One slab's rebuild; see the module documentation.
pub struct RebuildSteps {
    /// The core's admission; its sources sorted by split index.
    admission: Admission,
    batch_slots: u32,
    codec: Box<dyn PageCodec>,
    page: Vec<u8>,
    parity: Vec<u8>,
    /// (split index, version) of each split of the current page that is not corrupt; version 0
    /// is a slot never written.
    votes: Vec<(u8, u8)>,
    phase: Phase,
    /// The first slot of the current batch (or of the next one, between batches).
    next_slot: u32,
    /// Sources asked that have not answered yet.
    pending: SourceSet,
    /// Sources holding the current batch.
    holding: SourceSet,
    failed: SourceSet,
    rebuilt: u64,
    skipped: u64,
    lost: u64,
    /// Pages already handed out by [`Self::take_progress`].
    progress_taken: u64,
}

impl RebuildSteps {
    /// A rebuild of `admission` in batches of `batch_slots` slots (1 up to what one
    /// `ReadSplitsReply` carries at this split size). Allocates its codec and buffers here, once.
    pub fn new(mut admission: Admission, batch_slots: u32) -> RebuildSteps {
        let params = admission.params;
        let most = max_read_splits_count(params.split_bytes() as u32);
        assert!((1..=most).contains(&batch_slots), "batch of {batch_slots} slots, 1..={most} allowed");
        assert!(admission.sources.len() <= 32, "the core admits at most one source per split index");
        assert!(admission.sources.len() >= params.data_splits, "the core admits k sources at least");
        admission.sources.sort_by_key(|source| source.split_index);
        RebuildSteps {
            codec: new_codec(params),
            page: vec![0; params.page_bytes],
            parity: vec![0; params.parity_bytes()],
            votes: Vec::with_capacity(admission.sources.len()),
            batch_slots,
            admission,
            phase: Phase::Between,
            next_slot: 0,
            pending: SourceSet::default(),
            holding: SourceSet::default(),
            failed: SourceSet::default(),
            rebuilt: 0,
            skipped: 0,
            lost: 0,
            progress_taken: 0,
        }
    }

    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The sources, data splits first: the positions of every [`SourceSet`].
    pub fn sources(&self) -> &[RegenerationSource] {
        &self.admission.sources
    }

    pub fn batch_slots(&self) -> u32 {
        self.batch_slots
    }

    pub fn pages(&self) -> u32 {
        self.admission.pages
    }

    /// Slots in the next batch (0 once every batch is done).
    pub fn next_batch_pages(&self) -> u32 {
        self.batch_slots.min(self.admission.pages.saturating_sub(self.next_slot))
    }

    /// What the machine needs next. Decides every page whose answers are in (judging,
    /// decoding and storing it) before it says.
    pub fn wants(&mut self) -> Want {
        loop {
            match self.phase {
                Phase::Ended(end) => return Want::Done(self.outcome(end)),
                Phase::Between if self.next_slot >= self.admission.pages => self.end(RebuildEnd::Complete),
                Phase::Between => {
                    return Want::NextBatch { first_slot: self.next_slot, count: self.next_batch_pages() }
                }
                Phase::Fetching if !self.pending.is_empty() => {
                    let (first_slot, count) = (self.next_slot, self.next_batch_pages());
                    return Want::Batch { first_slot, count, sources: self.pending };
                }
                Phase::Fetching => self.choose_batch_sources(),
                Phase::Page { index } if !self.pending.is_empty() => {
                    return Want::Page { slot: self.next_slot + index, index, sources: self.pending };
                }
                Phase::Page { index } => {
                    let version = self.newest_version();
                    let others = self.usable().without(self.holding);
                    if version.is_none() && !others.is_empty() {
                        self.phase = Phase::Single { index };
                        self.pending = others;
                    } else {
                        self.conclude_page(index, version);
                    }
                }
                Phase::Single { index } if !self.pending.is_empty() => {
                    return Want::Single { slot: self.next_slot + index, sources: self.pending };
                }
                Phase::Single { index } => {
                    let version = self.newest_version();
                    self.conclude_page(index, version);
                }
            }
        }
    }

    /// The shell goes on to the batch [`Want::NextBatch`] named.
    pub fn begin_batch(&mut self) {
        assert_eq!(self.phase, Phase::Between, "a batch begins between batches");
        let (first_slot, count) = (self.next_slot, self.next_batch_pages());
        assert!(count > 0, "a batch is left to begin");
        let slab = &self.admission.slab;
        // The real rebuild's check between batches: a slab unmapped or evicted is not filled.
        if slab.is_detached() {
            self.end(RebuildEnd::SlabGone);
        } else if (first_slot..first_slot + count).all(|slot| slab.meta(slot).version != 0) {
            self.skipped += u64::from(count);
            self.next_slot += count;
        } else {
            self.holding = SourceSet::default();
            self.phase = Phase::Fetching;
        }
    }

    /// Source `position` holds the batch asked of it.
    pub fn batch_read(&mut self, position: usize) {
        assert_eq!(self.phase, Phase::Fetching, "a batch is read while the machine fetches one");
        self.answered(position);
        self.holding.insert(position);
    }

    /// Source `position` failed (down, refused, timed out, did not answer as the protocol says):
    /// it is asked nothing more in this rebuild.
    pub fn source_failed(&mut self, position: usize) {
        self.answered(position);
        self.holding.remove(position);
        self.failed.insert(position);
    }

    /// Source `position`'s split of the slot [`Want::Page`] or [`Want::Single`] named: its
    /// metadata (`None` when the metadata did not decode: a corrupt split) and payload, with the
    /// payload's CRC-32C if the shell computed it already (else it is computed here).
    pub fn offer_split(
        &mut self,
        position: usize,
        meta: Option<SplitMeta>,
        payload: &[u8],
        payload_crc: Option<u32>,
    ) {
        let index = match self.phase {
            Phase::Page { index } | Phase::Single { index } => index,
            phase => panic!("a split offered in {phase:?}"),
        };
        self.answered(position);
        let params = self.admission.params;
        assert_eq!(payload.len(), params.split_bytes(), "a whole split is offered");
        let split_index = self.admission.sources[position].split_index;
        let page_number = self.admission.slab.label().first_page + u64::from(self.next_slot + index);
        let verdict = match (meta, payload_crc) {
            (None, _) => SplitVerdict::Corrupt,
            (Some(meta), Some(crc)) => judge_split_crc(crc, meta, page_number, split_index),
            (Some(meta), None) => judge_split(payload, meta, page_number, split_index),
        };
        let Some(version) = verdict.version() else {
            return;
        };
        // Each source holds its own split index, so a split's place in the page is its own;
        // splits of the version that loses are never marked present.
        if version != 0 {
            let (k, split_bytes) = (params.data_splits, params.split_bytes());
            split_buffer_mut(&mut self.page, &mut self.parity, k, split_bytes, usize::from(split_index))
                .copy_from_slice(payload);
        }
        self.votes.push((split_index, version));
    }

    /// The shell gives the rebuild up (its node stops, its requester is gone): the pages not
    /// handled yet are lost.
    pub fn abandon(&mut self) {
        if !matches!(self.phase, Phase::Ended(_)) {
            self.end(RebuildEnd::Abandoned);
        }
    }

    /// Pages handled (rebuilt, skipped or lost) since the last call, for the node's progress.
    pub fn take_progress(&mut self) -> u64 {
        let handled = self.rebuilt + self.skipped + self.lost;
        let new = handled - self.progress_taken;
        self.progress_taken = handled;
        new
    }

    fn answered(&mut self, position: usize) {
        assert!(self.pending.contains(position), "source {position} answers a question asked of it");
        self.pending.remove(position);
    }

    /// Sources that have not failed.
    fn usable(&self) -> SourceSet {
        SourceSet(all_of(self.admission.sources.len()).0 & !self.failed.0)
    }

    /// Asks the first sources that have not failed, in order, for what the holding ones lack
    /// of k; with fewer than k left, the rebuild ends.
    fn choose_batch_sources(&mut self) {
        let k = self.admission.params.data_splits;
        if self.holding.len() == k {
            self.enter_page(0);
            return;
        }
        let candidates = self.usable().without(self.holding);
        if self.holding.len() + candidates.len() < k {
            tracing::debug!(slab_id = self.admission.slab_id, "rebuild: fewer than k sources left");
            self.end(RebuildEnd::TooFewSources);
            return;
        }
        for position in candidates.iter().take(k - self.holding.len()) {
            self.pending.insert(position);
        }
    }

    /// Goes to page `index` of the batch, past slots the client wrote since the rebuild began;
    /// past the batch's last page, to the next batch.
    fn enter_page(&mut self, mut index: u32) {
        let count = self.next_batch_pages();
        while index < count && self.admission.slab.meta(self.next_slot + index).version != 0 {
            self.skipped += 1;
            index += 1;
        }
        if index == count {
            self.next_slot += count;
            self.holding = SourceSet::default();
            self.phase = Phase::Between;
            return;
        }
        self.votes.clear();
        self.pending = self.holding;
        self.phase = Phase::Page { index };
    }

    fn newest_version(&self) -> Option<u8> {
        newest_with_k(self.votes.iter().map(|(_, version)| *version), self.admission.params.data_splits)
    }

    /// Page `index` of the batch is settled at `version` (`None`: no k splits agree on one).
    fn conclude_page(&mut self, index: u32, version: Option<u8>) {
        let slot = self.next_slot + index;
        match version {
            None => {
                tracing::debug!(
                    slab_id = self.admission.slab_id,
                    slot,
                    "page lost: fewer than k consistent splits"
                );
                self.lost += 1;
            }
            // k splits agree the page was never written and none of a newer version reach k: the
            // slot stays unwritten, as it would be on a slab that never failed.
            Some(0) => self.skipped += 1,
            Some(version) => {
                let present = self
                    .votes
                    .iter()
                    .filter(|(_, vote)| *vote == version)
                    .fold(0u32, |present, (split_index, _)| present | 1 << split_index);
                let page_number = self.admission.slab.label().first_page + u64::from(slot);
                let stored = store_rebuilt_page(
                    self.codec.as_mut(),
                    &mut self.page,
                    &mut self.parity,
                    present,
                    &self.admission,
                    slot,
                    page_number,
                    version,
                );
                match stored {
                    PageStored::Rebuilt => self.rebuilt += 1,
                    PageStored::WrittenMeanwhile => self.skipped += 1,
                    PageStored::Lost => self.lost += 1,
                }
            }
        }
        self.enter_page(index + 1);
    }

    /// Ends the rebuild: every page not handled yet is lost.
    fn end(&mut self, end: RebuildEnd) {
        let handled = self.rebuilt + self.skipped + self.lost;
        self.lost += u64::from(self.admission.pages) - handled;
        self.pending = SourceSet::default();
        self.holding = SourceSet::default();
        self.phase = Phase::Ended(end);
    }

    fn outcome(&self, end: RebuildEnd) -> RebuildOutcome {
        let outcome = RebuildOutcome {
            pages_rebuilt: self.rebuilt,
            pages_skipped: self.skipped,
            pages_lost: self.lost,
            sources_failed: self.failed.len() as u32,
            end,
        };
        assert_eq!(
            self.rebuilt + self.skipped + self.lost,
            u64::from(self.admission.pages),
            "every page counted once"
        );
        outcome
    }
}

/// Positions `0..count`.
fn all_of(count: usize) -> SourceSet {
    SourceSet(if count >= 32 { u32::MAX } else { (1 << count) - 1 })
}

#[cfg(test)]
#[path = "rebuild_steps_tests.rs"]
mod tests;
