//! Background slab regeneration (seed 000 §4.2, "Background Slab Regeneration"), done on the node
//! that holds the new, empty slab: the threaded shell around the core's rebuild machine
//! (`core::RebuildSteps`, which owns every decision: which sources to read, how each split is
//! judged, each page's version, what is stored, what is counted).
//!
//! A client that lost a slab maps a new one here and sends `Regenerate` naming the surviving
//! splits of the range. The node answers `Ok` at once and a rebuild thread then drives the
//! machine: between batches it checks that the node is not stopping and that the requester is
//! still connected; it reads each batch the machine wants (`ReadSplits`) from the sources it
//! names, each asked a few batches ahead so they serve the next ones while this one is decoded,
//! and checksums each batch as it arrives (`sources`); it offers each page's splits from those
//! replies, and reads single slots (`ReadSplit`) from the other sources for pages the batch does
//! not settle. When the machine is done it sends `RegenerationDone` on the requesting connection.
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
//! stale splits. Any of the first four is a failed source for the machine (which replaces it, and
//! ends the rebuild with the rest lost when fewer than k are left); corrupt, torn and stale
//! splits are the machine's to judge.
//!
//! Invariant: at most `MAX_CONCURRENT_REGENERATIONS` rebuilds run at once (the core admits them), one thread each; the
//! node stops them (and joins them) before it unmaps its slabs. A rebuild holds its place only
//! while someone waits for it: it ends (and frees the place) when the node stops, its slab is
//! unmapped, or the connection that asked for it closes, checked between batches; every read of
//! a source has a deadline (`sources`), so a stalled source holds a batch for that long at most.
//! The shell allocates nothing per page: the batch replies are read into each source's buffer,
//! and a page's splits are offered to the machine straight from there.

mod sources;

pub use sources::{read_floor, FloorSource, PIPELINE_DEPTH};

use crate::core::{Admission, RebuildEnd, RebuildOutcome, RebuildSteps, Session, SourceSet, Want};
use crate::shared::Shared;
use remem_proto::{max_read_splits_count, Control, SPLIT_META_BYTES};
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
    /// The rebuild's decisions, and the core's admission it owns.
    steps: RebuildSteps,
    pages_done: u64,
}

impl Job {
    fn claim(&self) -> Claim<'_> {
        Claim {
            secret: &self.shared.secret,
            client_id: self.session.client_id,
            session: self.session.session,
            encrypt: self.shared.encrypt,
        }
    }

    /// Adds the pages the machine handled since last time to the node's progress.
    fn count_progress(&mut self) {
        let pages = self.steps.take_progress();
        self.pages_done += pages;
        self.shared.core.rebuilds.add_done(pages);
    }

    /// Why the shell gives the rebuild up before its next batch, if it does.
    fn reason_to_stop(&self) -> Option<&'static str> {
        if self.shared.stopping.load(Ordering::Relaxed) {
            return Some("the node is stopping");
        }
        // The requester gave up on this rebuild (it drops a connection only when it declares the
        // node failed, and then starts the rebuild over elsewhere): nobody would hear the
        // report, and the place among the running rebuilds is wanted.
        self.shared
            .peers
            .get(self.session.connection)
            .is_none()
            .then_some("the requesting connection is gone")
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.shared.regenerations.forget_streams(self.id);
        self.shared.core.rebuilds.release(self.steps.admission(), self.pages_done);
    }
}

/// Runs the rebuild on its own thread; it reports `RegenerationDone` when it ends.
pub fn spawn(shared: &Arc<Shared>, session: &Session, request_id: u64, admission: Admission) {
    let slab_id = admission.slab_id;
    let batch_slots = max_read_splits_count(admission.params.split_bytes() as u32);
    let job = Job {
        shared: Arc::clone(shared),
        id: shared.regenerations.next_job.fetch_add(1, Ordering::Relaxed),
        session: *session,
        request_id,
        steps: RebuildSteps::new(admission, batch_slots),
        pages_done: 0,
    };
    let spawned = std::thread::Builder::new().name(format!("remem-regen-{slab_id}")).spawn(move || {
        let mut job = job;
        let report = rebuild(&mut job);
        // The slab is an ordinary one again before its owner hears so: an `ExportSlab` sent on
        // `RegenerationDone` must not find it still rebuilding. (Drop clears it too, on every
        // other way out.)
        job.steps.admission().slab.set_regenerating(false);
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
            slab_id = report.slab_id,
            "the requesting connection is gone; RegenerationDone not delivered"
        );
    }
}

