//! What a scenario does to the simulated client besides page ops: regions, control round trips,
//! membership, faults at chosen times, a client crash and its reopen from the saved map.

use super::*;

impl SimDriver {
    // ---- regions ----------------------------------------------------------------------------

    /// Maps a region of `page_count` pages coded with `shape`: per range, k+r nodes from the
    /// placement policy and a `MapSlab` round trip per slab, as the blocking driver does.
    pub fn create_region(&mut self, shape: Shape, page_count: u64) -> Result<RegionInfo, String> {
        self.create_region_pinned(shape, page_count, None)
    }

    /// Maps a region of `page_count` pages without redundancy (k = 1, r = 0) beside region
    /// `beside`, page for page: each range on the node of split `split` of the range of `beside`
    /// holding the same pages, as `Client::create_region_beside` does.
    pub fn create_region_beside(
        &mut self,
        shape: Shape,
        page_count: u64,
        beside: &RegionInfo,
        split: usize,
    ) -> Result<RegionInfo, String> {
        if shape.total_splits() != 1 {
            return Err(format!("a region beside another has one split per range, not {shape:?}"));
        }
        let (_, pages_per_range) = self.range_geometry(shape)?;
        let nodes = self
            .engine
            .nodes_beside(beside.index, split, pages_per_range, page_count)
            .map_err(|error| error.to_string())?;
        let region = self.create_region_pinned(shape, page_count, Some(nodes))?;
        // Rebuilds of either region keep its slabs off the other's data nodes.
        self.engine.set_region_beside(region.index, beside.index, split);
        Ok(region)
    }

    /// Split bytes and pages per range of a region of `shape` on the cluster's slabs.
    pub(super) fn range_geometry(&self, shape: Shape) -> Result<(usize, u64), String> {
        let params = CodecParams::new(shape.data_splits, shape.parity_splits, self.config.page_bytes)
            .map_err(|error| error.to_string())?;
        let split_bytes = params.split_bytes();
        let slab_size = self.engine.nodes().iter().map(|node| node.info.slab_size_bytes).max().unwrap_or(0);
        if slab_size < split_bytes as u64 {
            return Err(format!("slabs of {slab_size} bytes cannot hold splits of {split_bytes}"));
        }
        Ok((split_bytes, slab_size / split_bytes as u64))
    }

    /// [`SimDriver::create_region`], or with `pinned` each range's one slab on `pinned[range]`.
    fn create_region_pinned(
        &mut self,
        shape: Shape,
        page_count: u64,
        pinned: Option<Vec<NodeId>>,
    ) -> Result<RegionInfo, String> {
        assert!(page_count > 0 && shape.extra_reads <= shape.parity_splits);
        let (split_bytes, pages_per_range) = self.range_geometry(shape)?;
        let range_count = page_count.div_ceil(pages_per_range);
        let first_page = self.engine.page_count();
        let first_range = self.engine.ranges().len();
        let mut loads: Vec<NodeLoad> = self
            .engine
            .nodes()
            .iter()
            .enumerate()
            .filter(|(index, node)| {
                node.connected
                    && node.membership == remem_client::engine::Membership::Member
                    && !self.removed[*index]
            })
            .map(|(index, node)| NodeLoad {
                node_index: index,
                failure_domain: node.info.failure_domain.clone(),
                slabs_mapped: u64::from(node.info.slabs_mapped),
                slabs_free: node.info.free_bytes / node.info.slab_size_bytes.max(1),
            })
            .collect();
        let mut ranges = Vec::with_capacity(range_count as usize);
        for local_range in 0..range_count {
            let nodes = match &pinned {
                Some(pinned) => vec![pinned[local_range as usize]],
                None => {
                    self.engine
                        .placement_mut()
                        .place(&loads, shape.total_splits())
                        .map_err(|error| format!("placement: {error}"))?
                        .nodes
                }
            };
            let mut slabs = Vec::with_capacity(shape.total_splits());
            for (split, &node) in nodes.iter().enumerate() {
                let message = Control::MapSlab {
                    split_bytes: split_bytes as u32,
                    split_index: split as u8,
                    first_page: first_page + local_range * pages_per_range,
                    range_id: (first_range as u64) + local_range,
                };
                match self.control(node, &message)? {
                    Control::SlabMapped { slab_id, slots } if u64::from(slots) == pages_per_range => {
                        slabs.push(SlabRef { node, slab_id });
                    }
                    other => return Err(format!("node {node} answered MapSlab with {other:?}")),
                }
                if let Some(load) = loads.iter_mut().find(|load| load.node_index == node) {
                    load.slabs_mapped += 1;
                    load.slabs_free = load.slabs_free.saturating_sub(1);
                }
            }
            ranges.push(slabs);
        }
        self.saved_ranges.extend(ranges.iter().cloned());
        let info = self.engine.add_region(shape, page_count, pages_per_range, ranges, true);
        self.saved_regions.push(SavedRegion {
            shape,
            page_count,
            pages_per_range,
            first_range,
            range_count: range_count as usize,
        });
        self.settle();
        Ok(info)
    }

