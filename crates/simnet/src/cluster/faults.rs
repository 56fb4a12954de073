//! The faults a scenario injects into the simulated cluster, each at a given simulated time.

use super::*;

impl SimCluster {
    /// The node's process dies: its memory, queued input and running rebuilds are gone, each
    /// open connection's client gets `ConnectionLost` after the replies already on the wire, and
    /// `connect` fails until `restart_empty`.
    ///
    /// Errors: `NoSuchNode`, `NodeDead`.
    pub fn kill(&mut self, now: SimTime, node: usize) -> Result<(), SimError> {
        self.advance(now);
        self.check_alive(node)?;
        self.nodes[node].die();
        self.jobs.retain(|_, job| job.node != node);
        for id in self.connections_of(node) {
            self.close_node_end(now, id, LostNotice::AfterReplies);
        }
        self.counts.kills += 1;
        Ok(())
    }

    /// The node comes back with no slabs (a new process on the same host: same index, address,
    /// failure domain and capacity, and a new node id, as a real node draws one at start, so a
    /// client can tell a new life from a stall). A live node is killed first (counted as a kill).
    /// Clients must `connect` again.
    pub fn restart_empty(&mut self, now: SimTime, node: usize) -> Result<(), SimError> {
        self.advance(now);
        self.check_node(node)?;
        if self.nodes[node].alive {
            self.kill(now, node)?;
        }
        // A new process: a new node id, as a real node draws one at start.
        self.nodes[node].restart();
        self.counts.restarts += 1;
        Ok(())
    }

    /// Like SIGSTOP until `until`: the node reads and answers nothing, runs no rebuild and refuses
    /// new connections; then it serves what queued up, in order. Replies already on the wire
    /// still arrive. A second stall extends the first; one that ends by `now` changes nothing.
    /// (The simulator's own faults still reach a stalled node: `evict` sends its notice at once,
    /// so a runner that wants a frozen node leaves it alone.)
    ///
    /// Errors: `NoSuchNode`, `NodeDead`.
    pub fn stall(&mut self, now: SimTime, node: usize, until: SimTime) -> Result<(), SimError> {
        self.advance(now);
        self.check_alive(node)?;
        let state = &mut self.nodes[node];
        state.stalled_until = state.stalled_until.max(until);
        self.schedule(until.max(now), Event::Wake { node });
        self.counts.stalls += 1;
        Ok(())
    }

    /// Cuts the node off the network until `until`: every message to or from it is lost
    /// (including replies already on the wire, and its rebuilds' reads of other nodes, and other
    /// rebuilds' reads of it), its connections close (their clients hear of it as `notice`
    /// says), and `connect` fails until then. Its memory survives. A dead node may be
    /// partitioned too (it stays unreachable after a restart until `until`).
    ///
    /// Errors: `NoSuchNode`.
    pub fn partition(
        &mut self,
        now: SimTime,
        node: usize,
        until: SimTime,
        notice: PartitionNotice,
    ) -> Result<(), SimError> {
        self.advance(now);
        self.check_node(node)?;
        let state = &mut self.nodes[node];
        state.partitioned_until = state.partitioned_until.max(until);
        for id in self.connections_of(node) {
            self.connections.get_mut(&id).expect("listed").cut = true;
            self.close_node_end(now, id, LostNotice::Partition(notice));
        }
        self.counts.partitions += 1;
        Ok(())
    }

    /// Makes the node a straggler: each reply it sends from now on takes `delay_ns` plus up to
    /// `jitter_ns` (uniform) longer. `(0, 0)` makes it normal again. Survives restarts (it is the
    /// host that is slow).
    pub fn set_extra_delay(
        &mut self,
        now: SimTime,
        node: usize,
        delay_ns: SimTime,
        jitter_ns: SimTime,
    ) -> Result<(), SimError> {
        self.advance(now);
        self.check_node(node)?;
        let state = &mut self.nodes[node];
        state.extra_delay_ns = delay_ns;
        state.extra_jitter_ns = jitter_ns;
        if delay_ns > 0 || jitter_ns > 0 {
            self.counts.stragglers += 1;
        }
        Ok(())
    }

