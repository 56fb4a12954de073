//! Node health: what turns silence, a lost connection or corrupt splits into a failed node, and
//! a failed node back into a member.
//!
//! - A request unanswered past `request_timeout` fails its node (a hang, SIGSTOP, a partition).
//! - A node that sent nothing for `heartbeat_interval` is pinged, so an idle client still
//!   notices a hung node; an unanswered ping fails the node after `request_timeout`.
//! - A failed node's connection is dropped, its splits in flight fail over to other splits, its
//!   slabs become unavailable and are rebuilt elsewhere. Unless removed, it is probed every
//!   `probe_interval`: when a connection succeeds it is readmitted, the slabs of ours it still
//!   holds that no range names any more are released, and it takes new slabs again.
//! - Corrupt splits are counted per node (decayed); past the error-correction limit reads of its
//!   ranges ask one more split, past the regeneration limit its slabs are rebuilt elsewhere with
//!   the old slab kept as a source until the new one is complete.

use std::time::Instant;

use remem_placement::NodeLoad;
use remem_proto::{Control, NodeInfo};

use super::{Action, Engine, Membership, NodeEntry, NodeId, OpBuffers};

/// Corrupt-split counters halve every this many splits read from a node, so the rate follows
/// the node's recent behaviour.
const ERROR_WINDOW_SPLITS: u64 = 8192;

/// What the client has seen of one node's splits: the basis of the corruption thresholds.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeStats {
    pub splits_read: u64,
    pub splits_corrupt: u64,
    /// Corrupt splits ever seen (not decayed).
    pub corrupt_total: u64,
}

impl NodeStats {
    pub fn error_rate(&self) -> f64 {
        if self.splits_read == 0 {
            0.0
        } else {
            self.splits_corrupt as f64 / self.splits_read as f64
        }
    }
}

impl Engine {
    /// The time passed: ops past their deadline fail their nodes, idle nodes are pinged, failed
    /// nodes are probed, queued rebuilds start. Call it at [`Engine::next_deadline`] at the
    /// latest, and whenever convenient (it is cheap).
    pub fn tick(&mut self, now: Instant, buffers: &mut dyn OpBuffers) {
        self.now = now;
        self.expire_deadlines();
        self.heartbeats();
        self.probe_failed_nodes();
        self.process_events(buffers);
        self.drive_regenerations();
    }

    /// The driver's connection to `node` is gone (EOF, reset, a protocol error).
    pub fn connection_lost(&mut self, now: Instant, node: NodeId, why: &str, buffers: &mut dyn OpBuffers) {
        self.now = now;
        self.node_failed(node, why);
        self.process_events(buffers);
    }

    /// The driver connected to `node` (a probe of a failed node, or a node added without a
    /// connection) and fetched its info: the node is readmitted.
    pub fn node_connected(&mut self, now: Instant, node: NodeId, info: NodeInfo) {
        self.now = now;
        let entry = &mut self.nodes[node];
        if entry.membership == Membership::Removed {
            self.actions.push(Action::Disconnect { node });
            return;
        }
        let was_failed = !entry.connected;
        let new_life = entry.info.node_id != info.node_id;
        if new_life {
            // Another process on the same address (a restart): the memory of the old one, and
            // the slabs of ours it held, are gone; slab ids there now name other slabs.
            entry.orphans.clear();
        }
        entry.connected = true;
        entry.info = info;
        entry.last_heard = now;
        entry.ping_sent = None;
        entry.out.clear();
        entry.out_sent = 0;
        entry.queued = false;
        if was_failed {
            tracing::info!(node = %entry.address, "node answers again: readmitted");
        }
        if !new_life {
            self.readmit_untouched_slabs(node);
        }
        if new_life {
            let stale: Vec<u32> = self
                .regenerations_old_sources()
                .filter(|old| old.node == node)
                .map(|old| old.slab_id)
                .collect();
            for slab_id in stale {
                self.forget_source(node, slab_id);
            }
        }
        // Slabs of ours it still holds that no range names any more go back to it.
        for slab_id in std::mem::take(&mut self.nodes[node].orphans) {
            self.unmap_quietly(node, slab_id);
        }
        // Slabs it holds that a range still names and that missed writes since it failed stay
        // unavailable: their rebuild (already queued) replaces them; the old slab is released
        // once the new one is complete.
    }

