//! One client connection: the handshake, then requests served strictly in order by the node core
//! (`core::Session::serve_one`); this module is the shell around it: socket, buffers, deadlines,
//! and the effects the core asks for (sending a memfd, telling other connections of an eviction,
//! starting a rebuild thread, a reply delay).
//!
//! I/O shape: one `read` fills a per-connection input buffer with as many frames as the socket
//! holds; every complete frame in it is served; every reply is appended to a per-connection
//! output buffer; the output goes out in one `write` when no complete frame is left, right before
//! the thread would block in `read` again. A `WriteSplit` payload is copied from the input buffer
//! into its slot, and a `ReadSplit(s)` payload from its slot into the output buffer. On these
//! 2-core VMs a system call costs about a microsecond and a 512-byte copy about 10-30
//! nanoseconds, so one copy per split replaces three `recv`s and one `sendmsg` per request, and a
//! pipelined batch of requests costs two system calls in all.
//!
//! Fault model: the peer may send anything. A header is validated as soon as its 16 bytes are
//! buffered, before the node waits for the body. A frame that does not decode, a kind the node
//! does not accept, anything but the handshake before `AuthOk`, or a `WriteSplit` that fails
//! validation gets an `Error` reply and the connection is closed; a `WriteSplit` is validated as
//! soon as its prefix is buffered and its payload is never applied if refused, and since the
//! payload is not consumed the stream cannot be resynchronised. Refused requests without a payload
//! (unknown slab, not owner, slot out of range, no capacity, bad split size, refused fault or
//! regeneration) get an `Error` reply and the connection stays open.
//!
//! Invariant: no allocation per request in steady state. The input buffer grows to its working
//! size once a client is busy (or to one frame that does not fit), the output buffer keeps its
//! capacity while the client is busy, and payloads move with one copy each between those buffers
//! and slab memory. What the buffers may hold, how long and node-wide is `buffers`: a partial
//! frame has a deadline, idle connections shrink their buffers, growth is charged to a budget.

mod buffers;
mod encrypted;
mod requests;

