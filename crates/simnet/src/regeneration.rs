//! Simulated slab rebuilds (`Regenerate`), following `crates/node/src/regenerate/` page by page
//! but reading the sources' slabs straight from the other simulated nodes instead of over sockets.
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
//!   unwritten. Otherwise the lost split is decoded (a data split) or re-encoded (a parity),
//!   checksummed with the target's split index and stored only if the slot is still unwritten.
//!
//! Invariant: a job holds its node's incarnation; a killed node's jobs are dropped by the cluster
//! and never report.

use crate::node::{AcceptedRegeneration, SimNode};
use crate::{NetworkOptions, SimTime};
use remem_codec::{new_codec, CodecParams, PageCodec};
use remem_proto::{judge_split, max_read_splits_count, newest_with_k, split_checksum, SplitMeta};
use std::net::{IpAddr, SocketAddr};

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
}

/// One running rebuild.
pub(crate) struct Job {
    pub(crate) node: usize,
    pub(crate) incarnation: u64,
    pub(crate) connection: u64,
    pub(crate) request_id: u64,
    pub(crate) client_id: u64,
    pub(crate) slab_id: u32,
    params: CodecParams,
    target_split: u8,
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
        let mut sources: Vec<JobSource> = accepted
            .sources
            .iter()
            .map(|source| JobSource {
                split_index: source.split_index,
                slab_id: source.slab_id,
                node: node_of_address(source.address, node_count),
                failed: false,
            })
            .collect();
        sources.sort_by_key(|source| source.split_index);
        Job {
            node,
            incarnation,
            connection: accepted.connection,
            request_id: accepted.request_id,
            client_id: accepted.client_id,
            slab_id: accepted.slab_id,
            params: accepted.params,
            target_split: accepted.target_split,
            pages: accepted.pages,
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
    /// The rebuilt split is in the scratch page (data) or parity buffer at this byte range.
    Rebuilt {
        meta: SplitMeta,
        in_parity: bool,
        at: usize,
    },
}

/// Runs one step of `job` at `now`; see the module documentation.
pub(crate) fn step(
    nodes: &mut [SimNode],
    scratch: &mut Scratch,
    job: &mut Job,
    options: &NetworkOptions,
    now: SimTime,
) -> Step {
    let target_present = nodes[job.node]
        .slabs
        .get(&job.slab_id)
        .is_some_and(|slab| slab.owner_client_id == job.client_id && slab.regenerating);
    if !target_present || job.next_slot >= job.pages {
        return Step::Finished;
    }
    let count = job.next_batch_pages(options);
    let first_slot = job.next_slot;
    let all_written = {
        let slab = &nodes[job.node].slabs[&job.slab_id];
        (first_slot..first_slot + count).all(|slot| slab.meta(slot).version != 0)
    };
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
        for slot in first_slot..first_slot + count {
            match rebuild_page(nodes, scratch, codec, job, slot, now) {
                PageOutcome::Skipped => job.skipped += 1,
                PageOutcome::Lost => job.lost += 1,
                PageOutcome::Rebuilt { meta, in_parity, at } => {
                    let buffer = if in_parity { &scratch.parity } else { &scratch.page };
                    let split = &buffer[at..at + job.split_bytes()];
                    let slab =
                        nodes[job.node].slabs.get_mut(&job.slab_id).expect("checked at the step's start");
                    if slab.store_if_unwritten(slot, split, meta) {
                        job.rebuilt += 1;
                    } else {
                        job.skipped += 1;
                    }
                }
            }
        }
    }
    job.next_slot += count;
    nodes[job.node].regeneration_pages_done += u64::from(count);
    if job.next_slot >= job.pages {
        Step::Finished
    } else {
        Step::Continue { at: now + job.next_step_duration(options) }
    }
}

/// Whether source `position` of `job` can serve slots `first_slot..first_slot + count` now.
fn usable(nodes: &[SimNode], job: &Job, position: usize, first_slot: u32, count: u32, now: SimTime) -> bool {
    let source = &job.sources[position];
    let Some(index) = source.node else {
        return false;
    };
    let (rebuilder, node) = (&nodes[job.node], &nodes[index]);
    !rebuilder.is_partitioned(now)
        && node.alive
        && !node.is_stalled(now)
        && !node.is_partitioned(now)
        && node.slabs.get(&source.slab_id).is_some_and(|slab| {
            slab.owner_client_id == job.client_id
                && slab.split_bytes as usize == job.split_bytes()
                && u64::from(first_slot) + u64::from(count) <= u64::from(slab.slots)
        })
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
        if usable(nodes, job, position, first_slot, count, now) {
            scratch.active.push(position);
        } else {
            job.sources[position].failed = true;
        }
    }
}

/// Source `position`'s stored split of `slot`; the source was checked usable.
fn source_split<'a>(nodes: &'a [SimNode], job: &Job, position: usize, slot: u32) -> (SplitMeta, &'a [u8]) {
    let source = &job.sources[position];
    let node = source.node.expect("usable sources name a node");
    let slab = &nodes[node].slabs[&source.slab_id];
    (slab.meta(slot), slab.payload(slot))
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
    if nodes[job.node].slabs[&job.slab_id].meta(slot).version != 0 {
        return PageOutcome::Skipped;
    }
    let page_number = nodes[job.node].slabs[&job.slab_id].first_page + u64::from(slot);
    scratch.votes.clear();
    for &position in &scratch.active {
        let (meta, payload) = source_split(nodes, job, position, slot);
        if let Some(version) =
            judge_split(payload, meta, page_number, job.sources[position].split_index).version()
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
            if !usable(nodes, job, position, slot, 1, now) {
                job.sources[position].failed = true;
                continue;
            }
            let (meta, payload) = source_split(nodes, job, position, slot);
            let split_index = job.sources[position].split_index;
            if let Some(version) = judge_split(payload, meta, page_number, split_index).version() {
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
        let (_, payload) = source_split(nodes, job, position, slot);
        remem_codec::split_buffer_mut(&mut scratch.page, &mut scratch.parity, k, split_bytes, split_index)
            .copy_from_slice(payload);
        present |= 1 << split_index;
    }
    let codec = &mut scratch.codecs[codec];
    if codec.decode(&mut scratch.page, &scratch.parity, present).is_err() {
        // k votes for one version were counted above, so only a bug gets here; lose the page.
        debug_assert!(false, "decode failed with k valid splits");
        return PageOutcome::Lost;
    }
    let target = usize::from(job.target_split);
    let (in_parity, at) = if target < k {
        (false, target * split_bytes)
    } else {
        codec.encode(&scratch.page, &mut scratch.parity);
        (true, (target - k) * split_bytes)
    };
    let buffer = if in_parity { &scratch.parity } else { &scratch.page };
    let checksum = split_checksum(&buffer[at..at + split_bytes], version, page_number, job.target_split);
    PageOutcome::Rebuilt { meta: SplitMeta { version, checksum }, in_parity, at }
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
