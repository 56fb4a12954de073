//! Simulated slab rebuilds (`Regenerate`), admitted by the node core and following
//! `crates/node/src/regenerate/` page by page, but reading the sources' slabs through the other
//! simulated nodes' cores (as the rebuild's client id) instead of over sockets. Each page ends in
//! the core's own last step, `remem_node::core::store_rebuilt_page`; the batch loop below is the
//! simulator's (the rebuild is not yet one step machine in the core).
//!
//! A rebuild runs in steps of `NetworkOptions::regeneration_batch_pages` slots, one step per
//! batch's worth of simulated time, so the client's writes, unmaps, evictions and faults land
//! between steps as they would land between the real node's `ReadSplits` batches. Per step:
//!
//! - slots all written by the client since the rebuild began are skipped without reading;
//! - otherwise the first k usable sources, data splits first, supply the batch; a source is
//!   usable while its node is alive, not stalled and not partitioned (nor is the rebuilding node),
//!   it still maps the slab for the same client id with the same split size, and the batch is
//!   inside it. A source that is not usable when needed has failed for the rest of the rebuild
//!   (the real node waits for a stalled source until its I/O timeout; the simulator fails it at
//!   once). With fewer than k sources left the rebuild ends and the remaining pages are lost;
//! - per page, every split is judged ([`judge_split`]) and the newest version with k votes
//!   ([`newest_with_k`]) wins, never a mix; a page the k batch sources do not settle is asked of
//!   every other usable source. Newest version 0 means the page was never written: it counts as
//!   skipped and nothing is stored. No version with k votes: the page is lost and its slot stays
//!   unwritten. Otherwise the core decodes the lost split (a data split) or re-encodes it (a
//!   parity), checksums it with the target's split index and stores it only if the slot is still
//!   unwritten.
//!
//! Invariant: a job holds its node's incarnation; a killed node's jobs are dropped by the cluster
//! and never report.

use crate::cluster::node::{AcceptedRegeneration, SimNode};
use crate::{NetworkOptions, SimTime};
use remem_codec::{new_codec, CodecParams, PageCodec};
use remem_node::core::{store_rebuilt_page, Admission, PageStored, Slab};
use remem_proto::{judge_split, max_read_splits_count, newest_with_k, SplitMeta};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Port of every simulated node's address.
pub(crate) const NODE_PORT: u16 = 7077;

/// The address node `index` is known by in `Regenerate` sources: 10.a.b.c:7077.
pub(crate) fn node_address(index: usize) -> SocketAddr {
    assert!(index < 1 << 24, "the simulated address space holds 2^24 nodes");
    let [_, a, b, c] = (index as u32).to_be_bytes();
    SocketAddr::new(IpAddr::from([10, a, b, c]), NODE_PORT)
}

/// The node index behind a simulated address, if it is one.
fn node_of_address(address: SocketAddr, node_count: usize) -> Option<usize> {
    let SocketAddr::V4(address) = address else {
        return None;
    };
    let [ten, a, b, c] = address.ip().octets();
    let index = u32::from_be_bytes([0, a, b, c]) as usize;
    (ten == 10 && address.port() == NODE_PORT && index < node_count).then_some(index)
}

struct JobSource {
    split_index: u8,
    slab_id: u32,
    /// `None` if the address names no simulated node: it fails when first asked.
    node: Option<usize>,
    failed: bool,
    /// The source's slab while the batch being rebuilt reads it.
    slab: Option<Arc<Slab>>,
}

/// One running rebuild.
pub(crate) struct Job {
    pub(crate) node: usize,
    pub(crate) incarnation: u64,
    pub(crate) connection: u64,
    pub(crate) request_id: u64,
    pub(crate) client_id: u64,
    pub(crate) slab_id: u32,
    /// The core's admission: the slab being rebuilt, the code, the sources; released when the
    /// rebuild ends (`SimCluster::finish_regeneration`).
    pub(crate) admission: Admission,
    params: CodecParams,
    pub(crate) pages: u32,
    /// Sorted by split index: data splits first.
    sources: Vec<JobSource>,
    pub(crate) next_slot: u32,
    pub(crate) rebuilt: u64,
    pub(crate) skipped: u64,
    pub(crate) lost: u64,
    pub(crate) started_at: SimTime,
}

impl Job {
    pub(crate) fn new(
        node: usize,
        incarnation: u64,
        accepted: AcceptedRegeneration,
        node_count: usize,
        now: SimTime,
    ) -> Job {
        let admission = accepted.admission;
        let mut sources: Vec<JobSource> = admission
            .sources
            .iter()
            .map(|source| JobSource {
                split_index: source.split_index,
                slab_id: source.slab_id,
                node: node_of_address(source.address, node_count),
                failed: false,
                slab: None,
            })
            .collect();
        sources.sort_by_key(|source| source.split_index);
        Job {
            node,
            incarnation,
            connection: accepted.connection,
            request_id: accepted.request_id,
            client_id: admission.client_id,
            slab_id: admission.slab_id,
            params: admission.params,
            pages: admission.pages,
            admission,
            sources,
            next_slot: 0,
            rebuilt: 0,
            skipped: 0,
            lost: 0,
            started_at: now,
        }
    }

