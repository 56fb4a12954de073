//! remem-node: the memory node server.
//!
//! Job: hold slabs of memory (memfds, `shared_memory`) for authenticated clients and serve split
//! reads and writes on them over the remem wire protocol (`docs/PROTOCOL.md`). A node stores what clients send and
//! never interprets payloads on the data path: erasure coding, checksum verification and
//! placement are the client's. The one exception is a rebuild (`Regenerate`, module
//! `regenerate`): there the node acts for the client, reads surviving splits from other nodes,
//! checks their checksums and decodes, to fill a new slab without the client doing the work.
//!
//! Shape: every decision is the sans-I/O core's (`core`: slab table, sessions, leases, rebuild
//! admission), which the simulator (crates/simnet) runs too; the rest of this crate is the
//! threaded shell that runs it over sockets. One acceptor loop ([`Node::run`]) and one thread per connection with blocking I/O and
//! buffered frames (module `connection`). Each node is its own process and the connection count
//! is bounded by `max_connections`, so threads are cheap enough and keep request order per
//! connection trivially. What all these threads share is one `shared::Shared`. Rebuilds run on
//! their own threads, at most [`MAX_CONCURRENT_REGENERATIONS`] at once. Fault injection (`fault`)
//! exists only when the node is configured for it. The resource monitor (`monitor`), when configured, is one more thread
//! that keeps a free-memory headroom on the host: it pre-allocates slabs when memory is plentiful
//! and evicts the least active ones when it is not.
//!
//! Invariants:
//! - Nothing but the handshake is served before a connection is authenticated.
//! - A slab is used only by the client id that mapped it; it outlives connections (a restarted
//!   client with the same id keeps its slabs) and is unmapped on `UnmapSlab` or node shutdown.
//! - Mapped memory (slabs plus 5 bytes of metadata per slot) plus pre-allocated slabs never
//!   exceeds `capacity_bytes`.
//! - After `run` returns, no connection, rebuild or monitor thread is left and every slab is
//!   unmapped.

mod connection;
pub mod core;
mod fault;
pub mod leases;
mod log_limit;
pub mod monitor;
mod peers;
mod regenerate;
mod shared;
mod shared_memory;
mod slot_copy;
mod stream;

pub use connection::{
    CONNECTION_BUFFER_BUDGET_BYTES, HANDSHAKE_TIMEOUT, IDLE_SHRINK_AFTER, INPUT_BUFFER_BYTES,
    PARTIAL_FRAME_TIMEOUT, SMALL_INPUT_BYTES, WRITE_TIMEOUT,
};

/// Connections that have not authenticated yet, at most, apart from `max_connections`
/// authenticated ones. Each lives at most [`HANDSHAKE_TIMEOUT`] in all.
pub const MAX_UNAUTHENTICATED_CONNECTIONS: usize = 64;
pub use core::{MAX_CONCURRENT_REGENERATIONS, METADATA_BYTES_PER_SLOT};
pub use monitor::{MemorySource, ResourceMonitorConfig};
pub use regenerate::{read_floor, FloorSource, RegenerationReport, PIPELINE_DEPTH};

use connection::Connection;
use fault::Faults;
use monitor::Monitor;
use peers::{Peer, Peers};
use regenerate::Regenerations;
use remem_proto::auth::Secret;
use remem_proto::MAX_FAILURE_DOMAIN_BYTES;
use shared::Shared;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stream::Stream;

/// How often the acceptor looks at the shutdown flag.
const SHUTDOWN_POLL: Duration = Duration::from_millis(50);
/// How often expired leases are looked for: a lease's slabs are freed at most this much after
/// its grace period ends.
const LEASE_CHECK_PERIOD: Duration = Duration::from_millis(250);
/// Smallest slab: one page, so mmap lengths are page multiples.
pub const MIN_SLAB_SIZE_BYTES: u64 = 4096;
/// Largest slab: 4 GiB keeps the slot count of the smallest splits (64 bytes) well inside u32.
pub const MAX_SLAB_SIZE_BYTES: u64 = 1 << 32;