    /// One control request and the loop run until its reply (at most a request timeout).
    pub fn control(&mut self, node: NodeId, message: &Control) -> Result<Control, String> {
        let Some(id) = self.engine.queue_control(node, message) else {
            return Err(format!("node {node} is not connected"));
        };
        self.settle();
        let deadline = self.now + self.config.request_timeout.as_nanos() as SimTime;
        loop {
            if let Some((_, reply)) = self.engine.take_control_reply(id) {
                return match reply {
                    Control::Error { code, message } => {
                        Err(format!("node {node} refused: {code:?}: {message}"))
                    }
                    reply => Ok(reply),
                };
            }
            if !self.engine.node(node).connected {
                self.engine.forget_control(id);
                return Err(format!("node {node} went down"));
            }
            if !self.step(deadline) {
                self.engine.forget_control(id);
                return Err(format!("node {node} did not answer in time"));
            }
        }
    }

    // ---- membership -------------------------------------------------------------------------

    /// A new node joins the cluster and the client at run time. Returns its id (= its index).
    pub fn add_node(&mut self, failure_domain: String, capacity_slabs: u32, slab_size_bytes: u64) -> NodeId {
        let node = self.cluster.add_node(failure_domain, capacity_slabs, slab_size_bytes);
        self.inputs.push(Vec::new());
        self.removed.push(false);
        let info = self.cluster.connect(self.now, node, self.config.client_id).expect("a new node is alive");
        self.stats.connects += 1;
        let address = self.cluster.node_address(node);
        let instant = self.instant();
        let id = self.engine.add_node(instant, address, None, info, true);
        assert_eq!(id, node, "engine node ids follow cluster node indices");
        self.note(|| format!("node {node} added"));
        self.settle();
        id
    }

    /// Drains a node: the engine rebuilds its slabs elsewhere.
    pub fn drain_node(&mut self, node: NodeId) {
        self.note(|| format!("node {node} drained"));
        let instant = self.instant();
        self.engine.drain_node(instant, node);
        self.settle();
    }

    /// Removes a node for good.
    pub fn remove_node(&mut self, node: NodeId) {
        self.note(|| format!("node {node} removed"));
        self.removed[node] = true;
        let instant = self.instant();
        self.engine.remove_node(instant, node);
        self.settle();
    }

    // ---- faults -----------------------------------------------------------------------------

    /// Applies `faults` when the time reaches each (they are merged with those already planned,
    /// by time; faults in the past apply at the next step).
    pub fn schedule_faults(&mut self, faults: &[ScheduledFault]) {
        let mut all: Vec<ScheduledFault> = self.faults.drain(..).chain(faults.iter().copied()).collect();
        all.sort_by_key(|fault| (fault.at, fault.node));
        self.faults = all.into();
    }

    /// Faults planned and not applied yet.
    pub fn pending_faults(&self) -> usize {
        self.faults.len()
    }

    /// Applies one fault now (whatever its `at`), counting it.
    pub fn apply_fault(&mut self, fault: &ScheduledFault) {
        let now = self.now;
        let result = self.cluster.apply_fault(now, fault);
        let node = fault.node;
        match result {
            Err(error) => {
                self.tally.refused += 1;
                self.note(|| format!("fault {:?} on node {node} refused: {error}", fault.action));
            }
            Ok(()) => {
                self.note(|| format!("fault {:?} on node {node}", fault.action));
                let timeout = self.config.request_timeout.as_nanos() as SimTime;
                match fault.action {
                    FaultAction::Kill => self.tally.kills += 1,
                    FaultAction::RestartEmpty => self.tally.restarts_empty += 1,
                    FaultAction::Stall { until } if until.saturating_sub(now) < timeout => {
                        self.tally.short_stalls += 1
                    }
                    FaultAction::Stall { .. } => self.tally.long_stalls += 1,
                    FaultAction::Partition { .. } => self.tally.partitions += 1,
                    FaultAction::ExtraDelay { .. } => self.tally.stragglers += 1,
                    FaultAction::FlipBits { .. } => self.tally.bit_flips += 1,
                    FaultAction::Evict => self.tally.evictions += 1,
                    FaultAction::DropNextWrites { .. } => self.tally.dropped_writes += 1,
                }
            }
        }
    }

    /// Applies `action` to `node` now.
    pub fn fault_now(&mut self, node: usize, action: FaultAction) {
        self.apply_fault(&ScheduledFault { at: self.now, node, action });
    }

