//! Regions of the blocking driver: mapping a new region's slabs (a control round trip per slab,
//! between batches), where the placement policy says or pinned beside another region, and
//! questions about where pages live.

use std::net::SocketAddr;

use remem_codec::CodecParams;
use remem_placement::{NodeLoad, PlacementError};
use remem_proto::Control;

use super::{connect, Client};
use crate::core::Shape;
use crate::engine::{BesideError, NoBuffers, NodeId, OpBuffers, RegionInfo, SlabRef};
use crate::error::{ConnectError, NodeMemoryNeed};

/// The node memory a region of `bytes` coded with `shape` takes on nodes with slabs of
/// `slab_size_bytes`, for pages of `page_bytes`: k+r slabs per range of whole pages, each slab
/// with the metadata the node keeps beside it, as the client's placement counts it. Zero for a
/// shape the codec refuses.
pub fn region_node_bytes(shape: Shape, bytes: u64, slab_size_bytes: u64, page_bytes: usize) -> u64 {
    let Ok(params) = CodecParams::new(shape.data_splits, shape.parity_splits, page_bytes) else { return 0 };
    let split_bytes = params.split_bytes();
    let pages_per_range = (slab_size_bytes / split_bytes as u64).max(1);
    let ranges = (bytes / page_bytes as u64).div_ceil(pages_per_range);
    let slab_bytes = crate::engine::slab_footprint_bytes(pages_per_range * split_bytes as u64, split_bytes);
    ranges.saturating_mul(shape.total_splits() as u64).saturating_mul(slab_bytes)
}

/// Where a new region's ranges go: their shape, split size and first page and range.
#[derive(Clone, Copy)]
pub(super) struct RangeGeometry {
    pub(super) shape: Shape,
    pub(super) split_bytes: usize,
    pub(super) pages_per_range: u64,
    pub(super) first_page: u64,
    pub(super) first_range: u64,
}

impl Client {
    /// Adds a region of `bytes` coded with `shape` (none: r=0; rep(n): k=1, r=n-1; EC(k,r)) to
    /// this client's page space, placed like the first one. Its pages are
    /// `first_page..first_page + page_count` of the returned info, used with
    /// [`super::PageOp`] as any other page. Between batches only.
    pub fn create_region(&mut self, shape: Shape, bytes: u64) -> Result<RegionInfo, ConnectError> {
        self.check_new_region(shape)?;
        let region = self.place_region(shape, bytes, None)?;
        if self.config.shared_memory {
            self.export_slabs();
        }
        Ok(region)
    }

    /// Adds a region of `bytes` without redundancy (`shape` must have k = 1, r = 0) laid page
    /// for page beside region `beside`: its page `first_page + i` corresponds to `beside`'s page
    /// `beside.first_page + i`, and each of its ranges is mapped on the node that holds split
    /// `split` of the range of `beside` holding the same pages. With `split` = k (the first
    /// parity), EC-oriented replication keeps an object's main copy here, never on a node of the
    /// data splits of its EC page. Only the placement is pinned: a slab of this region that is
    /// lost is replaced where the placement policy says (and its pages are lost: it has no
    /// redundancy). Between batches only.
    ///
    /// Errors: [`ConnectError::Beside`] when `shape` has more than one split, `split` is not a
    /// split of `beside`, `bytes` holds more pages than `beside`, the split is unavailable now,
    /// or a range would share a node with data splits of its pages (only with shapes whose
    /// ranges do not nest); mapping errors as [`Client::create_region`].
    pub fn create_region_beside(
        &mut self,
        shape: Shape,
        bytes: u64,
        beside: &RegionInfo,
        split: usize,
    ) -> Result<RegionInfo, ConnectError> {
        self.check_new_region(shape)?;
        if shape.total_splits() != 1 {
            let (data_splits, parity_splits) = (shape.data_splits, shape.parity_splits);
            return Err(BesideError::Shape { data_splits, parity_splits }.into());
        }
        let (_, pages_per_range) = self.range_geometry(shape)?;
        let page_count = bytes / self.config.page_bytes as u64;
        if page_count == 0 {
            return Err(ConnectError::EmptyAddressSpace { bytes });
        }
        if self.config.lazy_ranges {
            let total_splits = beside.shape.total_splits();
            if split >= total_splits {
                return Err(BesideError::NoSplit { split, total_splits }.into());
            }
            if page_count > beside.page_count {
                let beside_page_count = beside.page_count;
                return Err(BesideError::TooLarge { page_count, beside_page_count }.into());
            }
            let region = self.place_region(shape, bytes, None)?;
            self.engine.set_region_beside(region.index, beside.index, split);
            return Ok(region);
        }
        let nodes = self.engine.nodes_beside(beside.index, split, pages_per_range, page_count)?;
        let region = self.place_region(shape, bytes, Some(nodes))?;
        // Rebuilds of either region keep its slabs off the other's data nodes.
        self.engine.set_region_beside(region.index, beside.index, split);
        if self.config.shared_memory {
            self.export_slabs();
        }
        Ok(region)
    }

