//! Sockets of the blocking and poll drivers: one connection per node (TCP or Unix), one mio
//! `Poll` over them, per-connection receive buffers cut into whole frames for the engine, and the
//! engine's outboxes written out.
//!
//! Encryption (`ClientConfig::encrypt`, TCP only): the engine's outbox is sealed into a
//! per-connection buffer before it is written, and received ciphertext is opened into the
//! receive buffer (`remem_proto::encryption::Inbound`), so the engine sees the same plaintext
//! frames either way. Both buffers are kept: no allocation per page.
//!
//! Copies: one `read` drains many replies into the connection's buffer; each frame's body is
//! handed to the engine as a slice of it, and the engine copies a split once into its place.
//! Reading each payload with its own `read` into the page would save that copy (about 10 ns)
//! but cost one more system call per split (about 1 us).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use mio::net::{TcpStream as MioStream, UnixStream as MioUnixStream};
use mio::{Events, Interest, Poll, Token};
use remem_proto::encryption::{Inbound, Sealer, MAX_PLAINTEXT_BYTES};
use remem_proto::{FrameHeader, HEADER_BYTES, SPLIT_META_BYTES};

use super::connect::BlockingStream;
use crate::engine::{Engine, NodeId, OpBuffers};
use crate::error::FrameError;
use crate::shm;

/// A node connection's socket: TCP, or a Unix socket (which can carry a slab's memfd).
enum ConnStream {
    Tcp(MioStream),
    Unix(MioUnixStream),
    /// No connection (the node failed, or was unreachable).
    Closed,
}

