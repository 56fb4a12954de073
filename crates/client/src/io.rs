//! The TCP driver of the Resilience Manager: sockets, frames, buffers, the event loop.
//!
//! Run to completion (seed 000 §4.1.3): the thread that calls [`Client::execute`] sends the
//! splits, waits on the sockets itself (one `epoll` over every node connection) and finishes
//! each page, decode included, before it returns. No request is handed to another thread.
//!
//! Per page, nothing is allocated: op slots, parity buffers, the event queue and the socket
//! buffers are sized when the client connects.
//!
//! Copies. A write copies each split once into the connection's send buffer and a read copies
//! each arriving split once from the receive buffer into its place: data splits straight into
//! the caller's page, parities into the op's parity buffer, and decoding writes the missing data
//! splits into the page (in-place coding, seed 000 Figure 7). Reading each payload with its own
//! `read` into the page would save that copy of page_size/k bytes (about 10 ns) but cost one more
//! system call per split (about 1 us); one `read` here drains many replies.
//!
//! Late binding and in-place safety: a reply names its op slot and the op's generation. Once an
//! op is done its slot's generation moves on, so a late reply is copied nowhere. Within one op
//! each split is asked once, so no reply can overwrite a split that the decoder counted on.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::net::TcpStream as MioStream;
use mio::net::UnixStream as MioUnixStream;
use mio::{Events, Interest, Poll, Token};
use remem_codec::{CodecParams, PageCodec};
use remem_placement::{NodeLoad, Placement};
use remem_proto::auth::Secret;
use remem_proto::{
    Control, FrameHeader, Kind, NodeInfo, SplitMeta, WriteSplitPrefix, HEADER_BYTES, SPLIT_META_BYTES,
};

use crate::core::{ReadState, ReadStep, Shape, SplitMask, SplitOutcome, WriteState, WriteStep};
use crate::error::{ConnectError, PageError};

mod regeneration;
mod shm;
mod slab_map;

use shm::ShmSlab;

pub use regeneration::RegenerationStatus;
pub use slab_map::{SlabMapError, SlabMapFile};

/// Top bit of a request id: a control request, not a split of an op.
const CONTROL_REQUEST: u64 = 1 << 63;
/// Largest control reply body we accept (NodeInfoReply and Error are the big ones).
const MAX_CONTROL_BODY_BYTES: usize = 1024;
/// Most splits an op can have: k <= 16, r <= 4.
const MAX_SPLITS: usize = 20;
/// Page flag: discarded since its last write, reads as zeros.
const PAGE_DISCARDED: u8 = 1;
/// Page flag: version not known (reopened client); a read discovers it.
const PAGE_VERSION_UNKNOWN: u8 = 2;
/// With shared-memory slabs a batch may finish without touching a socket; the sockets (eviction
/// notices, a node's EOF) are still looked at, without blocking, at least this often.
const SOCKET_CHECK_INTERVAL: Duration = Duration::from_millis(1);

/// Where a node listens and which failure domain it reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    pub address: SocketAddr,
    /// The node's Unix socket, if it has one on this host: with
    /// [`ClientConfig::shared_memory`] the client connects there and maps its slabs.
    pub unix_socket: Option<PathBuf>,
}

/// Settings of one client (one remote address space).
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub shape: Shape,
    pub page_bytes: usize,
    pub address_space_bytes: u64,
    /// Identity that owns the slabs on the nodes.
    pub client_id: u64,
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
}

impl ClientConfig {
    pub fn new(shape: Shape, address_space_bytes: u64) -> ClientConfig {
        ClientConfig {
            shape,
            page_bytes: 4096,
            address_space_bytes,
            client_id: rand::random(),
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
        }
    }
}

/// One page operation of a batch given to [`Client::execute`].
pub enum PageOp<'a> {
    Write {
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

impl PageOp<'_> {
    fn page(&self) -> Option<u64> {
        match self {
            PageOp::Write { page, .. } | PageOp::Read { page, .. } => Some(*page),
            PageOp::Probe { .. } => None,
        }
    }
}

/// What [`Client::execute`] reports for each op.
#[derive(Debug)]
pub struct OpDone {
    /// Index of the op in the batch.
    pub index: usize,
    pub result: Result<(), PageError>,
    /// From the moment the op was started (its first split sent) to its completion.
    pub latency: Duration,
    /// True when the read had to decode (a data split was missing or late).
    pub decoded: bool,
}

/// One slab of a range: which node, which slab id there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabRef {
    pub node: usize,
    pub slab_id: u32,
}

/// An address range: `pages_per_range` consecutive pages on k+r slabs.
#[derive(Clone, Debug)]
pub struct Range {
    pub slabs: Vec<SlabRef>,
    /// Splits whose slab is known to be down (or being rebuilt): never read.
    pub unavailable: SplitMask,
    /// Splits whose slab is being rebuilt on a new node: `slabs` already names the new slab,
    /// which takes writes (they win over the rebuild) but no reads until the rebuild is done.
    pub rebuilding: SplitMask,
}

