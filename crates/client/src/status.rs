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
            failure_domain: info.failure_domain,
        }
    }
}