    /// Flips `flips` random bits in the split bytes of written slots (version != 0) of slab
    /// `slab_id`, as the node's `Corrupt` fault does; metadata is untouched, so the splits fail
    /// their checksums. Returns the slots hit, sorted, without repeats (empty if none is
    /// written).
    ///
    /// Errors: `NoSuchNode`, `NodeDead`, `UnknownSlab`.
    pub fn flip_bits(
        &mut self,
        now: SimTime,
        node: usize,
        slab_id: u32,
        flips: u32,
    ) -> Result<Vec<u32>, SimError> {
        self.advance(now);
        self.check_alive(node)?;
        let slab = self.nodes[node]
            .core
            .table
            .get_any(slab_id)
            .map_err(|_| SimError::UnknownSlab { node, slab_id })?;
        let written: Vec<u32> = (0..slab.slots()).filter(|slot| slab.meta(*slot).version != 0).collect();
        let mut hit = Vec::new();
        if !written.is_empty() {
            let bits = slab.split_bytes() as usize * 8;
            for _ in 0..flips {
                let slot = written[self.fault_rng.gen_range(0..written.len())];
                slab.flip_bit(slot, self.fault_rng.gen_range(0..bits));
                hit.push(slot);
            }
            self.counts.bits_flipped += u64::from(flips);
        }
        hit.sort_unstable();
        hit.dedup();
        self.counts.bit_flip_faults += 1;
        Ok(hit)
    }

    /// Flips bit `bit` (below the split size in bits) of the split stored in `slot` of slab
    /// `slab_id`, metadata untouched: that one split fails its checksum. The targeted form of
    /// [`SimCluster::flip_bits`], for scenarios that need given pages corrupt on given nodes
    /// (counted like it: one fault, one bit).
    ///
    /// Errors: `NoSuchNode`, `NodeDead`, `UnknownSlab` (also for a slot or bit out of range).
    pub fn corrupt_split(
        &mut self,
        now: SimTime,
        node: usize,
        slab_id: u32,
        slot: u32,
        bit: usize,
    ) -> Result<(), SimError> {
        self.advance(now);
        self.check_alive(node)?;
        let slab = self.nodes[node]
            .core
            .table
            .get_any(slab_id)
            .map_err(|_| SimError::UnknownSlab { node, slab_id })?;
        if slot >= slab.slots() || bit >= slab.split_bytes() as usize * 8 {
            return Err(SimError::UnknownSlab { node, slab_id });
        }
        slab.flip_bit(slot, bit);
        self.counts.bit_flip_faults += 1;
        self.counts.bits_flipped += 1;
        Ok(())
    }

    /// Evicts slab `slab_id` as a node under memory pressure does: `SlabEvicted { slab_id }`
    /// (request id 0) goes to the owner's open connection to this node, then the slab is unmapped
    /// (`UnknownSlab` from then on; a rebuild filling it stops and reports).
    ///
    /// Errors: `NoSuchNode`, `NodeDead`, `UnknownSlab`.
    pub fn evict(&mut self, now: SimTime, node: usize, slab_id: u32) -> Result<(), SimError> {
        self.advance(now);
        self.check_alive(node)?;
        // The core's eviction: the owner's connections are told first, then the slab is unmapped.
        let mut told = Vec::new();
        let connections = &self.connections;
        self.nodes[node]
            .core
            .evict_slab(slab_id, |owner| {
                told.extend(
                    connections
                        .iter()
                        .filter(|(_, connection)| {
                            connection.node == node && connection.client_id == owner && connection.node_open
                        })
                        .map(|(id, _)| *id),
                );
                told.len()
            })
            .map_err(|_| SimError::UnknownSlab { node, slab_id })?;
        let mut notice = Vec::new();
        Control::SlabEvicted { slab_id }.encode(0, &mut notice);
        for id in told {
            self.send_to_client(now, id, notice.clone());
        }
        self.counts.evictions += 1;
        Ok(())
    }