    /// A split was read from `node` (the denominator of its error rate).
    pub(super) fn record_split_read(&mut self, node: NodeId) {
        let stats = &mut self.nodes[node].stats;
        stats.splits_read += 1;
        if stats.splits_read >= ERROR_WINDOW_SPLITS {
            stats.splits_read /= 2;
            stats.splits_corrupt /= 2;
        }
    }

    /// A split from `node` failed its checksum. Past the regeneration limit, every slab of this
    /// client on that node is rebuilt elsewhere, the old slab kept as a source (its good splits
    /// may be what some pages still need).
    pub(super) fn record_corruption(&mut self, node: NodeId) {
        let stats = &mut self.nodes[node].stats;
        stats.splits_corrupt += 1;
        stats.corrupt_total += 1;
        let trusted = stats.splits_read >= self.config.error_rate_min_samples;
        if !(trusted && stats.error_rate() >= self.config.slab_regeneration_limit) {
            return;
        }
        let rate = stats.error_rate();
        tracing::warn!(node = %self.nodes[node].address, rate, "node corrupts too often");
        let stats = &mut self.nodes[node].stats;
        // Reset, so that one burst of errors triggers one rebuild.
        stats.splits_read = 0;
        stats.splits_corrupt = 0;
        for range in 0..self.ranges.len() {
            for split in 0..self.ranges[range].slabs.len() {
                let slab = self.ranges[range].slabs[split];
                if slab.node == node && self.ranges[range].unavailable & (1 << split) == 0 {
                    self.schedule_regeneration(range, split, "corruption", true);
                }
            }
        }
    }

    /// True when a node of the range corrupts above the error-correction limit.
    pub(super) fn range_has_suspect_node(&self, range: usize) -> bool {
        self.ranges[range].slabs.iter().any(|slab| {
            let stats = &self.nodes[slab.node].stats;
            stats.splits_read >= self.config.error_rate_min_samples
                && stats.error_rate() >= self.config.error_correction_limit
        })
    }

    pub(super) fn heard_from(&mut self, node: NodeId) {
        self.nodes[node].last_heard = self.now;
    }

    /// When `node` next needs the engine's attention (a heartbeat, a ping's deadline, a probe).
    pub(super) fn node_deadline(&self, node: &NodeEntry) -> Option<Instant> {
        match (node.membership, node.connected) {
            (Membership::Removed, _) => None,
            (_, false) => Some(node.next_probe),
            (_, true) => Some(match node.ping_sent {
                Some(sent) => sent + self.config.request_timeout,
                None => node.last_heard + self.config.heartbeat_interval,
            }),
        }
    }

    /// A node that leaves a split unanswered past its op's deadline has failed. One flag per
    /// node: there is no limit on the node count.
    pub(super) fn expire_deadlines(&mut self) {
        let now = self.now;
        let mut any = false;
        for (slot, deadline) in self.slots.iter().zip(&self.slot_deadlines) {
            if deadline.is_none_or(|deadline| deadline > now) {
                continue;
            }
            let pending = slot.pending();
            for split in 0..super::MAX_SPLITS {
                if pending & (1 << split) == 0 {
                    continue;
                }
                let node = self.slot_split_node(slot, split);
                self.hung[node] = true;
                any = true;
            }
        }
        if any {
            for node in 0..self.nodes.len() {
                if std::mem::take(&mut self.hung[node]) {
                    self.node_failed(node, "no reply within the request timeout");
                }
            }
        }
        let timeout = self.config.request_timeout;
        for deadline in self.slot_deadlines.iter_mut().flatten() {
            if *deadline <= now {
                // Replacements asked because of this expiry get their own full timeout.
                *deadline = now + timeout;
            }
        }
    }

    /// Pings nodes that have been quiet, and fails those whose ping went unanswered.
    pub(super) fn heartbeats(&mut self) {
        let now = self.now;
        for node in 0..self.nodes.len() {
            let entry = &self.nodes[node];
            if !entry.connected || entry.membership == Membership::Removed {
                continue;
            }
            match entry.ping_sent {
                Some(sent) if now >= sent + self.config.request_timeout => {
                    self.node_failed(node, "no answer to a heartbeat within the request timeout");
                }
                Some(_) => {}
                None if now >= entry.last_heard + self.config.heartbeat_interval => {
                    let id = self.next_control_id();
                    Control::Ping.encode(id, &mut self.nodes[node].out);
                    self.nodes[node].ping_sent = Some(now);
                    self.mark_queued(node);
                }
                None => {}
            }
        }
    }

