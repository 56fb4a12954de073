//! Failure handling that outlives one op: slabs that became unavailable (node failed or hung,
//! slab evicted, too many corrupt splits, node drained) are rebuilt on another node in the
//! background (seed 000 §4.2 "Background Slab Regeneration"), driven by the engine's events.
//!
//! The client rebuilds nothing itself: it maps an empty slab on a new node (one that holds no
//! other slab of the range, chosen by the placement policy), points the range at it for writes,
//! and hands the rebuild to that node with the list of surviving slabs. The new node reads k of
//! them, decodes, and stores each page unless the client wrote it since the rebuild began, so
//! writes never wait (the seed blocks them). Reads skip the slab until the node reports every
//! page back.
//!
//! Decisions (each one a fault found from outside, kept as a simulator scenario):
//! - healing does not wait for traffic: rebuilds are started from [`Engine::tick`];
//! - a rebuild that reports `pages_lost > 0` failed: the slab stays unavailable and the rebuild
//!   runs again on the same new slab (pages already rebuilt are skipped there) until every page
//!   is back, with a growing delay;
//! - the slab being replaced stays a source while its node is reachable (a node that corrupts,
//!   a drained node, a stalled node that came back): its good splits may be what some pages
//!   need. Stale splits there are harmless: the rebuild keeps the newest version with k splits.
//!   It is released only when its replacement is complete.
//! - a refused attempt (`NoCapacity`: four rebuilds running there, or no room) releases its new
//!   slab and is placed again after the retry delay, on another node if one can take it, else on
//!   the same one. The node of a dropped target stays a candidate: after a stall the readmitted
//!   node is often the only one outside a range, and ruling it out for the attempt it refused
//!   left the range degraded until more nodes died (issue 31, item 6);
//! - the new slab never makes a failure domain hold more than r splits of the range unless
//!   `allow_shared_domains`: the slab stays unrebuilt instead, as the range's first placement is
//!   refused instead;
//! - the client counts slabs it maps and unmaps in its view of each node's room, so attempts that
//!   were refused do not make the cluster look full.
//!
//! - a slab of a range without redundancy (r = 0) can only be copied from the slab it replaces:
//!   when that one cannot be read, the range's written pages are lost (marked unreadable) and the
//!   new slab is complete at once, empty; a copy that lost pages is accepted as it is (retrying
//!   cannot bring back what the only source could not give). More generally, a rebuild with
//!   fewer than k sources completes at once when the range has no page left it could bring back;
//! - a rebuild of a parity split may lose parity-stale pages whose data split is corrupt (no
//!   version has k votes): it is complete when it lost no more pages than the range has
//!   unreadable and parity-stale ones and a retry brought none back (`parity_stale.rs`).
//!
//! Invariants: a split is read only from a slab whose bit is clear in `unavailable`; a slab
//! being rebuilt keeps its bit set until its rebuild reports every page back (or loses no more
//! pages than the client knows to be unreadable anyway: pages whose last write failed, and
//! parity-stale pages of a range that lost a data slab, see `parity_stale.rs`). A new
//! slab takes every write from the moment it is mapped until it is complete or dropped: its
//! `rebuilding` bit is set exactly while a rebuild names it as its target, retries included.

use std::time::{Duration, Instant};

use remem_proto::{Control, RegenerationSource, MAX_REGENERATION_SOURCES};

use remem_placement::NodeLoad;

use super::{Engine, Membership, NodeId, SlabRef};

