//! Why a call on the simulated cluster was refused.

use crate::SimTime;

/// A fault or connection request that cannot apply to the node as it is now. Calls that return
/// it change nothing (and count no fault).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("node {node} does not exist (the cluster has {node_count} nodes)")]
    NoSuchNode { node: usize, node_count: usize },
    #[error("node {node} is dead")]
    NodeDead { node: usize },
    #[error("node {node} is partitioned until {until} ns")]
    NodePartitioned { node: usize, until: SimTime },
    #[error("node {node} is stalled until {until} ns (a real handshake would wait and time out)")]
    NodeStalled { node: usize, until: SimTime },
    #[error("node {node} maps no slab {slab_id}")]
    UnknownSlab { node: usize, slab_id: u32 },
    #[error("node {node} maps no slab to fault")]
    NoSlab { node: usize },
}
