//! The listener: accepts connections on TCP or a Unix socket and serves each on its own thread.
//!
//! Slots. A connection in its handshake sits in a bounded pool of its own (the oldest closed
//! when it is full) and has one deadline for the whole handshake; only at the end of the
//! handshake does it take one of `max_connections` transmission slots. So connections that
//! never finish the handshake cannot lock clients out, while clients in transmission may stay
//! quiet as long as they like (the kernel's NBD client, qemu and nbdcopy all do). A slot in
//! transmission is only for whoever passed the export's access control (Unix socket
//! permissions, TLS with client certificates): docs/SECURITY.md. A per-address limit is left
//! out: same-host clients all come from 127.0.0.1 or a Unix socket, with no address to tell
//! them apart.
//!
//! All connections share one [`SharedStore`]: one [`crate::PageStore`] behind a mutex, held for
//! the span of one batch (the remem client is driven by one thread at a time, run to
//! completion, so connections take turns per batch), or one engine per core with the pages
//! sharded across them ([`crate::Shards`]), where connections on different cores run different
//! engines at once. A stop flag ends the
//! accept loop and, at the next wait for input, every connection; `serve` returns when all
//! connection threads have finished.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::ConnectionError;
use crate::handshake::Export;
use crate::log_limit::CONNECTION_EVENTS;
use crate::session;
use crate::shards::SharedStore;
use crate::tls::TlsSettings;
use crate::transmission::{poll_readable, Limits, Transmission};

/// Where the server listens.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// A connected client socket.
pub enum Stream {
    Tcp(std::net::TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(stream) => Stream::Tcp(stream.try_clone()?),
            Stream::Unix(stream) => Stream::Unix(stream.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(stream) => stream.shutdown(Shutdown::Both),
            Stream::Unix(stream) => stream.shutdown(Shutdown::Both),
        };
    }

    pub(crate) fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => {
                stream.set_read_timeout(Some(read))?;
                stream.set_write_timeout(Some(write))
            }
            Stream::Unix(stream) => {
                stream.set_read_timeout(Some(read))?;
                stream.set_write_timeout(Some(write))
            }
        }
    }

    fn configure(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => {
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)
            }
            Stream::Unix(stream) => stream.set_nonblocking(false),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.read(buf),
            Stream::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write(buf),
            Stream::Unix(stream) => stream.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(stream) => stream.as_raw_fd(),
            Stream::Unix(stream) => stream.as_raw_fd(),
        }
    }
}

impl Listener {
    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, peer) = listener.accept()?;
                Ok((Stream::Tcp(stream), peer.to_string()))
            }
            Listener::Unix(listener) => {
                let (stream, _) = listener.accept()?;
                Ok((Stream::Unix(stream), "unix".to_string()))
            }
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(listener) => listener.set_nonblocking(true),
            Listener::Unix(listener) => listener.set_nonblocking(true),
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Listener::Tcp(listener) => listener.as_raw_fd(),
            Listener::Unix(listener) => listener.as_raw_fd(),
        }
    }
}

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub export: Export,
    pub limits: Limits,
    /// Connections in transmission at once; a client past it is refused at the end of its
    /// handshake (`NBD_REP_ERR_POLICY` to GO, a disconnect for EXPORT_NAME).
    pub max_connections: usize,
    /// Connections still in their handshake at once, apart from `max_connections`; when full,
    /// the oldest is closed to make room.
    pub max_handshakes: usize,
    /// The whole handshake (TLS included) must end within this, or the connection is closed.
    pub handshake_timeout: Duration,
    /// A client that does not take its replies for this long is dropped.
    pub reply_timeout: Duration,
    /// TLS offered (or required) over this listener; `None`: STARTTLS is refused.
    pub tls: Option<TlsSettings>,
}

