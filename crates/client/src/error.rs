//! Errors of the client, per operation, with the fields a caller needs to act on them.

use std::net::SocketAddr;

/// Why [`crate::Client::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("coding parameters: {0}")]
    Params(#[from] remem_codec::ParamsError),
    #[error("{needed} nodes are needed for k+r splits on distinct nodes, the cluster has {given}")]
    TooFewNodes { needed: usize, given: usize },
    /// Fewer nodes answered than the client needs to start: k+r for a new client (its splits go
    /// to distinct nodes), one for a reopened map.
    #[error(
        "only {reachable} of the cluster's {} nodes answered, {needed} are needed; unreachable: {}",
        reachable + unreachable.len(),
        UnreachableList(unreachable)
    )]
    TooFewReachable { needed: usize, reachable: usize, unreachable: Vec<UnreachableNode> },
    #[error("node {address}: {source}")]
    Io { address: SocketAddr, source: std::io::Error },
    #[error("node {address}: handshake failed: {message}")]
    Handshake { address: SocketAddr, message: String },
    /// Another process holds this client id (and so its slabs) on a node, with a live lease:
    /// this one is fenced off and must not go on.
    #[error(
        "node {address}: client id {client_id:#x} is held by another live process ({message}); \
         stop that process first (its slabs stay with it), or start with a fresh state"
    )]
    ClientIdInUse { address: SocketAddr, client_id: u64, message: String },
    #[error("node {address}: protocol error: {message}")]
    Protocol { address: SocketAddr, message: String },
    #[error("node {address} refused: {code}: {message}")]
    Refused { address: SocketAddr, code: String, message: String },
    #[error("node {address} has {slab_size_bytes}-byte slabs, the others {expected_bytes}: every node of a cluster must use one slab size")]
    SlabSizeMismatch { address: SocketAddr, slab_size_bytes: u64, expected_bytes: u64 },
    #[error("slabs of {slab_size_bytes} bytes cannot hold a split of {split_bytes} bytes")]
    SlabTooSmall { slab_size_bytes: u64, split_bytes: usize },
    #[error("an address space of {bytes} bytes holds no page")]
    EmptyAddressSpace { bytes: u64 },
    #[error("placement: {0}")]
    Placement(#[from] remem_placement::PlacementError),
    /// Placement found too few nodes with a free slab for a new region: what the region needs
    /// and what the nodes have free.
    #[error(
        "{needs} and the {nodes} nodes that answered have {} free{}: ask for less, or add nodes or \
         capacity{}",
        format_bytes(*free_bytes),
        if needs.needed_bytes <= *free_bytes { ", but not on enough distinct nodes" } else { "" },
        placement.as_ref().map(|placement| format!(" ({placement})")).unwrap_or_default()
    )]
    NodeMemory {
        needs: NodeMemoryNeed,
        free_bytes: u64,
        nodes: usize,
        /// What placement said, when it was asked; None when the free slabs were too few in all
        /// and nothing was mapped.
        placement: Option<remem_placement::PlacementError>,
    },
    /// A range would have more than r splits in one failure domain (`ClientConfig::allow_shared_domains` off).
    #[error("placement: {message}")]
    SharedFailureDomains { message: String },
    #[error("region beside another: {0}")]
    Beside(#[from] crate::engine::BesideError),
    #[error("cannot create the event loop: {0}")]
    Poll(std::io::Error),
    #[error("cannot start the probe thread: {0}")]
    ProbeThread(std::io::Error),
}

/// The node memory an address space of `bytes` coded with `shape` needs: `10.00 TiB at EC(8,2)
/// needs 12.60 TiB of node memory`. One wording for every size error (a front end's region,
/// the demo's host check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeMemoryNeed {
    pub bytes: u64,
    pub data_splits: usize,
    pub parity_splits: usize,
    pub needed_bytes: u64,
}

impl NodeMemoryNeed {
    pub fn new(shape: crate::Shape, bytes: u64, needed_bytes: u64) -> NodeMemoryNeed {
        NodeMemoryNeed {
            bytes,
            data_splits: shape.data_splits,
            parity_splits: shape.parity_splits,
            needed_bytes,
        }
    }
}

