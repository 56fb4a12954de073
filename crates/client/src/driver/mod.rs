//! The blocking driver: [`Client`] runs the engine over real sockets on the caller's thread.
//!
//! Run to completion (seed 000 §4.1.3): the thread that calls [`Client::execute`] submits the
//! ops, waits on the sockets itself (one `epoll` over every node connection) and finishes each
//! page, decode included, before it returns. Between batches [`Client::poll_background`] lets
//! an idle caller heal (rebuilds, heartbeats, probes of failed nodes): healing does not need
//! traffic, but it needs someone to run the loop. Front ends that have their own event loop use
//! the poll driver (`PollClient`) instead.
//!
//! Per page, nothing is allocated: op slots, parity buffers, the event queue and the socket
//! buffers are sized when the client connects (or adds a region).

mod config;
mod connect;
mod control;
mod lazy;
mod membership;
mod poll;
mod regions;
mod slab_map;
mod transport;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use remem_codec::CodecParams;
use remem_placement::Placement;
use remem_proto::auth::Secret;
use remem_proto::Control;

use crate::core::Shape;
use crate::engine::{Action, Engine, NoBuffers, NodeId, OpBuffers, RegionInfo, Submit};
use crate::error::{ConnectError, PageError, UnreachableNode};

use config::Batch;
pub use config::{ClientConfig, MemoryReport, NodeAddress, PageOp};
pub(crate) use connect::connect_node;
pub use connect::query_node;
pub use membership::MembershipChange;
pub use poll::PollClient;
pub use regions::region_node_bytes;
pub use slab_map::{RegionMap, SlabMapError, SlabMapFile};
pub(crate) use transport::Transport;

/// With shared-memory slabs a batch may finish without touching a socket; the sockets (eviction
/// notices, a node's EOF) are still looked at, without blocking, at least this often.
const SOCKET_CHECK_INTERVAL: Duration = Duration::from_millis(1);
/// A probe of a failed node waits at most this long for it to answer (on its own thread).
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connected client: the engine driven by the caller's thread over real sockets.
///
/// Not `Sync`: one thread drives it (run to completion). Several threads use several clients.
pub struct Client {
    config: ClientConfig,
    secret: Secret,
    engine: Engine,
    transport: Transport,
    /// Ops in flight at most (<= the engine's slots); see [`Client::set_max_in_flight`].
    in_flight_limit: usize,
    last_socket_check: Instant,
    /// Failed nodes with a probe under way, and where the probes report.
    probing: Vec<NodeId>,
    /// Set when a node refused this client's session because another process took its client
    /// id over there ([`Client::fenced_at_node`]).
    fenced_at_node: Option<String>,
    probe_results: ProbeChannel,
    /// The probe thread started with the client (`ClientConfig::probe_thread_at_start`).
    /// The probe thread's requests, and the pipe that wakes it (`start_prober`).
    prober: Option<(std::sync::mpsc::Sender<ProbeRequest>, std::io::PipeWriter)>,
    /// This client's claim on `config.client_id` at the nodes (`Control::Hello::session`):
    /// random, never 0, fixed for the client's life.
    session: u64,
    /// What its owner calls a region, by index, for people ([`Client::label_region`]).
    region_labels: std::collections::BTreeMap<usize, String>,
}

type ProbeResult = (NodeId, connect::Connected);

/// One warning per node a client started without (it counts them as failed and probes them).
/// A client that does not start names them in its error instead, so none is said twice.
fn warn_unreachable(unreachable: &[UnreachableNode]) {
    for node in unreachable {
        tracing::warn!(node = %node.address, error = %node.reason, "node unreachable: counted as failed");
    }
}

/// How long a starting client retries a node where another session still holds its client id
/// (`ConnectError::ClientIdInUse`) before giving up: long enough for a node to notice that the
/// process it replaces died (its sockets close at once), short enough to fail fast when that
/// process is alive.
const FENCE_WAIT: Duration = Duration::from_secs(3);
type ProbeChannel = (std::sync::mpsc::Sender<ProbeResult>, std::sync::mpsc::Receiver<ProbeResult>);

/// A failed node for the probe thread to connect to.
struct ProbeRequest {
    node: NodeId,
    address: std::net::SocketAddr,
    unix: Option<std::path::PathBuf>,
    timeout: Duration,
}

