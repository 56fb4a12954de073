//! Background slab regeneration (seed 000 §4.2, "Background Slab Regeneration"), done on the node
//! that holds the new, empty slab.
//!
//! A client that lost a slab maps a new one here and sends `Regenerate` naming the surviving
//! splits of the range. The node answers `Ok` at once and a rebuild thread then, for each batch of
//! slots: reads the batch (`ReadSplits`) from k sources, data splits first, each asked a few
//! batches ahead so they serve the next ones while this one is decoded (`sources`); judges every
//! split (checksums of a page's splits computed together, `remem_proto::payload_crcs`)
//! with the protocol's shared rules (`remem_proto::judge_split`: valid at a version, never
//! written, or corrupt) and keeps, per page, the newest version that k of the splits agree on
//! (`remem_proto::newest_with_k`, where never written is version 0, older than any write), so a
//! torn write of two versions is never mixed; asks the remaining sources for pages that lack k
//! such splits; and then either leaves the slot alone (the newest agreed version is 0: the page
//! was never written, so there is nothing to rebuild) or decodes the page, takes the lost split (a
//! data split from the decoded page, a parity split by re-encoding it) and stores it with its own
//! checksum, but only if the slot is still unwritten. When it ends it sends `RegenerationDone` on
//! the requesting connection.
//!
//! Counting, which the client acts on (any lost page means the slab is not rebuilt): a page is
//! rebuilt when its split was stored; skipped when there was nothing to store (the client wrote
//! the slot meanwhile, or the page was never written); lost only when it was, or may have been,
//! written and could not be rebuilt: no version has k consistent splits, or the rebuild ended
//! before reaching it. Rebuilt + skipped + lost = pages.
//!
//! Better than the seed, writes are not blocked during the rebuild: the client writes new pages to
//! the new slab too, and those win. "Store if unwritten" and a client write of the same slot are
//! atomic with respect to each other through the slab's regeneration lock, taken by both only
//! while the slab is being rebuilt (see the slab module).
//!
//! The rebuild acts for the client: it connects to the sources with the node's cluster secret and
//! the requester's client id, so the sources' ownership checks pass (docs/PROTOCOL.md, security).
//!
//! Fault model: a source may be down, fail mid-way, time out, refuse, or return corrupted, torn or
//! stale splits. A failed source is replaced by another; a corrupt split (bad checksum, or
//! metadata with non-zero reserved bytes) is an erasure, never a vote for "never written". With
//! fewer than k sources left, the rebuild ends with the pages done and reports the rest lost. A
//! page without k consistent splits is lost and its slot stays unwritten, so it reads as version
//! 0 (an erasure), never as wrong data.
//!
//! Invariant: at most `MAX_CONCURRENT_REGENERATIONS` rebuilds run at once (the core admits them), one thread each; the
//! node stops them (and joins them) before it unmaps its slabs. A rebuild holds its place only
//! while someone waits for it: it ends (and frees the place) when the node stops, its slab is
//! unmapped, or the connection that asked for it closes, checked between batches; every read of
//! a source has a deadline (`sources`), so a stalled source holds a batch for that long at most.

mod sources;

pub use sources::{read_floor, FloorSource, PIPELINE_DEPTH};

use crate::core::{store_rebuilt_page, Admission, PageStored, Session, Slab};
use crate::shared::Shared;
use remem_codec::{new_codec, split_buffer_mut, CodecParams, PageCodec, MAX_DATA_SPLITS};
use remem_proto::{
    judge_split, judge_split_crc, max_read_splits_count, newest_with_k, Control, SplitMeta, SplitVerdict,
    SPLIT_META_BYTES,
};
use sources::{fetch_batch, Batch, Claim, Source};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a rebuild did: the numbers of `RegenerationDone`, and its speed for logs and benches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegenerationReport {
    pub slab_id: u32,
    pub pages_rebuilt: u64,
    pub pages_skipped: u64,
    pub pages_lost: u64,
    /// Bytes of the new slab covered (`pages * split_bytes`).
    pub slab_bytes: u64,
    pub elapsed: Duration,
}

impl RegenerationReport {
    /// Rebuild throughput in MiB of the new slab per second.
    pub fn slab_mib_per_second(&self) -> f64 {
        self.slab_bytes as f64 / (1024.0 * 1024.0) / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The node's rebuild threads, and the sockets to their sources (so a stopping node can unblock
/// them). Their admission and progress are the core's (`core::RebuildProgress`).
#[derive(Default)]
pub struct Regenerations {
    next_job: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    streams: Mutex<Vec<(u64, TcpStream)>>,
}

impl Regenerations {
    /// Unblocks every rebuild (their sources' sockets are shut down; they also check
    /// `Shared::stopping` between batches) and joins their threads.
    pub fn stop_and_join(&self) {
        for (_, stream) in lock(&self.streams).iter() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a regeneration thread panicked");
            }
        }
    }