impl std::fmt::Display for NodeMemoryNeed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} at {} needs {} of node memory",
            format_bytes(self.bytes),
            crate::RegionHealth::scheme_name(self.data_splits, self.parity_splits),
            format_bytes(self.needed_bytes)
        )
    }
}

/// A byte count with the largest binary unit that keeps it readable: `12.50 TiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size {
            return format!("{:.2} {name}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// A node a client could not reach when it started, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreachableNode {
    pub address: SocketAddr,
    /// The connect error, as text.
    pub reason: String,
}

impl UnreachableNode {
    /// `address` could not be reached because of `error` (its text without the address).
    pub fn new(address: SocketAddr, error: &ConnectError) -> UnreachableNode {
        let text = error.to_string();
        let prefix = format!("node {address}");
        let reason = match text.strip_prefix(&prefix) {
            Some(rest) => rest.trim_start_matches(':').trim_start().to_owned(),
            None => text,
        };
        UnreachableNode { address, reason }
    }
}

/// Unreachable nodes as one line: `address (reason), ...`, or `address, ... (all: reason)` when
/// they share one reason (every node of a cluster that is gone).
struct UnreachableList<'a>(&'a [UnreachableNode]);

impl std::fmt::Display for UnreachableList<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = self.0;
        let shared = nodes.len() > 1 && nodes.iter().all(|node| node.reason == nodes[0].reason);
        for (index, node) in nodes.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            if shared {
                write!(formatter, "{separator}{}", node.address)?;
            } else {
                write!(formatter, "{separator}{} ({})", node.address, node.reason)?;
            }
        }
        if shared {
            write!(formatter, " (all: {})", nodes[0].reason)?;
        }
        Ok(())
    }
}

/// Why one page operation failed. Never returned with wrong data: a page that cannot be read
/// correctly is an error.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("page {page} is beyond the address space of {page_count} pages")]
    OutOfRange { page: u64, page_count: u64 },
    #[error("page {page} is in range {range}, which has no slabs yet (mapped when first needed)")]
    Unmapped { page: u64, range: usize },
    #[error("buffer of {len} bytes given for a {page_bytes}-byte page")]
    BadBuffer { len: usize, page_bytes: usize },
    #[error("page {page} (range {range}) is unreadable: {valid_splits} valid splits of the {needed_splits} needed; failed or unavailable nodes: {failed_nodes:?}")]
    Lost { page: u64, range: usize, valid_splits: usize, needed_splits: usize, failed_nodes: Vec<SocketAddr> },
    #[error("write of page {page} (range {range}) failed: {stored_splits} splits stored, {needed_splits} needed; failed nodes: {failed_nodes:?}")]
    WriteFailed {
        page: u64,
        range: usize,
        stored_splits: usize,
        needed_splits: usize,
        failed_nodes: Vec<SocketAddr>,
    },
    #[error("page {page}: decode failed: {message}")]
    Decode { page: u64, message: String },
    #[error("page {page} has no stale parities to write: it was not written data splits only since its last whole write or parity write")]
    NotParityStale { page: u64 },
    #[error("page {page} is parity-stale and one of its data splits may be lost, or its version is unknown: write it whole")]
    ParityStaleLost { page: u64 },
    #[error("node {address} is down")]
    NodeDown { address: SocketAddr },
    #[error("node {address} did not answer in time")]
    Timeout { address: SocketAddr },
    #[error("node {address} refused: {code}: {message}")]
    Refused { address: SocketAddr, code: String, message: String },
    #[error("node {address}: protocol error: {message}")]
    Protocol { address: SocketAddr, message: String },
}

/// Why a frame from a node broke the protocol (the connection is then dropped and the node
/// treated as failed).
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("{kind:?} frame of {len} bytes is too long")]
    TooLong { kind: remem_proto::Kind, len: usize },
    #[error("undecodable frame: {0}")]
    Decode(#[from] remem_proto::DecodeError),
    #[error("{0}")]
    Malformed(String),
}