/// How long a rebuild that could not start or lost pages first waits before trying again; the
/// delay doubles up to [`MAX_RETRY_DELAY`].
const RETRY_DELAY: Duration = Duration::from_millis(200);
/// The reason of the rebuild a node failure schedules.
pub(super) const NODE_FAILED: &str = "node failed";
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub(super) struct Regeneration {
    pub(super) range: usize,
    split: usize,
    reason: &'static str,
    state: State,
    started: Instant,
    /// The slab being replaced, while it may still serve as a source; released when done.
    old: Option<SlabRef>,
    /// A new slab already mapped by an earlier attempt (its rebuilt pages are kept).
    target: Option<SlabRef>,
    attempts: u32,
    /// Pages the previous attempt lost, if it lost any.
    lost_before: Option<u64>,
    /// The node of the slab that was lost: never the replacement's (its old slab may still be
    /// there, and a node that evicted or corrupted it is a poor home for it).
    lost_node: NodeId,
    /// The node that last refused this rebuild (no room, too many rebuilds running): the next
    /// attempt goes elsewhere when another node can take it, else back to it.
    refused_by: Option<NodeId>,
    /// "Only crowded failure domains can take it" was logged for this rebuild.
    domain_warned: bool,
    /// "No node can take the rebuilt slab" was logged for this rebuild.
    no_target_warned: bool,
}

/// [`Engine::beside_home`]'s answer.
enum BesideHome {
    Node(NodeId),
    Wait,
}

#[derive(Debug)]
enum State {
    Queued { not_before: Instant },
    Mapping { node: NodeId, request_id: u64 },
    Rebuilding { node: NodeId, request_id: u64 },
}

impl Regeneration {
    pub(super) fn not_before(&self) -> Option<Instant> {
        match self.state {
            State::Queued { not_before } => Some(not_before),
            _ => None,
        }
    }

    fn retry_delay(&self) -> Duration {
        RETRY_DELAY.saturating_mul(1 << self.attempts.min(5)).min(MAX_RETRY_DELAY)
    }
}

/// Progress of background work, for tests and the CLI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegenerationStatus {
    pub in_flight: usize,
    pub done: u64,
}

impl Engine {
    /// Marks a slab unavailable and, if enabled, queues its rebuild (once per slab). With
    /// `keep_old` the slab being replaced is a source while its node is reachable.
    pub(super) fn schedule_regeneration(
        &mut self,
        range: usize,
        split: usize,
        reason: &'static str,
        keep_old: bool,
    ) {
        let bit = 1 << split;
        if self.ranges[range].unavailable & bit == 0 {
            self.ranges[range].missed &= !bit;
        }
        self.ranges[range].unavailable |= bit;
        // An unavailable slab is never read or written through shared memory again.
        self.drop_shm(range, split);
        // Whether or not it is rebuilt, what only this slab held is gone.
        self.data_slab_lost(range, split);
        if !self.config.regenerate {
            return;
        }
        if self.regenerations.iter().any(|task| task.range == range && task.split == split) {
            return;
        }
        tracing::info!(range, split, reason, "slab lost: rebuilding it elsewhere");
        let old = self.ranges[range].slabs[split];
        if keep_old && self.nodes[old.node].connected {
            // Still reachable: reads keep using it until its replacement is complete.
            self.ranges[range].previous |= bit;
            self.previous_slabs.push((range, split, old));
        }
        self.regenerations.push(Regeneration {
            range,
            split,
            reason,
            state: State::Queued { not_before: self.now },
            started: self.now,
            old: keep_old.then_some(old),
            target: None,
            attempts: 0,
            lost_before: None,
            lost_node: old.node,
            refused_by: None,
            domain_warned: false,
            no_target_warned: false,
        });
        if !keep_old {
            let split_bytes = self.regions[self.ranges[range].region].split_bytes;
            self.release_slab(old, split_bytes);
        }
    }

