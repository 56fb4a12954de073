//! The admission of rebuilds (`Regenerate`) and their progress counters: the node-side checks of
//! a rebuild request, in the order the protocol documents them, and the place each admitted
//! rebuild holds among the [`MAX_CONCURRENT_REGENERATIONS`] a node runs at once.
//!
//! The rebuild's decisions (which sources to read, each page's version) are the step machine's
//! (`rebuild_steps`), which ends every page with [`store_rebuilt_page`]; its reads (k surviving
//! slabs, batch by batch) are done by the shell that admitted it: the threaded node's
//! `regenerate` module over sockets, the simulator's over its simulated nodes.
//!
//! Invariant: every [`Admission`] is released exactly once ([`RebuildProgress::release`]), which
//! gives back its place, removes its pages from the progress and ends the slab's rebuild mode.

use super::{NodeCore, Refusal, Slab};
use remem_codec::CodecParams;
use remem_proto::RegenerationSource;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Most rebuilds one node runs at once; a further `Regenerate` gets `Error(NoCapacity)`.
pub const MAX_CONCURRENT_REGENERATIONS: u32 = 4;

/// Rebuilds running now, summed, for `NodeInfoReply`.
#[derive(Default)]
pub struct RebuildProgress {
    running: AtomicU32,
    pages_done: AtomicU64,
    pages_total: AtomicU64,
}

/// A snapshot of [`RebuildProgress`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    pub regenerating_slabs: u32,
    pub pages_done: u64,
    pub pages_total: u64,
}

impl RebuildProgress {
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            regenerating_slabs: self.running.load(Ordering::Relaxed),
            pages_done: self.pages_done.load(Ordering::Relaxed),
            pages_total: self.pages_total.load(Ordering::Relaxed),
        }
    }

    /// `pages` more pages of a running rebuild are done (rebuilt, skipped or lost).
    pub fn add_done(&self, pages: u64) {
        self.pages_done.fetch_add(pages, Ordering::Relaxed);
    }

    /// The rebuild of `admission` ended having counted `pages_done` pages: its place is free,
    /// its pages leave the progress, and its slab is an ordinary one again.
    pub fn release(&self, admission: &Admission, pages_done: u64) {
        self.pages_done.fetch_sub(pages_done, Ordering::Relaxed);
        self.pages_total.fetch_sub(u64::from(admission.pages), Ordering::Relaxed);
        admission.slab.set_regenerating(false);
        let before = self.running.fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "a rebuild is released once");
    }
}

/// A rebuild the core accepted: its slab is in rebuild mode and it holds a place until
/// [`RebuildProgress::release`].
pub struct Admission {
    pub client_id: u64,
    pub slab_id: u32,
    pub slab: Arc<Slab>,
    pub params: CodecParams,
    /// The split index of the slab being rebuilt.
    pub target_split: u8,
    pub pages: u32,
    pub sources: Vec<RegenerationSource>,
}

/// The fields of a `Regenerate`.
pub struct RebuildRequest {
    pub slab_id: u32,
    pub data_splits: u8,
    pub parity_splits: u8,
    pub page_bytes: u32,
    pub pages: u32,
    pub sources: Vec<RegenerationSource>,
}