/// A raw fan-out: `targets.len()` one-split reads, done at the `need`-th reply.
#[derive(Clone, Debug)]
pub struct Probe {
    targets: Vec<(usize, u32)>,
    need: usize,
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

/// A node connection's socket: TCP, or a Unix socket (which can carry a slab's memfd).
enum ConnStream {
    Tcp(MioStream),
    Unix(MioUnixStream),
    /// No connection: the node was unreachable when a saved map was reopened.
    Unreachable,
}

impl ConnStream {
    fn source(&mut self) -> Option<&mut dyn mio::event::Source> {
        match self {
            ConnStream::Tcp(stream) => Some(stream),
            ConnStream::Unix(stream) => Some(stream),
            ConnStream::Unreachable => None,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            ConnStream::Tcp(stream) => stream.write(bytes),
            ConnStream::Unix(stream) => stream.write(bytes),
            ConnStream::Unreachable => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// One read; on a Unix socket descriptors that come along go onto `fds` (see `shm`).
    fn read(&mut self, buf: &mut [u8], fds: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
        match self {
            ConnStream::Tcp(stream) => stream.read(buf),
            ConnStream::Unix(stream) => match shm::recv_with_fds(stream.as_raw_fd(), buf, fds)? {
                (_, true) => Err(io::Error::new(io::ErrorKind::InvalidData, "unexpected file descriptors")),
                (received, false) => Ok(received),
            },
            ConnStream::Unreachable => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

/// A blocking connection during connect: TCP or Unix.
pub(crate) enum BlockingStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for BlockingStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Tcp(stream) => stream.read(buf),
            BlockingStream::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for BlockingStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Tcp(stream) => stream.write(buf),
            BlockingStream::Unix(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Conn {
    address: SocketAddr,
    stream: ConnStream,
    /// Descriptors received and not yet claimed by their `SlabExported` frame.
    fds: VecDeque<OwnedFd>,
    alive: bool,
    out: Vec<u8>,
    out_sent: usize,
    writable_interest: bool,
    input: Vec<u8>,
    input_start: usize,
    input_end: usize,
    info: NodeInfo,
    /// In `Client::send_order` since its last flush.
    queued: bool,
    /// The node's Unix socket as given to the client (saved in the slab map for a restart).
    unix_socket: Option<PathBuf>,
}

/// Notes that `conn` (node `node`) has requests to send; every frame queued on a connection
/// outside `control` (which flushes at once) is followed by this call, and `flush_all` sends
/// exactly the connections noted, in the order their first request was queued: a read queues its data splits before its extra
/// parity split, and sending them in that order is what lets the data splits win the race
/// (no decode) on a healthy cluster, whatever the node numbering.
fn mark_queued(send_order: &mut Vec<usize>, conn: &mut Conn, node: usize) {
    if !conn.queued {
        conn.queued = true;
        send_order.push(node);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotKind {
    Free,
    Write,
    Read,
    Probe,
}

struct OpSlot {
    kind: SlotKind,
    generation: u32,
    op_index: usize,
    page: u64,
    range: usize,
    slot_in_range: u32,
    version: u8,
    read: Option<ReadState>,
    write: Option<WriteState>,
    probe: usize,
    probe_replies: usize,
    probe_asked: u32,
    parity: Vec<u8>,
    started: Instant,
    deadline: Instant,
}

#[derive(Clone, Copy, Debug)]
struct SplitEvent {
    slot: usize,
    generation: u32,
    split: usize,
    outcome: Outcome,
}

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Read(SplitOutcome),
    Write(bool),
    ProbeReply,
    ProbeFailed,
    /// A split of a shared-memory slab to read: done (synchronously) in `process_events`, where
    /// the destination page is at hand.
    ShmRead,
}

/// A connected client: one remote address space on k+r slabs per range.
///
/// Not `Sync`: one thread drives it (run to completion). Several threads use several clients.
pub struct Client {
    config: ClientConfig,
    codec: Box<dyn PageCodec>,
    split_bytes: usize,
    pages_per_range: u64,
    page_count: u64,
    conns: Vec<Conn>,
    ranges: Vec<Range>,
    versions: Vec<u8>,
    /// Per page: [`PAGE_DISCARDED`] (reads as zeros; kept apart from `versions` so that the
    /// next write continues the version sequence) and [`PAGE_VERSION_UNKNOWN`] (a reopened
    /// client has not learnt the page's version yet: reads discover it).
    page_flags: Vec<u8>,
    slots: Vec<OpSlot>,
    active: usize,
    /// Ops in flight at most (<= slots.len()); see [`Client::set_max_in_flight`].
    in_flight_limit: usize,
    events: Vec<SplitEvent>,
    poll: Poll,
    poll_events: Events,
    probes: Vec<Probe>,
    probe_slabs: Vec<(usize, u32)>,
    control_counter: u64,
    control_reply: Option<(u64, Control)>,
    /// Per node: splits read and splits that failed their checksum (decayed).
    node_stats: Vec<NodeStats>,
    /// Slab rebuilds this client has asked for and not seen finish.
    regenerations: Vec<regeneration::Regeneration>,
    regenerations_done: u64,
    /// The policy that placed the ranges; it also chooses where a lost slab is rebuilt.
    placement: Box<dyn Placement>,
    /// Connections with requests to send, in the order of their first request (`mark_queued`).
    send_order: Vec<usize>,
    /// Per (range, split), at `range * (k + r) + split`: the slab's shared mapping, if exported.
    shm: Vec<Option<ShmSlab>>,
    /// Whether any slab was ever exported (then `execute` polls the sockets now and then).
    shm_in_use: bool,
    last_socket_check: Instant,
    /// The descriptor that came with the last `SlabExported` control reply.
    control_fd: Option<OwnedFd>,
    /// (range, split) of slabs rebuilt on a node with a Unix socket, to export between batches.
    pending_exports: Vec<(usize, usize)>,
    /// Per range: page operations started on it, ever (what `SlabActivity` answers).
    range_accesses: Vec<u64>,
}

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

fn request_id(slot: usize, generation: u32, split: usize) -> u64 {
    ((generation as u64) << 32) | ((slot as u64) << 8) | split as u64
}

fn parse_request_id(id: u64) -> (usize, u32, usize) {
    (((id >> 8) & 0xff_ffff) as usize, (id >> 32) as u32, (id & 0xff) as usize)
}

impl Client {
    /// Connects to every node, authenticates, maps k+r slabs per address range with
    /// `placement`, and returns a client ready for page I/O. The client keeps `placement` to
    /// choose where lost slabs are rebuilt ([`Placement::replace`]).
    pub fn connect(
        nodes: &[NodeAddress],
        secret: &Secret,
        config: ClientConfig,
        mut placement: Box<dyn Placement>,
    ) -> Result<Client, ConnectError> {
        let shape = config.shape;
        assert!(config.max_in_flight >= 1 && config.max_in_flight < (1 << 24));
        assert!(shape.extra_reads <= shape.parity_splits, "delta is at most r");
        let codec_params = CodecParams::new(shape.data_splits, shape.parity_splits, config.page_bytes)?;
        let split_bytes = codec_params.split_bytes();
        let width = shape.total_splits();
        if nodes.len() < width {
            return Err(ConnectError::TooFewNodes { needed: width, given: nodes.len() });
        }

        let mut streams = Vec::with_capacity(nodes.len());
        for node in nodes {
            let unix = node.unix_socket.as_deref().filter(|_| config.shared_memory);
            let (stream, info) = slab_map::connect_node(node.address, unix, secret, &config)?;
            streams.push((stream, info, node.address));
        }

        let slab_size = streams[0].1.slab_size_bytes;
        for (_, info, address) in &streams {
            if info.slab_size_bytes != slab_size {
                return Err(ConnectError::SlabSizeMismatch {
                    address: *address,
                    slab_size_bytes: info.slab_size_bytes,
                    expected_bytes: slab_size,
                });
            }
        }
        if slab_size < split_bytes as u64 {
            return Err(ConnectError::SlabTooSmall { slab_size_bytes: slab_size, split_bytes });
        }
        let pages_per_range = slab_size / split_bytes as u64;
        let page_count = config.address_space_bytes / config.page_bytes as u64;
        if page_count == 0 {
            return Err(ConnectError::EmptyAddressSpace { bytes: config.address_space_bytes });
        }
        let range_count = page_count.div_ceil(pages_per_range);

        let mut loads: Vec<NodeLoad> = streams
            .iter()
            .enumerate()
            .map(|(index, (_, info, _))| NodeLoad {
                node_index: index,
                failure_domain: info.failure_domain.clone(),
                slabs_mapped: info.slabs_mapped as u64,
                slabs_free: info.free_bytes / info.slab_size_bytes.max(1),
            })
            .collect();
        let mut ranges = Vec::with_capacity(range_count as usize);
        let mut request = 2;
        for range_index in 0..range_count {
            let placed = placement.place(&loads, width)?;
            if !placed.distinct_domains {
                tracing::warn!(range = range_index, "range placed with shared failure domains");
            }
            let mut slabs = Vec::with_capacity(width);
            for (split, &node) in placed.nodes.iter().enumerate() {
                let (stream, _, address) = &mut streams[node];
                let map = Control::MapSlab {
                    split_bytes: split_bytes as u32,
                    split_index: split as u8,
                    first_page: range_index * pages_per_range,
                    range_id: range_index,
                };
                request += 1;
                match blocking_control(stream, request, &map, *address)? {
                    Control::SlabMapped { slab_id, slots } => {
                        if slots as u64 != pages_per_range {
                            return Err(ConnectError::SlabSizeMismatch {
                                address: *address,
                                slab_size_bytes: slots as u64 * split_bytes as u64,
                                expected_bytes: slab_size,
                            });
                        }
                        slabs.push(SlabRef { node, slab_id });
                    }
                    other => return Err(unexpected(*address, &other)),
                }
                loads[node].slabs_mapped += 1;
                loads[node].slabs_free = loads[node].slabs_free.saturating_sub(1);
            }
            ranges.push(Range { slabs, unavailable: 0, rebuilding: 0 });
        }

        let streams =
            streams.into_iter().map(|(stream, info, address)| (Some(stream), info, address)).collect();
        let mut client =
            Client::assemble(config, codec_params, streams, ranges, pages_per_range, page_count, placement)?;
        for (conn, node) in client.conns.iter_mut().zip(nodes) {
            conn.unix_socket = node.unix_socket.clone();
        }
        client.export_slabs();
        client.volunteer_for_activity();
        Ok(client)
    }

    /// Builds the client around authenticated connections and a slab map.
    fn assemble(
        config: ClientConfig,
        codec_params: CodecParams,
        streams: Vec<(Option<BlockingStream>, NodeInfo, SocketAddr)>,
        ranges: Vec<Range>,
        pages_per_range: u64,
        page_count: u64,
        placement: Box<dyn Placement>,
    ) -> Result<Client, ConnectError> {
        let split_bytes = codec_params.split_bytes();
        let node_count = streams.len();
        let ranges_len = ranges.len();
        let poll = Poll::new().map_err(ConnectError::Poll)?;
        let mut conns = Vec::with_capacity(streams.len());
        let input_bytes = (256 * 1024).max(4 * (HEADER_BYTES + SPLIT_META_BYTES + config.page_bytes));
        for (index, (stream, info, address)) in streams.into_iter().enumerate() {
            let io_error = |source| ConnectError::Io { address, source };
            let mut stream = match stream {
                None => ConnStream::Unreachable,
                Some(BlockingStream::Tcp(stream)) => {
                    stream.set_read_timeout(None).map_err(io_error)?;
                    stream.set_nonblocking(true).map_err(io_error)?;
                    ConnStream::Tcp(MioStream::from_std(stream))
                }
                Some(BlockingStream::Unix(stream)) => {
                    stream.set_read_timeout(None).map_err(io_error)?;
                    stream.set_nonblocking(true).map_err(io_error)?;
                    ConnStream::Unix(MioUnixStream::from_std(stream))
                }
            };
            if let Some(source) = stream.source() {
                poll.registry().register(source, Token(index), Interest::READABLE).map_err(io_error)?;
            }
            conns.push(Conn {
                address,
                stream,
                fds: VecDeque::with_capacity(shm::MAX_PENDING_FDS),
                alive: true,
                out: Vec::with_capacity(64 * 1024),
                out_sent: 0,
                writable_interest: false,
                input: vec![0; input_bytes],
                input_start: 0,
                input_end: 0,
                info,
                queued: false,
                unix_socket: None,
            });
        }

        let now = Instant::now();
        let slots = (0..config.max_in_flight)
            .map(|_| OpSlot {
                kind: SlotKind::Free,
                generation: 0,
                op_index: 0,
                page: 0,
                range: 0,
                slot_in_range: 0,
                version: 0,
                read: None,
                write: None,
                probe: 0,
                probe_replies: 0,
                probe_asked: 0,
                parity: vec![0; codec_params.parity_bytes()],
                started: now,
                deadline: now,
            })
            .collect();
        Ok(Client {
            codec: remem_codec::new_codec(codec_params),
            split_bytes,
            pages_per_range,
            page_count,
            conns,
            ranges,
            versions: vec![0; page_count as usize],
            page_flags: vec![0; page_count as usize],
            slots,
            active: 0,
            in_flight_limit: config.max_in_flight,
            events: Vec::with_capacity(config.max_in_flight * MAX_SPLITS * 2),
            poll,
            poll_events: Events::with_capacity(256),
            probes: Vec::new(),
            probe_slabs: Vec::new(),
            control_counter: 0,
            control_reply: None,
            node_stats: vec![NodeStats::default(); node_count],
            regenerations: Vec::new(),
            regenerations_done: 0,
            placement,
            send_order: Vec::with_capacity(node_count),
            shm: (0..ranges_len * config.shape.total_splits()).map(|_| None).collect(),
            shm_in_use: false,
            pending_exports: Vec::new(),
            range_accesses: vec![0; ranges_len],
            last_socket_check: now,
            control_fd: None,
            config,
        })
    }

    pub fn page_count(&self) -> u64 {
        self.config.address_space_bytes / self.config.page_bytes as u64
    }

    pub fn page_bytes(&self) -> usize {
        self.config.page_bytes
    }

    pub fn shape(&self) -> Shape {
        self.config.shape
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    pub fn node_addresses(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.conns.iter().map(|conn| conn.address)
    }

    /// Sets how many ops [`Client::execute`] keeps in flight, between 1 and the
    /// `max_in_flight` the client was connected with.
    pub fn set_max_in_flight(&mut self, limit: usize) {
        self.in_flight_limit = limit.clamp(1, self.slots.len());
    }

    /// Forgets a page: it reads as zeros from now on, with no remote I/O, until written again.
    /// Its splits stay in the slabs (slabs are the unit of remote memory) and are overwritten by
    /// the next write; a stale split can never be read back because the client only accepts
    /// splits of the page's current version.
    pub fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.check_page(page, self.config.page_bytes)?;
        assert!(!self.page_in_flight(page), "discard between batches only");
        self.page_flags[page as usize] |= PAGE_DISCARDED;
        Ok(())
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
    pub fn execute(&mut self, ops: &mut [PageOp<'_>], mut on_done: impl FnMut(OpDone)) {
        if !self.pending_exports.is_empty() && self.active == 0 {
            self.export_rebuilt_slabs();
        }
        if self.shm_in_use && self.last_socket_check.elapsed() >= SOCKET_CHECK_INTERVAL {
            // Batches on shared memory alone never wait on the sockets: look at them here, without
            // blocking, for eviction notices and dead nodes.
            self.last_socket_check = Instant::now();
            self.wait_and_read(ops, Some(Duration::ZERO));
            self.process_events(ops, &mut on_done);
        }
        let mut next = 0;
        while next < ops.len() || self.active > 0 {
            while next < ops.len() && self.active < self.in_flight_limit {
                if let Some(page) = ops[next].page() {
                    if self.page_in_flight(page) {
                        break;
                    }
                }
                self.start_op(ops, next, &mut on_done);
                next += 1;
            }
            if !self.events.is_empty() {
                // Splits on shared memory are done already: finish what they finish.
                self.process_events(ops, &mut on_done);
            }
            self.flush_all();
            if self.active == 0 {
                continue;
            }
            // Queued rebuilds wait at most this long for the loop to come round again.
            let max_wait = (!self.regenerations.is_empty()).then_some(Duration::from_millis(100));
            self.wait_and_read(ops, max_wait);
            self.process_events(ops, &mut on_done);
            self.expire_deadlines();
            self.process_events(ops, &mut on_done);
            self.drive_regenerations();
        }
    }

    fn page_in_flight(&self, page: u64) -> bool {
        self.slots
            .iter()
            .any(|slot| matches!(slot.kind, SlotKind::Read | SlotKind::Write) && slot.page == page)
    }

    fn free_slot(&self) -> usize {
        self.slots.iter().position(|slot| slot.kind == SlotKind::Free).expect("active < slots")
    }

    fn start_op(&mut self, ops: &mut [PageOp<'_>], index: usize, on_done: &mut impl FnMut(OpDone)) {
        let started = Instant::now();
        // Some ops finish without any I/O: bad arguments, a never-written page, no slabs left.
        let finished_now: Option<Result<(), PageError>> = match &mut ops[index] {
            PageOp::Write { page, data } => {
                let page = *page;
                self.check_page(page, data.len())
                    .and_then(|()| self.start_write(index, page, data, started))
                    .err()
                    .map(Err)
            }
            PageOp::Read { page, buf } => {
                let page = *page;
                let flags = self.page_flags.get(page as usize).copied().unwrap_or(0);
                match self.check_page(page, buf.len()) {
                    Err(error) => Some(Err(error)),
                    Ok(()) if flags & PAGE_VERSION_UNKNOWN != 0 => {
                        self.start_read(index, page, None, started).err().map(Err)
                    }
                    Ok(()) if self.versions[page as usize] == 0 || flags & PAGE_DISCARDED != 0 => {
                        // Never written by this client: the page holds zeros, no remote read.
                        buf.fill(0);
                        Some(Ok(()))
                    }
                    Ok(()) => {
                        let version = self.versions[page as usize];
                        self.start_read(index, page, Some(version), started).err().map(Err)
                    }
                }
            }
            PageOp::Probe { probe } => {
                let probe = *probe;
                assert!(probe < self.probes.len(), "probe {probe} was not prepared");
                self.start_probe(index, probe, started);
                None
            }
        };
        if let Some(result) = finished_now {
            on_done(OpDone { index, result, latency: started.elapsed(), decoded: false });
        }
    }

    fn check_page(&self, page: u64, len: usize) -> Result<(), PageError> {
        if page >= self.page_count {
            return Err(PageError::OutOfRange { page, page_count: self.page_count });
        }
        if len != self.config.page_bytes {
            return Err(PageError::BadBuffer { len, page_bytes: self.config.page_bytes });
        }
        Ok(())
    }

    fn claim_slot(&mut self, kind: SlotKind, index: usize, page: u64, started: Instant) -> usize {
        let slot_index = self.free_slot();
        let range = (page / self.pages_per_range) as usize;
        let slot = &mut self.slots[slot_index];
        slot.kind = kind;
        slot.generation = slot.generation.wrapping_add(1) & 0x7fff_ffff;
        slot.op_index = index;
        slot.page = page;
        slot.range = range;
        slot.slot_in_range = (page % self.pages_per_range) as u32;
        slot.started = started;
        slot.deadline = started + self.config.request_timeout;
        self.active += 1;
        slot_index
    }

    fn release_slot(&mut self, slot_index: usize) {
        let slot = &mut self.slots[slot_index];
        slot.kind = SlotKind::Free;
        slot.read = None;
        slot.write = None;
        // Late replies carry the old generation and are dropped.
        slot.generation = slot.generation.wrapping_add(1) & 0x7fff_ffff;
        self.active -= 1;
    }

    fn start_write(
        &mut self,
        index: usize,
        page: u64,
        data: &[u8],
        started: Instant,
    ) -> Result<(), PageError> {
        let shape = self.config.shape;
        let range_index = (page / self.pages_per_range) as usize;
        self.range_accesses[range_index] = self.range_accesses[range_index].wrapping_add(1);
        let range = &self.ranges[range_index];
        // Slabs being rebuilt take writes: the rebuild skips pages written since it began.
        let unavailable = range.unavailable & !range.rebuilding;
        let (state, step) = WriteState::start(shape, unavailable);
        if let WriteStep::Failed { stored, failed } = step {
            return Err(PageError::WriteFailed {
                page,
                range: range_index,
                stored_splits: stored.count_ones() as usize,
                needed_splits: shape.data_splits,
                failed_nodes: self.nodes_of(range_index, failed),
            });
        }
        let slot_index = self.claim_slot(SlotKind::Write, index, page, started);
        let version = remem_proto::next_version(self.versions[page as usize]);
        let targets = state.targets();
        let slot = &mut self.slots[slot_index];
        slot.version = version;
        slot.write = Some(state);
        let split_bytes = self.split_bytes;
        self.prefetch_shm(range_index, self.slots[slot_index].slot_in_range, targets);
        // Data splits go on the wire first; parities are encoded while they travel.
        for split in 0..shape.data_splits {
            if targets & (1 << split) != 0 {
                let payload = &data[split * split_bytes..(split + 1) * split_bytes];
                self.queue_write_split(slot_index, split, payload);
            }
        }
        if self.active == 1 {
            // An idle pipe: the data splits travel while the parities are encoded (seed 000
            // §4.1.1). With other ops in flight, frames of many pages leave together at the
            // end of admission, one system call per node instead of one per page.
            self.flush_all();
        }
        if shape.parity_splits > 0 {
            let slot = &mut self.slots[slot_index];
            self.codec.encode(data, &mut slot.parity);
            let parity = std::mem::take(&mut self.slots[slot_index].parity);
            for parity_index in 0..shape.parity_splits {
                let split = shape.data_splits + parity_index;
                if targets & (1 << split) != 0 {
                    let payload = &parity[parity_index * split_bytes..(parity_index + 1) * split_bytes];
                    self.queue_write_split(slot_index, split, payload);
                }
            }
            self.slots[slot_index].parity = parity;
        }
        Ok(())
    }

    fn queue_write_split(&mut self, slot_index: usize, split: usize, payload: &[u8]) {
        let slot = &self.slots[slot_index];
        let slab = self.ranges[slot.range].slabs[split];
        let checksum = remem_proto::split_checksum(payload, slot.version, slot.page, split as u8);
        let prefix = WriteSplitPrefix {
            slab_id: slab.slab_id,
            slot: slot.slot_in_range,
            version: slot.version,
            checksum,
        };
        let (range, generation) = (slot.range, slot.generation);
        let meta = SplitMeta { version: slot.version, checksum };
        let shm_stored = live_shm(&self.shm, &self.ranges, self.config.shape.total_splits(), range, split)
            .map(|shm| shm.write_split(prefix.slot, payload, meta));
        if let Some(stored) = shm_stored {
            self.events.push(SplitEvent {
                slot: slot_index,
                generation,
                split,
                outcome: Outcome::Write(stored),
            });
            if !stored {
                self.schedule_regeneration(range, split, "shared-memory slab revoked");
            }
            return;
        }
        let id = request_id(slot_index, slot.generation, split);
        let conn = &mut self.conns[slab.node];
        if !conn.alive {
            let generation = slot.generation;
            self.events.push(SplitEvent {
                slot: slot_index,
                generation,
                split,
                outcome: Outcome::Write(false),
            });
            return;
        }
        remem_proto::encode_write_split(id, &prefix, payload, &mut conn.out);
        mark_queued(&mut self.send_order, conn, slab.node);
    }

    fn start_read(
        &mut self,
        index: usize,
        page: u64,
        version: Option<u8>,
        started: Instant,
    ) -> Result<(), PageError> {
        let shape = self.config.shape;
        let range_index = (page / self.pages_per_range) as usize;
        self.range_accesses[range_index] = self.range_accesses[range_index].wrapping_add(1);
        let unavailable = self.ranges[range_index].unavailable;
        let (state, step) = match version {
            Some(version) => {
                // Ranges with a node that corrupts often start with one more split, so that a
                // bad split rarely costs a second round trip (seed 000 §4.2 "Corruption").
                let suspect = self.range_has_suspect_node(range_index);
                let mut extra = (shape.extra_reads + suspect as usize).min(shape.parity_splits);
                // Shared-memory splits complete at once and in order, so an extra split cannot
                // beat a data split: when every data split is shared, ask no more than k (a
                // failed one is replaced at once, as always).
                let data = shape.data_mask();
                if self.shm_in_use && self.shared_memory_splits(range_index) & data == data {
                    extra = 0;
                }
                ReadState::start(shape, version, unavailable, extra)
            }
            None => ReadState::discover(shape, unavailable),
        };
        if let ReadStep::Lost { valid, failed } = step {
            return Err(self.lost_error(page, range_index, valid, failed));
        }
        let slot_index = self.claim_slot(SlotKind::Read, index, page, started);
        self.slots[slot_index].version = version.unwrap_or(0);
        self.slots[slot_index].read = Some(state);
        if let ReadStep::Ask(mask) = step {
            self.queue_reads(slot_index, mask);
        }
        Ok(())
    }

    fn queue_reads(&mut self, slot_index: usize, mask: SplitMask) {
        let slot = &self.slots[slot_index];
        let (range, slot_in_range, generation) = (slot.range, slot.slot_in_range, slot.generation);
        self.prefetch_shm(range, slot_in_range, mask);
        for split in 0..self.config.shape.total_splits() {
            if mask & (1 << split) == 0 {
                continue;
            }
            let slab = self.ranges[range].slabs[split];
            if live_shm(&self.shm, &self.ranges, self.config.shape.total_splits(), range, split).is_some() {
                self.events.push(SplitEvent {
                    slot: slot_index,
                    generation,
                    split,
                    outcome: Outcome::ShmRead,
                });
                continue;
            }
            let conn = &mut self.conns[slab.node];
            if !conn.alive {
                self.events.push(SplitEvent {
                    slot: slot_index,
                    generation,
                    split,
                    outcome: Outcome::Read(SplitOutcome::Failed),
                });
                continue;
            }
            let message = Control::ReadSplit { slab_id: slab.slab_id, slot: slot_in_range };
            message.encode(request_id(slot_index, generation, split), &mut conn.out);
            mark_queued(&mut self.send_order, conn, slab.node);
        }
    }

    fn start_probe(&mut self, index: usize, probe: usize, started: Instant) {
        let slot_index = self.claim_slot(SlotKind::Probe, index, 0, started);
        let generation = self.slots[slot_index].generation;
        let slot = &mut self.slots[slot_index];
        slot.probe = probe;
        slot.probe_replies = 0;
        slot.probe_asked = 0;
        for (split, &(node, slab_id)) in self.probes[probe].targets.iter().enumerate() {
            self.slots[slot_index].probe_asked |= 1 << split;
            let message = Control::ReadSplit { slab_id, slot: 0 };
            message.encode(request_id(slot_index, generation, split), &mut self.conns[node].out);
            mark_queued(&mut self.send_order, &mut self.conns[node], node);
        }
    }

    fn lost_error(&self, page: u64, range: usize, valid: SplitMask, failed: SplitMask) -> PageError {
        PageError::Lost {
            page,
            range,
            valid_splits: valid.count_ones() as usize,
            needed_splits: self.config.shape.data_splits,
            failed_nodes: self.nodes_of(range, failed),
        }
    }

    fn nodes_of(&self, range: usize, mask: SplitMask) -> Vec<SocketAddr> {
        (0..self.config.shape.total_splits())
            .filter(|split| mask & (1 << split) != 0)
            .map(|split| self.conns[self.ranges[range].slabs[split].node].address)
            .collect()
    }

    fn flush_all(&mut self) {
        let mut order = std::mem::take(&mut self.send_order);
        for &index in &order {
            self.conns[index].queued = false;
            if self.conns[index].out.len() > self.conns[index].out_sent {
                self.flush(index);
            }
        }
        order.clear();
        self.send_order = order;
    }

    fn flush(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        if !conn.alive {
            conn.out.clear();
            conn.out_sent = 0;
            return;
        }
        while conn.out_sent < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_sent..]) {
                Ok(0) => return self.conn_died(index, "connection closed while sending"),
                Ok(sent) => conn.out_sent += sent,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if !conn.writable_interest {
                        conn.writable_interest = true;
                        if let Some(source) = conn.stream.source() {
                            let interest = Interest::READABLE | Interest::WRITABLE;
                            let _ = self.poll.registry().reregister(source, Token(index), interest);
                        }
                    }
                    return;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return self.conn_died(index, &error.to_string()),
            }
        }
        conn.out.clear();
        conn.out_sent = 0;
        if conn.writable_interest {
            conn.writable_interest = false;
            if let Some(source) = conn.stream.source() {
                let _ = self.poll.registry().reregister(source, Token(index), Interest::READABLE);
            }
        }
    }

    /// Fails the splits in flight on one slab (evicted): the ops fall back to other splits.
    fn fail_pending_on(&mut self, range: usize, split: usize) {
        for slot_index in 0..self.slots.len() {
            let slot = &self.slots[slot_index];
            if slot.range != range {
                continue;
            }
            let generation = slot.generation;
            let outcome = match slot.kind {
                SlotKind::Read
                    if slot.read.as_ref().is_some_and(|read| read.pending() & (1 << split) != 0) =>
                {
                    Outcome::Read(SplitOutcome::Failed)
                }
                SlotKind::Write
                    if slot.write.as_ref().is_some_and(|write| write.pending() & (1 << split) != 0) =>
                {
                    Outcome::Write(false)
                }
                _ => continue,
            };
            self.events.push(SplitEvent { slot: slot_index, generation, split, outcome });
        }
    }

    /// Marks a node connection dead and fails every split in flight on it.
    fn conn_died(&mut self, index: usize, why: &str) {
        let conn = &mut self.conns[index];
        if !conn.alive {
            return;
        }
        tracing::warn!(node = %conn.address, reason = why, "node connection lost");
        conn.alive = false;
        conn.out.clear();
        conn.out_sent = 0;
        if let Some(source) = conn.stream.source() {
            let _ = self.poll.registry().deregister(source);
        }
        conn.fds.clear();
        for range in &mut self.ranges {
            for (split, slab) in range.slabs.iter().enumerate() {
                if slab.node == index {
                    range.unavailable |= 1 << split;
                }
            }
        }
        for slot_index in 0..self.slots.len() {
            let slot = &self.slots[slot_index];
            let generation = slot.generation;
            match slot.kind {
                SlotKind::Free => {}
                SlotKind::Read => {
                    let pending = slot.read.as_ref().map_or(0, |read| read.pending());
                    for split in 0..self.config.shape.total_splits() {
                        if pending & (1 << split) != 0 && self.ranges[slot.range].slabs[split].node == index {
                            self.events.push(SplitEvent {
                                slot: slot_index,
                                generation,
                                split,
                                outcome: Outcome::Read(SplitOutcome::Failed),
                            });
                        }
                    }
                }
                SlotKind::Write => {
                    let pending = slot.write.as_ref().map_or(0, |write| write.pending());
                    for split in 0..self.config.shape.total_splits() {
                        if pending & (1 << split) != 0 && self.ranges[slot.range].slabs[split].node == index {
                            self.events.push(SplitEvent {
                                slot: slot_index,
                                generation,
                                split,
                                outcome: Outcome::Write(false),
                            });
                        }
                    }
                }
                SlotKind::Probe => {
                    let probe = &self.probes[slot.probe];
                    if probe.targets.iter().any(|&(node, _)| node == index) {
                        self.events.push(SplitEvent {
                            slot: slot_index,
                            generation,
                            split: 0,
                            outcome: Outcome::ProbeFailed,
                        });
                    }
                }
            }
        }
        self.regeneration_node_died(index);
        for range in 0..self.ranges.len() {
            for split in 0..self.config.shape.total_splits() {
                if self.ranges[range].slabs[split].node == index {
                    self.schedule_regeneration(range, split, "node failed");
                }
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.slots.iter().filter(|slot| slot.kind != SlotKind::Free).map(|slot| slot.deadline).min()
    }

    fn wait_and_read(&mut self, ops: &mut [PageOp<'_>], max_wait: Option<Duration>) {
        let until_deadline =
            self.next_deadline().map(|deadline| deadline.saturating_duration_since(Instant::now()));
        let timeout = match (until_deadline, max_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Err(error) = self.poll_spinning_first(timeout) {
            if error.kind() != io::ErrorKind::Interrupted {
                tracing::error!(%error, "poll failed");
            }
            return;
        }
        // Collect first: reading needs &mut self while the events borrow self.poll_events.
        let mut ready: [(usize, bool, bool); 64] = [(0, false, false); 64];
        let mut count = 0;
        for event in self.poll_events.iter() {
            if count == ready.len() {
                break;
            }
            ready[count] = (
                event.token().0,
                event.is_readable() || event.is_read_closed() || event.is_error(),
                event.is_writable(),
            );
            count += 1;
        }
        for &(index, readable, writable) in &ready[..count] {
            if writable {
                self.flush(index);
            }
            if readable {
                self.read_conn(index, ops);
            }
        }
    }

    /// Polls without blocking for up to `spin_before_block`, then blocks. On these VMs a
    /// blocked thread costs 20-25 us to wake on the other vCPU; spinning briefly catches replies
    /// that are already on their way. Spinning long would starve node processes that share the
    /// two cores (DESIGN.md), so the spin is short and off by default.
    fn poll_spinning_first(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let spin = self.config.spin_before_block;
        if !spin.is_zero() && timeout.is_none_or(|timeout| !timeout.is_zero()) {
            let started = Instant::now();
            while started.elapsed() < spin {
                self.poll.poll(&mut self.poll_events, Some(Duration::ZERO))?;
                if !self.poll_events.is_empty() {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
        }
        self.poll.poll(&mut self.poll_events, timeout)
    }

    /// Drains what the socket holds and turns each complete frame into an event.
    fn read_conn(&mut self, index: usize, ops: &mut [PageOp<'_>]) {
        loop {
            let conn = &mut self.conns[index];
            if !conn.alive {
                return;
            }
            if conn.input_start > 0 && conn.input_end == conn.input.len() {
                conn.input.copy_within(conn.input_start..conn.input_end, 0);
                conn.input_end -= conn.input_start;
                conn.input_start = 0;
            }
            let end = conn.input_end;
            match conn.stream.read(&mut conn.input[end..], &mut conn.fds) {
                Ok(0) => return self.conn_died(index, "node closed the connection"),
                Ok(received) => {
                    conn.input_end += received;
                    if let Err(why) = self.parse_frames(index, ops) {
                        return self.conn_died(index, &why);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return self.conn_died(index, &error.to_string()),
            }
        }
    }

    fn parse_frames(&mut self, index: usize, ops: &mut [PageOp<'_>]) -> Result<(), String> {
        loop {
            let conn = &mut self.conns[index];
            let available = conn.input_end - conn.input_start;
            if available < HEADER_BYTES {
                break;
            }
            let header_bytes: &[u8; HEADER_BYTES] = conn.input
                [conn.input_start..conn.input_start + HEADER_BYTES]
                .try_into()
                .expect("slice of HEADER_BYTES");
            let header = FrameHeader::decode(header_bytes).map_err(|error| error.to_string())?;
            let body_len = header.body_len as usize;
            let max_body = match header.kind {
                Kind::ReadSplitReply => SPLIT_META_BYTES + self.split_bytes.max(self.config.page_bytes),
                _ => MAX_CONTROL_BODY_BYTES,
            };
            if body_len > max_body {
                return Err(format!("{:?} reply of {body_len} bytes is too long", header.kind));
            }
            if body_len + HEADER_BYTES > conn.input.len() - conn.input_start {
                // The frame fits only after compaction.
                conn.input.copy_within(conn.input_start..conn.input_end, 0);
                conn.input_end -= conn.input_start;
                conn.input_start = 0;
            }
            if available < HEADER_BYTES + body_len {
                break;
            }
            let body_start = conn.input_start + HEADER_BYTES;
            conn.input_start = body_start + body_len;
            self.handle_frame(index, header, body_start, body_len, ops)?;
        }
        let conn = &mut self.conns[index];
        if conn.input_start == conn.input_end {
            conn.input_start = 0;
            conn.input_end = 0;
        }
        Ok(())
    }

    fn handle_frame(
        &mut self,
        index: usize,
        header: FrameHeader,
        body_start: usize,
        body_len: usize,
        ops: &mut [PageOp<'_>],
    ) -> Result<(), String> {
        let body = body_start..body_start + body_len;
        if header.kind == Kind::SlabActivityQuery {
            // Unsolicited: a node's resource monitor asks how active one of our slabs is (we
            // volunteered this connection with `AnswerActivity`). The answer goes out with the
            // next flush; a client that is not running its loop does not answer, and the node
            // then keeps what it saw itself.
            let message = Control::decode_body(header.kind, &self.conns[index].input[body.clone()])
                .map_err(|error| error.to_string())?;
            if let Control::SlabActivityQuery { slab_id } = message {
                let accesses = self
                    .ranges
                    .iter()
                    .position(|range| {
                        range.slabs.iter().any(|slab| slab.node == index && slab.slab_id == slab_id)
                    })
                    .map_or(0, |range| self.range_accesses[range]);
                let conn = &mut self.conns[index];
                Control::SlabActivity { slab_id, accesses }.encode(header.request_id, &mut conn.out);
                mark_queued(&mut self.send_order, conn, index);
            }
            return Ok(());
        }
        if header.kind == Kind::SlabEvicted {
            // Unsolicited: the node evicts one of our slabs (memory pressure or command).
            let message = Control::decode_body(header.kind, &self.conns[index].input[body])
                .map_err(|error| error.to_string())?;
            if let Control::SlabEvicted { slab_id } = message {
                self.slab_evicted(index, slab_id);
            }
            return Ok(());
        }
        if header.request_id & CONTROL_REQUEST != 0 {
            let message = Control::decode_body(header.kind, &self.conns[index].input[body])
                .map_err(|error| error.to_string())?;
            if header.kind == Kind::SlabExported {
                // The memfd came with this frame's first byte, so it is already queued.
                let fd = self.conns[index].fds.pop_front().ok_or("SlabExported without a descriptor")?;
                self.control_fd = Some(fd);
            }
            if !self.regeneration_reply(index, header.request_id, &message) {
                self.control_reply = Some((header.request_id, message));
            }
            return Ok(());
        }
        let (slot_index, generation, split) = parse_request_id(header.request_id);
        if split >= MAX_SPLITS {
            return Err(format!("reply names split {split}"));
        }
        let current = self
            .slots
            .get(slot_index)
            .filter(|slot| slot.generation == generation && slot.kind != SlotKind::Free);
        let Some(slot) = current else {
            // A late reply of a finished op: dropped.
            return Ok(());
        };
        let kind = slot.kind;
        let outcome = match (header.kind, kind) {
            (Kind::WriteSplitOk, SlotKind::Write) => Outcome::Write(true),
            (Kind::Error, SlotKind::Write) => {
                self.log_node_error(index, header, body);
                Outcome::Write(false)
            }
            (Kind::Error, SlotKind::Read) => {
                self.log_node_error(index, header, body);
                Outcome::Read(SplitOutcome::Failed)
            }
            (Kind::Error, SlotKind::Probe) => return Err("probe read failed".into()),
            (Kind::ReadSplitReply, SlotKind::Probe) => Outcome::ProbeReply,
            (Kind::ReadSplitReply, SlotKind::Read) => {
                if body_len != SPLIT_META_BYTES + self.split_bytes {
                    return Err(format!("split reply of {body_len} bytes"));
                }
                let conn = &self.conns[index];
                let meta_bytes: &[u8; SPLIT_META_BYTES] =
                    conn.input[body_start..body_start + SPLIT_META_BYTES].try_into().expect("meta");
                let meta = SplitMeta::decode(meta_bytes).map_err(|error| error.to_string())?;
                let payload = &conn.input[body_start + SPLIT_META_BYTES..body_start + body_len];
                let slot = &self.slots[slot_index];
                let checksum = remem_proto::split_checksum(payload, meta.version, slot.page, split as u8);
                let never_written = meta.version == 0 && meta.checksum == 0;
                self.record_split_read(index);
                if never_written {
                    // A slot never written (or rebuilt as lost): valid only as "no data".
                    Outcome::Read(SplitOutcome::Valid { version: 0 })
                } else if checksum != meta.checksum || meta.version == 0 {
                    self.record_corruption(index);
                    Outcome::Read(SplitOutcome::Corrupt)
                } else {
                    self.place_split(slot_index, split, index, body_start + SPLIT_META_BYTES, ops);
                    Outcome::Read(SplitOutcome::Valid { version: meta.version })
                }
            }
            (other, _) => return Err(format!("unexpected {other:?} reply")),
        };
        self.events.push(SplitEvent { slot: slot_index, generation, split, outcome });
        Ok(())
    }

    fn log_node_error(&self, index: usize, header: FrameHeader, body: std::ops::Range<usize>) {
        match Control::decode_body(header.kind, &self.conns[index].input[body]) {
            Ok(Control::Error { code, message }) => {
                tracing::warn!(node = %self.conns[index].address, ?code, %message, "node refused a split")
            }
            _ => tracing::warn!(node = %self.conns[index].address, "node sent a malformed error"),
        }
    }

    /// Copies a verified split to its place: a data split into the caller's page, a parity into
    /// the op's parity buffer.
    fn place_split(
        &mut self,
        slot_index: usize,
        split: usize,
        conn: usize,
        payload_start: usize,
        ops: &mut [PageOp<'_>],
    ) {
        let k = self.config.shape.data_splits;
        let split_bytes = self.split_bytes;
        let payload = &self.conns[conn].input[payload_start..payload_start + split_bytes];
        let slot = &mut self.slots[slot_index];
        if split >= k {
            slot.parity[(split - k) * split_bytes..(split - k + 1) * split_bytes].copy_from_slice(payload);
        } else if let PageOp::Read { buf, .. } = &mut ops[slot.op_index] {
            buf[split * split_bytes..(split + 1) * split_bytes].copy_from_slice(payload);
        } else {
            unreachable!("a read slot points at a read op");
        }
    }

    /// Feeds queued split events to the state machines and finishes ops.
    fn process_events(&mut self, ops: &mut [PageOp<'_>], on_done: &mut impl FnMut(OpDone)) {
        let mut cursor = 0;
        // Handling an event can queue more (a dead connection found while asking more splits).
        while cursor < self.events.len() {
            let mut event = self.events[cursor];
            cursor += 1;
            let slot = &self.slots[event.slot];
            if slot.generation != event.generation || slot.kind == SlotKind::Free {
                continue;
            }
            if let Outcome::ShmRead = event.outcome {
                event.outcome = Outcome::Read(self.read_shm_split(event.slot, event.split, ops));
            }
            let slot = &mut self.slots[event.slot];
            match event.outcome {
                Outcome::Read(outcome) => {
                    let step = slot
                        .read
                        .as_mut()
                        .expect("read slot has a read state")
                        .on_reply(event.split, outcome);
                    match step {
                        ReadStep::Wait => {}
                        ReadStep::Ask(mask) => {
                            self.queue_reads(event.slot, mask);
                        }
                        ReadStep::Done { present, needs_decode, version } => {
                            let page = slot.page as usize;
                            let op_index = slot.op_index;
                            if self.page_flags[page] & PAGE_VERSION_UNKNOWN != 0 {
                                self.versions[page] = version;
                                self.page_flags[page] &= !PAGE_VERSION_UNKNOWN;
                            }
                            let result = if version == 0 {
                                // Discovery found the page never written: zeros.
                                if let PageOp::Read { buf, .. } = &mut ops[op_index] {
                                    buf.fill(0);
                                }
                                Ok(())
                            } else if needs_decode {
                                self.decode(event.slot, present, ops)
                            } else {
                                Ok(())
                            };
                            self.finish(event.slot, result, needs_decode, on_done);
                        }
                        ReadStep::Lost { valid, failed } => {
                            let slot = &self.slots[event.slot];
                            let page = slot.page as usize;
                            if self.page_flags[page] & PAGE_VERSION_UNKNOWN != 0 {
                                // No version has k splits (a torn write, or too many losses):
                                // the page stays unreadable until rewritten, and the next write
                                // must be newer than every split seen.
                                let newest = slot.read.as_ref().and_then(|read| read.newest_version_seen());
                                self.versions[page] = newest.unwrap_or(0).max(1);
                                self.page_flags[page] &= !PAGE_VERSION_UNKNOWN;
                            }
                            let slot = &self.slots[event.slot];
                            let error = self.lost_error(slot.page, slot.range, valid, failed);
                            self.finish(event.slot, Err(error), false, on_done);
                        }
                    }
                }
                Outcome::Write(stored) => {
                    let step = slot
                        .write
                        .as_mut()
                        .expect("write slot has a write state")
                        .on_ack(event.split, stored);
                    match step {
                        WriteStep::Wait => {}
                        WriteStep::Done { degraded } => {
                            let slot = &self.slots[event.slot];
                            self.versions[slot.page as usize] = slot.version;
                            self.page_flags[slot.page as usize] = 0;
                            if degraded != 0 {
                                tracing::debug!(page = slot.page, degraded, "page written degraded");
                            }
                            self.finish(event.slot, Ok(()), false, on_done);
                        }
                        WriteStep::Failed { stored, failed } => {
                            let slot = &self.slots[event.slot];
                            let error = PageError::WriteFailed {
                                page: slot.page,
                                range: slot.range,
                                stored_splits: stored.count_ones() as usize,
                                needed_splits: self.config.shape.data_splits,
                                failed_nodes: self.nodes_of(slot.range, failed),
                            };
                            self.finish(event.slot, Err(error), false, on_done);
                        }
                    }
                }
                Outcome::ProbeFailed => {
                    let address = self.conns[self.probes[slot.probe].targets[0].0].address;
                    self.finish(event.slot, Err(PageError::NodeDown { address }), false, on_done);
                }
                Outcome::ProbeReply => {
                    slot.probe_replies += 1;
                    if slot.probe_replies == self.probes[slot.probe].need {
                        self.finish(event.slot, Ok(()), false, on_done);
                    }
                }
                Outcome::ShmRead => unreachable!("turned into a read outcome above"),
            }
        }
        self.events.clear();
        self.flush_all();
    }

    fn decode(
        &mut self,
        slot_index: usize,
        present: SplitMask,
        ops: &mut [PageOp<'_>],
    ) -> Result<(), PageError> {
        let slot = &self.slots[slot_index];
        let PageOp::Read { buf, .. } = &mut ops[slot.op_index] else {
            unreachable!("a read slot points at a read op");
        };
        self.codec
            .decode(buf, &slot.parity, present)
            .map_err(|error| PageError::Decode { page: slot.page, message: error.to_string() })
    }

    fn finish(
        &mut self,
        slot_index: usize,
        result: Result<(), PageError>,
        decoded: bool,
        on_done: &mut impl FnMut(OpDone),
    ) {
        let slot = &self.slots[slot_index];
        let done = OpDone { index: slot.op_index, result, latency: slot.started.elapsed(), decoded };
        self.release_slot(slot_index);
        on_done(done);
    }

    /// A node that leaves a split unanswered past the deadline is treated as failed (a silent
    /// hang, SIGSTOP, a partition): its connection is closed, its splits in flight fail over to
    /// other splits, its slabs become unavailable and are rebuilt elsewhere.
    fn expire_deadlines(&mut self) {
        let now = Instant::now();
        let mut hung: u64 = 0;
        for slot in &self.slots {
            if slot.kind == SlotKind::Free || slot.deadline > now {
                continue;
            }
            let pending = match slot.kind {
                SlotKind::Read => slot.read.as_ref().map_or(0, |read| read.pending()),
                SlotKind::Write => slot.write.as_ref().map_or(0, |write| write.pending()),
                SlotKind::Probe => slot.probe_asked,
                SlotKind::Free => 0,
            };
            for split in 0..MAX_SPLITS {
                if pending & (1 << split) == 0 {
                    continue;
                }
                let node = match slot.kind {
                    SlotKind::Probe => self.probes[slot.probe].targets[split].0,
                    _ => self.ranges[slot.range].slabs[split].node,
                };
                hung |= 1 << node.min(63);
            }
        }
        for node in 0..self.conns.len().min(64) {
            if hung & (1 << node) != 0 {
                self.conn_died(node, "no reply within the request timeout");
            }
        }
        for slot in &mut self.slots {
            if slot.kind != SlotKind::Free && slot.deadline <= now {
                // Replacements asked because of this expiry get their own full timeout.
                slot.deadline = now + self.config.request_timeout;
            }
        }
    }

    /// Sends one control request to a node and runs the event loop until its reply arrives.
    fn control(&mut self, node: usize, message: &Control) -> Result<Control, PageError> {
        assert_eq!(self.active, 0, "control requests run between batches");
        let address = self.conns[node].address;
        if !self.conns[node].alive {
            return Err(PageError::NodeDown { address });
        }
        self.control_counter += 1;
        let id = CONTROL_REQUEST | self.control_counter;
        message.encode(id, &mut self.conns[node].out);
        self.flush(node);
        let deadline = Instant::now() + self.config.request_timeout;
        self.control_reply = None;
        self.control_fd = None;
        loop {
            if let Some((reply_id, reply)) = self.control_reply.take() {
                if reply_id == id {
                    return match reply {
                        Control::Error { code, message } => {
                            Err(PageError::Refused { address, code: format!("{code:?}"), message })
                        }
                        reply => Ok(reply),
                    };
                }
            }
            if !self.conns[node].alive {
                return Err(PageError::NodeDown { address });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(PageError::Timeout { address });
            }
            if self.poll.poll(&mut self.poll_events, Some(deadline - now)).is_err() {
                continue;
            }
            let tokens: Vec<usize> = self.poll_events.iter().map(|event| event.token().0).collect();
            for index in tokens {
                self.flush(index);
                self.read_conn(index, &mut []);
            }
            self.events.clear();
        }
    }

    /// Asks every node for its state.
    pub fn node_infos(&mut self) -> Vec<(SocketAddr, Result<NodeInfo, PageError>)> {
        (0..self.conns.len())
            .map(|node| {
                let address = self.conns[node].address;
                let info = match self.control(node, &Control::NodeInfo) {
                    Ok(Control::NodeInfoReply(info)) => {
                        self.conns[node].info = info.clone();
                        Ok(info)
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

    /// The remote memory this client holds: its slabs and their metadata, from what the nodes
    /// report (each node's totals split evenly over its slabs).
    pub fn memory_report(&mut self) -> MemoryReport {
        let infos = self.node_infos();
        let mut report = MemoryReport {
            address_space_bytes: self.ranges.len() as u64
                * self.pages_per_range
                * self.config.page_bytes as u64,
            ..MemoryReport::default()
        };
        let mut mine = vec![0u64; self.conns.len()];
        for range in &self.ranges {
            for slab in &range.slabs {
                mine[slab.node] += 1;
            }
        }
        for (node, (_, info)) in infos.iter().enumerate() {
            if let Ok(info) = info {
                report.slab_bytes += mine[node] * info.slab_size_bytes;
                if info.slabs_mapped > 0 {
                    report.metadata_bytes += info.metadata_bytes * mine[node] / info.slabs_mapped as u64;
                }
            }
        }
        report
    }

    /// Prepares a raw fan-out probe for the transport floor: one slab of `split_bytes` slots on
    /// each of `nodes`, read at slot 0; the probe op is done at the `need`-th reply. Returns the
    /// probe index for [`PageOp::Probe`].
    pub fn prepare_probe(
        &mut self,
        nodes: &[usize],
        split_bytes: usize,
        need: usize,
    ) -> Result<usize, PageError> {
        assert!(need >= 1 && need <= nodes.len() && nodes.len() <= MAX_SPLITS);
        let mut targets = Vec::with_capacity(nodes.len());
        for &node in nodes {
            let message = Control::MapSlab {
                split_bytes: split_bytes as u32,
                split_index: 0,
                first_page: 0,
                range_id: u64::MAX,
            };
            match self.control(node, &message)? {
                Control::SlabMapped { slab_id, .. } => {
                    targets.push((node, slab_id));
                    self.probe_slabs.push((node, slab_id));
                }
                other => {
                    let address = self.conns[node].address;
                    return Err(PageError::Protocol {
                        address,
                        message: format!("{:?} reply", other.kind()),
                    });
                }
            }
        }
        self.probes.push(Probe { targets, need });
        Ok(self.probes.len() - 1)
    }

    /// Nodes that hold the slabs of range 0, in split order (for probes that mirror a page).
    pub fn range_nodes(&self, range: usize) -> Vec<usize> {
        self.ranges[range].slabs.iter().map(|slab| slab.node).collect()
    }

    /// Pages per address range: page `p` lives in range `p / pages_per_range()`.
    pub fn pages_per_range(&self) -> u64 {
        self.pages_per_range
    }

    /// Unmaps every slab of this client. Also done on drop; call it to see the errors.
    pub fn release(&mut self) -> Result<(), PageError> {
        // Our mappings go first: a slab is never touched again once its unmap is on the way.
        self.shm.iter_mut().for_each(|mapping| *mapping = None);
        let mut first_error = None;
        let mut slabs: Vec<(usize, u32)> = self.probe_slabs.drain(..).collect();
        for range in self.ranges.drain(..) {
            slabs.extend(range.slabs.iter().map(|slab| (slab.node, slab.slab_id)));
        }
        for (node, slab_id) in slabs {
            if !self.conns[node].alive {
                continue;
            }
            if let Err(error) = self.control(node, &Control::UnmapSlab { slab_id }) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !self.config.release_on_drop {
            return;
        }
        if let Err(error) = self.release() {
            tracing::warn!(%error, "could not release every slab");
        }
    }
}

fn blocking_control(
    stream: &mut (impl Read + Write),
    request_id: u64,
    message: &Control,
    address: SocketAddr,
) -> Result<Control, ConnectError> {
    let io_error = |source| ConnectError::Io { address, source };
    remem_proto::blocking::write_control(stream, request_id, message).map_err(io_error)?;
    let mut body = Vec::new();
    let header = remem_proto::blocking::read_frame(stream, &mut body)
        .map_err(|error| ConnectError::Protocol { address, message: error.to_string() })?;
    if header.request_id != request_id {
        return Err(ConnectError::Protocol { address, message: "reply to another request".into() });
    }
    let reply = Control::decode_body(header.kind, &body)
        .map_err(|error| ConnectError::Protocol { address, message: error.to_string() })?;
    if let Control::Error { code, message } = reply {
        return Err(ConnectError::Refused { address, code: format!("{code:?}"), message });
    }
    Ok(reply)
}

fn unexpected(address: SocketAddr, reply: &Control) -> ConnectError {
    ConnectError::Protocol { address, message: format!("unexpected reply {:?}", reply.kind()) }
}

/// The shared mapping of split `split` of range `range`, if it is exported and still the slab the
/// range names (a rebuilt or replaced slab never reuses an old mapping).
fn live_shm<'a>(
    shm: &'a [Option<ShmSlab>],
    ranges: &[Range],
    width: usize,
    range: usize,
    split: usize,
) -> Option<&'a ShmSlab> {
    let mapping = shm.get(range * width + split)?.as_ref()?;
    let slab = ranges[range].slabs[split];
    (mapping.node == slab.node && mapping.slab_id == slab.slab_id).then_some(mapping)
}

impl Client {
    /// Asks every Unix-socket node to export this client's slabs on it and maps them. A slab
    /// that cannot be exported stays on the socket path (logged). Between batches only.
    /// Tells every node that this client's connection answers its resource monitor's activity
    /// questions (`AnswerActivity`; side connections never do). A node that refuses is only
    /// logged: it then ranks our slabs by what it sees.
    pub(super) fn volunteer_for_activity(&mut self) {
        for node in 0..self.conns.len() {
            if !self.conns[node].alive {
                continue;
            }
            if let Err(error) = self.control(node, &Control::AnswerActivity) {
                tracing::warn!(node = %self.conns[node].address, %error, "node will not ask us about activity");
            }
        }
    }

    /// Maps the slabs rebuilt since the last batch as shared memory (a control round trip each,
    /// so only between batches). A slab that changed again or is unavailable is skipped.
    fn export_rebuilt_slabs(&mut self) {
        let width = self.config.shape.total_splits();
        for (range, split) in std::mem::take(&mut self.pending_exports) {
            let slab = self.ranges[range].slabs[split];
            let skipped =
                (self.ranges[range].unavailable | self.ranges[range].rebuilding) & (1 << split) != 0;
            if skipped || self.shm[range * width + split].is_some() {
                continue;
            }
            match self.export_slab(slab.node, slab.slab_id) {
                Ok(mapping) => {
                    self.shm[range * width + split] = Some(mapping);
                    self.shm_in_use = true;
                }
                Err(message) => tracing::warn!(node = %self.conns[slab.node].address, slab_id = slab.slab_id,
                    %message, "rebuilt slab stays on the socket path"),
            }
        }
    }

    fn export_slabs(&mut self) {
        let width = self.config.shape.total_splits();
        for range in 0..self.ranges.len() {
            for split in 0..width {
                let slab = self.ranges[range].slabs[split];
                let skipped =
                    (self.ranges[range].unavailable | self.ranges[range].rebuilding) & (1 << split) != 0;
                if skipped || !matches!(self.conns[slab.node].stream, ConnStream::Unix(_)) {
                    continue;
                }
                match self.export_slab(slab.node, slab.slab_id) {
                    Ok(mapping) => {
                        self.shm[range * width + split] = Some(mapping);
                        self.shm_in_use = true;
                    }
                    Err(message) => {
                        tracing::warn!(node = %self.conns[slab.node].address, slab_id = slab.slab_id, %message,
                            "slab stays on the socket path")
                    }
                }
            }
        }
    }

    /// Starts loading the shared-memory slots of `mask` (see [`ShmSlab::prefetch`]).
    fn prefetch_shm(&self, range: usize, slot_in_range: u32, mask: SplitMask) {
        if !self.shm_in_use {
            return;
        }
        let width = self.config.shape.total_splits();
        for split in (0..width).filter(|split| mask & (1 << split) != 0) {
            if let Some(mapping) = live_shm(&self.shm, &self.ranges, width, range, split) {
                mapping.prefetch(slot_in_range);
            }
        }
    }

    /// The splits of range `range` that this client reads and writes through shared memory.
    pub fn shared_memory_splits(&self, range: usize) -> SplitMask {
        let width = self.config.shape.total_splits();
        (0..width)
            .filter(|&split| live_shm(&self.shm, &self.ranges, width, range, split).is_some())
            .fold(0, |mask, split| mask | (1 << split))
    }

    fn export_slab(&mut self, node: usize, slab_id: u32) -> Result<ShmSlab, String> {
        let reply =
            self.control(node, &Control::ExportSlab { slab_id }).map_err(|error| error.to_string())?;
        let memfd = self.control_fd.take();
        let Control::SlabExported { slab_id: exported, epoch, layout } = reply else {
            return Err(format!("{:?} reply to ExportSlab", reply.kind()));
        };
        if exported != slab_id {
            return Err(format!("asked for slab {slab_id}, node exported {exported}"));
        }
        if layout.split_bytes as usize != self.split_bytes || u64::from(layout.slots) != self.pages_per_range
        {
            return Err(format!("slab of {} splits of {} bytes", layout.slots, layout.split_bytes));
        }
        let memfd = memfd.ok_or("no descriptor with SlabExported")?;
        let expected = shm::Expected { owner_client_id: self.config.client_id, slab_id, epoch, layout };
        ShmSlab::map(memfd, node, expected).map_err(|error| error.to_string())
    }

    /// Forgets the shared mapping of one split (revoked, evicted, its node lost, or replaced).
    pub(super) fn drop_shm(&mut self, range: usize, split: usize) {
        let width = self.config.shape.total_splits();
        if let Some(mapping) = self.shm.get_mut(range * width + split) {
            *mapping = None;
        }
    }

    /// Reads one split of a shared-memory slab straight into its place (the caller's page for a
    /// data split, the op's parity buffer for a parity) and checks it like a split from a socket.
    fn read_shm_split(&mut self, slot_index: usize, split: usize, ops: &mut [PageOp<'_>]) -> SplitOutcome {
        let width = self.config.shape.total_splits();
        let k = self.config.shape.data_splits;
        let split_bytes = self.split_bytes;
        let slot = &mut self.slots[slot_index];
        let (range, page, slot_in_range) = (slot.range, slot.page, slot.slot_in_range);
        let Some(mapping) = live_shm(&self.shm, &self.ranges, width, range, split) else {
            return SplitOutcome::Failed;
        };
        let target = if split >= k {
            &mut slot.parity[(split - k) * split_bytes..(split - k + 1) * split_bytes]
        } else if let PageOp::Read { buf, .. } = &mut ops[slot.op_index] {
            &mut buf[split * split_bytes..(split + 1) * split_bytes]
        } else {
            unreachable!("a read slot points at a read op");
        };
        let node = mapping.node;
        let Some(meta) = mapping.read_split(slot_in_range, target) else {
            if mapping.is_revoked() {
                self.schedule_regeneration(range, split, "shared-memory slab revoked");
                return SplitOutcome::Failed;
            }
            // A write overlapped the copy (not ours: we never race ourselves): an erasure.
            return SplitOutcome::Corrupt;
        };
        let checksum = remem_proto::split_checksum(target, meta.version, page, split as u8);
        self.record_split_read(node);
        if meta.version == 0 && meta.checksum == 0 {
            SplitOutcome::Valid { version: 0 }
        } else if checksum != meta.checksum || meta.version == 0 {
            self.record_corruption(node);
            SplitOutcome::Corrupt
        } else {
            SplitOutcome::Valid { version: meta.version }
        }
    }
}