    /// The node came back in the same life: each of its slabs that a range still names, that
    /// missed no write of its range since it went away, and whose rebuild has not started, is
    /// the range's split again as it was (no rebuild). So a client cut off from every node at
    /// once (a pause longer than the nodes' lease, a partition) writes again when they answer,
    /// even where no spare node could take a rebuilt slab. Not for ranges without redundancy,
    /// nor for a data split of a range with parity-stale pages (their loss was already
    /// recorded): those keep their rebuild.
    pub(super) fn readmit_untouched_slabs(&mut self, node: NodeId) {
        let mut index = 0;
        while index < self.regenerations.len() {
            let task = &self.regenerations[index];
            let (range_index, split, bit) = (task.range, task.split, 1 << task.split);
            let range = &self.ranges[range_index];
            let shape = self.regions[range.region].shape;
            // Only a rebuild for a node failure: its slab was released to the node's orphans
            // (never unmapped while connected) and is still there if the node is.
            let untouched = task.reason == NODE_FAILED
                && matches!(task.state, State::Queued { .. })
                && task.target.is_none()
                && range.slabs[split].node == node
                && range.unavailable & bit != 0
                && (range.missed | range.rebuilding | range.previous) & bit == 0
                && shape.total_splits() > 1
                && !(split < shape.data_splits && range.parity_stale_pages > 0);
            if !untouched {
                index += 1;
                continue;
            }
            self.regenerations.remove(index);
            let slab_id = range.slabs[split].slab_id;
            self.ranges[range_index].unavailable &= !bit;
            // A client whose versions were not exact released the slab when it failed: it is
            // the range's again.
            self.nodes[node].orphans.retain(|&orphan| orphan != slab_id);
            tracing::info!(
                range = range_index,
                split,
                "slab back as it was (it missed no write): no rebuild"
            );
        }
    }

    /// Starts queued rebuilds whose time has come.
    pub(super) fn drive_regenerations(&mut self) {
        let mut index = 0;
        while index < self.regenerations.len() {
            let tasks = self.regenerations.len();
            if let State::Queued { not_before } = self.regenerations[index].state {
                if not_before <= self.now {
                    self.start_regeneration(index);
                }
            }
            // A rebuild with nothing to rebuild completes as it starts (and leaves the list):
            // the task now at `index` has not been looked at yet.
            if self.regenerations.len() == tasks {
                index += 1;
            }
        }
    }

    fn requeue(&mut self, index: usize) {
        let task = &mut self.regenerations[index];
        let delay = task.retry_delay();
        task.attempts += 1;
        task.state = State::Queued { not_before: self.now + delay };
    }

    fn start_regeneration(&mut self, index: usize) {
        if let Some(target) = self.regenerations[index].target {
            if self.nodes[target.node].connected {
                return self.send_regenerate(index, target);
            }
            self.regenerations[index].target = None;
        }
        let (range, split) = (self.regenerations[index].range, self.regenerations[index].split);
        let excluded = self.replacement_excluded(index);
        let split_bytes = self.regions[self.ranges[range].region].split_bytes;
        let candidates = self.placement_candidates(split_bytes);
        let chosen = match self.beside_home(index, &excluded, &candidates) {
            Some(BesideHome::Node(node)) => Some(node),
            Some(BesideHome::Wait) => return self.requeue(index),
            None => self.choose_replacement(index, candidates, &excluded),
        };
        let Some(node) = chosen else {
            return self.requeue(index);
        };
        let region = &self.regions[self.ranges[range].region];
        let message = Control::MapSlab {
            split_bytes: region.split_bytes as u32,
            split_index: split as u8,
            first_page: self.range_first_page(range),
            range_id: range as u64,
        };
        let request_id = self.send_control(node, &message).expect("candidates are connected");
        // Count the slab now so that two rebuilds do not pile onto one node.
        self.count_mapped_slab(node, split_bytes);
        self.regenerations[index].state = State::Mapping { node, request_id };
    }