    /// The node silently drops the next `count` `WriteSplit` frames it receives: no reply, nothing
    /// stored. To the client a write to this node never lands and never answers (it times out),
    /// as if it had been lost between the client's buffer and the slab. Other frames are served
    /// normally. Reset by a kill.
    ///
    /// For torn writes across nodes from a client crash, see [`SimCluster::crash_client`].
    ///
    /// Errors: `NoSuchNode`, `NodeDead`.
    pub fn drop_next_writes(&mut self, now: SimTime, node: usize, count: u32) -> Result<(), SimError> {
        self.advance(now);
        self.check_alive(node)?;
        self.nodes[node].writes_to_drop += count;
        self.counts.writes_armed_to_drop += u64::from(count);
        Ok(())
    }

    /// The client process `client_id` crashes: every connection it has closes on its side (no
    /// more deliveries to it), and what it had sent but not yet delivered meets `fate`. What
    /// arrives is served as usual (replies go nowhere), then the node sees the close. A crash
    /// while a write's splits are in flight, with [`InFlightFate::Random`], leaves the page torn:
    /// some nodes hold the new version, others the old one. The client restarts by `connect`ing
    /// again with the same id; its slabs are still its own.
    pub fn crash_client(&mut self, now: SimTime, client_id: u64, fate: InFlightFate) {
        self.advance(now);
        let crashed: Vec<u64> =
            self.current.iter().filter(|((_, client), _)| *client == client_id).map(|(_, id)| *id).collect();
        let delivered_ppm = match fate {
            InFlightFate::Delivered => 1_000_000,
            InFlightFate::Dropped => 0,
            InFlightFate::Random { delivered_ppm } => delivered_ppm.min(1_000_000),
        };
        let doomed: Vec<(SimTime, u64)> = self
            .events
            .iter()
            .filter(|(_, event)| matches!(event, Event::ToNode { connection, .. } if crashed.contains(connection)))
            .map(|(key, _)| *key)
            .collect();
        for key in doomed {
            if self.fault_rng.gen_range(0..1_000_000) >= delivered_ppm {
                self.events.remove(&key);
                self.counts.in_flight_messages_dropped += 1;
            }
        }
        for id in crashed {
            let connection = &self.connections[&id];
            self.current.remove(&(connection.node, connection.client_id));
            self.close_client_end(now, id);
        }
        self.counts.client_crashes += 1;
    }

    /// Applies one fault of a [`crate::FaultSchedule`] at `now` (normally `fault.at`). `FlipBits`
    /// and `Evict` pick one of the node's slabs at random.
    ///
    /// Errors: as the fault's own call; `NoSlab` for `FlipBits` or `Evict` on a node without
    /// slabs.
    pub fn apply_fault(&mut self, now: SimTime, fault: &ScheduledFault) -> Result<(), SimError> {
        let node = fault.node;
        match fault.action {
            FaultAction::Kill => self.kill(now, node),
            FaultAction::RestartEmpty => self.restart_empty(now, node),
            FaultAction::Stall { until } => self.stall(now, node, until),
            FaultAction::Partition { until, notice } => self.partition(now, node, until, notice),
            FaultAction::ExtraDelay { delay_ns, jitter_ns } => {
                self.set_extra_delay(now, node, delay_ns, jitter_ns)
            }
            FaultAction::FlipBits { flips } => {
                let slab_id = self.random_slab(now, node)?;
                self.flip_bits(now, node, slab_id, flips).map(drop)
            }
            FaultAction::Evict => {
                let slab_id = self.random_slab(now, node)?;
                self.evict(now, node, slab_id)
            }
            FaultAction::DropNextWrites { count } => self.drop_next_writes(now, node, count),
        }
    }
}
