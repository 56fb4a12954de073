//! Regions whose ranges get their slabs when the caller first needs them, and give them back
//! when it no longer does, as `Client::map_range` and `Client::release_range` do with
//! `ClientConfig::lazy_ranges` (the engine's side is `remem_client::engine`'s `lazy.rs`); and a
//! submit that refuses instead of queueing, as the poll driver's does. They let a front end's
//! engine (the kv's `Cache`) run over the simulator exactly as it runs over the poll driver.
//!
//! Invariant: the saved slab map follows every map and release, so a reopen finds what is
//! mapped; the engine counts every slab it is given (`Engine::count_mapped_slab`), so placement
//! sees the same loads as with the real client.

use remem_client::engine::RangePlacement;

use super::*;

/// Placements tried for one range when a node chosen for it does not map its slab (as
/// `Client::map_range`).
const MAP_TRIES: usize = 3;

impl SimDriver {
    /// Adds a region of `page_count` pages coded with `shape` with no range mapped yet: each
    /// range is mapped by [`SimDriver::map_range`].
    pub fn create_lazy_region(&mut self, shape: Shape, page_count: u64) -> Result<RegionInfo, String> {
        assert!(page_count > 0 && shape.extra_reads <= shape.parity_splits);
        let (_, pages_per_range) = self.range_geometry(shape)?;
        let range_count = page_count.div_ceil(pages_per_range) as usize;
        let first_range = self.engine.ranges().len();
        let unmapped = vec![Vec::new(); range_count];
        self.saved_ranges.extend(unmapped.iter().cloned());
        let info = self.engine.add_region(shape, page_count, pages_per_range, unmapped, true);
        self.saved_regions.push(SavedRegion { shape, page_count, pages_per_range, first_range, range_count });
        self.settle();
        Ok(info)
    }

    /// As [`SimDriver::create_lazy_region`] for a region without redundancy laid beside
    /// `beside` (each range, when mapped, on the node of split `split` of the range of `beside`
    /// holding the same pages), as `Client::create_region_beside` with lazy ranges.
    pub fn create_lazy_region_beside(
        &mut self,
        shape: Shape,
        page_count: u64,
        beside: &RegionInfo,
        split: usize,
    ) -> Result<RegionInfo, String> {
        if shape.total_splits() != 1 || split >= beside.shape.total_splits() || page_count > beside.page_count
        {
            return Err(format!(
                "no region of {page_count} pages {shape:?} fits beside split {split} of {beside:?}"
            ));
        }
        let region = self.create_lazy_region(shape, page_count)?;
        self.engine.set_region_beside(region.index, beside.index, split);
        Ok(region)
    }