/// Everything a node needs to start.
#[derive(Debug)]
pub struct NodeConfig {
    pub listen: SocketAddr,
    /// Most memory the node maps for slabs plus their metadata.
    pub capacity_bytes: u64,
    /// Size of every slab: a power of two in 4 KiB..=4 GiB.
    pub slab_size_bytes: u64,
    /// Reported in `NodeInfoReply`; at most 64 bytes of UTF-8.
    pub failure_domain: String,
    pub secret: Secret,
    pub node_id: u64,
    /// Authenticated connections served at once; a further one gets `Error(NoCapacity)` after
    /// its handshake and is closed. Connections still authenticating are counted apart
    /// ([`MAX_UNAUTHENTICATED_CONNECTIONS`]).
    pub max_connections: usize,
    /// Accept `InjectFault` (tests and benchmarks only); without it the node answers
    /// `Error(Unsupported)`.
    pub fault_injection: bool,
    /// Keep a free-memory headroom on the host (pre-allocate, evict); `None` lends up to
    /// `capacity_bytes` whatever the host has left.
    pub resource_monitor: Option<ResourceMonitorConfig>,
    /// Also listen on this Unix socket (same protocol, plus `ExportSlab` for same-host clients,
    /// `docs/SHM.md`). A stale socket file at the path is replaced; the file is removed when the
    /// node stops.
    pub unix_socket: Option<PathBuf>,
    /// How long the slabs of a client whose lease lapsed (its last connection closed, or its
    /// host stopped answering TCP keepalive) are kept for it to re-attach (`leases`).
    pub lease_grace: Duration,
    /// A claimed connection that sends nothing for this long (no request, no heartbeat) is
    /// closed, so a stopped client process loses its lease (`leases`).
    pub lease_timeout: Duration,
    /// Require authenticated encryption (Noise, `remem_proto::encryption`) on every TCP
    /// connection, and use it on the node's own connections to rebuild sources. Unix sockets
    /// stay on the host and are never encrypted.
    pub encrypt: bool,
}

/// A bound, not yet serving, memory node.
pub struct Node {
    listener: TcpListener,
    local_addr: SocketAddr,
    unix_listener: Option<(UnixListener, PathBuf)>,
    shared: Arc<Shared>,
    /// The monitor to start in `run`, with the memory source chosen at bind.
    monitor: Option<(ResourceMonitorConfig, MemorySource)>,
}

/// A handle on a node's state that outlives [`Node::run`]'s borrow: for node-internal actions
/// that do not come from a client, such as eviction under memory pressure.
#[derive(Clone)]
pub struct NodeHandle {
    shared: Arc<Shared>,
}

impl NodeHandle {
    /// Evicts slab `slab_id`: sends `SlabEvicted` to every connection of its owner on this node,
    /// then unmaps it (memory returns once in-flight requests on it finish).
    ///
    /// Errors: `NotFound` if no such slab is mapped.
    pub fn evict_slab(&self, slab_id: u32) -> io::Result<()> {
        self.shared
            .evict_slab(slab_id, None)
            .map(|_| ())
            .map_err(|error| io::Error::new(io::ErrorKind::NotFound, error.to_string()))
    }

    /// What the node would answer to `NodeInfo` now.
    pub fn info(&self) -> remem_proto::NodeInfo {
        self.shared.core.node_info()
    }

    /// Bytes of connection buffers charged to the node-wide budget now
    /// ([`CONNECTION_BUFFER_BUDGET_BYTES`]).
    pub fn connection_buffer_bytes(&self) -> usize {
        self.shared.buffer_budget.used_bytes()
    }

    /// Pre-allocated slabs waiting for a `MapSlab`.
    pub fn pooled_slabs(&self) -> u32 {
        self.shared.core.table.stats().pooled_slabs
    }

    /// Slabs freed since start because their client's lease expired (`leases`).
    pub fn slabs_freed_by_lease_expiry(&self) -> u64 {
        self.shared.core.slabs_freed_by_expiry.load(Ordering::Relaxed)
    }
}