fn rebuild(job: &mut Job) -> RegenerationReport {
    let started = Instant::now();
    let admission = job.steps.admission();
    tracing::info!(
        client_id = admission.client_id,
        slab_id = admission.slab_id,
        split_index = admission.target_split,
        data_splits = admission.params.data_splits,
        parity_splits = admission.params.parity_splits,
        pages = admission.pages,
        sources = admission.sources.len(),
        "regeneration started"
    );
    let (slab_id, split_bytes) = (admission.slab_id, admission.params.split_bytes() as u32);
    // In the machine's order (data splits first): its positions are indices here.
    let mut sources: Vec<Source> = job
        .steps
        .sources()
        .iter()
        .map(|source| Source::new(source.split_index, source.slab_id, source.address))
        .collect();
    let mut single_body = Vec::new();
    let outcome = loop {
        match job.steps.wants() {
            Want::NextBatch { .. } => {
                job.count_progress();
                match job.reason_to_stop() {
                    Some(why) => {
                        tracing::warn!(slab_id, why, "regeneration abandoned");
                        job.steps.abandon();
                    }
                    None => job.steps.begin_batch(),
                }
            }
            Want::Batch { first_slot, sources: asked, .. } => {
                let (batch, end) = (job.steps.batch_slots(), job.steps.pages());
                let span = Batch { first_slot, batch, end, split_bytes };
                let on_connect =
                    |stream: &TcpStream| job.shared.regenerations.register_stream(job.id, stream);
                fetch_batch(&job.claim(), &on_connect, &mut sources, asked.iter(), span, true);
                for position in asked.iter() {
                    if sources[position].holds(first_slot) {
                        job.steps.batch_read(position);
                    } else {
                        job.steps.source_failed(position);
                    }
                }
            }
            Want::Page { index, sources: asked, .. } => {
                // The batch's splits of this page, checksummed when their batch was read
                // (`Source::checksum_entries`).
                for position in asked.iter() {
                    let source = &sources[position];
                    let (meta, payload) = source.entry(index as usize, split_bytes as usize);
                    job.steps.offer_split(position, meta, payload, Some(source.crc(index as usize)));
                }
            }
            Want::Single { slot, sources: asked } => {
                read_single(job, &mut sources, asked, slot, &mut single_body)
            }
            Want::Done(outcome) => break outcome,
        }
    };
    job.count_progress();
    if outcome.end == RebuildEnd::TooFewSources {
        tracing::error!(
            slab_id,
            sources_failed = outcome.sources_failed,
            "regeneration: fewer than k sources left"
        );
    }
    finished(job, &outcome, started)
}

/// Reads slot `slot` alone (`ReadSplit`) from each source in `asked` (none of which holds a
/// batch) and offers it to the machine, or fails the source.
fn read_single(job: &mut Job, sources: &mut [Source], asked: SourceSet, slot: u32, body: &mut Vec<u8>) {
    let split_bytes = job.steps.admission().params.split_bytes() as u32;
    for position in asked.iter() {
        let source = &mut sources[position];
        let on_connect = |stream: &TcpStream| job.shared.regenerations.register_stream(job.id, stream);
        let fetched =
            source.connect(&job.claim(), &on_connect).and_then(|()| source.read_one(slot, split_bytes, body));
        match fetched {
            Ok(meta) => job.steps.offer_split(position, meta, &body[SPLIT_META_BYTES..], None),
            Err(error) => {
                source.fail(&error);
                job.steps.source_failed(position);
            }
        }
    }
}

/// The report of a rebuild that ended with `outcome`, logged.
fn finished(job: &Job, outcome: &RebuildOutcome, started: Instant) -> RegenerationReport {
    let admission = job.steps.admission();
    let report = RegenerationReport {
        slab_id: admission.slab_id,
        pages_rebuilt: outcome.pages_rebuilt,
        pages_skipped: outcome.pages_skipped,
        pages_lost: outcome.pages_lost,
        slab_bytes: u64::from(admission.pages) * admission.params.split_bytes() as u64,
        elapsed: started.elapsed(),
    };
    tracing::info!(
        slab_id = report.slab_id,
        pages_rebuilt = report.pages_rebuilt,
        pages_skipped = report.pages_skipped,
        pages_lost = report.pages_lost,
        sources_failed = outcome.sources_failed,
        end = ?outcome.end,
        seconds = report.elapsed.as_secs_f64(),
        mib_per_second = report.slab_mib_per_second(),
        "regeneration finished"
    );
    report
}
