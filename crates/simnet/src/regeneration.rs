//! Simulated slab rebuilds (`Regenerate`): the node core admits them and its rebuild machine
//! (`remem_node::core::RebuildSteps`, the one the threaded node drives over sockets) makes every
//! decision; this shell answers what the machine wants by reading the sources' slabs through the
//! other simulated nodes' cores (as the rebuild's client id) instead of over sockets, and gives
//! the rebuild its simulated time.
//!
//! A rebuild runs in steps of one batch of `NetworkOptions::regeneration_batch_pages` slots (as
//! large as one `ReadSplitsReply` of its split size may carry at most, the real node's batch), one
//! step per batch's worth of simulated time, so the client's writes, unmaps, evictions and faults
//! land between steps as they would land between the real node's `ReadSplits` batches. A batch
//! whose slots the client all wrote since the rebuild began takes its step too, unread.
//!
//! A source answers while its node is alive, not stalled and not partitioned (nor is the
//! rebuilding node), it still maps the slab for the same client id with the same split size, and
//! the slots asked are inside it; otherwise it has failed for the rest of the rebuild (the real
//! node waits for a stalled source until its I/O timeout; the simulator fails it at once). A
//! stalled rebuilding node takes its next step when the stall ends.
//!
//! Invariant: a job holds its node's incarnation; a killed node's jobs are dropped by the cluster
//! and never report.

use crate::cluster::node::{AcceptedRegeneration, SimNode};
use crate::{NetworkOptions, SimTime};
use remem_node::core::{RebuildOutcome, RebuildSteps, Slab, SourceSet, Want};
use remem_proto::max_read_splits_count;
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

/// One running rebuild.
pub(crate) struct Job {
    pub(crate) node: usize,
    pub(crate) incarnation: u64,
    pub(crate) connection: u64,
    pub(crate) request_id: u64,
    /// The rebuild's decisions and the core's admission (the slab being rebuilt, the code, the
    /// sources), released when the rebuild ends (`SimCluster::finish_regeneration`).
    pub(crate) steps: RebuildSteps,
    /// The node of each source, in the machine's order; `None` if the address names no
    /// simulated node (it fails when first asked).
    source_nodes: Vec<Option<usize>>,
    /// Each source's slab while the batch being rebuilt reads it.
    source_slabs: Vec<Option<Arc<Slab>>>,
    /// Pages added to the node's rebuild progress.
    pub(crate) pages_counted: u64,
    pub(crate) started_at: SimTime,
}

impl Job {
    pub(crate) fn new(
        node: usize,
        incarnation: u64,
        accepted: AcceptedRegeneration,
        node_count: usize,
        options: &NetworkOptions,
        now: SimTime,
    ) -> Job {
        let split_bytes = accepted.admission.params.split_bytes() as u32;
        let batch_slots = options.regeneration_batch_pages.clamp(1, max_read_splits_count(split_bytes));
        let steps = RebuildSteps::new(accepted.admission, batch_slots);
        let source_nodes =
            steps.sources().iter().map(|source| node_of_address(source.address, node_count)).collect();
        Job {
            node,
            incarnation,
            connection: accepted.connection,
            request_id: accepted.request_id,
            source_slabs: vec![None; steps.sources().len()],
            steps,
            source_nodes,
            pages_counted: 0,
            started_at: now,
        }
    }

    /// Simulated time of the next step: its batch's pages at the configured rate.
    pub(crate) fn next_step_duration(&self, options: &NetworkOptions) -> SimTime {
        u64::from(self.steps.next_batch_pages()) * options.regeneration_ns_per_page
    }

    /// Adds the pages the machine handled since last time to the node's rebuild progress.
    fn count_progress(&mut self, nodes: &[SimNode]) {
        let pages = self.steps.take_progress();
        self.pages_counted += pages;
        nodes[self.node].core.rebuilds.add_done(pages);
    }
}

/// One source split, copied out of its slab; kept by the cluster across rebuilds so that steps
/// do not allocate.
#[derive(Default)]
pub(crate) struct Scratch {
    split: Vec<u8>,
}

/// What one step left to do.
pub(crate) enum Step {
    /// More pages to go: run the next step then.
    Continue { at: SimTime },
    /// The rebuild ended (done, target gone, or too few sources).
    Finished(RebuildOutcome),
}

/// Runs one step of `job` at `now`: begins the next batch and answers what the machine wants
/// until it names the batch after it (or ends).
pub(crate) fn step(
    nodes: &[SimNode],
    scratch: &mut Scratch,
    job: &mut Job,
    options: &NetworkOptions,
    now: SimTime,
) -> Step {
    let mut begun = false;
    scratch.split.resize(job.steps.admission().params.split_bytes(), 0);
    loop {
        match job.steps.wants() {
            Want::NextBatch { .. } if begun => {
                job.count_progress(nodes);
                job.source_slabs.fill(None);
                return Step::Continue { at: now + job.next_step_duration(options) };
            }
            Want::NextBatch { .. } => {
                begun = true;
                job.steps.begin_batch();
            }
            Want::Batch { first_slot, count, sources } => {
                for position in sources.iter() {
                    match usable(nodes, job, position, first_slot, count, now) {
                        Some(slab) => {
                            job.source_slabs[position] = Some(slab);
                            job.steps.batch_read(position);
                        }
                        None => job.steps.source_failed(position),
                    }
                }
            }
            Want::Page { slot, sources, .. } => {
                for position in sources.iter() {
                    let slab = job.source_slabs[position].as_ref().expect("batch sources hold their slab");
                    let meta = slab.read(slot, &mut scratch.split);
                    job.steps.offer_split(position, Some(meta), &scratch.split, None);
                }
            }
            Want::Single { slot, sources } => read_single(nodes, scratch, job, sources, slot, now),
            Want::Done(outcome) => {
                job.count_progress(nodes);
                job.source_slabs.fill(None);
                return Step::Finished(outcome);
            }
        }
    }
}

/// Slot `slot` alone from each source in `asked`, as the real node's `ReadSplit`.
fn read_single(
    nodes: &[SimNode],
    scratch: &mut Scratch,
    job: &mut Job,
    asked: SourceSet,
    slot: u32,
    now: SimTime,
) {
    for position in asked.iter() {
        match usable(nodes, job, position, slot, 1, now) {
            Some(slab) => {
                let meta = slab.read(slot, &mut scratch.split);
                job.steps.offer_split(position, Some(meta), &scratch.split, None);
            }
            None => job.steps.source_failed(position),
        }
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
    let index = job.source_nodes[position]?;
    let (rebuilder, node) = (&nodes[job.node], &nodes[index]);
    if rebuilder.is_partitioned(now) || !node.alive || node.is_stalled(now) || node.is_partitioned(now) {
        return None;
    }
    let admission = job.steps.admission();
    let slab = node.core.table.get(admission.client_id, job.steps.sources()[position].slab_id).ok()?;
    (slab.split_bytes() as usize == admission.params.split_bytes()
        && u64::from(first_slot) + u64::from(count) <= u64::from(slab.slots()))
    .then_some(slab)
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