    fn check_new_region(&self, shape: Shape) -> Result<(), ConnectError> {
        assert_eq!(self.engine.active(), 0, "regions are added between batches");
        assert!(shape.extra_reads <= shape.parity_splits, "delta is at most r");
        CodecParams::new(shape.data_splits, shape.parity_splits, self.config.page_bytes)?;
        let connected = self.engine.nodes().iter().filter(|node| node.connected).count();
        if connected < shape.total_splits() {
            return Err(ConnectError::TooFewNodes { needed: shape.total_splits(), given: connected });
        }
        Ok(())
    }

    /// Split bytes and pages per range of a region of `shape` on this cluster's slabs.
    fn range_geometry(&self, shape: Shape) -> Result<(usize, u64), ConnectError> {
        let params = CodecParams::new(shape.data_splits, shape.parity_splits, self.config.page_bytes)?;
        let split_bytes = params.split_bytes();
        let slab_size = self.engine.nodes().iter().map(|node| node.info.slab_size_bytes).max().unwrap_or(0);
        if slab_size < split_bytes as u64 {
            return Err(ConnectError::SlabTooSmall { slab_size_bytes: slab_size, split_bytes });
        }
        Ok((split_bytes, slab_size / split_bytes as u64))
    }

    /// Maps the ranges of a new region of `bytes` with `shape` (a control round trip per slab)
    /// and adds it to the engine. Each range goes where the placement policy says, or, with
    /// `pinned`, its one slab on `pinned[range]`.
    pub(super) fn place_region(
        &mut self,
        shape: Shape,
        bytes: u64,
        pinned: Option<Vec<NodeId>>,
    ) -> Result<RegionInfo, ConnectError> {
        let (split_bytes, pages_per_range) = self.range_geometry(shape)?;
        let page_count = bytes / self.config.page_bytes as u64;
        if page_count == 0 {
            return Err(ConnectError::EmptyAddressSpace { bytes });
        }
        let range_count = page_count.div_ceil(pages_per_range);
        if let Some(pinned) = &pinned {
            assert_eq!(pinned.len() as u64, range_count, "one pinned node per range");
            assert_eq!(shape.total_splits(), 1, "only ranges of one split are pinned");
        }
        let first_page = self.engine.page_count();
        let first_range = self.engine.ranges().len() as u64;
        if self.config.lazy_ranges {
            let unmapped = vec![Vec::new(); range_count as usize];
            return Ok(self.engine.add_region(shape, page_count, pages_per_range, unmapped, true));
        }
        let (mut loads, free_bytes) = self.member_loads(split_bytes);
        let nodes = loads.len();
        // Fewer free slabs than the region's slabs in all: refused before a round trip, rather
        // than after mapping (and releasing) as many slabs as there are, which takes minutes
        // for a region of terabytes.
        let slabs_free: u64 = loads.iter().map(|load| load.slabs_free).sum();
        if pinned.is_none() && slabs_free < range_count.saturating_mul(shape.total_splits() as u64) {
            return Err(self.node_memory_error(shape, bytes, (free_bytes, nodes), None));
        }
        let mut ranges = Vec::with_capacity(range_count as usize);
        let geometry = RangeGeometry { shape, split_bytes, pages_per_range, first_page, first_range };
        let mapped = self.map_ranges(&geometry, range_count, pinned.as_deref(), &mut loads, &mut ranges);
        if let Err(error) = mapped {
            // Release what this region mapped so far: nothing leaks on a failed start.
            for slab in ranges.iter().flatten() {
                let SlabRef { node, slab_id } = *slab;
                let _ = self.control(node, &Control::UnmapSlab { slab_id });
            }
            // Too few nodes with room is, most often, too little memory: say how much is
            // needed and free, not only how many nodes.
            return Err(match error {
                ConnectError::Placement(placement @ PlacementError::NotEnoughNodes { .. }) => {
                    self.node_memory_error(shape, bytes, (free_bytes, nodes), Some(placement))
                }
                other => other,
            });
        }
        Ok(self.engine.add_region(shape, page_count, pages_per_range, ranges, true))
    }