    /// Simulated time of the next step: its batch's pages at the configured rate.
    pub(crate) fn next_step_duration(&self, options: &NetworkOptions) -> SimTime {
        u64::from(self.next_batch_pages(options)) * options.regeneration_ns_per_page
    }

    /// Pages of the next step: a batch, as large as one `ReadSplitsReply` of this split size may
    /// carry at most (the real node's batch), or what is left.
    fn next_batch_pages(&self, options: &NetworkOptions) -> u32 {
        let batch =
            options.regeneration_batch_pages.clamp(1, max_read_splits_count(self.split_bytes() as u32));
        batch.min(self.pages - self.next_slot)
    }

    fn split_bytes(&self) -> usize {
        self.params.split_bytes()
    }
}

/// Per-rebuild work buffers and codecs, kept by the cluster across rebuilds so that steps do not
/// allocate.
#[derive(Default)]
pub(crate) struct Scratch {
    codecs: Vec<Box<dyn PageCodec>>,
    page: Vec<u8>,
    parity: Vec<u8>,
    /// Positions (in the job's sources) of the sources supplying the current batch.
    active: Vec<usize>,
    /// (source position, version) of each split of the current page that is not corrupt.
    votes: Vec<(usize, u8)>,
    /// One source split, copied out of its slab.
    split: Vec<u8>,
}

impl Scratch {
    /// The codec for `params`, built the first time it is needed.
    fn codec_index(&mut self, params: CodecParams) -> usize {
        match self.codecs.iter().position(|codec| codec.params() == params) {
            Some(index) => index,
            None => {
                self.codecs.push(new_codec(params));
                self.codecs.len() - 1
            }
        }
    }
}

/// What one step left to do.
pub(crate) enum Step {
    /// More pages to go: run the next step then.
    Continue { at: SimTime },
    /// The rebuild ended (done, target gone, or too few sources); pages not handled count lost.
    Finished,
}

/// What one page came to.
enum PageOutcome {
    /// The slot was written by the client since the rebuild began, or the page was never written.
    Skipped,
    Lost,
    /// k splits of one version were found: what the core's last step of a page did with them.
    Stored(PageStored),
}

/// Runs one step of `job` at `now`; see the module documentation.
pub(crate) fn step(
    nodes: &mut [SimNode],
    scratch: &mut Scratch,
    job: &mut Job,
    options: &NetworkOptions,
    now: SimTime,
) -> Step {
    let target = Arc::clone(&job.admission.slab);
    // The real rebuild's check between batches: a slab unmapped or evicted is no longer filled.
    if target.is_detached() || job.next_slot >= job.pages {
        return Step::Finished;
    }
    let count = job.next_batch_pages(options);
    let first_slot = job.next_slot;
    let all_written = (first_slot..first_slot + count).all(|slot| target.meta(slot).version != 0);
    if all_written {
        job.skipped += u64::from(count);
    } else {
        choose_active(nodes, scratch, job, first_slot, count, now);
        if scratch.active.len() < job.params.data_splits {
            return Step::Finished;
        }
        let codec = scratch.codec_index(job.params);
        scratch.page.resize(job.params.page_bytes, 0);
        scratch.parity.resize(job.params.parity_bytes(), 0);
        scratch.split.resize(job.split_bytes(), 0);
        for slot in first_slot..first_slot + count {
            match rebuild_page(nodes, scratch, codec, job, slot, now) {
                PageOutcome::Skipped => job.skipped += 1,
                PageOutcome::Lost => job.lost += 1,
                PageOutcome::Stored(PageStored::Rebuilt) => job.rebuilt += 1,
                PageOutcome::Stored(PageStored::WrittenMeanwhile) => job.skipped += 1,
                PageOutcome::Stored(PageStored::Lost) => job.lost += 1,
            }
        }
    }
    for source in &mut job.sources {
        source.slab = None;
    }
    job.next_slot += count;
    nodes[job.node].core.rebuilds.add_done(u64::from(count));
    if job.next_slot >= job.pages {
        Step::Finished
    } else {
        Step::Continue { at: now + job.next_step_duration(options) }
    }
}

