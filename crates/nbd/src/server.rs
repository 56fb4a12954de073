//! The listener: accepts connections on TCP or a Unix socket and serves each on its own thread.
//!
//! All connections share one [`PageStore`] behind a mutex, held for the span of one batch. The
//! remem client is driven by one thread at a time (run to completion), so connections take
//! turns per batch; what they gain is independence, not parallelism. A stop flag ends the
//! accept loop and, at the next wait for input, every connection; `serve` returns when all
//! connection threads have finished.

use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::ConnectionError;
use crate::handshake::{negotiate, Export, HandshakeOutcome};
use crate::store::PageStore;
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
    fn configure(&self, handshake_timeout: Duration, reply_timeout: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => {
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(handshake_timeout))?;
                stream.set_write_timeout(Some(reply_timeout))
            }
            Stream::Unix(stream) => {
                stream.set_nonblocking(false)?;
                stream.set_read_timeout(Some(handshake_timeout))?;
                stream.set_write_timeout(Some(reply_timeout))
            }
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
    /// Connections served at once; more are closed on accept.
    pub max_connections: usize,
    /// A client silent this long during the handshake is dropped.
    pub handshake_timeout: Duration,
    /// A client that does not take its replies for this long is dropped.
    pub reply_timeout: Duration,
}

impl ServerConfig {
    pub fn new(export: Export) -> ServerConfig {
        let limits = Limits { max_request_bytes: export.max_request_bytes, ..Limits::default() };
        ServerConfig {
            export,
            limits,
            max_connections: 16,
            handshake_timeout: Duration::from_secs(30),
            reply_timeout: Duration::from_secs(60),
        }
    }
}

/// Serves one connection: handshake, then transmission until the client leaves.
pub fn serve_connection<S: PageStore, T: Read + Write + AsRawFd>(
    mut socket: T,
    store: &Mutex<S>,
    config: &ServerConfig,
    stop: &AtomicBool,
) -> Result<(), ConnectionError> {
    match negotiate(&mut socket, &config.export)? {
        HandshakeOutcome::Ended => Ok(()),
        HandshakeOutcome::Transmission(negotiated) => {
            Transmission::new(socket, store, &config.export, negotiated, config.limits, stop).run()
        }
    }
}

/// How often the server lets the store do background work ([`PageStore::background`]).
pub const BACKGROUND_INTERVAL: Duration = Duration::from_millis(100);

/// Accepts and serves connections until `stop` is raised, then waits for every connection.
/// A background thread runs the store's background work every [`BACKGROUND_INTERVAL`] under the
/// store's lock, between requests: healing (rebuilds, failed nodes noticed and readmitted) must
/// not wait for traffic.
pub fn serve<S: PageStore + Send>(
    listener: &Listener,
    store: &Mutex<S>,
    config: &ServerConfig,
    stop: &AtomicBool,
) -> io::Result<()> {
    listener.set_nonblocking()?;
    let active = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let background =
            std::thread::Builder::new().name("nbd-background".into()).spawn_scoped(scope, || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(BACKGROUND_INTERVAL);
                    match store.lock() {
                        Ok(mut store) => store.background(),
                        Err(_) => return,
                    }
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
            if active.load(Ordering::Relaxed) >= config.max_connections {
                tracing::warn!(%peer, max = config.max_connections, "too many connections; closing");
                continue;
            }
            if let Err(error) = stream.configure(config.handshake_timeout, config.reply_timeout) {
                tracing::warn!(%peer, %error, "cannot configure the connection");
                continue;
            }
            connection_id += 1;
            active.fetch_add(1, Ordering::Relaxed);
            let active = &active;
            let spawned = std::thread::Builder::new().name(format!("nbd-{connection_id}")).spawn_scoped(
                scope,
                move || {
                    tracing::info!(connection = connection_id, %peer, "client connected");
                    match serve_connection(stream, store, config, stop) {
                        Ok(()) => tracing::info!(connection = connection_id, "client disconnected"),
                        Err(error) => tracing::warn!(connection = connection_id, %error, "connection ended"),
                    }
                    active.fetch_sub(1, Ordering::Relaxed);
                },
            );
            if let Err(error) = spawned {
                active.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(%error, "cannot start a connection thread");
            }
        }
        Ok(())
    })
}