impl Client {
    /// Connects to every node (all at once, each bounded by `config.connect_timeout`),
    /// authenticates, maps k+r slabs per address range with `placement` on the nodes that
    /// answered, and returns a client ready for page I/O. The client keeps `placement` to choose
    /// where new and lost slabs go.
    ///
    /// Nodes that do not answer (refused, down, stopped) join as failed nodes: they hold none of
    /// the new slabs, are probed, and take slabs again once readmitted.
    ///
    /// Errors: [`ConnectError::TooFewNodes`] when the cluster has fewer than k+r nodes,
    /// [`ConnectError::TooFewReachable`] (naming the unreachable nodes and why) when fewer than
    /// k+r answered, [`ConnectError::SlabSizeMismatch`] when the nodes that answered disagree on
    /// the slab size, and mapping errors (nothing stays mapped then).
    pub fn connect(
        nodes: &[NodeAddress],
        secret: &Secret,
        config: ClientConfig,
        placement: Box<dyn Placement>,
    ) -> Result<Client, ConnectError> {
        let shape = config.shape;
        assert!(shape.extra_reads <= shape.parity_splits, "delta is at most r");
        CodecParams::new(shape.data_splits, shape.parity_splits, config.page_bytes)?;
        let needed = shape.total_splits();
        if nodes.len() < needed {
            return Err(ConnectError::TooFewNodes { needed, given: nodes.len() });
        }
        let mut client = Client::empty(secret, config.clone(), placement)?;
        let unreachable = client.join_all(nodes)?;
        let reachable = nodes.len() - unreachable.len();
        if reachable < needed {
            return Err(ConnectError::TooFewReachable { needed, reachable, unreachable });
        }
        warn_unreachable(&unreachable);
        let mut connected = client.engine.nodes().iter().filter(|entry| entry.connected);
        let slab_size = connected.next().expect("k+r >= 1 nodes answered").info.slab_size_bytes;
        for entry in connected {
            if entry.info.slab_size_bytes != slab_size {
                return Err(ConnectError::SlabSizeMismatch {
                    address: entry.address,
                    slab_size_bytes: entry.info.slab_size_bytes,
                    expected_bytes: slab_size,
                });
            }
        }
        // With lazy ranges and no address space, the caller creates every region itself.
        if !(config.lazy_ranges && config.address_space_bytes == 0) {
            client.place_region(shape, config.address_space_bytes, None)?;
        }
        client.export_slabs();
        client.volunteer_for_activity();
        Ok(client)
    }

    /// A client with no nodes and no regions.
    fn empty(
        secret: &Secret,
        config: ClientConfig,
        placement: Box<dyn Placement>,
    ) -> Result<Client, ConnectError> {
        let transport = Transport::new(config.page_bytes).map_err(ConnectError::Poll)?;
        let mut client = Client {
            engine: Engine::new(config.engine_config(), placement, Instant::now()),
            in_flight_limit: config.max_in_flight,
            secret: secret.clone(),
            transport,
            last_socket_check: Instant::now(),
            probing: Vec::new(),
            fenced_at_node: None,
            probe_results: std::sync::mpsc::channel(),
            prober: None,
            region_labels: std::collections::BTreeMap::new(),
            session: match config.session {
                0 => rand::random::<u64>() | 1,
                given => given,
            },
            config,
        };
        if client.config.probe_thread_at_start {
            client.start_prober().map_err(ConnectError::ProbeThread)?;
        }
        Ok(client)
    }

    /// Connects to one node and adds it to the engine; a failure is returned.
    fn join(&mut self, node: &NodeAddress) -> Result<NodeId, ConnectError> {
        let unix = node.unix_socket.as_deref().filter(|_| self.config.shared_memory);
        let connected = connect_node(
            node.address,
            unix,
            &self.secret,
            (self.config.client_id, self.session),
            self.config.connect_timeout,
            self.config.encrypt,
        );
        let (stream, info) = connected?;
        self.admit(node, stream, info)
    }

    /// Adds a node the driver connected to.
    fn admit(
        &mut self,
        node: &NodeAddress,
        stream: connect::BlockingStream,
        info: remem_proto::NodeInfo,
    ) -> Result<NodeId, ConnectError> {
        let id = self.engine.add_node(Instant::now(), node.address, node.unix_socket.clone(), info, true);
        let io_error = |source| ConnectError::Io { address: node.address, source };
        self.transport.attach(id, Some(stream)).map_err(io_error)?;
        Ok(id)
    }

