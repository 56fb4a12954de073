//! Failure handling that outlives one op: slabs that became unavailable (node failed or hung,
//! slab evicted, too many corrupt splits) are rebuilt on another node in the background
//! (seed 000 §4.2 "Background Slab Regeneration"), driven by the client's own event loop.
//!
//! The client does not rebuild anything itself: it maps an empty slab on a new node (one that
//! holds no other slab of the range), points the range at it for writes, and hands the rebuild
//! to that node with the list of surviving slabs. The new node reads k of them, decodes, and
//! stores each page unless the client wrote it since the rebuild began, so writes never wait
//! (the seed blocks them). Reads skip the slab until the node reports `RegenerationDone`.
//!
//! Invariant: a split is read only from a slab whose bit is clear in `unavailable`; a slab
//! being rebuilt keeps its bit set until the rebuild is reported done.

use std::time::{Duration, Instant};

use remem_placement::NodeLoad;
use remem_proto::{Control, RegenerationSource};

use super::{Client, SlabRef, CONTROL_REQUEST};

/// How long a rebuild that could not start waits before trying again.
const RETRY_DELAY: Duration = Duration::from_millis(500);
/// Corrupt-split counters halve every this many splits read from a node, so the rate follows
/// the node's recent behaviour.
const ERROR_WINDOW_SPLITS: u64 = 8192;

#[derive(Debug)]
pub(super) struct Regeneration {
    range: usize,
    split: usize,
    reason: &'static str,
    state: State,
    started: Instant,
}

#[derive(Debug)]
enum State {
    Queued { not_before: Instant },
    Mapping { node: usize, request_id: u64 },
    Rebuilding { node: usize, request_id: u64 },
}

/// Progress of background work, for tests and the CLI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegenerationStatus {
    pub in_flight: usize,
    pub done: u64,
}

impl Client {
    fn next_control_id(&mut self) -> u64 {
        self.control_counter += 1;
        CONTROL_REQUEST | self.control_counter
    }

    /// Marks a slab unavailable and, if enabled, queues its rebuild (once per slab).
    pub(super) fn schedule_regeneration(&mut self, range: usize, split: usize, reason: &'static str) {
        let bit = 1 << split;
        self.ranges[range].unavailable |= bit;
        // An unavailable slab is never read or written through shared memory again.
        self.drop_shm(range, split);
        if !self.config.regenerate {
            return;
        }
        if self.regenerations.iter().any(|task| task.range == range && task.split == split) {
            return;
        }
        tracing::info!(range, split, reason, "slab lost: rebuilding it elsewhere");
        self.regenerations.push(Regeneration {
            range,
            split,
            reason,
            state: State::Queued { not_before: Instant::now() },
            started: Instant::now(),
        });
    }

    /// Starts queued rebuilds whose time has come. Called from the event loop.
    pub(super) fn drive_regenerations(&mut self) {
        let now = Instant::now();
        for index in 0..self.regenerations.len() {
            if let State::Queued { not_before } = self.regenerations[index].state {
                if not_before <= now {
                    self.start_mapping(index);
                }
            }
        }
    }

    fn start_mapping(&mut self, index: usize) {
        let (range, split) = (self.regenerations[index].range, self.regenerations[index].split);
        let in_range: Vec<usize> = self.ranges[range].slabs.iter().map(|slab| slab.node).collect();
        let candidates: Vec<NodeLoad> = self
            .conns
            .iter()
            .enumerate()
            .filter(|(_, conn)| conn.alive)
            .map(|(node, conn)| NodeLoad {
                node_index: node,
                failure_domain: conn.info.failure_domain.clone(),
                slabs_mapped: conn.info.slabs_mapped as u64,
                slabs_free: conn.info.free_bytes / conn.info.slab_size_bytes.max(1),
            })
            .collect();
        let Ok(node) = self.placement.replace(&candidates, &in_range) else {
            tracing::warn!(range, split, "no node can take the rebuilt slab yet; retrying");
            self.regenerations[index].state = State::Queued { not_before: Instant::now() + RETRY_DELAY };
            return;
        };
        let request_id = self.next_control_id();
        let message = Control::MapSlab {
            split_bytes: self.split_bytes as u32,
            split_index: split as u8,
            first_page: range as u64 * self.pages_per_range,
            range_id: range as u64,
        };
        message.encode(request_id, &mut self.conns[node].out);
        super::mark_queued(&mut self.send_order, &mut self.conns[node], node);
        // Count the slab now so that two rebuilds do not pile onto one node.
        self.conns[node].info.slabs_mapped += 1;
        self.conns[node].info.free_bytes =
            self.conns[node].info.free_bytes.saturating_sub(self.conns[node].info.slab_size_bytes);
        self.regenerations[index].state = State::Mapping { node, request_id };
    }

