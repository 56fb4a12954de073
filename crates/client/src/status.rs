//! What the client reports of nodes, in its own types (front ends and tools never see the wire
//! protocol's messages).

use remem_proto::NodeInfo;

/// A node's own account of itself (its answer to a node-info request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// Random per node process: a node restarted at the same address has a new one.
    pub node_id: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub slab_size_bytes: u64,
    /// Slabs mapped on the node, by every client.
    pub slabs_mapped: u32,
    pub metadata_bytes: u64,
    pub requests_served: u64,
    /// Rebuilds running on the node now.
    pub regenerating_slabs: u32,
    /// Pages handled by the rebuilds running now, and pages they have to handle in all.
    pub regeneration_pages_done: u64,
    pub regeneration_pages_total: u64,
    /// Client ids whose lease is live on the node (a process connected).
    pub clients_live: u32,
    /// Client ids whose lease lapsed: their slabs are kept until the grace period ends.
    pub clients_in_grace: u32,
    pub slabs_in_grace: u32,
    pub failure_domain: String,
}

impl From<NodeInfo> for NodeStatus {
    fn from(info: NodeInfo) -> NodeStatus {
        NodeStatus {
            node_id: info.node_id,
            capacity_bytes: info.capacity_bytes,
            free_bytes: info.free_bytes,
            slab_size_bytes: info.slab_size_bytes,
            slabs_mapped: info.slabs_mapped,
            metadata_bytes: info.metadata_bytes,
            requests_served: info.requests_served,
            regenerating_slabs: info.regenerating_slabs,
            regeneration_pages_done: info.regeneration_pages_done,
            regeneration_pages_total: info.regeneration_pages_total,
            clients_live: info.clients_live,
            clients_in_grace: info.clients_in_grace,
            slabs_in_grace: info.slabs_in_grace,
            failure_domain: info.failure_domain,
        }
    }
}

/// The health of one region of a client's page space, as the client sees it: how many of its
/// ranges have every split, miss some (still readable), are rebuilding, or miss more than the
/// code tolerates (lost until written again).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionHealth {
    pub index: usize,
    /// `none`, `rep(N)` or `EC(k,r)`, then the region's label in parentheses when its owner gave
    /// it one (`none (EOR main copies)`, [`crate::Client::label_region`]).
    pub scheme: String,
    pub ranges: u64,
    /// Ranges with every split available.
    pub healthy: u64,
    /// Readable ranges missing splits: entry `i` counts the ranges missing `i + 1` splits.
    pub degraded_by_missing_splits: Vec<u64>,
    /// Ranges with a split being rebuilt on a new node now (also counted as degraded).
    pub rebuilding: u64,
    /// Ranges missing more splits than the code has parities: their pages fail until written.
    pub lost: u64,
    /// Pages no read can return now (their last write or a rebuild lost them).
    pub unreadable_pages: u64,
}

impl RegionHealth {
    /// The scheme's name for a shape of `data_splits` + `parity_splits`.
    pub fn scheme_name(data_splits: usize, parity_splits: usize) -> String {
        match (data_splits, parity_splits) {
            (1, 0) => "none".to_owned(),
            (1, parity) => format!("rep({})", parity + 1),
            (data, parity) => format!("EC({data},{parity})"),
        }
    }
}

impl crate::Client {
    /// The health of every region (see [`RegionHealth`]); cheap enough to call every second.
    pub fn region_health(&self) -> Vec<RegionHealth> {
        let mut regions: Vec<RegionHealth> = self
            .regions()
            .iter()
            .map(|region| RegionHealth {
                index: region.index,
                scheme: {
                    let scheme =
                        RegionHealth::scheme_name(region.shape.data_splits, region.shape.parity_splits);
                    match self.region_label(region.index) {
                        Some(label) => format!("{scheme} ({label})"),
                        None => scheme,
                    }
                },
                ranges: 0,
                healthy: 0,
                degraded_by_missing_splits: vec![0; region.shape.parity_splits],
                rebuilding: 0,
                lost: 0,
                unreadable_pages: 0,
            })
            .collect();
        for range in self.ranges() {
            // A range not mapped yet (lazy ranges) holds nothing: not counted.
            let Some(health) = regions.get_mut(range.region).filter(|_| !range.slabs.is_empty()) else {
                continue;
            };
            let parity_splits = health.degraded_by_missing_splits.len();
            let missing = (range.unavailable | range.rebuilding).count_ones() as usize;
            health.ranges += 1;
            health.unreadable_pages += range.unreadable_pages;
            if range.rebuilding != 0 {
                health.rebuilding += 1;
            }
            match missing {
                0 => health.healthy += 1,
                missing if missing <= parity_splits => health.degraded_by_missing_splits[missing - 1] += 1,
                _ => health.lost += 1,
            }
        }
        regions
    }
}