    /// "`bytes` at `shape` needs this much node memory, and `nodes` have `free_bytes` free",
    /// with the placement's own complaint if it made one: too few nodes with room is, most often,
    /// too little memory.
    pub(super) fn node_memory_error(
        &self,
        shape: Shape,
        bytes: u64,
        (free_bytes, nodes): (u64, usize),
        placement: Option<PlacementError>,
    ) -> ConnectError {
        let needs = NodeMemoryNeed::new(shape, bytes, self.region_node_bytes(shape, bytes));
        ConnectError::NodeMemory { needs, free_bytes, nodes, placement }
    }

    /// [`region_node_bytes`] on this client's nodes.
    fn region_node_bytes(&self, shape: Shape, bytes: u64) -> u64 {
        let slab_size_bytes =
            self.engine.nodes().iter().map(|node| node.info.slab_size_bytes).max().unwrap_or(0);
        region_node_bytes(shape, bytes, slab_size_bytes, self.config.page_bytes)
    }

    /// The loads of the connected member nodes (what placement chooses among), for slabs of
    /// splits of `split_bytes`, and the bytes they have free.
    pub(super) fn member_loads(&self, split_bytes: usize) -> (Vec<NodeLoad>, u64) {
        let members = self
            .engine
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, node)| node.connected && node.membership == crate::engine::Membership::Member);
        let mut free_bytes = 0;
        let loads = members
            .map(|(index, node)| {
                free_bytes += node.info.free_bytes;
                NodeLoad {
                    node_index: index,
                    failure_domain: node.info.failure_domain.clone(),
                    slabs_mapped: node.info.slabs_mapped as u64,
                    slabs_free: node.info.free_bytes
                        / crate::engine::slab_footprint_bytes(node.info.slab_size_bytes, split_bytes),
                }
            })
            .collect();
        (loads, free_bytes)
    }

    /// Maps the slabs of `range_count` ranges, pushing each range (and each slab as it is mapped)
    /// onto `ranges`, so that on an error the caller knows every slab to release.
    fn map_ranges(
        &mut self,
        geometry: &RangeGeometry,
        range_count: u64,
        pinned: Option<&[NodeId]>,
        loads: &mut [NodeLoad],
        ranges: &mut Vec<Vec<SlabRef>>,
    ) -> Result<(), ConnectError> {
        let RangeGeometry { shape, first_page, first_range, pages_per_range, .. } = *geometry;
        for local_range in 0..range_count {
            let nodes = match pinned {
                Some(pinned) => vec![pinned[local_range as usize]],
                None => self.place_range(loads, shape, first_range + local_range)?,
            };
            ranges.push(Vec::with_capacity(shape.total_splits()));
            for (split, &node) in nodes.iter().enumerate() {
                let range_first_page = first_page + local_range * pages_per_range;
                let slab_id = self.map_slab(
                    geometry,
                    (node, split),
                    (range_first_page, first_range + local_range),
                    &mut NoBuffers,
                )?;
                ranges.last_mut().expect("pushed above").push(SlabRef { node, slab_id });
                if let Some(load) = loads.iter_mut().find(|load| load.node_index == node) {
                    load.slabs_mapped += 1;
                    load.slabs_free = load.slabs_free.saturating_sub(1);
                }
            }
        }
        Ok(())
    }

    /// The nodes of a new range of `shape` (range number `range`, for the log), by the
    /// placement policy over `loads`, refusing more than r splits in one failure domain unless
    /// the configuration allows it.
    pub(super) fn place_range(
        &mut self,
        loads: &mut [NodeLoad],
        shape: Shape,
        range: u64,
    ) -> Result<Vec<NodeId>, ConnectError> {
        let placed = self.engine.placement_mut().place(loads, shape.total_splits())?;
        if !placed.distinct_domains {
            match crowded_domain(loads, &placed.nodes, shape) {
                Some(error) if !self.config.allow_shared_domains => return Err(error),
                _ => tracing::warn!(range, "range placed with shared failure domains"),
            }
        }
        Ok(placed.nodes)
    }

    /// Maps one slab of a range (`at`: its first page and range number) for split `split` on
    /// `node`, running the loop with `buffers` until the node answers, and counts it in the
    /// engine. Returns the slab id.
    pub(super) fn map_slab(
        &mut self,
        geometry: &RangeGeometry,
        (node, split): (NodeId, usize),
        (first_page, range_id): (u64, u64),
        buffers: &mut dyn OpBuffers,
    ) -> Result<u32, ConnectError> {
        let RangeGeometry { split_bytes, pages_per_range, .. } = *geometry;
        let map = Control::MapSlab {
            split_bytes: split_bytes as u32,
            split_index: split as u8,
            first_page,
            range_id,
        };
        let address = self.engine.node(node).address;
        let reply = self
            .control_with(node, &map, buffers)
            .map_err(|error| ConnectError::Protocol { address, message: format!("mapping a slab: {error}") });
        let slab_id = match reply {
            Ok(Control::SlabMapped { slab_id, slots }) if u64::from(slots) == pages_per_range => slab_id,
            Ok(Control::SlabMapped { slots, .. }) => {
                return Err(ConnectError::SlabSizeMismatch {
                    address,
                    slab_size_bytes: u64::from(slots) * split_bytes as u64,
                    expected_bytes: pages_per_range * split_bytes as u64,
                })
            }
            Ok(other) => return Err(connect::unexpected(address, &other)),
            Err(error) => return Err(error),
        };
        self.engine.count_mapped_slab(node, split_bytes);
        Ok(slab_id)
    }

    /// The node holding split `split` of the range of `page` (where writes of that split go),
    /// with its address; `None` if the page or the split does not exist.
    pub fn split_node(&self, page: u64, split: usize) -> Option<(NodeId, SocketAddr)> {
        let node = self.engine.split_node(page, split)?;
        Some((node, self.engine.node(node).address))
    }

    /// Whether `page` is parity-stale: written with [`super::PageOp::WriteData`] since its last
    /// whole or parity write, so it is read from its data splits alone and does not survive the
    /// loss of one of them (its main copy, elsewhere, does). False for a page out of range.
    pub fn page_is_parity_stale(&self, page: u64) -> bool {
        self.engine.page_is_parity_stale(page)
    }

    /// Whether the client knows `page` cannot be read until it is written again (its last write
    /// failed, a data split of it was lost while it was parity-stale, or its range lost the only
    /// slab it had). A read may fail for other reasons too (a node down now).
    pub fn page_is_unreadable(&self, page: u64) -> bool {
        self.engine.page_is_unreadable(page)
    }
}

