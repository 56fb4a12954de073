//! One simulated memory node: the real node core (`remem_node::core`) in a simulated host.
//!
//! Job: hand the bytes that arrived on one connection to the core, frame by frame, as the
//! threaded node's connection threads do, and carry out what the core asks (start a rebuild,
//! volunteer for activity questions). Around the core sits only what belongs to the host and the
//! network: liveness, stalls, partitions, a straggler's delay, dropped writes, the queue of what a
//! stalled node has not read yet. The core decides every answer, so what a seed finds here is a
//! bug of the code the real node runs.
//!
//! What the simulated host lacks, each harmless to a client: no handshake (the cluster's
//! `connect` stands for it, and claims no lease: session 0, as a tool's connection), no fault
//! injection command (the core is built without it and refuses `InjectFault` as a node started
//! without `--fault-injection` does; the simulator injects faults through its own API), no shared
//! memory (`ExportSlab` is refused as on a TCP connection; slabs live on the heap), no resource
//! monitor.

use crate::SimTime;
use remem_node::core::{Admission, Backing, CoreConfig, Effect, NodeCore, Served, Session, Transport};
use remem_proto::shm::ShmLayout;
use remem_proto::{FrameHeader, Kind, HEADER_BYTES, MIN_SPLIT_BYTES, WRITE_SPLIT_PREFIX_BYTES};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

/// Leases never lapse in the simulator (no connection claims one), so any value does.
const LEASE_GRACE: Duration = Duration::from_secs(120);
const LEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// A `Regenerate` the core admitted (its `Ok` is on its way); the cluster runs it.
pub(crate) struct AcceptedRegeneration {
    pub(crate) connection: u64,
    pub(crate) request_id: u64,
    pub(crate) admission: Admission,
}

/// Something a stalled node has not read yet, in arrival order.
pub(crate) enum Inbox {
    Bytes {
        connection: u64,
        bytes: Vec<u8>,
    },
    /// The client closed the connection after what it sent before.
    Closed {
        connection: u64,
    },
}

/// How serving the bytes of one connection ended.
pub(crate) struct ServedBytes {
    /// Bytes of complete frames served; the rest is a partial frame to keep.
    pub(crate) consumed: usize,
    /// The core refused in a way that closes the connection (after its `Error` reply).
    pub(crate) close: bool,
}

pub(crate) struct SimNode {
    pub(crate) node_id: u64,
    pub(crate) address: SocketAddr,
    pub(crate) failure_domain: String,
    pub(crate) capacity_slabs: u32,
    pub(crate) slab_size_bytes: u64,
    pub(crate) alive: bool,
    /// Bumped by every kill, so work of a previous life is recognised as stale.
    pub(crate) incarnation: u64,
    /// Like SIGSTOP: nothing is read or answered before this time.
    pub(crate) stalled_until: SimTime,
    /// No message reaches the node or leaves it before this time.
    pub(crate) partitioned_until: SimTime,
    /// A straggler's extra delay on every reply, plus up to `extra_jitter_ns`.
    pub(crate) extra_delay_ns: SimTime,
    pub(crate) extra_jitter_ns: SimTime,
    /// `WriteSplit` frames still to drop silently (`SimCluster::drop_next_writes`).
    pub(crate) writes_to_drop: u32,
    /// Writes dropped that way over the node's whole history (kept across restarts).
    pub(crate) writes_dropped: u64,
    /// The node process: slabs, answers, rebuild admission. A new one per life.
    pub(crate) core: NodeCore,
    pub(crate) inbox: VecDeque<Inbox>,
    /// Rebuilds admitted while serving, for the cluster to start.
    pub(crate) accepted: Vec<AcceptedRegeneration>,
}

/// The capacity in bytes of `capacity_slabs` slabs of the smallest split size (the largest
/// footprint: slab, metadata and header), so that many slabs of any split size fit.
fn capacity_bytes(capacity_slabs: u32, slab_size_bytes: u64) -> u64 {
    let layout = ShmLayout::new(slab_size_bytes, MIN_SPLIT_BYTES).expect("add_node checks the slab size");
    u64::from(capacity_slabs) * layout.total_bytes
}

fn new_core(node_id: u64, failure_domain: &str, capacity_slabs: u32, slab_size_bytes: u64) -> NodeCore {
    NodeCore::new(CoreConfig {
        node_id,
        capacity_bytes: capacity_bytes(capacity_slabs, slab_size_bytes),
        slab_size_bytes,
        failure_domain: failure_domain.to_owned(),
        fault_injection: false,
        backing: Backing::Heap,
        lease_grace: LEASE_GRACE,
        lease_timeout: LEASE_TIMEOUT,
    })
}