impl ServerConfig {
    pub fn new(export: Export) -> ServerConfig {
        let limits = Limits { max_request_bytes: export.max_request_bytes, ..Limits::default() };
        ServerConfig {
            export,
            limits,
            max_connections: 16,
            max_handshakes: 64,
            handshake_timeout: Duration::from_secs(10),
            reply_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// Serves one connection: handshake, then transmission until the client leaves. `admit` takes
/// a transmission slot at the end of the handshake.
pub fn serve_connection<S: SharedStore>(
    stream: Stream,
    store: &S,
    connection: u64,
    config: &ServerConfig,
    stop: &AtomicBool,
    admit: &dyn Fn() -> bool,
) -> Result<(), ConnectionError> {
    match session::handshake(stream, config, admit)? {
        None => Ok(()),
        Some((session, negotiated)) => {
            Transmission::new(session, store, connection, &config.export, negotiated, config.limits, stop)
                .run()
        }
    }
}

/// Connections in their handshake: a pool apart from the transmission slots, bounded, the
/// oldest closed when a new one needs room. A flood of connections that never finish the
/// handshake thus delays a real client by at most its own handshake, and each lives at most
/// `handshake_timeout` anyway.
#[derive(Default)]
struct Handshakes {
    open: Mutex<VecDeque<(u64, Stream)>>,
}

impl Handshakes {
    /// Adds connection `id`; returns how many older ones were closed to stay within `max`.
    fn insert(&self, id: u64, stream: Stream, max: usize) -> usize {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut evicted = 0;
        while open.len() >= max.max(1) {
            let Some((_, oldest)) = open.pop_front() else { break };
            // Wakes the thread blocked reading it; its handshake ends with an error.
            oldest.shutdown();
            evicted += 1;
        }
        open.push_back((id, stream));
        evicted
    }

    fn remove(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        open.retain(|(open_id, _)| *open_id != id);
    }
}

/// How often the server lets the store do background work ([`PageStore::background`]).
pub const BACKGROUND_INTERVAL: Duration = Duration::from_millis(100);

/// Accepts and serves connections until `stop` is raised, then waits for every connection.
/// A background thread runs the store's background work every [`BACKGROUND_INTERVAL`] under the
/// store's lock, between requests: healing (rebuilds, failed nodes noticed and readmitted) must
/// not wait for traffic.
///
/// Lines a client can cause at will (connections, their failures, failed requests) are
/// rate-limited (`log_limit`).
pub fn serve<S: SharedStore>(
    listener: &Listener,
    store: &S,
    config: &ServerConfig,
    stop: &AtomicBool,
) -> io::Result<()> {
    listener.set_nonblocking()?;
    let active = AtomicUsize::new(0);
    let handshakes = Handshakes::default();
    std::thread::scope(|scope| {
        let background =
            std::thread::Builder::new().name("nbd-background".into()).spawn_scoped(scope, || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(BACKGROUND_INTERVAL);
                    store.background();
                }
            });
        if let Err(error) = background {
            tracing::warn!(%error, "cannot start the background thread: the export heals only under I/O");
        }
        let mut connection_id = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if !poll_readable(listener.raw_fd(), config.limits.poll_interval_ms)? {
                continue;
            }
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!(%error, "accept failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let registered = stream.configure().and_then(|()| stream.try_clone());
            let handle = match registered {
                Ok(handle) => handle,
                Err(error) => {
                    tracing::warn!(%peer, %error, "cannot configure the connection");
                    continue;
                }
            };
            connection_id += 1;
            let evicted = handshakes.insert(connection_id, handle, config.max_handshakes);
            if evicted > 0 && CONNECTION_EVENTS.allow() {
                tracing::warn!(%peer, evicted, "too many connections in their handshake: the oldest closed");
            }
            let (active, handshakes) = (&active, &handshakes);
            let spawned = std::thread::Builder::new().name(format!("nbd-{connection_id}")).spawn_scoped(
                scope,
                move || {
                    let admitted = std::cell::Cell::new(false);
                    // Takes a transmission slot if one is free; the handshake pool is left then.
                    let admit = || {
                        let taken = active
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |count| {
                                (count < config.max_connections).then_some(count + 1)
                            })
                            .is_ok();
                        if taken {
                            admitted.set(true);
                            handshakes.remove(connection_id);
                        }
                        taken
                    };
                    let result = serve_connection(stream, store, connection_id, config, stop, &admit);
                    if admitted.get() {
                        active.fetch_sub(1, Ordering::Relaxed);
                    } else {
                        handshakes.remove(connection_id);
                    }
                    if CONNECTION_EVENTS.allow() {
                        match (result, admitted.get()) {
                            (Ok(()), true) => tracing::info!(connection = connection_id, %peer, "client disconnected"),
                            (Ok(()), false) => tracing::info!(connection = connection_id, %peer, "client left during the handshake"),
                            (Err(error), _) => tracing::warn!(connection = connection_id, %peer, %error, "connection ended"),
                        }
                    }
                },
            );
            if let Err(error) = spawned {
                handshakes.remove(connection_id);
                tracing::warn!(%error, "cannot start a connection thread");
            }
        }
        Ok(())
    })
}