    // ---- client crash -----------------------------------------------------------------------

    /// Saves the slab map after a rebuild finished: per range and split, the slab the range names
    /// if it is complete (available), else the one saved before. A client saves its map after
    /// connecting and after rebuilds; a half-rebuilt slab is never in it.
    pub(super) fn maybe_save_map(&mut self) {
        let done = self.engine.regeneration_status().done;
        if done == self.saved_at_rebuilds_done {
            return;
        }
        self.saved_at_rebuilds_done = done;
        self.saved_lost_pages = self.engine.lost_page_runs();
        for (index, range) in self.engine.ranges().iter().enumerate() {
            for (split, slab) in range.slabs.iter().enumerate() {
                if range.unavailable & (1 << split) == 0 {
                    self.saved_ranges[index][split] = *slab;
                }
            }
        }
    }

    /// The slab map a client saved (see [`SimDriver::reopen`]).
    pub fn saved_map(&self) -> &[Vec<SlabRef>] {
        &self.saved_ranges
    }

    /// The client process crashes: the engine is dropped (a new one is built by
    /// [`SimDriver::reopen`]), its connections close, and what it had sent and not yet delivered
    /// meets `fate` (with `Random`, writes in flight are torn across nodes). Returns the ops that
    /// had no result; the time then runs on for `downtime` without a client.
    pub fn crash_client(&mut self, fate: InFlightFate, downtime: SimTime) -> Vec<AbandonedOp> {
        self.note(|| format!("client crashes ({fate:?}), down for {downtime} ns"));
        self.cluster.crash_client(self.now, self.config.client_id, fate);
        self.stats.client_crashes += 1;
        self.tally.client_crashes += 1;
        let abandoned: Vec<AbandonedOp> = self
            .ops
            .iter_mut()
            .filter_map(Option::take)
            .map(|entry| AbandonedOp {
                id: entry.id,
                page: entry.page,
                is_write: entry.kind.is_write(),
                kind: entry.kind,
                started: entry.started,
            })
            .collect();
        self.ops.clear();
        self.free_tags.clear();
        self.queue.clear();
        self.inputs.iter_mut().for_each(Vec::clear);
        // A fresh engine that knows nothing yet stands in until `reopen`; the time runs without
        // a client: only the cluster's events and planned faults happen.
        let placeholder = Engine::new(self.config.clone(), self.placement.build(0), self.instant());
        drop(std::mem::replace(&mut self.engine, placeholder));
        let until = self.now + downtime;
        loop {
            let cluster = self.cluster.next_event_time();
            let fault = self.faults.front().map(|fault| fault.at.max(self.now));
            let Some(at) = [cluster, fault].into_iter().flatten().min().filter(|at| *at <= until) else {
                break;
            };
            self.now = at.max(self.now);
            while self.faults.front().is_some_and(|fault| fault.at <= self.now) {
                let fault = self.faults.pop_front().expect("checked");
                self.apply_fault(&fault);
            }
            let mut deliveries = std::mem::take(&mut self.deliveries);
            self.cluster.poll(self.now, &mut deliveries);
            deliveries.clear();
            self.deliveries = deliveries;
        }
        self.now = until.max(self.now);
        let mut deliveries = std::mem::take(&mut self.deliveries);
        self.cluster.poll(self.now, &mut deliveries);
        deliveries.clear();
        self.deliveries = deliveries;
        abandoned
    }

    /// A new engine with the same client id reopens the saved slab map: every node connected
    /// again (those that refuse join unreachable and count as failed), every region added back
    /// with its pages' versions unknown, placement by LeastLoaded, as `Client::reopen`.
    pub fn reopen(&mut self) {
        self.note(|| "client reopens its saved slab map".to_owned());
        // As `Client::reopen`: the map does not record the policy, a reopened client places its
        // rebuilt slabs with LeastLoaded.
        self.placement_seed = self.placement_seed.wrapping_add(1);
        let placement = PlacementPolicy::LeastLoaded.build(self.placement_seed);
        self.engine = Engine::new(self.config.clone(), placement, self.instant());
        self.steps_at_now = 0;
        self.join_all_nodes();
        for region in self.saved_regions.clone() {
            let ranges =
                self.saved_ranges[region.first_range..region.first_range + region.range_count].to_vec();
            self.engine.add_region(region.shape, region.page_count, region.pages_per_range, ranges, false);
        }
        self.engine.mark_lost_unless_found(&self.saved_lost_pages);
        let instant = self.instant();
        for node in 0..self.removed.len() {
            if self.removed[node] {
                self.engine.remove_node(instant, node);
            }
        }
        self.engine.fail_unreachable_nodes(instant);
        self.saved_at_rebuilds_done = 0;
        self.settle();
    }

    // ---- checks -----------------------------------------------------------------------------
}