impl Node {
    /// Validates `config` and binds the listener.
    ///
    /// Errors: `InvalidInput` for a slab size that is not a power of two in 4 KiB..=4 GiB,
    /// a failure domain over 64 bytes, `max_connections == 0`, a monitor knob out of range, or a
    /// monitor that finds no memory source; bind errors as they come.
    pub fn bind(config: NodeConfig) -> io::Result<Node> {
        let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidInput, message);
        if !config.slab_size_bytes.is_power_of_two()
            || !(MIN_SLAB_SIZE_BYTES..=MAX_SLAB_SIZE_BYTES).contains(&config.slab_size_bytes)
        {
            return Err(invalid(format!(
                "slab_size_bytes {} must be a power of two in {MIN_SLAB_SIZE_BYTES}..={MAX_SLAB_SIZE_BYTES}",
                config.slab_size_bytes
            )));
        }
        if config.failure_domain.len() > MAX_FAILURE_DOMAIN_BYTES {
            return Err(invalid(format!("failure domain longer than {MAX_FAILURE_DOMAIN_BYTES} bytes")));
        }
        if config.max_connections == 0 {
            return Err(invalid("max_connections must be at least 1".to_owned()));
        }
        let monitor = match config.resource_monitor {
            Some(monitor_config) => {
                monitor_config.validate().map_err(invalid)?;
                let source = MemorySource::detect(&monitor_config.filesystem_root)
                    .map_err(|error| invalid(format!("resource monitor: no memory source: {error}")))?;
                let reading = source.read().map_err(|error| invalid(format!("resource monitor: {error}")))?;
                tracing::info!(
                    %source,
                    limit_bytes = reading.limit_bytes,
                    free_bytes = reading.free_bytes,
                    period_ms = monitor_config.period.as_millis() as u64,
                    headroom_percent = monitor_config.headroom_percent,
                    eviction_extra = monitor_config.eviction_extra,
                    prealloc_slabs = monitor_config.prealloc_slabs,
                    "resource monitor: host memory source chosen"
                );
                Some((monitor_config, source))
            }
            None => {
                tracing::info!(
                    "resource monitor off: the node lends up to its capacity whatever the host has left"
                );
                None
            }
        };
        let listener = TcpListener::bind(config.listen)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let unix_listener = match &config.unix_socket {
            Some(path) => Some((bind_unix(path)?, path.clone())),
            None => None,
        };
        tracing::info!(
            %local_addr,
            node_id = config.node_id,
            capacity_bytes = config.capacity_bytes,
            slab_size_bytes = config.slab_size_bytes,
            failure_domain = %config.failure_domain,
            fault_injection = config.fault_injection,
            unix_socket = ?config.unix_socket,
            encrypt = config.encrypt,
            "node listening"
        );
        Ok(Node {
            listener,
            local_addr,
            unix_listener,
            monitor,
            shared: Arc::new(Shared {
                core: core::NodeCore::new(core::CoreConfig {
                    node_id: config.node_id,
                    capacity_bytes: config.capacity_bytes,
                    slab_size_bytes: config.slab_size_bytes,
                    failure_domain: config.failure_domain,
                    fault_injection: config.fault_injection,
                    backing: core::Backing::Memfd,
                    lease_grace: config.lease_grace,
                    lease_timeout: config.lease_timeout,
                }),
                secret: config.secret,
                encrypt: config.encrypt,
                peers: Peers::default(),
                faults: Faults::new(config.fault_injection),
                regenerations: Regenerations::default(),
                stopping: AtomicBool::new(false),
                activity_answers: monitor::ActivityAnswers::default(),
                max_connections: config.max_connections,
                buffer_budget: connection::BufferBudget::new(CONNECTION_BUFFER_BUDGET_BYTES),
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn handle(&self) -> NodeHandle {
        NodeHandle { shared: Arc::clone(&self.shared) }
    }

    /// Serves until `shutdown` is set (checked every 50 ms), then closes every connection, joins
    /// their threads and unmaps all slabs.
    ///
    /// Errors: only if polling the listener itself fails; per-connection and accept errors are
    /// logged and survived.
    pub fn run(mut self, shutdown: Arc<AtomicBool>) -> io::Result<()> {
        let monitor = match self.monitor.take() {
            Some((config, source)) => Some(Monitor::start(Arc::clone(&self.shared), config, source)?),
            None => None,
        };
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut next_connection = 0u64;
        let mut leases_checked = Instant::now();
        let result = loop {
            if shutdown.load(Ordering::Relaxed) {
                break Ok(());
            }
            if leases_checked.elapsed() >= LEASE_CHECK_PERIOD {
                leases_checked = Instant::now();
                self.shared.core.expire_leases(leases_checked);
            }
            threads.retain(|thread| !thread.is_finished());
            let unix_fd = self.unix_listener.as_ref().map(|(listener, _)| listener.as_raw_fd());
            let (tcp_ready, unix_ready) =
                match wait_readable(self.listener.as_raw_fd(), unix_fd, SHUTDOWN_POLL) {
                    Ok(ready) => ready,
                    Err(error) => break Err(error),
                };
            if tcp_ready {
                match self.listener.accept() {
                    Ok((stream, peer)) => {
                        next_connection += 1;
                        let prepared = stream
                            .set_nodelay(true)
                            .and_then(|()| connection::keepalive(&stream))
                            .map(|()| Stream::Tcp(stream));
                        if let Some(thread) =
                            self.start_connection(next_connection, prepared, peer.to_string())
                        {
                            threads.push(thread);
                        }
                    }
                    Err(error) => self.accept_failed(error),
                }
            }
            if let (true, Some((listener, _))) = (unix_ready, &self.unix_listener) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        next_connection += 1;
                        if let Some(thread) = self.start_connection(
                            next_connection,
                            Ok(Stream::Unix(stream)),
                            "unix".to_owned(),
                        ) {
                            threads.push(thread);
                        }
                    }
                    Err(error) => self.accept_failed(error),
                }
            }
        };
        self.stop(threads, monitor);
        result
    }

    fn accept_failed(&self, error: io::Error) {
        if error.kind() == io::ErrorKind::WouldBlock {
            return;
        }
        // Typically EMFILE or a connection reset before accept: keep serving, but do not spin on
        // a persistent error.
        tracing::warn!(%error, "accept failed");
        std::thread::sleep(SHUTDOWN_POLL);
    }

    fn start_connection(
        &self,
        number: u64,
        stream: io::Result<Stream>,
        peer: String,
    ) -> Option<JoinHandle<()>> {
        let prepared = stream.and_then(|stream| {
            stream.set_nonblocking(false)?;
            let handle = stream.try_clone()?;
            Ok((stream, handle))
        });
        let (stream, handle) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::warn!(%peer, %error, "cannot set up connection");
                return None;
            }
        };
        let handle = Arc::new(Peer::new(handle));
        // Not authenticated yet: a pool of its own, the oldest waiting connection evicted when it
        // is full (`Peers::insert_unauthenticated`). The authenticated limit is checked after
        // the handshake.
        if let Some(evicted) = self.shared.peers.insert_unauthenticated(
            number,
            Arc::clone(&handle),
            MAX_UNAUTHENTICATED_CONNECTIONS,
        ) {
            if log_limit::UNAUTHENTICATED_FAILURES.allow() {
                tracing::warn!(%peer, evicted, "too many connections waiting to authenticate: the oldest closed");
            }
        }
        // Anyone can connect: the line worth keeping is "client authenticated", at info.
        tracing::debug!(%peer, connection = number, "connection accepted");
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new().name(format!("remem-conn-{number}")).spawn(move || {
            Connection::new(stream, peer, Arc::clone(&shared), number, handle).serve();
            shared.peers.remove(number);
        });
        match spawned {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::error!(%error, "cannot spawn connection thread");
                self.shared.peers.remove(number);
                None
            }
        }
    }

    fn stop(&self, threads: Vec<JoinHandle<()>>, monitor: Option<Monitor>) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // The monitor sees the flag within 50 ms; it may not fill the pool after `clear`.
        if let Some(monitor) = monitor {
            monitor.join();
        }
        let open = self.shared.peers.drain();
        // Shutting a socket down wakes a thread blocked reading or writing it.
        for peer in &open {
            let _ = peer.stream.shutdown(std::net::Shutdown::Both);
        }
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a connection thread panicked");
            }
        }
        self.shared.regenerations.stop_and_join();
        let slabs = self.shared.core.table.clear();
        if let Some((_, path)) = &self.unix_listener {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!(
            connections_closed = open.len(),
            slabs_unmapped = slabs,
            requests_served = self.shared.core.requests_served.load(Ordering::Relaxed),
            "node stopped"
        );
    }
}

/// Binds the Unix listener at `path`, replacing a stale socket file (never any other file).
fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = UnixListener::bind(path)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Waits up to `timeout` for either listener to have a connection to accept; returns which.
fn wait_readable(tcp: RawFd, unix: Option<RawFd>, timeout: Duration) -> io::Result<(bool, bool)> {
    let mut poll_fds = [
        libc::pollfd { fd: tcp, events: libc::POLLIN, revents: 0 },
        // A negative fd is ignored by poll.
        libc::pollfd { fd: unix.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: two valid pollfds that live across the call; nfds is 2.
    let ready = unsafe { libc::poll(poll_fds.as_mut_ptr(), 2, timeout.as_millis() as libc::c_int) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok((false, false));
        }
        return Err(error);
    }
    Ok((poll_fds[0].revents != 0, poll_fds[1].revents != 0))
}
