//! Ranges mapped when the front end first needs them and given back when it no longer does
//! ([`super::ClientConfig::lazy_ranges`]; the engine's side is `engine/lazy.rs`). Both run while
//! ops are in flight: mapping runs the client's loop with the caller's buffers until the nodes
//! answer, and ops that complete meanwhile wait for the caller as after any turn of the loop.

use remem_placement::PlacementError;

use super::regions::RangeGeometry;
use super::Client;
use crate::engine::{NodeId, OpBuffers, RangePlacement, SlabRef};
use crate::error::ConnectError;

/// Placements tried for one range when a node chosen for it does not map its slab.
const MAP_TRIES: usize = 3;

impl Client {
    /// Maps range `range`, which has no slabs: k+r slabs where the placement policy says (for
    /// a region laid beside another, its one slab on the node that rule names), each a control
    /// round trip, then exported as shared memory where the client uses it. Pages of the range
    /// are new: never written. `buffers` are those of the ops in flight.
    ///
    /// A node that does not map its slab (down and not declared failed yet, or out of room) is
    /// avoided and the range placed again, up to [`MAP_TRIES`] placements.
    ///
    /// Errors: [`ConnectError::NodeMemory`] when too few nodes have a free slab,
    /// [`ConnectError::Beside`] when the range's pinned node is not available, the last mapping
    /// error; nothing stays mapped then.
    pub fn map_range(&mut self, range: usize, buffers: &mut dyn OpBuffers) -> Result<(), ConnectError> {
        assert!(!self.engine.range_mapped(range), "range {range} is mapped already");
        let shape = self.engine.shape_of_range(range);
        let split_bytes = self.engine.split_bytes_of_range(range);
        let pages_per_range = self.engine.pages_per_range_of(range);
        let first_page = self.engine.first_page_of_range(range);
        let geometry =
            RangeGeometry { shape, split_bytes, pages_per_range, first_page, first_range: range as u64 };
        let mut placement = self.engine.placement_of_range(range)?;
        // Nodes that did not map their slab (down and not declared failed yet, or out of room)
        // join those the next placement avoids, a few times, before the range is refused.
        let mut last_error = None;
        for _ in 0..MAP_TRIES {
            let nodes = match &placement {
                RangePlacement::Pinned(node) => vec![*node],
                RangePlacement::Avoiding(avoid) => {
                    let (mut loads, free_bytes) = self.member_loads(split_bytes);
                    for load in loads.iter_mut().filter(|load| avoid.contains(&load.node_index)) {
                        load.slabs_free = 0;
                    }
                    match self.place_range(&mut loads, shape, range as u64) {
                        // Nodes refused meanwhile: their error says more than the memory left.
                        Err(_) if last_error.is_some() => break,
                        Err(ConnectError::Placement(placement @ PlacementError::NotEnoughNodes { .. })) => {
                            let bytes = pages_per_range * self.config.page_bytes as u64;
                            let room = (free_bytes, loads.len());
                            return Err(self.node_memory_error(shape, bytes, room, Some(placement)));
                        }
                        other => other?,
                    }
                }
            };
            match self.map_slabs(&geometry, &nodes, range, buffers) {
                Ok(slabs) => {
                    self.engine.set_range_slabs(range, slabs);
                    if self.config.shared_memory {
                        let wanted = (0..nodes.len()).map(|split| (range, split));
                        let wanted =
                            wanted.filter(|&(_, split)| self.transport.is_unix(nodes[split])).collect();
                        self.export(wanted, buffers);
                    }
                    return Ok(());
                }
                Err((_, error)) if matches!(placement, RangePlacement::Pinned(_)) => return Err(error),
                Err((node, error)) => {
                    tracing::debug!(range, node, %error, "a node did not map its slab: placing the range again");
                    if let RangePlacement::Avoiding(avoid) = &mut placement {
                        avoid.push(node);
                    }
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.expect("a try failed"))
    }

    /// Maps one slab of `range` on each of `nodes` (split i on `nodes[i]`). On a failure the
    /// slabs mapped are given back, and the node that failed is returned with its error.
    fn map_slabs(
        &mut self,
        geometry: &RangeGeometry,
        nodes: &[NodeId],
        range: usize,
        buffers: &mut dyn OpBuffers,
    ) -> Result<Vec<SlabRef>, (NodeId, ConnectError)> {
        let mut slabs = Vec::with_capacity(nodes.len());
        for (split, &node) in nodes.iter().enumerate() {
            match self.map_slab(geometry, (node, split), (geometry.first_page, range as u64), buffers) {
                Ok(slab_id) => slabs.push(SlabRef { node, slab_id }),
                Err(error) => {
                    self.engine.release_unplaced_slabs(slabs, geometry.split_bytes);
                    return Err((node, error));
                }
            }
        }
        Ok(slabs)
    }

    /// Gives range `range` back: its slabs are unmapped (the requests leave with the next
    /// frames sent) and its pages forgotten. False, with nothing done, while an op or a rebuild
    /// is on it: try again later. The caller must not read or write its pages until it maps it
    /// again.
    pub fn release_range(&mut self, range: usize) -> bool {
        self.engine.release_range(range)
    }

    /// Ranges that have their slabs, of every region.
    pub fn mapped_range_count(&self) -> usize {
        (0..self.engine.ranges().len()).filter(|&range| self.engine.range_mapped(range)).count()
    }

    /// Node memory this client's slabs take now (each slab and its metadata, as placement
    /// counts it): what a front end with lazy ranges holds for what it stores.
    pub fn mapped_node_bytes(&self) -> u64 {
        let slab_size = self.engine.nodes().iter().map(|node| node.info.slab_size_bytes).max().unwrap_or(0);
        (0..self.engine.ranges().len())
            .map(|range| {
                let slabs = self.engine.ranges()[range].slabs.len() as u64;
                slabs
                    * crate::engine::slab_footprint_bytes(slab_size, self.engine.split_bytes_of_range(range))
            })
            .sum()
    }
}