impl SimNode {
    pub(crate) fn new(
        node_id: u64,
        address: SocketAddr,
        failure_domain: String,
        capacity_slabs: u32,
        slab_size_bytes: u64,
    ) -> SimNode {
        SimNode {
            core: new_core(node_id, &failure_domain, capacity_slabs, slab_size_bytes),
            node_id,
            address,
            failure_domain,
            capacity_slabs,
            slab_size_bytes,
            alive: true,
            incarnation: 0,
            stalled_until: 0,
            partitioned_until: 0,
            extra_delay_ns: 0,
            extra_jitter_ns: 0,
            writes_to_drop: 0,
            writes_dropped: 0,
            inbox: VecDeque::new(),
            accepted: Vec::new(),
        }
    }

    pub(crate) fn is_stalled(&self, now: SimTime) -> bool {
        self.stalled_until > now
    }

    pub(crate) fn is_partitioned(&self, now: SimTime) -> bool {
        self.partitioned_until > now
    }

    /// The process dies: memory, queued input and running rebuilds are gone. What belongs to the
    /// host or the network (address, straggler delay, partition) stays.
    pub(crate) fn die(&mut self) {
        self.alive = false;
        self.incarnation += 1;
        self.stalled_until = 0;
        self.writes_to_drop = 0;
        self.core = new_core(self.node_id, &self.failure_domain, self.capacity_slabs, self.slab_size_bytes);
        self.inbox.clear();
        self.accepted.clear();
    }

    /// A new process on the same host, with a new node id (as a real node draws one at start).
    pub(crate) fn restart(&mut self) {
        assert!(!self.alive, "a live node is killed before it restarts");
        self.alive = true;
        self.node_id += 1 << 32;
        self.core = new_core(self.node_id, &self.failure_domain, self.capacity_slabs, self.slab_size_bytes);
    }

    /// Serves every complete frame at the front of `input`, which arrived on `connection` of
    /// `client_id`, appending all replies to `out`. Stops at a partial frame (the caller keeps
    /// it for the next arrival) or at a refusal that closes the connection.
    pub(crate) fn serve(
        &mut self,
        client_id: u64,
        connection: u64,
        input: &[u8],
        out: &mut Vec<u8>,
        answers_activity: &mut bool,
    ) -> ServedBytes {
        let session = Session { client_id, session: 0, connection, transport: Transport::Simulated };
        let mut at = 0;
        loop {
            let rest = &input[at..];
            if self.writes_to_drop > 0 {
                match dropped_write_bytes(rest) {
                    DropCheck::Wait => return ServedBytes { consumed: at, close: false },
                    DropCheck::Drop(frame_bytes) => {
                        self.writes_to_drop -= 1;
                        self.writes_dropped += 1;
                        at += frame_bytes;
                        continue;
                    }
                    DropCheck::Serve => {}
                }
            }
            match session.serve_one(&self.core, rest, out) {
                Served::Wait => return ServedBytes { consumed: at, close: false },
                Served::Close(_) => return ServedBytes { consumed: at, close: true },
                Served::Done { consumed, effect, .. } => {
                    at += consumed;
                    match effect {
                        None => {}
                        Some(Effect::Rebuild { request_id, admission }) => {
                            self.accepted.push(AcceptedRegeneration { connection, request_id, admission });
                        }
                        Some(Effect::AnswersActivity) => *answers_activity = true,
                        // No resource monitor asks.
                        Some(Effect::ActivityAnswer { .. }) => {}
                        Some(Effect::Export { .. } | Effect::Evict { .. } | Effect::SetDelay(_)) => {
                            unreachable!("a simulated core has neither shared memory nor fault injection")
                        }
                    }
                }
            }
        }
    }
}

/// Whether the front of `input` is a `WriteSplit` to drop (a dropped-writes fault is armed).
enum DropCheck {
    /// Not enough bytes yet to tell, or to drop the whole frame.
    Wait,
    /// A whole `WriteSplit` of this many bytes: drop it unseen.
    Drop(usize),
    /// Something else: the core serves it.
    Serve,
}

fn dropped_write_bytes(input: &[u8]) -> DropCheck {
    let Some(header_bytes) = input.first_chunk::<HEADER_BYTES>() else {
        return DropCheck::Wait;
    };
    match FrameHeader::decode(header_bytes) {
        Ok(header) if header.kind == Kind::WriteSplit => {
            let frame_bytes = HEADER_BYTES + header.body_len as usize;
            if input.len() < HEADER_BYTES + WRITE_SPLIT_PREFIX_BYTES || input.len() < frame_bytes {
                DropCheck::Wait
            } else {
                DropCheck::Drop(frame_bytes)
            }
        }
        _ => DropCheck::Serve,
    }
}