    /// Where the new slab of rebuild `index` goes when its range is of a region laid beside
    /// another (EOR's main copies): where the range was pinned, the node of the beside split of
    /// the other region's range holding its first page, or the node that split is being rebuilt
    /// on, so the main copies of a range stay together on one node off its data nodes ([`Wait`]
    /// while that rebuild has no node yet, a few attempts). `None`: no such home (not beside,
    /// or the home cannot take it): the placement policy chooses, avoiding `excluded`.
    ///
    /// [`Wait`]: BesideHome::Wait
    fn beside_home(&self, index: usize, excluded: &[NodeId], candidates: &[NodeLoad]) -> Option<BesideHome> {
        const WAIT_ATTEMPTS: u32 = 3;
        let task = &self.regenerations[index];
        let region = &self.regions[self.ranges[task.range].region];
        let (beside, split) = region.beside?;
        let (offset, _) = self.range_offsets(task.range);
        let beside = &self.regions[beside];
        if offset >= beside.page_count {
            return None;
        }
        let home_range = beside.first_range + (offset / beside.pages_per_range) as usize;
        let home = &self.ranges[home_range];
        let node = if home.slabs.is_empty() {
            return None;
        } else if home.unavailable & (1 << split) == 0 {
            home.slabs[split].node
        } else {
            let rebuild =
                self.regenerations.iter().find(|other| other.range == home_range && other.split == split);
            match rebuild.map(|other| (&other.state, other.target)) {
                Some((State::Mapping { node, .. } | State::Rebuilding { node, .. }, _)) => *node,
                Some((_, Some(target))) => target.node,
                _ if task.attempts < WAIT_ATTEMPTS => return Some(BesideHome::Wait),
                _ => return None,
            }
        };
        let free =
            candidates.iter().any(|candidate| candidate.node_index == node && candidate.slabs_free > 0);
        (free && self.nodes[node].connected && !excluded.contains(&node)).then_some(BesideHome::Node(node))
    }