    /// Connects to every node of `nodes` at once (a node down costs the connect timeout once)
    /// and adds them in order: those that answered connected, the others unreachable (failed:
    /// probed, their slabs lost until readmitted). Returns the unreachable ones and why.
    fn join_all(&mut self, nodes: &[NodeAddress]) -> Result<Vec<UnreachableNode>, ConnectError> {
        let (shared_memory, claim) = (self.config.shared_memory, (self.config.client_id, self.session));
        let (timeout, encrypt) = (self.config.connect_timeout, self.config.encrypt);
        let mut results = connect::connect_all(nodes, shared_memory, &self.secret, claim, timeout, encrypt);
        // A node where another live process holds the client id fences this one off: it must not
        // start at all (two owners of one slab map), not count that node as merely down. A
        // predecessor that just died may still hold it for a moment (its node has not yet seen
        // its connections close), so the claim is retried for `FENCE_WAIT` first.
        let deadline = Instant::now() + FENCE_WAIT;
        let in_use = |result: &connect::Connected| matches!(result, Err(ConnectError::ClientIdInUse { .. }));
        while results.iter().any(in_use) {
            if Instant::now() >= deadline {
                let fenced = results.into_iter().find(in_use).expect("one is in use");
                return Err(fenced.err().expect("an error"));
            }
            std::thread::sleep(Duration::from_millis(100));
            let retry: Vec<usize> = (0..nodes.len()).filter(|&index| in_use(&results[index])).collect();
            let retried: Vec<NodeAddress> = retry.iter().map(|&index| nodes[index].clone()).collect();
            let again = connect::connect_all(&retried, shared_memory, &self.secret, claim, timeout, encrypt);
            for (index, result) in retry.into_iter().zip(again) {
                results[index] = result;
            }
        }
        let mut unreachable = Vec::new();
        for (node, result) in nodes.iter().zip(results) {
            match result {
                Ok((stream, info)) => {
                    self.admit(node, stream, info)?;
                }
                Err(error) => {
                    // Said by the caller: once per node if the client starts, in its error if not.
                    unreachable.push(UnreachableNode::new(node.address, &error));
                    self.join_unreachable(node)?;
                }
            }
        }
        Ok(unreachable)
    }

    /// Adds a node that could not be reached: probed later, its slabs lost until then.
    fn join_unreachable(&mut self, node: &NodeAddress) -> Result<NodeId, ConnectError> {
        let info = crate::engine::unreachable_node_info();
        let id = self.engine.add_node(Instant::now(), node.address, node.unix_socket.clone(), info, false);
        self.transport
            .attach(id, None)
            .map_err(|source| ConnectError::Io { address: node.address, source })?;
        Ok(id)
    }

    /// The regions of this client's page space.
    pub fn regions(&self) -> Vec<RegionInfo> {
        self.engine.regions().collect()
    }

    /// Names region `index` for people: its owner's word for what the region holds, which
    /// its scheme alone does not say (kv's main copies of EOR values are a region without
    /// redundancy, like its `none` values). [`Client::region_health`] shows it after the scheme.
    pub fn label_region(&mut self, index: usize, label: &str) {
        self.region_labels.insert(index, label.to_owned());
    }

    /// The label [`Client::label_region`] gave region `index`.
    pub fn region_label(&self, index: usize) -> Option<&str> {
        self.region_labels.get(&index).map(String::as_str)
    }

    /// Pages of the whole page space (every region).
    pub fn page_count(&self) -> u64 {
        self.engine.page_count()
    }

    pub fn page_bytes(&self) -> usize {
        self.config.page_bytes
    }

    /// The shape of the first region.
    pub fn shape(&self) -> Shape {
        self.config.shape
    }

    pub fn ranges(&self) -> &[crate::engine::Range] {
        self.engine.ranges()
    }

    pub fn node_addresses(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.engine.nodes().iter().map(|node| node.address)
    }

    /// The engine this client drives (read only: for status and tests).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Sets how many ops [`Client::execute`] keeps in flight, between 1 and the
    /// `max_in_flight` the client was connected with.
    pub fn set_max_in_flight(&mut self, limit: usize) {
        self.in_flight_limit = limit.clamp(1, self.engine.slot_count());
    }