    /// Maps range `range`, which has no slabs: k + r slabs where the placement policy says
    /// (away from the nodes the engine says to avoid), or the one slab of a range laid beside
    /// another on its pinned node, each a `MapSlab` round trip in simulated time. As the real
    /// client does, a node that does not map its slab is avoided and the range placed again,
    /// up to three placements. Nothing stays mapped on an error.
    pub fn map_range(&mut self, range: usize) -> Result<(), String> {
        assert!(!self.engine.range_mapped(range), "range {range} is mapped already");
        let shape = self.engine.shape_of_range(range);
        let split_bytes = self.engine.split_bytes_of_range(range);
        let mut placement = self.engine.placement_of_range(range).map_err(|error| error.to_string())?;
        let mut last_error = None;
        for _ in 0..MAP_TRIES {
            let nodes = match &placement {
                RangePlacement::Pinned(node) => vec![*node],
                RangePlacement::Avoiding(avoid) => {
                    let mut loads = self.member_loads(split_bytes);
                    for load in loads.iter_mut().filter(|load| avoid.contains(&load.node_index)) {
                        load.slabs_free = 0;
                    }
                    match self.engine.placement_mut().place(&loads, shape.total_splits()) {
                        Ok(placed) => placed.nodes,
                        Err(_) if last_error.is_some() => break,
                        Err(error) => return Err(format!("placement: {error}")),
                    }
                }
            };
            match self.map_slabs(range, &nodes) {
                Ok(slabs) => {
                    self.note(|| format!("range {range} mapped on {nodes:?}"));
                    self.saved_ranges[range].clone_from(&slabs);
                    self.engine.set_range_slabs(range, slabs);
                    self.settle();
                    return Ok(());
                }
                Err((_, error)) if matches!(placement, RangePlacement::Pinned(_)) => return Err(error),
                Err((node, error)) => {
                    if let RangePlacement::Avoiding(avoid) = &mut placement {
                        avoid.push(node);
                    }
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.expect("a try failed"))
    }

    /// One slab of `range` on each of `nodes`; on a failure the slabs mapped are given back and
    /// the node that failed is returned with the error.
    fn map_slabs(&mut self, range: usize, nodes: &[NodeId]) -> Result<Vec<SlabRef>, (NodeId, String)> {
        let split_bytes = self.engine.split_bytes_of_range(range);
        let pages_per_range = self.engine.pages_per_range_of(range);
        let first_page = self.engine.first_page_of_range(range);
        let mut slabs = Vec::with_capacity(nodes.len());
        for (split, &node) in nodes.iter().enumerate() {
            let message = Control::MapSlab {
                split_bytes: split_bytes as u32,
                split_index: split as u8,
                first_page,
                range_id: range as u64,
            };
            let slab_id = match self.control(node, &message) {
                Ok(Control::SlabMapped { slab_id, slots }) if u64::from(slots) == pages_per_range => slab_id,
                other => {
                    self.engine.release_unplaced_slabs(slabs, split_bytes);
                    self.settle();
                    return Err((node, format!("node {node} answered MapSlab with {other:?}")));
                }
            };
            self.engine.count_mapped_slab(node, split_bytes);
            slabs.push(SlabRef { node, slab_id });
        }
        Ok(slabs)
    }

    /// Gives range `range` back (its slabs unmapped in the background, its pages forgotten).
    /// False, with nothing done, while an op or a rebuild is on it.
    pub fn release_range(&mut self, range: usize) -> bool {
        if !self.engine.release_range(range) {
            return false;
        }
        self.note(|| format!("range {range} given back"));
        self.saved_ranges[range].clear();
        self.settle();
        true
    }

    /// The connected member nodes as placement sees them, for slabs of splits of `split_bytes`.
    fn member_loads(&self, split_bytes: usize) -> Vec<NodeLoad> {
        let members = self.engine.nodes().iter().enumerate().filter(|(index, node)| {
            node.connected
                && node.membership == remem_client::engine::Membership::Member
                && !self.removed[*index]
        });
        members
            .map(|(index, node)| NodeLoad {
                node_index: index,
                failure_domain: node.info.failure_domain.clone(),
                slabs_mapped: u64::from(node.info.slabs_mapped),
                slabs_free: node.info.free_bytes
                    / remem_client::engine::slab_footprint_bytes(node.info.slab_size_bytes, split_bytes),
            })
            .collect()
    }

    /// Starts op `op` now if the engine takes it (nothing queued before it, a slot free, no op
    /// on its page in flight) and returns its id; `None`, with nothing kept, if it does not.
    /// The poll driver's `submit` contract: the caller keeps the op and tries again later.
    /// A `Probe` (the bench's raw fan-out) is no page op: it panics.
    pub fn try_submit(&mut self, op: Submit<'_>) -> Option<u64> {
        if !self.queue.is_empty() {
            return None;
        }
        let (page, kind) = match op {
            Submit::Read { page } => (page, SimOpKind::Read),
            Submit::Write { page, .. } => (page, SimOpKind::Write),
            Submit::WriteData { page, .. } => (page, SimOpKind::WriteData),
            Submit::WriteParity { page, .. } => (page, SimOpKind::WriteParity),
            Submit::Probe { .. } => panic!("a probe is no page op: the simulated driver takes page ops only"),
        };
        let buffer = if kind == SimOpKind::Read { vec![0; self.config.page_bytes] } else { Vec::new() };
        let id = self.next_op_id;
        let entry = OpEntry { id, page, kind, write: None, buffer, submitted_at: self.now, started: true };
        let tag = self.hold_op(entry);
        let instant = self.instant();
        if !self.engine.submit(instant, tag, op, &mut OpTable(&mut self.ops)) {
            self.ops[tag] = None;
            self.free_tags.push(tag);
            return None;
        }
        self.next_op_id += 1;
        self.stats.ops_submitted += 1;
        self.collect_completions();
        self.settle();
        Some(id)
    }
}
