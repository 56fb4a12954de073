//! Membership at run time for the blocking driver: nodes added, drained and removed while the
//! client runs, as a cluster's operator (or an etcd watch, later) says.

use std::time::Instant;

use super::{Client, NodeAddress};
use crate::engine::NodeId;
use crate::error::ConnectError;

impl Client {
    /// Adds a node to a running client: it becomes a candidate for new and rebuilt slabs (the
    /// placement policy learns of it from the candidates). Returns its id.
    pub fn add_node(&mut self, node: &NodeAddress) -> Result<NodeId, ConnectError> {
        if let Some(known) = self.engine.nodes().iter().position(|entry| entry.address == node.address) {
            if self.engine.node(known).membership != crate::engine::Membership::Removed {
                return Ok(known);
            }
        }
        let id = self.join(node)?;
        let slab_size = self.engine.node(0).info.slab_size_bytes;
        let info = &self.engine.node(id).info;
        if info.slab_size_bytes != slab_size {
            let error = ConnectError::SlabSizeMismatch {
                address: node.address,
                slab_size_bytes: info.slab_size_bytes,
                expected_bytes: slab_size,
            };
            self.engine.remove_node(Instant::now(), id);
            self.transport.detach(id);
            return Err(error);
        }
        tracing::info!(node = %node.address, id, "node added");
        Ok(id)
    }

    /// Drains a node: each of our slabs on it is rebuilt elsewhere (reads go on throughout; the
    /// old slab is a source until its replacement is complete and is released after). Drive
    /// the loop ([`Client::wait_for_regenerations`]) to let it finish.
    pub fn drain_node(&mut self, node: NodeId) {
        self.engine.drain_node(Instant::now(), node);
    }

    /// Removes a failed node for good: its slabs are rebuilt elsewhere and it is never probed
    /// again.
    pub fn remove_node(&mut self, node: NodeId) {
        self.engine.remove_node(Instant::now(), node);
        self.transport.detach(node);
    }

    /// Slabs of this client on `node`, by what its ranges name.
    pub fn slabs_on(&self, node: NodeId) -> usize {
        self.engine.ranges().iter().flat_map(|range| &range.slabs).filter(|slab| slab.node == node).count()
    }
}

/// One change of the cluster's membership, by node address: what a cluster file that changed,
/// an operator, or (later) an etcd watch says. [`Client::apply`] carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// A node joined: it takes new and rebuilt slabs.
    Added(NodeAddress),
    /// A node is leaving: its slabs move elsewhere, then it holds none of this client's.
    Draining(std::net::SocketAddr),
    /// A node is gone for good: its slabs are rebuilt elsewhere, it is never probed again.
    Removed(std::net::SocketAddr),
}

impl Client {
    /// Carries out one membership change. Changes naming a node the client does not know
    /// (draining or removing) are ignored; adding a known node is a no-op.
    pub fn apply(&mut self, change: &MembershipChange) -> Result<(), ConnectError> {
        let known = |client: &Client, address: std::net::SocketAddr| {
            client.engine.nodes().iter().position(|node| node.address == address)
        };
        match change {
            MembershipChange::Added(node) => self.add_node(node).map(|_| ()),
            MembershipChange::Draining(address) => {
                if let Some(node) = known(self, *address) {
                    self.drain_node(node);
                }
                Ok(())
            }
            MembershipChange::Removed(address) => {
                if let Some(node) = known(self, *address) {
                    self.remove_node(node);
                }
                Ok(())
            }
        }
    }
}