    /// Routes a control reply to the rebuild waiting for it. False if none was.
    pub(super) fn regeneration_reply(&mut self, from: usize, request_id: u64, message: &Control) -> bool {
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
        match (&self.regenerations[index].state, message) {
            (State::Mapping { node, .. }, Control::SlabMapped { slab_id, slots }) => {
                let node = *node;
                if u64::from(*slots) != self.pages_per_range {
                    tracing::error!(node = %self.conns[node].address, slots, "rebuild slab has the wrong size");
                    self.unmap_quietly(node, *slab_id);
                    self.regenerations[index].state =
                        State::Queued { not_before: Instant::now() + RETRY_DELAY };
                    return true;
                }
                let old = self.ranges[range].slabs[split];
                if self.conns[old.node].alive {
                    // Corruption or a hang that came back: the old slab is dropped.
                    self.unmap_quietly(old.node, old.slab_id);
                }
                self.drop_shm(range, split);
                self.ranges[range].slabs[split] = SlabRef { node, slab_id: *slab_id };
                self.ranges[range].rebuilding |= bit;
                let unavailable = self.ranges[range].unavailable;
                let sources: Vec<RegenerationSource> = (0..self.config.shape.total_splits())
                    .filter(|&other| unavailable & (1 << other) == 0)
                    .map(|other| {
                        let slab = self.ranges[range].slabs[other];
                        RegenerationSource {
                            split_index: other as u8,
                            slab_id: slab.slab_id,
                            address: self.conns[slab.node].address,
                        }
                    })
                    .collect();
                if sources.len() < self.config.shape.data_splits {
                    tracing::error!(
                        range,
                        split,
                        sources = sources.len(),
                        "too few slabs left to rebuild from"
                    );
                    self.ranges[range].rebuilding &= !bit;
                    self.regenerations.swap_remove(index);
                    return true;
                }
                let request_id = self.next_control_id();
                let message = Control::Regenerate {
                    slab_id: *slab_id,
                    data_splits: self.config.shape.data_splits as u8,
                    parity_splits: self.config.shape.parity_splits as u8,
                    page_bytes: self.config.page_bytes as u32,
                    pages: self.pages_per_range as u32,
                    sources,
                };
                message.encode(request_id, &mut self.conns[node].out);
                super::mark_queued(&mut self.send_order, &mut self.conns[node], node);
                self.regenerations[index].state = State::Rebuilding { node, request_id };
            }
            (State::Rebuilding { .. }, Control::Ok) => {}
            (
                State::Rebuilding { node, .. },
                Control::RegenerationDone { pages_rebuilt, pages_skipped, pages_lost, .. },
            ) => {
                let task = &self.regenerations[index];
                tracing::info!(
                    range,
                    split,
                    node = %self.conns[*node].address,
                    reason = task.reason,
                    pages_rebuilt,
                    pages_skipped,
                    pages_lost,
                    seconds = task.started.elapsed().as_secs_f64(),
                    "slab rebuilt"
                );
                self.ranges[range].unavailable &= !bit;
                self.ranges[range].rebuilding &= !bit;
                if matches!(self.conns[*node].stream, super::ConnStream::Unix(_)) {
                    self.pending_exports.push((range, split));
                }
                self.regenerations.swap_remove(index);
                self.regenerations_done += 1;
            }
            (state, Control::Error { code, message }) => {
                tracing::warn!(range, split, ?state, ?code, %message, "rebuild refused; retrying");
                if let State::Rebuilding { node, .. } = *state {
                    self.ranges[range].rebuilding &= !bit;
                    let slab = self.ranges[range].slabs[split];
                    if slab.node == node {
                        self.unmap_quietly(node, slab.slab_id);
                    }
                }
                self.regenerations[index].state = State::Queued { not_before: Instant::now() + RETRY_DELAY };
            }
            (state, other) => {
                tracing::warn!(?state, kind = ?other.kind(), "unexpected reply during a rebuild");
            }
        }
        true
    }