impl ConnStream {
    fn source(&mut self) -> Option<&mut dyn mio::event::Source> {
        match self {
            ConnStream::Tcp(stream) => Some(stream),
            ConnStream::Unix(stream) => Some(stream),
            ConnStream::Closed => None,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            ConnStream::Tcp(stream) => stream.write(bytes),
            ConnStream::Unix(stream) => stream.write(bytes),
            ConnStream::Closed => Err(io::ErrorKind::NotConnected.into()),
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
            ConnStream::Closed => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

/// The cipher of an encrypted connection and its two buffers.
struct Encryption {
    sealer: Sealer,
    /// Sealed bytes not yet written: `sealed[sealed_sent..]`.
    sealed: Vec<u8>,
    sealed_sent: usize,
    inbound: Inbound,
}

/// Plaintext taken from the outbox and sealed at once, at most: four whole messages.
const SEAL_CHUNK_BYTES: usize = 4 * MAX_PLAINTEXT_BYTES;

/// What one write attempt of [`Transport::flush`] came to.
enum WriteStep {
    /// Wrote something; try again.
    More,
    /// Nothing left to write.
    Done,
    /// The socket is full.
    Blocked,
    /// The connection is lost, and why.
    Lost(String),
}

struct Conn {
    stream: ConnStream,
    /// Set on an encrypted connection.
    encryption: Option<Box<Encryption>>,
    /// Descriptors received and not yet claimed by their `SlabExported` frame.
    fds: VecDeque<OwnedFd>,
    writable_interest: bool,
    input: Vec<u8>,
    input_start: usize,
    input_end: usize,
}

/// The sockets of one client, indexed by node id.
pub(crate) struct Transport {
    conns: Vec<Conn>,
    poll: Poll,
    poll_events: Events,
    input_bytes: usize,
    /// Token offset: the poll driver shares a registry with its embedder.
    token_base: usize,
}

impl Transport {
    pub(crate) fn new(page_bytes: usize) -> io::Result<Transport> {
        Ok(Transport {
            conns: Vec::new(),
            poll: Poll::new()?,
            poll_events: Events::with_capacity(256),
            input_bytes: (256 * 1024).max(4 * (HEADER_BYTES + SPLIT_META_BYTES + page_bytes)),
            token_base: 0,
        })
    }

    /// The epoll descriptor behind every connection (the poll driver nests it).
    pub(crate) fn poll_fd(&self) -> std::os::fd::RawFd {
        self.poll.as_raw_fd()
    }

    /// Attaches `stream` (or nothing) to node `node`, which must be the next id or a known one.
    pub(crate) fn attach(&mut self, node: NodeId, stream: Option<BlockingStream>) -> io::Result<()> {
        while self.conns.len() <= node {
            self.conns.push(Conn {
                stream: ConnStream::Closed,
                encryption: None,
                fds: VecDeque::with_capacity(shm::MAX_PENDING_FDS),
                writable_interest: false,
                input: Vec::new(),
                input_start: 0,
                input_end: 0,
            });
        }
        self.detach(node);
        let mut encryption = None;
        let mut stream = match stream {
            None => ConnStream::Closed,
            Some(BlockingStream::Tcp(stream)) => {
                stream.set_read_timeout(None)?;
                stream.set_nonblocking(true)?;
                ConnStream::Tcp(MioStream::from_std(stream))
            }
            Some(BlockingStream::Encrypted(secure)) => {
                let (stream, sealer, inbound) = secure.into_parts();
                stream.set_read_timeout(None)?;
                stream.set_nonblocking(true)?;
                encryption =
                    Some(Box::new(Encryption { sealer, sealed: Vec::new(), sealed_sent: 0, inbound }));
                ConnStream::Tcp(MioStream::from_std(stream))
            }
            Some(BlockingStream::Unix(stream)) => {
                stream.set_read_timeout(None)?;
                stream.set_nonblocking(true)?;
                ConnStream::Unix(MioUnixStream::from_std(stream))
            }
        };
        let token = Token(self.token_base + node);
        if let Some(source) = stream.source() {
            self.poll.registry().register(source, token, Interest::READABLE)?;
        }
        let conn = &mut self.conns[node];
        if conn.input.len() != self.input_bytes {
            conn.input = vec![0; self.input_bytes];
        }
        conn.stream = stream;
        conn.encryption = encryption;
        Ok(())
    }

    /// Closes the connection to `node` (the engine declared it failed or removed).
    pub(crate) fn detach(&mut self, node: NodeId) {
        let Some(conn) = self.conns.get_mut(node) else { return };
        if let Some(source) = conn.stream.source() {
            let _ = self.poll.registry().deregister(source);
        }
        conn.stream = ConnStream::Closed;
        conn.encryption = None;
        conn.fds.clear();
        conn.writable_interest = false;
        conn.input_start = 0;
        conn.input_end = 0;
    }

    pub(crate) fn is_unix(&self, node: NodeId) -> bool {
        matches!(self.conns.get(node).map(|conn| &conn.stream), Some(ConnStream::Unix(_)))
    }

    /// The descriptor that came with the last `SlabExported` frame from `node`.
    pub(crate) fn take_fd(&mut self, node: NodeId) -> Option<OwnedFd> {
        self.conns.get_mut(node)?.fds.pop_front()
    }

    /// Sends what the engine queued, node by node in its order.
    pub(crate) fn flush_all(&mut self, engine: &mut Engine, buffers: &mut dyn OpBuffers) {
        let order = engine.take_send_order();
        for &node in &order {
            self.flush(engine, node, buffers);
        }
        engine.return_send_order(order);
    }

    /// Writes node `node`'s outbox until it is empty or the socket is full.
    pub(crate) fn flush(&mut self, engine: &mut Engine, node: NodeId, buffers: &mut dyn OpBuffers) {
        let Some(conn) = self.conns.get_mut(node) else { return };
        loop {
            let step = match conn.encryption.as_deref_mut() {
                None => write_plain(&mut conn.stream, engine, node),
                Some(encryption) => write_sealed(&mut conn.stream, encryption, engine, node),
            };
            match step {
                WriteStep::More => {}
                WriteStep::Done => break,
                WriteStep::Blocked => {
                    if !conn.writable_interest {
                        conn.writable_interest = true;
                        if let Some(source) = conn.stream.source() {
                            let interest = Interest::READABLE | Interest::WRITABLE;
                            let token = Token(self.token_base + node);
                            let _ = self.poll.registry().reregister(source, token, interest);
                        }
                    }
                    return;
                }
                WriteStep::Lost(why) => return self.lost(engine, node, &why, buffers),
            }
        }
        if conn.writable_interest {
            conn.writable_interest = false;
            if let Some(source) = conn.stream.source() {
                let _ = self.poll.registry().reregister(
                    source,
                    Token(self.token_base + node),
                    Interest::READABLE,
                );
            }
        }
    }

    fn lost(&mut self, engine: &mut Engine, node: NodeId, why: &str, buffers: &mut dyn OpBuffers) {
        self.detach(node);
        engine.connection_lost(Instant::now(), node, why, buffers);
    }

    /// Waits up to `timeout` (`None`: until something happens) and feeds what arrived to the
    /// engine. With `spin` it polls without blocking that long first: on these VMs a blocked
    /// thread costs 20-25 us to wake on the other vCPU, and spinning briefly catches replies
    /// already on their way; spinning long would starve node processes sharing the two cores.
    pub(crate) fn wait_and_read(
        &mut self,
        engine: &mut Engine,
        timeout: Option<Duration>,
        spin: Duration,
        buffers: &mut dyn OpBuffers,
    ) {
        if let Err(error) = self.poll_spinning_first(timeout, spin) {
            if error.kind() != io::ErrorKind::Interrupted {
                tracing::error!(%error, "poll failed");
            }
            return;
        }
        // Collect first: reading needs &mut self while the events borrow self.poll_events. In
        // chunks, and every event serviced: readiness is edge-triggered, so an event skipped
        // here would leave its socket's bytes unread until the node sent more (with over 64
        // nodes answering at once, heartbeats went unread and live nodes were declared failed).
        let mut serviced = 0;
        loop {
            let mut ready: [(usize, bool, bool); 64] = [(0, false, false); 64];
            let mut count = 0;
            for event in self.poll_events.iter().skip(serviced).take(ready.len()) {
                let readable = event.is_readable() || event.is_read_closed() || event.is_error();
                ready[count] = (event.token().0, readable, event.is_writable());
                count += 1;
            }
            for &(token, readable, writable) in &ready[..count] {
                self.service(engine, token, readable, writable, buffers);
            }
            serviced += count;
            if count < ready.len() {
                break;
            }
        }
    }

    /// Handles readiness of one token (the poll driver calls this for events of its registry).
    /// False if the token is not one of ours.
    pub(crate) fn service(
        &mut self,
        engine: &mut Engine,
        token: usize,
        readable: bool,
        writable: bool,
        buffers: &mut dyn OpBuffers,
    ) -> bool {
        let Some(node) = token.checked_sub(self.token_base).filter(|node| *node < self.conns.len()) else {
            return false;
        };
        if writable {
            self.flush(engine, node, buffers);
        }
        if readable {
            self.read_conn(engine, node, buffers);
        }
        true
    }

    fn poll_spinning_first(&mut self, timeout: Option<Duration>, spin: Duration) -> io::Result<()> {
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

    /// Drains what the socket holds and hands each complete frame to the engine.
    fn read_conn(&mut self, engine: &mut Engine, node: NodeId, buffers: &mut dyn OpBuffers) {
        if self.conns[node].encryption.is_some() {
            return self.read_conn_encrypted(engine, node, buffers);
        }
        loop {
            let conn = &mut self.conns[node];
            if matches!(conn.stream, ConnStream::Closed) {
                return;
            }
            if conn.input_start > 0 && conn.input_end == conn.input.len() {
                conn.input.copy_within(conn.input_start..conn.input_end, 0);
                conn.input_end -= conn.input_start;
                conn.input_start = 0;
            }
            let end = conn.input_end;
            match conn.stream.read(&mut conn.input[end..], &mut conn.fds) {
                Ok(0) => return self.lost(engine, node, "node closed the connection", buffers),
                Ok(received) => {
                    conn.input_end += received;
                    if let Err(error) = self.parse_frames(engine, node, buffers) {
                        return self.lost(engine, node, &error.to_string(), buffers);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return self.lost(engine, node, &error.to_string(), buffers),
            }
        }
    }

    /// [`Transport::read_conn`] on an encrypted connection: ciphertext is read into its inbound
    /// buffer and whole messages are opened into the receive buffer, which is parsed after each.
    fn read_conn_encrypted(&mut self, engine: &mut Engine, node: NodeId, buffers: &mut dyn OpBuffers) {
        loop {
            // Hand out every whole message that has arrived.
            loop {
                let conn = &mut self.conns[node];
                let Some(encryption) = conn.encryption.as_deref_mut() else { return };
                if conn.input_start > 0 && conn.input.len() - conn.input_end < MAX_PLAINTEXT_BYTES {
                    conn.input.copy_within(conn.input_start..conn.input_end, 0);
                    conn.input_end -= conn.input_start;
                    conn.input_start = 0;
                }
                if conn.input_end == conn.input.len() {
                    return self.lost(engine, node, "a frame larger than the receive buffer", buffers);
                }
                match encryption.inbound.take_plaintext(&mut conn.input[conn.input_end..]) {
                    Ok(0) => break,
                    Ok(opened) => {
                        conn.input_end += opened;
                        if let Err(error) = self.parse_frames(engine, node, buffers) {
                            return self.lost(engine, node, &error.to_string(), buffers);
                        }
                    }
                    Err(error) => return self.lost(engine, node, &error.to_string(), buffers),
                }
            }
            let conn = &mut self.conns[node];
            let Some(encryption) = conn.encryption.as_deref_mut() else { return };
            match conn.stream.read(encryption.inbound.spare(), &mut conn.fds) {
                Ok(0) => return self.lost(engine, node, "node closed the connection", buffers),
                Ok(received) => encryption.inbound.received(received),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return self.lost(engine, node, &error.to_string(), buffers),
            }
        }
    }

    fn parse_frames(
        &mut self,
        engine: &mut Engine,
        node: NodeId,
        buffers: &mut dyn OpBuffers,
    ) -> Result<(), FrameError> {
        let now = Instant::now();
        loop {
            let conn = &mut self.conns[node];
            let available = conn.input_end - conn.input_start;
            if available < HEADER_BYTES {
                break;
            }
            let header_bytes: &[u8; HEADER_BYTES] =
                conn.input[conn.input_start..conn.input_start + HEADER_BYTES].try_into().expect("header");
            let header = FrameHeader::decode(header_bytes)?;
            let body_len = header.body_len as usize;
            if body_len > engine.max_reply_body(header.kind) {
                return Err(FrameError::TooLong { kind: header.kind, len: body_len });
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
            let body = &conn.input[body_start..body_start + body_len];
            engine.on_frame(now, node, header, body, buffers)?;
        }
        let conn = &mut self.conns[node];
        if conn.input_start == conn.input_end {
            conn.input_start = 0;
            conn.input_end = 0;
        }
        Ok(())
    }
}

/// One write of the outbox as it is.
fn write_plain(stream: &mut ConnStream, engine: &mut Engine, node: NodeId) -> WriteStep {
    let bytes = engine.outgoing(node);
    if bytes.is_empty() {
        return WriteStep::Done;
    }
    match stream.write(bytes) {
        Ok(0) => WriteStep::Lost("connection closed while sending".to_owned()),
        Ok(sent) => {
            engine.mark_sent(node, sent);
            WriteStep::More
        }
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => WriteStep::Blocked,
        Err(error) if error.kind() == io::ErrorKind::Interrupted => WriteStep::More,
        Err(error) if error.kind() == io::ErrorKind::NotConnected => {
            // The engine still thinks it is connected only until it learns otherwise.
            let sent = bytes.len();
            engine.mark_sent(node, sent);
            WriteStep::Done
        }
        Err(error) => WriteStep::Lost(error.to_string()),
    }
}

/// One write of sealed bytes; when all are written, the next piece of the outbox is sealed
/// first. Plaintext is taken from the outbox only once the sealed buffer is empty, so what waits
/// on a full socket stays in the engine's outbox as it would in plaintext.
fn write_sealed(
    stream: &mut ConnStream,
    encryption: &mut Encryption,
    engine: &mut Engine,
    node: NodeId,
) -> WriteStep {
    if encryption.sealed_sent == encryption.sealed.len() {
        encryption.sealed.clear();
        encryption.sealed_sent = 0;
        let bytes = engine.outgoing(node);
        if bytes.is_empty() {
            return WriteStep::Done;
        }
        let taken = bytes.len().min(SEAL_CHUNK_BYTES);
        if let Err(error) = encryption.sealer.seal(&bytes[..taken], &mut encryption.sealed) {
            return WriteStep::Lost(error.to_string());
        }
        engine.mark_sent(node, taken);
    }
    match stream.write(&encryption.sealed[encryption.sealed_sent..]) {
        Ok(0) => WriteStep::Lost("connection closed while sending".to_owned()),
        Ok(sent) => {
            encryption.sealed_sent += sent;
            WriteStep::More
        }
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => WriteStep::Blocked,
        Err(error) if error.kind() == io::ErrorKind::Interrupted => WriteStep::More,
        Err(error) => WriteStep::Lost(error.to_string()),
    }
}