    fn register_stream(&self, job: u64, stream: &TcpStream) {
        if let Ok(clone) = stream.try_clone() {
            lock(&self.streams).push((job, clone));
        }
    }

    fn forget_streams(&self, job: u64) {
        lock(&self.streams).retain(|(owner, _)| *owner != job);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Lists of handles stay consistent at every step; poisoning is no reason to stop.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An admitted rebuild (`core::Admission`) and the thread-side facts it needs. Dropping it
/// (finished or never started) releases its place in the core, ends the slab's rebuild mode and
/// removes its progress.
pub struct Job {
    shared: Arc<Shared>,
    id: u64,
    /// The requester: its client id and session (the rebuild reads the sources under the same
    /// claim, so a session fenced off at a source cannot rebuild from it, `leases`) and its
    /// connection, which gets `RegenerationDone`.
    session: Session,
    request_id: u64,
    admission: Admission,
    slab: Arc<Slab>,
    params: CodecParams,
    target_split: u8,
    pages_done: u64,
}

impl Job {
    fn claim(&self) -> Claim<'_> {
        Claim {
            secret: &self.shared.secret,
            client_id: self.session.client_id,
            session: self.session.session,
        }
    }

    fn add_done(&mut self, pages: u64) {
        self.pages_done += pages;
        self.shared.core.rebuilds.add_done(pages);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.shared.regenerations.forget_streams(self.id);
        self.shared.core.rebuilds.release(&self.admission, self.pages_done);
    }
}

/// Runs the rebuild on its own thread; it reports `RegenerationDone` when it ends.
pub fn spawn(shared: &Arc<Shared>, session: &Session, request_id: u64, admission: Admission) {
    let slab_id = admission.slab_id;
    let job = Job {
        shared: Arc::clone(shared),
        id: shared.regenerations.next_job.fetch_add(1, Ordering::Relaxed),
        session: *session,
        request_id,
        slab: Arc::clone(&admission.slab),
        params: admission.params,
        target_split: admission.target_split,
        admission,
        pages_done: 0,
    };
    let spawned = std::thread::Builder::new().name(format!("remem-regen-{slab_id}")).spawn(move || {
        let mut job = job;
        let report = rebuild(&mut job);
        // The slab is an ordinary one again before its owner hears so: an `ExportSlab` sent on
        // `RegenerationDone` must not find it still rebuilding. (Drop clears it too, on every
        // other way out.)
        job.slab.set_regenerating(false);
        send_report(&job, &report);
    });
    match spawned {
        Ok(thread) => {
            let mut threads = lock(&shared.regenerations.threads);
            threads.retain(|thread| !thread.is_finished());
            threads.push(thread);
        }
        // The job was moved into the failed spawn and dropped there, releasing its place.
        Err(error) => tracing::error!(slab_id, %error, "cannot spawn a regeneration thread"),
    }
}

fn send_report(job: &Job, report: &RegenerationReport) {
    let mut frame = Vec::with_capacity(64);
    Control::RegenerationDone {
        slab_id: report.slab_id,
        pages_rebuilt: report.pages_rebuilt,
        pages_skipped: report.pages_skipped,
        pages_lost: report.pages_lost,
    }
    .encode(job.request_id, &mut frame);
    // Connection numbers are never reused, so this is the requesting connection if it is open.
    let delivered = match job.shared.peers.get(job.session.connection) {
        Some(peer) => peer.send_frames(&frame),
        None => false,
    };
    if !delivered {
        tracing::warn!(
            client_id = job.session.client_id,
            slab_id = job.admission.slab_id,
            "the requesting connection is gone; RegenerationDone not delivered"
        );
    }
}

/// Per-page work buffers, allocated once per rebuild.
struct Scratch {
    codec: Box<dyn PageCodec>,
    page: Vec<u8>,
    parity: Vec<u8>,
    /// (source position, version) of the current page's batch splits that are not corrupt;
    /// version 0 is a slot never written.
    sound: Vec<(usize, u8)>,
    /// Splits fetched one by one from sources outside the batch that are not corrupt:
    /// (split index, version, payload). A never-written split keeps no payload.
    extra: Vec<(u8, u8, Vec<u8>)>,
    single_body: Vec<u8>,
}

/// The numbers of `RegenerationDone` (see the module documentation for what each one means).
#[derive(Default)]
struct Counts {
    rebuilt: u64,
    /// Written by the client meanwhile, or never written: nothing to store.
    skipped: u64,
    /// Written (or possibly written) and not rebuilt.
    lost: u64,
}

/// The verdict on one split as a source returned it; metadata that did not decode is corrupt.
fn judge(meta: Option<SplitMeta>, payload: &[u8], page: u64, split_index: u8) -> SplitVerdict {
    match meta {
        Some(meta) => judge_split(payload, meta, page, split_index),
        None => SplitVerdict::Corrupt,
    }
}

fn rebuild(job: &mut Job) -> RegenerationReport {
    let started = Instant::now();
    let request = &job.admission;
    let split_bytes = job.slab.split_bytes();
    tracing::info!(
        client_id = request.client_id,
        slab_id = request.slab_id,
        split_index = job.target_split,
        data_splits = job.params.data_splits,
        parity_splits = job.params.parity_splits,
        pages = request.pages,
        sources = request.sources.len(),
        "regeneration started"
    );
    // Data splits first: with all k data splits valid a page needs no decoding at all.
    let mut sources: Vec<Source> = request
        .sources
        .iter()
        .map(|source| Source::new(source.split_index, source.slab_id, source.address))
        .collect();
    sources.sort_by_key(|source| source.split_index);
    let mut scratch = Scratch {
        codec: new_codec(job.params),
        page: vec![0; job.params.page_bytes],
        parity: vec![0; job.params.parity_bytes()],
        sound: Vec::with_capacity(sources.len()),
        extra: Vec::new(),
        single_body: Vec::new(),
    };
    let mut counts = Counts::default();
    let pages = job.admission.pages;
    let batch = max_read_splits_count(split_bytes);
    let mut first_slot = 0u32;
    while first_slot < pages {
        let count = batch.min(pages - first_slot);
        if job.shared.stopping.load(Ordering::Relaxed) || job.slab.is_detached() {
            tracing::warn!(
                slab_id = job.admission.slab_id,
                "regeneration abandoned: node stopping or slab gone"
            );
            break;
        }
        if job.shared.peers.get(job.session.connection).is_none() {
            // The requester gave up on this rebuild (it drops a connection only when it
            // declares the node failed, and then starts the rebuild over elsewhere): nobody
            // would hear the report, and the place among the running rebuilds is wanted.
            tracing::warn!(
                client_id = job.session.client_id,
                slab_id = job.admission.slab_id,
                "regeneration abandoned: the requesting connection is gone"
            );
            break;
        }
        if (first_slot..first_slot + count).all(|slot| job.slab.meta(slot).version != 0) {
            counts.skipped += u64::from(count);
        } else {
            let claim = job.claim();
            let on_connect = |stream: &TcpStream| job.shared.regenerations.register_stream(job.id, stream);
            let span = Batch { first_slot, batch, end: pages, split_bytes };
            let active = fetch_batch(&claim, &on_connect, &mut sources, job.params.data_splits, span, true);
            if active.len() < job.params.data_splits {
                tracing::error!(
                    slab_id = job.admission.slab_id,
                    sources_left = active.len(),
                    "regeneration: fewer than k sources left"
                );
                break;
            }
            for index in 0..count {
                rebuild_page(job, &mut sources, &active, first_slot, index, &mut scratch, &mut counts);
            }
        }
        job.add_done(u64::from(count));
        first_slot += count;
    }
    counts.lost += u64::from(pages - first_slot);
    job.add_done(u64::from(pages - first_slot));
    let report = RegenerationReport {
        slab_id: job.admission.slab_id,
        pages_rebuilt: counts.rebuilt,
        pages_skipped: counts.skipped,
        pages_lost: counts.lost,
        slab_bytes: u64::from(pages) * u64::from(split_bytes),
        elapsed: started.elapsed(),
    };
    tracing::info!(
        slab_id = report.slab_id,
        pages_rebuilt = report.pages_rebuilt,
        pages_skipped = report.pages_skipped,
        pages_lost = report.pages_lost,
        seconds = report.elapsed.as_secs_f64(),
        mib_per_second = report.slab_mib_per_second(),
        "regeneration finished"
    );
    report
}

/// Rebuilds the page of slot `first_slot + index` from the batch, asking the other sources if
/// the batch does not settle it, and stores the lost split if the slot is still unwritten. A page
/// whose newest agreed version is 0 was never written: nothing is stored and it counts as
/// skipped.
fn rebuild_page(
    job: &Job,
    sources: &mut [Source],
    active: &[usize],
    first_slot: u32,
    index: u32,
    scratch: &mut Scratch,
    counts: &mut Counts,
) {
    let slot = first_slot + index;
    if job.slab.meta(slot).version != 0 {
        counts.skipped += 1;
        return;
    }
    let k = job.params.data_splits;
    let split_bytes = job.slab.split_bytes() as usize;
    let page_number = job.slab.label().first_page + u64::from(slot);
    scratch.sound.clear();
    scratch.extra.clear();
    // The batch's splits of this page, checksummed when their batch was read
    // (`Source::checksum_entries`).
    let active = &active[..active.len().min(MAX_DATA_SPLITS)];
    for &position in active {
        let source = &sources[position];
        let meta = source.entry(index as usize, split_bytes).0;
        let crc = source.crc(index as usize);
        let verdict = match meta {
            Some(meta) => judge_split_crc(crc, meta, page_number, source.split_index),
            None => SplitVerdict::Corrupt,
        };
        if let Some(version) = verdict.version() {
            scratch.sound.push((position, version));
        }
    }
    let mut version = newest_with_k(scratch.sound.iter().map(|(_, version)| *version), k);
    if version.is_none() {
        // Ask every other working source for this one slot.
        for (position, source) in sources.iter_mut().enumerate() {
            if active.contains(&position) || source.failed {
                continue;
            }
            let on_connect = |stream: &TcpStream| job.shared.regenerations.register_stream(job.id, stream);
            let fetched = source
                .connect(&job.claim(), &on_connect)
                .and_then(|()| source.read_one(slot, split_bytes as u32, &mut scratch.single_body));
            match fetched {
                Ok(meta) => {
                    let payload = &scratch.single_body[SPLIT_META_BYTES..];
                    match judge(meta, payload, page_number, source.split_index) {
                        SplitVerdict::Valid { version } => {
                            scratch.extra.push((source.split_index, version, payload.to_vec()))
                        }
                        SplitVerdict::NeverWritten => scratch.extra.push((source.split_index, 0, Vec::new())),
                        SplitVerdict::Corrupt => {}
                    }
                }
                Err(error) => source.fail(&error),
            }
        }
        let versions = scratch.sound.iter().map(|(_, version)| *version);
        version = newest_with_k(versions.chain(scratch.extra.iter().map(|(_, version, _)| *version)), k);
    }
    let version = match version {
        None => {
            counts.lost += 1;
            let slab_id = job.admission.slab_id;
            tracing::debug!(slab_id, slot, "page lost: fewer than k consistent splits");
            return;
        }
        // k splits agree the page was never written and none of a newer version reach k: the
        // slot stays unwritten, as it would be on a slab that never failed.
        Some(0) => {
            counts.skipped += 1;
            return;
        }
        Some(version) => version,
    };
    let mut present = 0u32;
    let batch_splits =
        scratch.sound.iter().filter(|(_, split_version)| *split_version == version).map(|(position, _)| {
            let source = &sources[*position];
            (source.split_index, source.entry(index as usize, split_bytes).1)
        });
    let extra_splits = scratch
        .extra
        .iter()
        .filter(|(_, split_version, _)| *split_version == version)
        .map(|(split_index, _, payload)| (*split_index, payload.as_slice()));
    for (split_index, payload) in batch_splits.chain(extra_splits) {
        let split_index = usize::from(split_index);
        split_buffer_mut(&mut scratch.page, &mut scratch.parity, k, split_bytes, split_index)
            .copy_from_slice(payload);
        present |= 1 << split_index;
    }
    let stored = store_rebuilt_page(
        scratch.codec.as_mut(),
        &mut scratch.page,
        &mut scratch.parity,
        present,
        &job.admission,
        slot,
        page_number,
        version,
    );
    match stored {
        PageStored::Rebuilt => counts.rebuilt += 1,
        PageStored::WrittenMeanwhile => counts.skipped += 1,
        PageStored::Lost => counts.lost += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_that_does_not_decode_is_corrupt_not_never_written() {
        let payload = [0u8; 64];
        assert_eq!(judge(None, &payload, 3, 1), SplitVerdict::Corrupt);
        assert_eq!(judge(Some(SplitMeta::default()), &payload, 3, 1), SplitVerdict::NeverWritten);
        let checksum = remem_proto::split_checksum(&payload, 4, 3, 1);
        assert_eq!(
            judge(Some(SplitMeta { version: 4, checksum }), &payload, 3, 1),
            SplitVerdict::Valid { version: 4 }
        );
    }
}