use crate::core::{Effect, Served, Session, Transport};
use crate::fault::ConnectionDelay;
use crate::log_limit::UNAUTHENTICATED_FAILURES;
use crate::peers::Peer;
use crate::regenerate;
use crate::shared::Shared;
use crate::stream::Stream;
use remem_proto::auth;
use remem_proto::encryption::Inbound;
use remem_proto::{Control, DecodeError, ErrorCode, FrameHeader, Kind, HEADER_BYTES, MAX_BODY_BYTES};
use std::io::{self, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use buffers::{
    BufferBudget, CONNECTION_BUFFER_BUDGET_BYTES, IDLE_SHRINK_AFTER, INPUT_BUFFER_BYTES,
    PARTIAL_FRAME_TIMEOUT, SMALL_INPUT_BYTES,
};

/// How long a peer may take to complete the handshake, so that unauthenticated connections cannot
/// hold connection slots forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one reply may stay blocked on a peer that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The output is written early once it holds this much, so a long pipeline of big reads does not
/// grow it without bound.
const OUTPUT_FLUSH_BYTES: usize = 256 * 1024;
/// The largest frame; a connection's input buffer grows to hold one if the budget allows.
const MAX_FRAME_BYTES: usize = HEADER_BYTES + MAX_BODY_BYTES as usize;

/// TCP keepalive of client connections: a silent connection is probed after
/// `KEEPALIVE_IDLE`, then every `KEEPALIVE_INTERVAL`, and dropped after `KEEPALIVE_PROBES`
/// unanswered probes, so a client whose host died or was cut off loses its lease (`leases`)
/// within about 10 s. A live client's kernel answers the probes even when the process is idle.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 5;

/// Turns TCP keepalive on for an accepted connection (see [`KEEPALIVE_IDLE`]).
pub fn keepalive(stream: &std::net::TcpStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| -> io::Result<()> {
        // SAFETY: `fd` is an open socket owned by `stream`, and the option value is a c_int
        // whose size is passed with it.
        let result = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE.as_secs() as libc::c_int)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL.as_secs() as libc::c_int)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES as libc::c_int)
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionEnd {
    #[error("peer closed the connection")]
    PeerClosed,
    #[error("connection I/O failed: {0}")]
    Io(#[from] io::Error),
    /// The node replied `Error(code)` and closed.
    #[error("closed after {code}: {message}")]
    Refused { code: ErrorCode, message: String },
    /// A frame was started and not finished within `PARTIAL_FRAME_TIMEOUT`.
    #[error("a frame was not completed in time")]
    PartialFrameTimeout,
    /// A claimed connection sent nothing, not even a heartbeat, for the lease timeout: its
    /// process stopped renewing its lease (`leases`).
    #[error("nothing received for {} s (no request, no heartbeat): the client process stopped renewing its lease", .0.as_secs_f64())]
    LeaseTimeout(Duration),
}

pub struct Connection {
    stream: Stream,
    /// The peer's address, for logs (`unix` for a Unix connection).
    peer: String,
    shared: Arc<Shared>,
    /// This connection's number in `Shared::peers`.
    number: u64,
    handle: Arc<Peer>,
    client_id: u64,
    /// The session that claimed `client_id` (`leases`), 0 for a tool's connection.
    session: u64,
    /// The claim counts toward the lease until the connection ends.
    claimed: bool,
    /// Received bytes; `input[start..end]` is not yet served. Its length is its capacity.
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Replies not yet written, and how many.
    out: Vec<u8>,
    replies_pending: u32,
    delay: ConnectionDelay,
    /// Bytes of `input` and `out` charged to the node's `BufferBudget`.
    charged_bytes: usize,
    /// When the first byte of the frame at the front of the input arrived, if one has.
    frame_started: Option<Instant>,
    /// The socket's read timeout as last set.
    read_timeout: Option<Duration>,
    /// Ciphertext received and the receiving half of the cipher, on an encrypted connection
    /// (`encrypted`); `None` reads plaintext into `input` directly.
    inbound: Option<Box<Inbound>>,
}

impl Connection {
    pub fn new(
        stream: Stream,
        peer: String,
        shared: Arc<Shared>,
        number: u64,
        handle: Arc<Peer>,
    ) -> Connection {
        Connection {
            stream,
            peer,
            shared,
            number,
            handle,
            client_id: 0,
            session: 0,
            claimed: false,
            input: vec![0; SMALL_INPUT_BYTES],
            start: 0,
            end: 0,
            out: Vec::with_capacity(buffers::SMALL_OUTPUT_BYTES),
            replies_pending: 0,
            delay: ConnectionDelay::new(number),
            charged_bytes: 0,
            frame_started: None,
            read_timeout: None,
            inbound: None,
        }
    }

    /// Serves the connection until the peer leaves, an I/O error, or a refusal that closes it.
    /// Lines about connections that never authenticated are rate-limited (`log_limit`): anyone
    /// who reaches the port can cause them.
    pub fn serve(&mut self) {
        let end = match self.handshake() {
            Ok(()) => {
                self.handle.authenticated(self.client_id);
                tracing::info!(peer = %self.peer, connection = self.number, client_id = self.client_id, "client authenticated");
                self.serve_requests()
            }
            Err(end) => {
                self.release_buffers();
                self.release_lease();
                if UNAUTHENTICATED_FAILURES.allow() {
                    tracing::warn!(peer = %self.peer, reason = %end, "connection closed before authenticating");
                }
                return;
            }
        };
        self.release_buffers();
        self.release_lease();
        match end {
            ConnectionEnd::PeerClosed => {
                tracing::info!(peer = %self.peer, client_id = self.client_id, "connection closed by peer")
            }
            // Logged, rate-limited, where the limit was met.
            ConnectionEnd::PartialFrameTimeout => {}
            ConnectionEnd::Refused { code: ErrorCode::NoCapacity, .. } => {}
            end => {
                tracing::warn!(peer = %self.peer, client_id = self.client_id, reason = %end, "connection closed")
            }
        }
    }

    /// The handshake has one deadline for all of it, not a timeout per read: a peer dripping a
    /// byte now and then cannot hold a pre-authentication slot past [`HANDSHAKE_TIMEOUT`].
    fn handshake(&mut self) -> Result<(), ConnectionEnd> {
        let deadline = std::time::Instant::now() + HANDSHAKE_TIMEOUT;
        self.stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        if !self.stream.is_unix() {
            self.open_tcp(deadline)?;
        }
        let (request_id, hello) = self.read_handshake_frame(Kind::Hello, deadline)?;
        let Control::Hello { client_id, client_nonce, session } = hello else {
            unreachable!("read_handshake_frame returns the kind asked for");
        };
        self.client_id = client_id;
        self.session = session;
        let node_nonce: [u8; 32] = rand::random();
        let node_proof = auth::node_proof(&self.shared.secret, &client_nonce, &node_nonce, client_id);
        self.push_control(request_id, &Control::Challenge { node_nonce, node_proof });
        let (request_id, auth_message) = self.read_handshake_frame(Kind::Auth, deadline)?;
        let Control::Auth { client_proof } = auth_message else {
            unreachable!("read_handshake_frame returns the kind asked for");
        };
        let expected = auth::client_proof(&self.shared.secret, &client_nonce, &node_nonce, client_id);
        if !auth::verify(&expected, &client_proof) {
            return Err(self.refuse(request_id, ErrorCode::AuthFailed, "client proof does not match"));
        }
        // The authenticated limit is checked here, not at accept: connections still
        // authenticating have a pool of their own (`Peers::insert_unauthenticated`).
        if self.shared.peers.authenticated_count() >= self.shared.max_connections {
            return Err(self.refuse(request_id, ErrorCode::NoCapacity, "connection limit reached"));
        }
        match self.shared.core.leases.claim(client_id, session) {
            Ok(took_over) => {
                self.claimed = true;
                if took_over {
                    tracing::warn!(peer = %self.peer, client_id, "a new session took over the lapsed lease of this client id; the old one is fenced off");
                }
            }
            Err(refused) => {
                return Err(self.refuse(request_id, ErrorCode::ClientIdInUse, refused.to_string()));
            }
        }
        self.push_control(request_id, &Control::AuthOk { node_id: self.shared.core.node_id });
        // Counted as authenticated before the client can read AuthOk, so a connection the client
        // opens next is checked against a count that includes this one.
        self.flush_as(Some(client_id))?;
        self.stream.set_read_timeout(None)?;
        self.read_timeout = None;
        Ok(())
    }

    /// The connection ended: it no longer holds its session's lease (the last one to close
    /// starts the grace period of the client's slabs).
    fn release_lease(&mut self) {
        if std::mem::take(&mut self.claimed) {
            self.shared.core.leases.release(self.client_id, self.session, Instant::now());
        }
    }

    /// Reads the next handshake frame, which must be of `expected` kind; anything else is refused
    /// with `NotAuthenticated` before its body is waited for.
    fn read_handshake_frame(
        &mut self,
        expected: Kind,
        deadline: std::time::Instant,
    ) -> Result<(u64, Control), ConnectionEnd> {
        loop {
            if let Some(header) = self.peek_header(SMALL_INPUT_BYTES)? {
                if header.kind != expected {
                    return Err(self.refuse(
                        header.request_id,
                        ErrorCode::NotAuthenticated,
                        format!("expected {expected:?}, got {:?}", header.kind),
                    ));
                }
                if self.frame_complete(header) {
                    let control = self.take_control(header)?;
                    return Ok((header.request_id, control));
                }
            }
            self.flush()?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::from(io::ErrorKind::TimedOut).into());
            }
            self.stream.set_read_timeout(Some(left))?;
            self.fill()?;
        }
    }

    fn serve_requests(&mut self) -> ConnectionEnd {
        match self.serve_requests_until_error() {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    /// Serves every complete buffered frame through the node core (`core::Session`); when none
    /// is left, writes the replies and reads.
    fn serve_requests_until_error(&mut self) -> Result<std::convert::Infallible, ConnectionEnd> {
        let session = Session {
            client_id: self.client_id,
            session: self.session,
            connection: self.number,
            transport: if self.stream.is_unix() { Transport::Unix } else { Transport::Tcp },
        };
        loop {
            if self.peek_header(MAX_FRAME_BYTES)?.is_some() {
                match session.serve_one(&self.shared.core, &self.input[self.start..self.end], &mut self.out) {
                    Served::Wait => {}
                    Served::Done { consumed, replies, effect } => {
                        self.start += consumed;
                        debug_assert!(self.start <= self.end);
                        self.frame_done();
                        self.replies_pending += replies;
                        if let Some(effect) = effect {
                            self.carry_out(&session, effect)?;
                        }
                        if self.out.len() >= OUTPUT_FLUSH_BYTES {
                            self.flush()?;
                        }
                        continue;
                    }
                    Served::Close(refusal) => {
                        self.replies_pending += 1;
                        return Err(self.closed_after(refusal.code(), refusal.to_string()));
                    }
                }
            }
            self.flush()?;
            self.fill_serving()?;
        }
    }

    /// Does what the core asked for a request it served.
    fn carry_out(&mut self, session: &Session, effect: Effect) -> Result<(), ConnectionEnd> {
        match effect {
            Effect::Rebuild { request_id, admission } => {
                // The core's Ok goes out before the rebuild can possibly report.
                self.flush()?;
                regenerate::spawn(&self.shared, session, request_id, admission);
            }
            Effect::Export { request_id, slab_id, slab } => self.export_slab(request_id, slab_id, &slab)?,
            Effect::Evict { request_id, slab_id } => {
                let result = self.shared.evict_slab(slab_id, Some(self.number));
                self.replies_pending += session.evicted(request_id, slab_id, result, &mut self.out);
            }
            Effect::SetDelay(delay) => self.shared.faults.set_delay(delay),
            Effect::AnswersActivity => self.handle.volunteer_for_activity(),
            // Kept only if the monitor asked this request id of this client about this slab.
            Effect::ActivityAnswer { request_id, slab_id, accesses } => {
                self.shared.activity_answers.answer(request_id, self.client_id, slab_id, accesses);
            }
        }
        Ok(())
    }

    /// The header of the frame at the front of the input, validated, once its 16 bytes are
    /// buffered; `None` before. A bad header, or a frame longer than `max_frame_bytes`, is
    /// refused here, before its body is waited for. Grows the input buffer if the frame cannot
    /// fit in it and the node's buffer budget allows (`buffers`), else refuses it.
    fn peek_header(&mut self, max_frame_bytes: usize) -> Result<Option<FrameHeader>, ConnectionEnd> {
        if self.end - self.start < HEADER_BYTES {
            return Ok(None);
        }
        let bytes: [u8; HEADER_BYTES] =
            self.input[self.start..self.start + HEADER_BYTES].try_into().expect("slice of the header length");
        let header = FrameHeader::decode(&bytes)
            .map_err(|error| self.refuse_malformed(FrameHeader::raw_request_id(&bytes), error))?;
        let frame_bytes = HEADER_BYTES + header.body_len as usize;
        assert!(frame_bytes <= MAX_FRAME_BYTES, "the header decoder bounds body_len");
        if frame_bytes > max_frame_bytes {
            return Err(self.refuse(
                header.request_id,
                ErrorCode::Malformed,
                format!("a {frame_bytes}-byte frame where at most {max_frame_bytes} bytes are accepted"),
            ));
        }
        self.grow_for_frame(header.request_id, frame_bytes)?;
        Ok(Some(header))
    }

    fn frame_complete(&self, header: FrameHeader) -> bool {
        self.end - self.start >= HEADER_BYTES + header.body_len as usize
    }

    fn consume(&mut self, header: FrameHeader) {
        self.start += HEADER_BYTES + header.body_len as usize;
        debug_assert!(self.start <= self.end);
        self.frame_done();
    }

    /// Decodes and consumes the complete control frame at the front of the input.
    fn take_control(&mut self, header: FrameHeader) -> Result<Control, ConnectionEnd> {
        let body_at = self.start + HEADER_BYTES;
        let decoded =
            Control::decode_body(header.kind, &self.input[body_at..body_at + header.body_len as usize]);
        self.consume(header);
        decoded.map_err(|error| self.refuse_malformed(header.request_id, error))
    }

    /// One `read` into the input buffer, after moving a partial frame to its front. A clean end of
    /// stream between frames is `PeerClosed`; inside a frame, an `UnexpectedEof` I/O error. On an
    /// encrypted connection it may add nothing (part of a message came).
    fn fill(&mut self) -> Result<(), ConnectionEnd> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.start > 0 {
            // Moves at most one partial frame, and each frame at most once.
            self.input.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        assert!(self.end < self.input.len(), "peek_header grows the buffer for a frame that does not fit");
        loop {
            // `None` is the end of the stream. An encrypted read may add nothing: its socket read
            // brought only part of a message, and the caller's deadlines apply before the next.
            let read = match &mut self.inbound {
                None => (&self.stream).read(&mut self.input[self.end..]).map(|n| (n > 0).then_some(n)),
                Some(inbound) => {
                    encrypted::read_decrypted(&self.stream, inbound, &mut self.input[self.end..])
                }
            };
            match read {
                Ok(None) if self.end == 0 => return Err(ConnectionEnd::PeerClosed),
                Ok(None) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(Some(n)) => {
                    self.end += n;
                    return Ok(());
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(end_of_io(error)),
            }
        }
    }

    /// Appends a control reply to the output.
    fn push_control(&mut self, request_id: u64, message: &Control) {
        message.encode(request_id, &mut self.out);
        self.replies_pending += 1;
    }

    /// Writes the pending output in one `write_all` (sealed first on an encrypted connection)
    /// under the connection's write lock (notices from other threads take it too), after the
    /// injected delay if one applies.
    fn flush(&mut self) -> Result<(), ConnectionEnd> {
        self.flush_as(None)
    }

    /// [`Connection::flush`]; with `authenticated`, the connection is recorded as that client's
    /// under the write lock, before the output goes out (`Peer::write_frames`).
    fn flush_as(&mut self, authenticated: Option<u64>) -> Result<(), ConnectionEnd> {
        if self.out.is_empty() {
            return Ok(());
        }
        if let Some(delay) = self.delay.roll(&self.shared.faults, self.replies_pending) {
            std::thread::sleep(delay);
        }
        self.replies_pending = 0;
        let result = self.handle.write_frames(&self.out, authenticated);
        self.out.clear();
        self.charge_output();
        result.map_err(end_of_io)
    }

    fn refuse_malformed(&mut self, request_id: u64, error: DecodeError) -> ConnectionEnd {
        self.refuse(request_id, ErrorCode::Malformed, error.to_string())
    }

    /// Replies `Error(code)` after the replies already pending (best effort: the peer may be
    /// gone) and ends the connection.
    fn refuse(&mut self, request_id: u64, code: ErrorCode, message: impl Into<String>) -> ConnectionEnd {
        let message = message.into();
        self.push_control(request_id, &Control::error(code, message.clone()));
        self.closed_after(code, message)
    }

    /// The refusal `Error(code)` is the last frame of the output: sends it (best effort: the
    /// peer may be gone) and ends the connection.
    fn closed_after(&mut self, code: ErrorCode, message: String) -> ConnectionEnd {
        if let Err(error) = self.flush() {
            tracing::debug!(peer = %self.peer, %error, "could not send the refusal");
        }
        self.linger();
        ConnectionEnd::Refused { code, message }
    }
}

fn end_of_io(error: io::Error) -> ConnectionEnd {
    ConnectionEnd::Io(error)
}