    /// Forgets a page: it reads as zeros from now on, with no remote I/O, until written again.
    /// Its splits stay in the slabs and are overwritten by the next write; a stale split can
    /// never be read back because the client only accepts splits of the page's current version.
    pub fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.engine.discard_page(page)
    }

    /// Writes one page and waits for all k+r splits (run to completion).
    pub fn write_page(&mut self, page: u64, data: &[u8]) -> Result<(), PageError> {
        let mut result = Ok(());
        self.execute(&mut [PageOp::Write { page, data }], |done| result = done.result);
        result
    }

    /// Reads one page into `buf` (page_bytes long).
    pub fn read_page(&mut self, page: u64, buf: &mut [u8]) -> Result<(), PageError> {
        let mut result = Ok(());
        self.execute(&mut [PageOp::Read { page, buf }], |done| result = done.result);
        result
    }

    /// Runs a batch like [`Client::execute`] and returns the first error (by completion order).
    /// Every op is still run to its end, so one failed page does not leave others half done.
    pub fn execute_all(&mut self, ops: &mut [PageOp<'_>]) -> Result<(), PageError> {
        let mut first_error = None;
        self.execute(ops, |done| {
            if let Err(error) = done.result {
                first_error.get_or_insert(error);
            }
        });
        first_error.map_or(Ok(()), Err)
    }

    /// Runs a batch, keeping up to `max_in_flight` ops in flight, and calls `on_done` once per
    /// op as it completes (in completion order). Ops on the same page run in batch order, one at
    /// a time. Returns when every op is done.
    pub fn execute(&mut self, ops: &mut [PageOp<'_>], mut on_done: impl FnMut(crate::engine::OpDone)) {
        if self.engine.active() == 0 {
            self.export_rebuilt_slabs();
        }
        let mut batch = Batch(ops);
        if self.engine.shm_in_use() && self.last_socket_check.elapsed() >= SOCKET_CHECK_INTERVAL {
            // Batches on shared memory alone never wait on the sockets: look at them here,
            // without blocking, for eviction notices and dead nodes.
            self.last_socket_check = Instant::now();
            self.run_loop_once(Some(Duration::ZERO), &mut batch);
        }
        let mut next = 0;
        let mut remaining = batch.0.len();
        while remaining > 0 {
            while next < batch.0.len() && self.engine.active() < self.in_flight_limit {
                // `*data` copies the batch's shared reference: no borrow of the batch remains.
                let submit = match &batch.0[next] {
                    PageOp::Write { page, data } => Submit::Write { page: *page, data },
                    PageOp::WriteData { page, data } => Submit::WriteData { page: *page, data },
                    PageOp::WriteParity { page, data } => Submit::WriteParity { page: *page, data },
                    PageOp::Read { page, .. } => Submit::Read { page: *page },
                    PageOp::Probe { probe } => Submit::Probe { probe: *probe },
                };
                // The next op may start at once: over shared memory its lines load while this
                // one is checksummed.
                let next_read = match batch.0.get(next + 1) {
                    Some(PageOp::Read { page, .. }) if self.in_flight_limit > 1 => Some(*page),
                    _ => None,
                };
                self.engine.hint_next_read(next_read);
                if !self.engine.submit(Instant::now(), next, submit, &mut batch) {
                    break;
                }
                next += 1;
                remaining -= self.deliver(&mut on_done);
            }
            self.transport.flush_all(&mut self.engine, &mut batch);
            remaining -= self.deliver(&mut on_done);
            if remaining == 0 {
                break;
            }
            if self.engine.active() == 0 {
                continue;
            }
            self.run_loop_once(None, &mut batch);
            remaining -= self.deliver(&mut on_done);
        }
    }

    /// Completions the engine has, to the caller. Returns how many.
    fn deliver(&mut self, on_done: &mut impl FnMut(crate::engine::OpDone)) -> usize {
        let mut count = 0;
        let now = Instant::now();
        for mut done in self.engine.take_completions() {
            // Wall time: an op on shared memory completes inside the call that started it.
            done.latency = now.saturating_duration_since(done.started);
            count += 1;
            on_done(done);
        }
        count
    }

    /// One turn of the loop: wait for the sockets (at most until the engine's next deadline, or
    /// `max_wait`), feed what came, tick, carry out the engine's actions, send.
    fn run_loop_once(&mut self, max_wait: Option<Duration>, buffers: &mut dyn OpBuffers) {
        let now = Instant::now();
        let until_deadline =
            self.engine.next_deadline().map(|deadline| deadline.saturating_duration_since(now));
        let timeout = match (until_deadline, max_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let spin = self.config.spin_before_block;
        self.transport.wait_and_read(&mut self.engine, timeout, spin, buffers);
        self.engine.tick(Instant::now(), buffers);
        self.finish_probes(buffers);
        self.carry_out_actions(buffers);
        self.transport.flush_all(&mut self.engine, buffers);
    }

    /// Connects and disconnects as the engine asks.
    fn carry_out_actions(&mut self, _buffers: &mut dyn OpBuffers) {
        while self.engine.has_actions() {
            let actions: Vec<Action> = self.engine.take_actions().collect();
            for action in actions {
                match action {
                    Action::Disconnect { node } => self.transport.detach(node),
                    Action::Connect { node } => self.probe_node(node),
                }
            }
        }
    }

    /// Starts a probe of a failed node on a helper thread: connecting and authenticating may
    /// block (a stopped node accepts TCP connections and never answers), which the data path
    /// must not wait for. The result is taken by [`Client::finish_probes`].
    fn probe_node(&mut self, node: NodeId) {
        if self.probing.contains(&node) {
            return;
        }
        let entry = self.engine.node(node);
        let address = entry.address;
        let unix = entry.unix_socket.clone().filter(|_| self.config.shared_memory);
        let (secret, claim) = (self.secret.clone(), (self.config.client_id, self.session));
        let timeout = PROBE_CONNECT_TIMEOUT.min(self.config.connect_timeout);
        let encrypt = self.config.encrypt;
        if let Some((requests, wake)) = &mut self.prober {
            use std::io::Write;
            if requests.send(ProbeRequest { node, address, unix, timeout }).is_ok()
                && wake.write(&[1]).is_ok()
            {
                self.probing.push(node);
            }
            return;
        }
        let results = self.probe_results.0.clone();
        let spawned = std::thread::Builder::new().name(format!("remem-probe-{node}")).spawn(move || {
            let result = connect_node(address, unix.as_deref(), &secret, claim, timeout, encrypt);
            let _ = results.send((node, result));
        });
        match spawned {
            Ok(_) => self.probing.push(node),
            Err(error) => tracing::warn!(node = %address, %error, "cannot start a probe thread"),
        }
    }

    /// Starts the one probe thread (`ClientConfig::probe_thread_at_start`): it connects to the
    /// nodes it is asked to, one at a time, and ends when the client is dropped.
    ///
    /// It sleeps in a read of a pipe, not in the channel: waking a thread blocked on a channel
    /// writes to that thread's own handle, which std allocates where the client cannot choose
    /// (under `remem run --paging uffd`, once in the program's malloc memory, paged out: the
    /// pager, which runs this client, faulted on it and waited for itself). A byte in a pipe
    /// touches only the kernel's memory.
    fn start_prober(&mut self) -> std::io::Result<()> {
        use std::io::Read;
        let (requests, receiver) = std::sync::mpsc::channel::<ProbeRequest>();
        let (mut woken, wake) = std::io::pipe()?;
        let (secret, claim) = (self.secret.clone(), (self.config.client_id, self.session));
        let (results, encrypt) = (self.probe_results.0.clone(), self.config.encrypt);
        std::thread::Builder::new().name("remem-prober".to_owned()).spawn(move || {
            let mut byte = [0u8; 1];
            loop {
                match woken.read(&mut byte) {
                    Ok(1) => {}
                    // A signal of the program's, delivered to this thread.
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                    // The client (the pipe's writer) was dropped.
                    _ => return,
                }
                while let Ok(ProbeRequest { node, address, unix, timeout }) = receiver.try_recv() {
                    let result = connect_node(address, unix.as_deref(), &secret, claim, timeout, encrypt);
                    if results.send((node, result)).is_err() {
                        return;
                    }
                }
            }
        })?;
        self.prober = Some((requests, wake));
        Ok(())
    }

    /// Readmits the failed nodes whose probe connected.
    fn finish_probes(&mut self, buffers: &mut dyn OpBuffers) {
        while let Ok((node, result)) = self.probe_results.1.try_recv() {
            self.probing.retain(|probing| *probing != node);
            let address = self.engine.node(node).address;
            let (stream, info) = match result {
                Ok(connected) => connected,
                Err(error @ ConnectError::ClientIdInUse { .. }) => {
                    // Another process took this client id over at that node while this one was
                    // cut off from it: the node stays failed here, never written again.
                    if self.fenced_at_node.is_none() {
                        tracing::error!(node = %address, %error, "fenced off at a node: another process holds this client id");
                        self.fenced_at_node = Some(error.to_string());
                    } else {
                        tracing::debug!(node = %address, %error, "still fenced off at a node");
                    }
                    continue;
                }
                Err(error) => {
                    tracing::debug!(node = %address, %error, "failed node still unreachable");
                    continue;
                }
            };
            if self.engine.node(node).connected {
                continue;
            }
            if let Err(error) = self.transport.attach(node, Some(stream)) {
                tracing::warn!(node = %address, %error, "probe connected but could not register");
                continue;
            }
            self.engine.node_connected(Instant::now(), node, info);
            if self.engine.node(node).connected {
                // Volunteer again for activity questions on the new connection.
                self.engine.send_control(node, &Control::AnswerActivity);
            }
            self.transport.flush(&mut self.engine, node, buffers);
        }
    }

    /// Runs the event loop for at most `timeout` without page I/O: rebuild progress, eviction
    /// notices, heartbeats, probes of failed nodes. An idle application calls it now and then
    /// (every 100 ms or so) so the client heals without traffic; `execute` does it too. The
    /// heartbeats renew the client's leases: a client that neither executes nor calls this for
    /// the nodes' lease timeout (`remem node --lease-timeout`, 10 s) has its connections closed,
    /// as a stopped process would, and another process may take its slabs over.
    pub fn poll_background(&mut self, timeout: Duration) {
        if self.engine.active() == 0 {
            self.export_rebuilt_slabs();
        }
        let mut buffers = NoBuffers;
        self.engine.tick(Instant::now(), &mut buffers);
        self.carry_out_actions(&mut buffers);
        self.transport.flush_all(&mut self.engine, &mut buffers);
        self.run_loop_once(Some(timeout), &mut buffers);
    }

    /// Drives background work until no rebuild is in flight or `timeout` passes. True if done.
    pub fn wait_for_regenerations(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.engine.has_regenerations() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.poll_background((deadline - now).min(Duration::from_millis(100)));
        }
        true
    }

    /// Why this client is fenced, if a node refused to take it back after it was cut off:
    /// another process holds its client id there now (docs/PROTOCOL.md, "Leases"). Such a node
    /// stays failed for this client; a front end should stop serving.
    pub fn fenced_at_node(&self) -> Option<&str> {
        self.fenced_at_node.as_deref()
    }

    pub fn regeneration_status(&self) -> crate::engine::RegenerationStatus {
        self.engine.regeneration_status()
    }

    pub fn node_stats(&self) -> Vec<crate::engine::NodeStats> {
        self.engine.node_stats()
    }

    /// Nodes that hold the slabs of range `range`, in split order.
    pub fn range_nodes(&self, range: usize) -> Vec<usize> {
        self.engine.ranges()[range].slabs.iter().map(|slab| slab.node).collect()
    }

    /// Pages per address range of the first region: page `p` lives in range
    /// `p / pages_per_range()`.
    pub fn pages_per_range(&self) -> u64 {
        self.engine.region_info(0).pages_per_range
    }

    /// The splits of range `range` that this client reads and writes through shared memory.
    pub fn shared_memory_splits(&self, range: usize) -> crate::core::SplitMask {
        self.engine.shared_memory_splits(range)
    }

    pub fn client_id(&self) -> u64 {
        self.config.client_id
    }

    /// What every node reports of itself (`Err` for a node that is down or does not answer).
    pub fn node_infos(&mut self) -> Vec<(SocketAddr, Result<crate::NodeStatus, PageError>)> {
        (0..self.engine.nodes().len())
            .map(|node| {
                let address = self.engine.node(node).address;
                let info = match self.control(node, &Control::NodeInfo) {
                    Ok(Control::NodeInfoReply(info)) => {
                        self.engine.set_node_info(node, info.clone());
                        Ok(crate::NodeStatus::from(info))
                    }
                    Ok(other) => {
                        Err(PageError::Protocol { address, message: format!("{:?} reply", other.kind()) })
                    }
                    Err(error) => Err(error),
                };
                (address, info)
            })
            .collect()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !self.config.release_on_drop {
            return;
        }
        // Ops still in flight (a poll driver dropped mid-way): their buffers may be gone.
        self.engine.abandon_ops();
        if let Err(error) = self.release() {
            tracing::warn!(%error, "could not release every slab");
        }
    }
}