impl NodeCore {
    /// Checks a `Regenerate` of `client_id` and reserves a place for it.
    ///
    /// Errors (the `Error` reply, connection kept): `UnknownSlab`/`NotOwner` for the target slab;
    /// `BadSplitSize` if the code is invalid or its split size is not the slab's; `SlotOutOfRange`
    /// if `pages` exceeds the slab's slots; `Unsupported` for split indices that do not fit the
    /// code (target or source index >= k + r, duplicates), fewer than k sources, or a slab
    /// already being rebuilt; `NoCapacity` with [`MAX_CONCURRENT_REGENERATIONS`] rebuilds running.
    pub fn admit_rebuild(&self, client_id: u64, request: RebuildRequest) -> Result<Admission, Refusal> {
        let slab = self.table.get(client_id, request.slab_id)?;
        let k = usize::from(request.data_splits);
        let params = CodecParams::new(k, usize::from(request.parity_splits), request.page_bytes as usize)
            .map_err(Refusal::BadCode)?;
        if params.split_bytes() != slab.split_bytes() as usize {
            return Err(Refusal::CodeSplitSize {
                code_split_bytes: params.split_bytes(),
                slab_id: request.slab_id,
                split_bytes: slab.split_bytes(),
            });
        }
        if request.pages > slab.slots() {
            return Err(Refusal::TooManyPages { pages: request.pages, slots: slab.slots() });
        }
        let total = params.total_splits();
        let target_split = slab.label().split_index;
        if usize::from(target_split) >= total {
            return Err(Refusal::TargetOutsideCode {
                slab_id: request.slab_id,
                split_index: target_split,
                total,
            });
        }
        // A source may name the split being rebuilt: the slab it replaces, kept by the client as a
        // source while its node is reachable (a node that corrupts, a drained node). Its splits are
        // judged like any other: corrupt or stale ones are erasures.
        let mut seen = 0u32;
        for source in &request.sources {
            if usize::from(source.split_index) >= total || seen & (1 << source.split_index) != 0 {
                return Err(Refusal::BadSource { split_index: source.split_index });
            }
            seen |= 1 << source.split_index;
        }
        if request.sources.len() < k {
            return Err(Refusal::TooFewSources { sources: request.sources.len(), k });
        }
        let reserved = self.rebuilds.running.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |running| {
            (running < MAX_CONCURRENT_REGENERATIONS).then_some(running + 1)
        });
        if reserved.is_err() {
            return Err(Refusal::RegenerationsBusy);
        }
        if !slab.set_regenerating(true) {
            self.rebuilds.running.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::AlreadyRegenerating { slab_id: request.slab_id });
        }
        self.rebuilds.pages_total.fetch_add(u64::from(request.pages), Ordering::Relaxed);
        Ok(Admission {
            client_id,
            slab_id: request.slab_id,
            slab,
            params,
            target_split,
            pages: request.pages,
            sources: request.sources,
        })
    }
}

/// What storing one rebuilt page came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PageStored {
    /// The target's split was decoded (or re-encoded) and stored.
    Rebuilt,
    /// The client wrote the slot meanwhile: its newer split wins, nothing stored.
    WrittenMeanwhile,
    /// The splits did not decode (only a bug gets here: k splits of one version were chosen).
    Lost,
}

/// The last step of rebuilding one page ([`super::RebuildSteps`]): `page` and `parity` hold the
/// splits of `version` marked in `present` (k of them at least, put there with
/// `remem_codec::split_buffer_mut`); decodes the page, takes the target's split (a data split
/// from the page, a parity split by re-encoding it), checksums it with the target's split index
/// and stores it in `slot` of the target slab only if the slot is still unwritten.
#[allow(clippy::too_many_arguments)]
pub(super) fn store_rebuilt_page(
    codec: &mut dyn remem_codec::PageCodec,
    page: &mut [u8],
    parity: &mut [u8],
    present: u32,
    admission: &Admission,
    slot: u32,
    page_number: u64,
    version: u8,
) -> PageStored {
    assert_ne!(version, 0, "a page never written is not rebuilt");
    let k = admission.params.data_splits;
    assert!(present.count_ones() as usize >= k, "k splits of one version are present");
    if let Err(error) = codec.decode(page, parity, present) {
        tracing::error!(slab_id = admission.slab_id, slot, %error, "regeneration decode failed");
        return PageStored::Lost;
    }
    let split_bytes = admission.params.split_bytes();
    let target = usize::from(admission.target_split);
    let rebuilt = if target < k {
        &page[target * split_bytes..(target + 1) * split_bytes]
    } else {
        codec.encode(page, parity);
        &parity[(target - k) * split_bytes..(target - k + 1) * split_bytes]
    };
    let checksum = remem_proto::split_checksum(rebuilt, version, page_number, admission.target_split);
    if admission.slab.store_if_unwritten(slot, rebuilt, remem_proto::SplitMeta { version, checksum }) {
        PageStored::Rebuilt
    } else {
        PageStored::WrittenMeanwhile
    }
}
