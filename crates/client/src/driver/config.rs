//! What a caller of the blocking driver hands it: where nodes are, the client's settings, the
//! ops of a batch; and what it gets back besides completions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::core::Shape;
use crate::engine::{EngineConfig, OpBuffers};

/// Where a node listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    pub address: SocketAddr,
    /// The node's Unix socket, if it has one on this host: with
    /// [`ClientConfig::shared_memory`] the client connects there and maps its slabs.
    pub unix_socket: Option<PathBuf>,
}

/// Settings of one client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Shape of the first region (the address space given to `connect`).
    pub shape: Shape,
    pub page_bytes: usize,
    pub address_space_bytes: u64,
    /// Identity that owns the slabs on the nodes.
    pub client_id: u64,
    /// The claim on `client_id` at the nodes (`Control::Hello::session`); 0 draws a random one.
    /// Clients of one process that share a client id (a front end's engines, one per core) give
    /// the same nonzero session, so the nodes see one holder, not a second process to fence.
    pub session: u64,
    /// Pages in flight at once in [`Client::execute`].
    pub max_in_flight: usize,
    /// A node that leaves a split unanswered this long is treated as failed.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Above this corrupt-split rate a node is suspect: reads of its ranges start with one
    /// more split (the seed's ErrorCorrectionLimit).
    pub error_correction_limit: f64,
    /// Above this rate the node's slabs are rebuilt elsewhere (SlabRegenerationLimit).
    pub slab_regeneration_limit: f64,
    /// Splits read from a node before its error rate is trusted.
    pub error_rate_min_samples: u64,
    /// Rebuild lost, evicted or corrupt slabs on other nodes in the background.
    pub regenerate: bool,
    /// Poll without blocking this long before blocking on the sockets (0 = block at once).
    pub spin_before_block: Duration,
    /// Unmap every slab when the client is dropped. Off for a client that saves its slab map
    /// to come back to its pages after a restart.
    pub release_on_drop: bool,
    /// Reach nodes that have a Unix socket through it and map their slabs as shared memory
    /// (`docs/SHM.md`); splits on those slabs are then plain loads and stores.
    pub shared_memory: bool,
    /// A quiet node is pinged this often; a failed node is probed this often.
    pub heartbeat_interval: Duration,
    pub probe_interval: Duration,
    /// Map a range with more than r splits in one failure domain (losing that domain loses
    /// data) when the cluster's domains allow no better, with a warning, instead of refusing;
    /// likewise, rebuild a lost slab into such a domain rather than leave it unrebuilt.
    pub allow_shared_domains: bool,
    /// Probe failed nodes on one thread started with the client, instead of a thread per
    /// probe. For a client that must never start a thread once it runs: the pager of `remem
    /// run --paging uffd`, whose thread serves the faults of the program's memory, where
    /// starting a thread allocates with the program's malloc (std's thread handle uses the
    /// `System` allocator) and can fault on a page only that thread would bring back. Its
    /// probes run one after another.
    pub probe_thread_at_start: bool,
    /// Regions get their page numbers at creation but no slabs: the caller maps a range with
    /// [`Client::map_range`] before its first op there and may give it back with
    /// [`Client::release_range`] (a front end whose node memory grows and shrinks with what it
    /// stores, as `remem kv`). Off: every range is mapped when its region is created. With it
    /// and an `address_space_bytes` of 0, `connect` creates no region: the caller does, with
    /// [`Client::create_region`], once it has seen the nodes.
    pub lazy_ranges: bool,
    /// Encrypt every TCP connection to the nodes (Noise keyed by the cluster secret,
    /// `remem_proto::encryption`); the nodes must run with `--encrypt`. Unix sockets and shared
    /// memory are never encrypted.
    pub encrypt: bool,
}

impl ClientConfig {
    pub fn new(shape: Shape, address_space_bytes: u64) -> ClientConfig {
        ClientConfig {
            shape,
            page_bytes: 4096,
            address_space_bytes,
            client_id: rand::random(),
            session: 0,
            max_in_flight: 32,
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            error_correction_limit: 0.001,
            slab_regeneration_limit: 0.01,
            error_rate_min_samples: 256,
            regenerate: true,
            release_on_drop: true,
            spin_before_block: Duration::ZERO,
            shared_memory: false,
            heartbeat_interval: Duration::from_secs(1),
            probe_interval: Duration::from_secs(1),
            allow_shared_domains: false,
            probe_thread_at_start: false,
            lazy_ranges: false,
            encrypt: false,
        }
    }

    pub(crate) fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            client_id: self.client_id,
            page_bytes: self.page_bytes,
            max_in_flight: self.max_in_flight,
            request_timeout: self.request_timeout,
            error_correction_limit: self.error_correction_limit,
            slab_regeneration_limit: self.slab_regeneration_limit,
            error_rate_min_samples: self.error_rate_min_samples,
            regenerate: self.regenerate,
            heartbeat_interval: self.heartbeat_interval,
            probe_interval: self.probe_interval,
            allow_shared_domains: self.allow_shared_domains,
        }
    }
}

/// One page operation of a batch given to [`Client::execute`] (see [`crate::Submit`] for what
/// each does and may fail with).
pub enum PageOp<'a> {
    /// The next version of the page, on all k+r splits.
    Write {
        page: u64,
        data: &'a [u8],
    },
    /// The next version on the k data splits only: the page becomes parity-stale.
    WriteData {
        page: u64,
        data: &'a [u8],
    },
    /// The r parities of a parity-stale page, from `data`: exactly what its data splits hold.
    WriteParity {
        page: u64,
        data: &'a [u8],
    },
    Read {
        page: u64,
        buf: &'a mut [u8],
    },
    /// A raw fan-out of a prepared probe (see [`Client::prepare_probe`]): the transport floor.
    Probe {
        probe: usize,
    },
}

/// A batch's ops as the engine's buffers: the tag of an op is its index.
pub(super) struct Batch<'a, 'b>(pub(super) &'a mut [PageOp<'b>]);

impl OpBuffers for Batch<'_, '_> {
    fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
        match &mut self.0[tag] {
            PageOp::Read { buf, .. } => buf,
            _ => unreachable!("op {tag} is not a read"),
        }
    }
}

/// Memory the nodes report, for the overhead figure.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryReport {
    /// Slab bytes mapped by this client (every slab of every range).
    pub slab_bytes: u64,
    /// Per-slot metadata the nodes keep for those slabs.
    pub metadata_bytes: u64,
    /// Bytes of address space covered by the mapped ranges.
    pub address_space_bytes: u64,
}