    /// Asks the driver to reconnect to failed nodes whose probe is due.
    pub(super) fn probe_failed_nodes(&mut self) {
        let now = self.now;
        for node in 0..self.nodes.len() {
            let entry = &mut self.nodes[node];
            if entry.connected || entry.membership == Membership::Removed || entry.next_probe > now {
                continue;
            }
            entry.next_probe = now + self.config.probe_interval;
            self.actions.push(Action::Connect { node });
        }
    }

    /// Marks a node failed: its connection is dropped, every split in flight on it fails over,
    /// its slabs become unavailable and are rebuilt elsewhere, and it is probed later.
    pub(super) fn node_failed(&mut self, node: NodeId, why: &str) {
        let now = self.now;
        let probe_interval = self.config.probe_interval;
        let entry = &mut self.nodes[node];
        if !entry.connected {
            return;
        }
        tracing::warn!(node = %entry.address, reason = why, "node failed");
        entry.connected = false;
        entry.out.clear();
        entry.out_sent = 0;
        entry.ping_sent = None;
        entry.next_probe = now + probe_interval;
        self.actions.push(Action::Disconnect { node });
        for range in &mut self.ranges {
            for (split, slab) in range.slabs.iter().enumerate() {
                if slab.node == node {
                    range.unavailable |= 1 << split;
                }
            }
        }
        let unreachable: Vec<(usize, usize)> = self
            .previous_slabs
            .iter()
            .filter(|(_, _, old)| old.node == node)
            .map(|&(range, split, _)| (range, split))
            .collect();
        for (range, split) in unreachable {
            self.forget_previous(range, split);
        }
        self.fail_pending_on_node(node);
        self.regeneration_node_died(node);
        for range in 0..self.ranges.len() {
            for split in 0..self.ranges[range].slabs.len() {
                if self.ranges[range].slabs[split].node == node {
                    // Kept as a source in case the node comes back in the same life (a stall, a
                    // partition): its splits are stale at worst, and a stale split only ever
                    // carries an older version, as long as this client's versions are exact
                    // (it never reopened a saved map: then a version number could have been
                    // used twice, and only reachable splits can be trusted).
                    let keep = self.versions_exact;
                    self.schedule_regeneration(range, split, super::regeneration::NODE_FAILED, keep);
                }
            }
        }
    }

    /// The node told us it evicted one of our slabs: like a failure of that slab alone.
    pub(super) fn slab_evicted(&mut self, node: NodeId, slab_id: u32) {
        for range in 0..self.ranges.len() {
            for split in 0..self.ranges[range].slabs.len() {
                let slab = self.ranges[range].slabs[split];
                if slab.node == node && slab.slab_id == slab_id {
                    tracing::warn!(node = %self.nodes[node].address, range, split, "slab evicted");
                    self.fail_pending_on(range, split);
                    self.slab_gone(range, split);
                    // Kept (then forgotten below) rather than released: the node unmapped it.
                    self.schedule_regeneration(range, split, "slab evicted", true);
                }
            }
        }
        self.forget_source(node, slab_id);
    }

    /// Nodes added without a connection (unreachable at a reopen) count as failed: their slabs
    /// are unavailable and rebuilt, and they are probed.
    pub fn fail_unreachable_nodes(&mut self, now: Instant) {
        self.now = now;
        for node in 0..self.nodes.len() {
            if !self.nodes[node].connected && self.nodes[node].membership != Membership::Removed {
                self.nodes[node].connected = true;
                self.node_failed(node, "unreachable");
            }
        }
    }

    pub fn nodes(&self) -> &[NodeEntry] {
        &self.nodes
    }

    pub fn node(&self, node: NodeId) -> &NodeEntry {
        &self.nodes[node]
    }

    /// Updates what the engine knows of a node's load (a NodeInfo the driver fetched).
    pub fn set_node_info(&mut self, node: NodeId, info: NodeInfo) {
        self.nodes[node].info = info;
    }

    /// Candidates for a new slab of splits of `split_bytes`: connected members, with their
    /// loads.
    pub(super) fn placement_candidates(&self, split_bytes: usize) -> Vec<NodeLoad> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.connected && node.membership == Membership::Member)
            .map(|(index, node)| node.load(index, split_bytes))
            .collect()
    }
}