    /// The nodes the new slab of rebuild `index` must not go to: those of the range's other
    /// splits, including the nodes of their own rebuilds in flight (two rebuilds of one range
    /// started together must not land on one node), and the node of the lost slab. Not the node
    /// the range names for this split when that is a target this rebuild dropped (refused,
    /// abandoned): that node may be the only one that can take the slab. For ranges of regions
    /// laid beside one another, also every node that would then hold a page's main copy and one
    /// of its data splits ([`Engine::beside_conflicts`]).
    fn replacement_excluded(&self, index: usize) -> Vec<NodeId> {
        let task = &self.regenerations[index];
        let (range, split) = (task.range, task.split);
        let mut excluded: Vec<NodeId> = self.ranges[range]
            .slabs
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != split)
            .map(|(_, slab)| slab.node)
            .collect();
        excluded.push(task.lost_node);
        excluded.extend(self.beside_conflicts(range, split));
        for other in self.regenerations.iter().filter(|other| other.range == range && other.split != split) {
            if let State::Mapping { node, .. } | State::Rebuilding { node, .. } = other.state {
                excluded.push(node);
            }
            excluded.extend(other.target.map(|target| target.node));
        }
        excluded
    }

    /// The node that takes the new slab of rebuild `index`, by the placement policy, or `None`
    /// (logged) when none can now. A node in a failure domain that already holds r of the
    /// range's other splits is taken only with `allow_shared_domains` and only when no other
    /// can take the slab: losing that domain would lose data. The node that last refused this
    /// rebuild is taken only when no other can.
    fn choose_replacement(
        &mut self,
        index: usize,
        mut candidates: Vec<NodeLoad>,
        excluded: &[NodeId],
    ) -> Option<NodeId> {
        let task = &self.regenerations[index];
        let (range, split, refused_by) = (task.range, task.split, task.refused_by);
        let crowded = self.crowded_domains(index);
        let in_crowded: Vec<bool> = candidates
            .iter()
            .map(|candidate| crowded.contains(&self.domain_key(candidate.node_index)))
            .collect();
        let free: Vec<u64> = candidates.iter().map(|candidate| candidate.slabs_free).collect();
        // Placement ignores a candidate without a free slab: that is how one is ruled out here
        // (leaving it out of the list would tell CodingSets it left the cluster).
        let mut attempt = |candidates: &mut [NodeLoad], allow_crowded: bool, allow_refuser: bool| {
            for (position, candidate) in candidates.iter_mut().enumerate() {
                let ruled_out = (in_crowded[position] && !allow_crowded)
                    || (refused_by == Some(candidate.node_index) && !allow_refuser);
                candidate.slabs_free = if ruled_out { 0 } else { free[position] };
            }
            self.placement.replace(candidates, excluded).ok()
        };
        let spread = attempt(&mut candidates, false, false).or_else(|| attempt(&mut candidates, false, true));
        if spread.is_some() {
            return spread;
        }
        let Some(crowding) = attempt(&mut candidates, true, true) else {
            if std::mem::replace(&mut self.regenerations[index].no_target_warned, true) {
                tracing::debug!(range, split, "no node can take the rebuilt slab yet; retrying");
            } else {
                tracing::warn!(
                    range,
                    split,
                    "no node can take the rebuilt slab yet; retrying (said once per slab)"
                );
            }
            return None;
        };
        let parity_splits = self.regions[self.ranges[range].region].shape.parity_splits;
        let address = self.nodes[crowding].address;
        if self.config.allow_shared_domains {
            tracing::warn!(range, split, node = %address, parity_splits,
                "rebuilt slab placed in a failure domain that already holds r splits of its range");
            return Some(crowding);
        }
        if !std::mem::replace(&mut self.regenerations[index].domain_warned, true) {
            tracing::warn!(range, split, parity_splits,
                "only failure domains already holding r splits of the range can take the rebuilt slab: \
                 it stays unrebuilt until a node in another domain can (allow_shared_domains accepts the risk)");
        }
        None
    }

    /// The failure domains that already hold r splits of rebuild `index`'s range, counting the
    /// range's other splits where they will be: a split being rebuilt counts at its new node
    /// once chosen (not at all before). Empty without parities (any loss loses data then).
    fn crowded_domains(&self, index: usize) -> Vec<(&str, usize)> {
        let task = &self.regenerations[index];
        let (range, split) = (task.range, task.split);
        let parity_splits = self.regions[self.ranges[range].region].shape.parity_splits;
        if parity_splits == 0 {
            return Vec::new();
        }
        let mut per_domain: Vec<((&str, usize), usize)> = Vec::new();
        for (other, slab) in self.ranges[range].slabs.iter().enumerate() {
            if other == split {
                continue;
            }
            let rebuild = self.regenerations.iter().find(|task| task.range == range && task.split == other);
            let node = match rebuild {
                Some(rebuild) => match rebuild.state {
                    State::Mapping { node, .. } | State::Rebuilding { node, .. } => Some(node),
                    State::Queued { .. } => rebuild.target.map(|target| target.node),
                },
                None => Some(slab.node),
            };
            let Some(node) = node else { continue };
            let key = self.domain_key(node);
            match per_domain.iter_mut().find(|(domain, _)| *domain == key) {
                Some((_, count)) => *count += 1,
                None => per_domain.push((key, 1)),
            }
        }
        per_domain
            .into_iter()
            .filter(|(_, count)| *count >= parity_splits)
            .map(|(domain, _)| domain)
            .collect()
    }

    /// A node's failure domain as placement counts it: an empty label is a domain of its own.
    fn domain_key(&self, node: NodeId) -> (&str, usize) {
        failure_domain_key(&self.nodes[node].info.failure_domain, node)
    }

    /// Points the range at the new slab for writes and hands the rebuild to its node.
    fn send_regenerate(&mut self, index: usize, target: SlabRef) {
        let (range, split, old) =
            (self.regenerations[index].range, self.regenerations[index].split, self.regenerations[index].old);
        let bit = 1 << split;
        self.drop_shm(range, split);
        self.ranges[range].slabs[split] = target;
        self.ranges[range].rebuilding |= bit;
        let region = &self.regions[self.ranges[range].region];
        let shape = region.shape;
        let unavailable = self.ranges[range].unavailable;
        let mut sources: Vec<RegenerationSource> = Vec::with_capacity(shape.total_splits());
        if let Some(old) = old.filter(|old| self.nodes[old.node].connected) {
            sources.push(RegenerationSource {
                split_index: split as u8,
                slab_id: old.slab_id,
                address: self.nodes[old.node].address,
            });
        }
        for other in 0..shape.total_splits() {
            let slab = self.ranges[range].slabs[other];
            if unavailable & (1 << other) != 0 || !self.nodes[slab.node].connected {
                continue;
            }
            if sources.len() < MAX_REGENERATION_SOURCES {
                sources.push(RegenerationSource {
                    split_index: other as u8,
                    slab_id: slab.slab_id,
                    address: self.nodes[slab.node].address,
                });
            }
        }
        if sources.len() < shape.data_splits {
            if shape.total_splits() == 1 {
                // No redundancy, and the slab it replaces cannot be read: nothing ever will be
                // a source. Waiting would keep the range unwritable for good.
                self.range_contents_lost(range);
            }
            if self.recoverable_pages(range) == 0 {
                // Nothing a rebuild could bring back: the new slab is complete as it is.
                tracing::info!(range, split, "no page to rebuild: the new slab is complete empty");
                self.regeneration_complete(index);
                return;
            }
            // The new slab keeps taking writes (its `rebuilding` bit stays) while the rebuild
            // waits: a write it missed would be skipped as "written" by the next attempt.
            tracing::warn!(
                range,
                split,
                sources = sources.len(),
                "too few slabs reachable to rebuild from; retrying"
            );
            return self.requeue(index);
        }
        let message = Control::Regenerate {
            slab_id: target.slab_id,
            data_splits: shape.data_splits as u8,
            parity_splits: shape.parity_splits as u8,
            page_bytes: self.config.page_bytes as u32,
            pages: region.pages_per_range as u32,
            sources,
        };
        let Some(request_id) = self.send_control(target.node, &message) else {
            self.ranges[range].rebuilding &= !bit;
            self.regenerations[index].target = None;
            return self.requeue(index);
        };
        self.regenerations[index].state = State::Rebuilding { node: target.node, request_id };
    }

    /// Routes a control reply to the rebuild waiting for it. False if none was.
    pub(super) fn regeneration_reply(&mut self, from: NodeId, request_id: u64, message: &Control) -> bool {
        let Some(index) = self.regenerations.iter().position(|task| match task.state {
            State::Mapping { node, request_id: id } | State::Rebuilding { node, request_id: id } => {
                node == from && id == request_id
            }
            State::Queued { .. } => false,
        }) else {
            return false;
        };
        let (range, split) = (self.regenerations[index].range, self.regenerations[index].split);
        let bit = 1 << split;
        let pages_per_range = self.regions[self.ranges[range].region].pages_per_range;
        match (&self.regenerations[index].state, message) {
            (State::Mapping { node, .. }, Control::SlabMapped { slab_id, slots }) => {
                let target = SlabRef { node: *node, slab_id: *slab_id };
                if u64::from(*slots) != pages_per_range {
                    tracing::error!(node = %self.nodes[target.node].address, slots, "rebuild slab has the wrong size");
                    self.unmap_quietly(target.node, target.slab_id);
                    let split_bytes = self.regions[self.ranges[range].region].split_bytes;
                    self.count_unmapped_slab(target.node, split_bytes);
                    return {
                        self.requeue(index);
                        true
                    };
                }
                self.regenerations[index].target = Some(target);
                self.send_regenerate(index, target);
            }
            (State::Rebuilding { .. }, Control::Ok) => {}
            (
                State::Rebuilding { node, .. },
                Control::RegenerationDone { pages_rebuilt, pages_skipped, pages_lost, .. },
            ) => {
                let task = &self.regenerations[index];
                let seconds = (self.now - task.started).as_secs_f64();
                let node_address = self.nodes[*node].address;
                let unreadable = self.ranges[range].unreadable_pages;
                // A range without redundancy was copied from its only source: what the copy
                // lost, no retry can bring back (those pages read as lost: their slots are
                // empty).
                let shape = self.regions[self.ranges[range].region].shape;
                let single = shape.total_splits() == 1;
                let settled = split >= shape.data_splits
                    && self.parity_rebuild_settled(range, *pages_lost, *pages_rebuilt, task.lost_before);
                if *pages_lost > unreadable && !single && !settled {
                    self.regenerations[index].lost_before = Some(*pages_lost);
                    let task = &self.regenerations[index];
                    // Holes: the slab must not be read. Run the rebuild again on the same slab
                    // (what it rebuilt is kept) until every page is back.
                    // The slab keeps taking writes meanwhile (`rebuilding` stays set).
                    tracing::warn!(range, split, node = %node_address, reason = task.reason, pages_rebuilt,
                        pages_lost, attempt = task.attempts, "rebuild left pages behind; retrying");
                    self.requeue(index);
                    return true;
                }
                tracing::info!(range, split, node = %node_address, reason = task.reason, pages_rebuilt,
                    pages_skipped, pages_lost, seconds, "slab rebuilt");
                self.regeneration_complete(index);
            }
            (state, Control::Error { code, message }) => {
                tracing::warn!(range, split, ?state, ?code, %message, "rebuild refused; retrying");
                let (refusing, rebuilding) = match *state {
                    State::Mapping { node, .. } => (node, false),
                    State::Rebuilding { node, .. } => (node, true),
                    State::Queued { .. } => unreachable!("replies are routed only to rebuilds awaiting one"),
                };
                let split_bytes = self.regions[self.ranges[range].region].split_bytes;
                if rebuilding {
                    self.ranges[range].rebuilding &= !bit;
                    if let Some(target) = self.regenerations[index].target.take() {
                        if target.node == refusing {
                            self.unmap_quietly(refusing, target.slab_id);
                            self.count_unmapped_slab(refusing, split_bytes);
                        }
                    }
                } else {
                    // The map was refused: the slab counted when it was asked for never was.
                    self.count_unmapped_slab(refusing, split_bytes);
                }
                // The next attempt goes to another node if one can take the slab: the range
                // must not wait on a node busy with other rebuilds while another is free.
                self.regenerations[index].refused_by = Some(refusing);
                self.requeue(index);
            }
            (state, other) => {
                tracing::warn!(?state, kind = ?other.kind(), "unexpected reply during a rebuild");
            }
        }
        true
    }

    /// The rebuild `index` is done: its new slab is read from now on, the slab it replaced is
    /// released.
    fn regeneration_complete(&mut self, index: usize) {
        let task = self.regenerations.swap_remove(index);
        let (range, split) = (task.range, task.split);
        let bit = 1 << split;
        self.ranges[range].unavailable &= !bit;
        self.ranges[range].rebuilding &= !bit;
        let node = self.ranges[range].slabs[split].node;
        if self.nodes[node].unix_socket.is_some() && !self.shm.is_empty() {
            self.pending_exports.push((range, split));
        }
        self.forget_previous(range, split);
        if let Some(old) = task.old {
            let split_bytes = self.regions[self.ranges[range].region].split_bytes;
            self.release_slab(old, split_bytes);
        }
        self.regenerations_done += 1;
    }

    /// Whether a lossy rebuild of a parity split may be complete anyway: it lost no more pages
    /// than the range has unreadable or parity-stale pages, and this attempt brought nothing
    /// back that the previous one had lost (retrying changes nothing). A parity-stale page whose
    /// data split is corrupt has no k splits of its version, so no parity of it can be rebuilt;
    /// nothing of it is lost either: its parities held nothing it needs, and an empty slot
    /// serves it as well as a stale one until its parity write. A rebuild that lost pages to a
    /// source failing mid-way is retried first and gets them back then.
    fn parity_rebuild_settled(
        &self,
        range: usize,
        lost: u64,
        rebuilt: u64,
        lost_before: Option<u64>,
    ) -> bool {
        if rebuilt > 0 || lost_before != Some(lost) {
            return false;
        }
        let readable_stale = self.parity_stale_readable_pages(range);
        lost <= self.ranges[range].unreadable_pages + readable_stale
    }

    /// Releases a slab (of splits of `split_bytes`) no range names any more: unmapped now if its
    /// node is reachable, and its room counted free again, else remembered and released when
    /// the node answers again (its room is known again from the node then).
    pub(super) fn release_slab(&mut self, slab: SlabRef, split_bytes: usize) {
        match (self.nodes[slab.node].connected, self.nodes[slab.node].membership) {
            (_, Membership::Removed) => {}
            (true, _) => {
                self.unmap_quietly(slab.node, slab.slab_id);
                self.count_unmapped_slab(slab.node, split_bytes);
            }
            (false, _) => self.nodes[slab.node].orphans.push(slab.slab_id),
        }
    }

    pub(super) fn unmap_quietly(&mut self, node: NodeId, slab_id: u32) {
        // The reply is not awaited: it lands as an unclaimed control reply and is dropped.
        if self.send_control(node, &Control::UnmapSlab { slab_id }).is_none() {
            self.nodes[node].orphans.push(slab_id);
        }
    }

    /// A node failed: rebuilds that targeted it start over elsewhere (their slab there is
    /// released when it comes back); rebuilds using it as the old source go on without it.
    pub(super) fn regeneration_node_died(&mut self, dead: NodeId) {
        for index in 0..self.regenerations.len() {
            let task = &mut self.regenerations[index];

            let node = match task.state {
                State::Mapping { node, .. } | State::Rebuilding { node, .. } => Some(node),
                State::Queued { .. } => None,
            };
            let target_dead = task.target.is_some_and(|target| target.node == dead);
            if matches!(task.state, State::Mapping { node, .. } if node == dead) {
                // The node may still map the slab when it resumes (a stall), answering on a
                // connection that is gone: that slab's id is never learnt and it stays mapped
                // until slab leases reclaim it. Counted, so the leak is visible.
                self.maps_abandoned += 1;
            }
            if node == Some(dead) || target_dead {
                self.ranges[task.range].rebuilding &= !(1 << task.split);
                if let Some(target) = task.target.take() {
                    self.nodes[target.node].orphans.push(target.slab_id);
                }
                task.state = State::Queued { not_before: self.now };
            }
        }
    }

    /// The slab that range `range` names for `split` is gone (evicted): a rebuild into it starts
    /// over.
    pub(super) fn slab_gone(&mut self, range: usize, split: usize) {
        let bit = 1 << split;
        let slab = self.ranges[range].slabs[split];
        for task in &mut self.regenerations {
            if task.range == range && task.split == split && task.target == Some(slab) {
                self.ranges[range].rebuilding &= !bit;
                task.target = None;
                task.state = State::Queued { not_before: self.now };
            }
        }
    }

    /// The old slabs rebuilds keep as sources.
    pub(super) fn regenerations_old_sources(&self) -> impl Iterator<Item = SlabRef> + '_ {
        self.regenerations.iter().filter_map(|task| task.old)
    }

    /// A slab kept as a rebuild source is gone: stop naming it.
    pub(super) fn forget_source(&mut self, node: NodeId, slab_id: u32) {
        let gone = SlabRef { node, slab_id };
        for index in 0..self.regenerations.len() {
            let task = &mut self.regenerations[index];
            if task.old == Some(gone) {
                task.old = None;
                let (range, split) = (task.range, task.split);
                self.forget_previous(range, split);
            }
        }
    }
}

/// A node's failure domain as the client counts splits per domain: its label, or, unlabelled, a
/// domain of its own (placement's rule). One definition for first placements and rebuilds.
pub(crate) fn failure_domain_key(label: &str, node: usize) -> (&str, usize) {
    match label {
        "" => ("", node),
        domain => (domain, usize::MAX),
    }
}