/// Source `position`'s slab if it can serve slots `first_slot..first_slot + count` now: read as
/// the rebuild's client id, as the real rebuild's `ReadSplits` are.
fn usable(
    nodes: &[SimNode],
    job: &Job,
    position: usize,
    first_slot: u32,
    count: u32,
    now: SimTime,
) -> Option<Arc<Slab>> {
    let source = &job.sources[position];
    let index = source.node?;
    let (rebuilder, node) = (&nodes[job.node], &nodes[index]);
    if rebuilder.is_partitioned(now) || !node.alive || node.is_stalled(now) || node.is_partitioned(now) {
        return None;
    }
    let slab = node.core.table.get(job.client_id, source.slab_id).ok()?;
    (slab.split_bytes() as usize == job.split_bytes()
        && u64::from(first_slot) + u64::from(count) <= u64::from(slab.slots()))
    .then_some(slab)
}

/// The first k sources that have not failed and can serve the batch, in split-index order;
/// sources found unusable on the way are failed for good.
fn choose_active(
    nodes: &[SimNode],
    scratch: &mut Scratch,
    job: &mut Job,
    first_slot: u32,
    count: u32,
    now: SimTime,
) {
    scratch.active.clear();
    for position in 0..job.sources.len() {
        if scratch.active.len() == job.params.data_splits {
            break;
        }
        if job.sources[position].failed {
            continue;
        }
        match usable(nodes, job, position, first_slot, count, now) {
            Some(slab) => {
                job.sources[position].slab = Some(slab);
                scratch.active.push(position);
            }
            None => job.sources[position].failed = true,
        }
    }
}

/// Source `position`'s stored split of `slot`, copied into `split`; the source was checked
/// usable for this batch.
fn source_split(job: &Job, position: usize, slot: u32, split: &mut [u8]) -> SplitMeta {
    job.sources[position].slab.as_ref().expect("usable sources hold their slab").read(slot, split)
}

fn rebuild_page(
    nodes: &[SimNode],
    scratch: &mut Scratch,
    codec: usize,
    job: &mut Job,
    slot: u32,
    now: SimTime,
) -> PageOutcome {
    let k = job.params.data_splits;
    let target = &job.admission.slab;
    if target.meta(slot).version != 0 {
        return PageOutcome::Skipped;
    }
    let page_number = target.label().first_page + u64::from(slot);
    scratch.votes.clear();
    for &position in &scratch.active {
        let meta = source_split(job, position, slot, &mut scratch.split);
        if let Some(version) =
            judge_split(&scratch.split, meta, page_number, job.sources[position].split_index).version()
        {
            scratch.votes.push((position, version));
        }
    }
    let mut version = newest_with_k(scratch.votes.iter().map(|(_, version)| *version), k);
    if version.is_none() {
        // The batch does not settle this page: ask every other source for this one slot.
        for position in 0..job.sources.len() {
            if scratch.active.contains(&position) || job.sources[position].failed {
                continue;
            }
            let Some(slab) = usable(nodes, job, position, slot, 1, now) else {
                job.sources[position].failed = true;
                continue;
            };
            job.sources[position].slab = Some(slab);
            let meta = source_split(job, position, slot, &mut scratch.split);
            let split_index = job.sources[position].split_index;
            if let Some(version) = judge_split(&scratch.split, meta, page_number, split_index).version() {
                scratch.votes.push((position, version));
            }
        }
        version = newest_with_k(scratch.votes.iter().map(|(_, version)| *version), k);
    }
    let version = match version {
        None => return PageOutcome::Lost,
        Some(0) => return PageOutcome::Skipped,
        Some(version) => version,
    };
    let split_bytes = job.split_bytes();
    let mut present = 0u32;
    for &(position, vote) in &scratch.votes {
        if vote != version {
            continue;
        }
        let split_index = usize::from(job.sources[position].split_index);
        let buffer = remem_codec::split_buffer_mut(
            &mut scratch.page,
            &mut scratch.parity,
            k,
            split_bytes,
            split_index,
        );
        source_split(job, position, slot, buffer);
        present |= 1 << split_index;
    }
    let codec = scratch.codecs[codec].as_mut();
    let stored = store_rebuilt_page(
        codec,
        &mut scratch.page,
        &mut scratch.parity,
        present,
        &job.admission,
        slot,
        page_number,
        version,
    );
    PageOutcome::Stored(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_map_back_to_their_nodes_and_nothing_else() {
        for index in [0, 1, 255, 256, 70_000] {
            assert_eq!(node_of_address(node_address(index), 70_001), Some(index));
        }
        assert_eq!(node_of_address(node_address(5), 5), None, "beyond the cluster");
        assert_eq!(node_of_address("10.0.0.1:7078".parse().unwrap(), 5), None, "wrong port");
        assert_eq!(node_of_address("11.0.0.1:7077".parse().unwrap(), 5), None, "wrong network");
        assert_eq!(node_of_address("[::1]:7077".parse().unwrap(), 5), None);
    }
}