    fn unmap_quietly(&mut self, node: usize, slab_id: u32) {
        // The reply is not awaited: it lands as an unclaimed control reply and is dropped.
        let request_id = self.next_control_id();
        Control::UnmapSlab { slab_id }.encode(request_id, &mut self.conns[node].out);
        super::mark_queued(&mut self.send_order, &mut self.conns[node], node);
    }

    /// A node died: rebuilds it was part of start over.
    pub(super) fn regeneration_node_died(&mut self, dead: usize) {
        for task in &mut self.regenerations {
            let node = match task.state {
                State::Mapping { node, .. } | State::Rebuilding { node, .. } => node,
                State::Queued { .. } => continue,
            };
            if node == dead {
                self.ranges[task.range].rebuilding &= !(1 << task.split);
                task.state = State::Queued { not_before: Instant::now() };
            }
        }
    }

    /// The node told us it evicted one of our slabs: like a failure of that slab alone.
    pub(super) fn slab_evicted(&mut self, node: usize, slab_id: u32) {
        for range in 0..self.ranges.len() {
            for split in 0..self.config.shape.total_splits() {
                let slab = self.ranges[range].slabs[split];
                if slab.node == node && slab.slab_id == slab_id {
                    tracing::warn!(node = %self.conns[node].address, range, split, "slab evicted");
                    self.fail_pending_on(range, split);
                    let bit = 1 << split;
                    if self.ranges[range].rebuilding & bit != 0 {
                        self.ranges[range].rebuilding &= !bit;
                        for task in &mut self.regenerations {
                            if task.range == range && task.split == split {
                                task.state = State::Queued { not_before: Instant::now() };
                            }
                        }
                    }
                    self.schedule_regeneration(range, split, "slab evicted");
                }
            }
        }
    }

    /// Counts one split read from `node` (the denominator of its error rate).
    pub(super) fn record_split_read(&mut self, node: usize) {
        let stats = &mut self.node_stats[node];
        stats.splits_read += 1;
        if stats.splits_read >= ERROR_WINDOW_SPLITS {
            stats.splits_read /= 2;
            stats.splits_corrupt /= 2;
        }
    }

    /// A split from `node` failed its checksum. Past the regeneration limit, every slab of this
    /// client on that node is rebuilt elsewhere.
    pub(super) fn record_corruption(&mut self, node: usize) {
        let stats = &mut self.node_stats[node];
        stats.splits_corrupt += 1;
        stats.corrupt_total += 1;
        let trusted = stats.splits_read >= self.config.error_rate_min_samples;
        if !(trusted && stats.error_rate() >= self.config.slab_regeneration_limit) {
            return;
        }
        tracing::warn!(node = %self.conns[node].address, rate = stats.error_rate(), "node corrupts too often");
        // Reset, so that one burst of errors triggers one rebuild.
        stats.splits_read = 0;
        stats.splits_corrupt = 0;
        for range in 0..self.ranges.len() {
            for split in 0..self.config.shape.total_splits() {
                let slab = self.ranges[range].slabs[split];
                if slab.node == node && self.ranges[range].unavailable & (1 << split) == 0 {
                    self.schedule_regeneration(range, split, "corruption");
                }
            }
        }
    }

    /// True when a node of the range corrupts above the error-correction limit.
    pub(super) fn range_has_suspect_node(&self, range: usize) -> bool {
        self.ranges[range].slabs.iter().any(|slab| {
            let stats = &self.node_stats[slab.node];
            stats.splits_read >= self.config.error_rate_min_samples
                && stats.error_rate() >= self.config.error_correction_limit
        })
    }

    /// Runs the event loop for at most `timeout` without page I/O: rebuild progress, eviction
    /// notices, connection failures. Applications call it when idle; `execute` does it too.
    pub fn poll_background(&mut self, timeout: Duration) {
        if !self.pending_exports.is_empty() && self.active == 0 {
            self.export_rebuilt_slabs();
        }
        self.drive_regenerations();
        self.flush_all();
        self.wait_and_read(&mut [], Some(timeout));
        self.process_events(&mut [], &mut |_| {});
        self.drive_regenerations();
        self.flush_all();
    }

    /// Drives background work until no rebuild is in flight or `timeout` passes. True if done.
    pub fn wait_for_regenerations(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.regenerations.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.poll_background((deadline - now).min(Duration::from_millis(100)));
        }
        true
    }

    pub fn regeneration_status(&self) -> RegenerationStatus {
        RegenerationStatus { in_flight: self.regenerations.len(), done: self.regenerations_done }
    }

    pub fn node_stats(&self) -> &[super::NodeStats] {
        &self.node_stats
    }
}