/// The key of a node's failure domain: an empty label is a domain of its own.
fn domain_of(load: &NodeLoad) -> (&str, usize) {
    crate::engine::failure_domain_key(&load.failure_domain, load.node_index)
}

/// When a range placed on `nodes` has more than r splits in one failure domain (losing that
/// domain would lose data), the error that says so and what would fit: the candidates' domains
/// hold at most min(nodes with room, r) splits each. Without parities any one loss loses data,
/// so no domain is crowded then.
fn crowded_domain(loads: &[NodeLoad], nodes: &[usize], shape: Shape) -> Option<ConnectError> {
    let parity = shape.parity_splits;
    if parity == 0 {
        return None;
    }
    let load_of = |node: usize| loads.iter().find(|load| load.node_index == node);
    let mut per_domain: std::collections::BTreeMap<(&str, usize), usize> = Default::default();
    for load in nodes.iter().filter_map(|&node| load_of(node)) {
        *per_domain.entry(domain_of(load)).or_default() += 1;
    }
    let ((domain, _), splits) = per_domain.into_iter().max_by_key(|(_, splits)| *splits)?;
    if splits <= parity {
        return None;
    }
    let mut with_room: std::collections::BTreeMap<(&str, usize), usize> = Default::default();
    for load in loads.iter().filter(|load| load.slabs_free > 0) {
        *with_room.entry(domain_of(load)).or_default() += 1;
    }
    let capacity: usize = with_room.values().map(|&nodes| nodes.min(parity)).sum();
    let fits = if capacity > parity {
        format!("-k {} -r {parity} fits them", capacity - parity)
    } else {
        "no code with this r fits them".to_owned()
    };
    Some(ConnectError::SharedFailureDomains {
        message: format!(
            "EC({},{parity}) would put {splits} splits of a range in failure domain {domain:?}, and losing \
             that domain would lose data (a range survives at most r={parity} splits lost); the {} nodes \
             with room are in {} failure domains, which hold at most {capacity} splits of a range at r \
             per domain: {fits}; add nodes in other domains, or pass --allow-shared-domains to accept \
             the risk",
            shape.data_splits,
            with_room.values().sum::<usize>(),
            with_room.len(),
        ),
    })
}
