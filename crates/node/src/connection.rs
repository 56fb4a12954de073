//! One client connection: the handshake, then requests served strictly in order.
//!
//! Fault model: the peer may send anything. A frame that does not decode, a kind the node does not
//! accept, anything but the handshake before `AuthOk`, or a `WriteSplit` that fails validation
//! gets an `Error` reply and the connection is closed; in the last case the payload is never read,
//! so the stream cannot be resynchronised. Refused requests without a payload (unknown slab, not
//! owner, slot out of range, no capacity, bad split size) get an `Error` reply and the connection
//! stays open.
//!
//! Invariant: no allocation per request in steady state; bodies, replies and iovecs reuse
//! per-connection buffers, and payloads move between the socket and slab memory directly.

use crate::raw_io::{self, iovec};
use crate::slab::{SlabError, SlabLabel, SlabTable};
use remem_proto::auth::{self, Secret};
use remem_proto::{
    encode_read_splits_reply_head, max_read_splits_count, Control, DecodeError, ErrorCode, FrameHeader, Kind,
    NodeInfo, WriteSplitPrefix, HEADER_BYTES, READ_SPLITS_MAX_COUNT, SPLIT_META_BYTES,
    WRITE_SPLIT_PREFIX_BYTES,
};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a peer may take to complete the handshake, so that unauthenticated connections cannot
/// hold connection slots forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one reply may stay blocked on a peer that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// State shared by all connections of a node.
pub struct Shared {
    pub node_id: u64,
    pub secret: Secret,
    pub capacity_bytes: u64,
    pub slab_size_bytes: u64,
    pub failure_domain: String,
    pub table: SlabTable,
    pub requests_served: AtomicU64,
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
}

pub struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    client_id: u64,
    body: Vec<u8>,
    out: Vec<u8>,
    metas: Vec<u8>,
    iovecs: Vec<libc::iovec>,
}

impl Connection {
    pub fn new(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) -> Connection {
        Connection {
            stream,
            peer,
            shared,
            client_id: 0,
            body: Vec::with_capacity(512),
            out: Vec::with_capacity(512),
            metas: Vec::with_capacity(READ_SPLITS_MAX_COUNT as usize * SPLIT_META_BYTES),
            iovecs: Vec::with_capacity(1 + 2 * READ_SPLITS_MAX_COUNT as usize),
        }
    }

    /// Serves the connection until the peer leaves, an I/O error, or a refusal that closes it.
    pub fn serve(&mut self) {
        let end = match self.handshake() {
            Ok(()) => {
                tracing::info!(peer = %self.peer, client_id = self.client_id, "client authenticated");
                self.serve_requests()
            }
            Err(end) => end,
        };
        match end {
            ConnectionEnd::PeerClosed => {
                tracing::info!(peer = %self.peer, client_id = self.client_id, "connection closed by peer")
            }
            end => {
                tracing::warn!(peer = %self.peer, client_id = self.client_id, reason = %end, "connection closed")
            }
        }
    }

    fn handshake(&mut self) -> Result<(), ConnectionEnd> {
        self.stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        self.stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let (request_id, hello) = self.read_handshake_frame(Kind::Hello)?;
        let Control::Hello { client_id, client_nonce } = hello else {
            unreachable!("read_handshake_frame returns the kind asked for");
        };
        self.client_id = client_id;
        let node_nonce: [u8; 32] = rand::random();
        let node_proof = auth::node_proof(&self.shared.secret, &client_nonce, &node_nonce, client_id);
        self.send_control(request_id, &Control::Challenge { node_nonce, node_proof })?;
        let (request_id, auth_message) = self.read_handshake_frame(Kind::Auth)?;
        let Control::Auth { client_proof } = auth_message else {
            unreachable!("read_handshake_frame returns the kind asked for");
        };
        let expected = auth::client_proof(&self.shared.secret, &client_nonce, &node_nonce, client_id);
        if !auth::verify(&expected, &client_proof) {
            return Err(self.refuse(request_id, ErrorCode::AuthFailed, "client proof does not match"));
        }
        self.send_control(request_id, &Control::AuthOk { node_id: self.shared.node_id })?;
        self.stream.set_read_timeout(None)?;
        Ok(())
    }

    /// Reads the next handshake frame, which must be of `expected` kind; anything else is refused
    /// with `NotAuthenticated` before its body is read.
    fn read_handshake_frame(&mut self, expected: Kind) -> Result<(u64, Control), ConnectionEnd> {
        let header = self.read_header()?;
        if header.kind != expected {
            return Err(self.refuse(
                header.request_id,
                ErrorCode::NotAuthenticated,
                format!("expected {expected:?}, got {:?}", header.kind),
            ));
        }
        let control = self.read_control_body(header)?;
        Ok((header.request_id, control))
    }

    fn serve_requests(&mut self) -> ConnectionEnd {
        match self.serve_requests_until_error() {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    fn serve_requests_until_error(&mut self) -> Result<std::convert::Infallible, ConnectionEnd> {
        loop {
            let header = self.read_header()?;
            self.shared.requests_served.fetch_add(1, Ordering::Relaxed);
            match header.kind {
                Kind::WriteSplit => self.write_split(header)?,
                Kind::MapSlab
                | Kind::UnmapSlab
                | Kind::NodeInfo
                | Kind::Ping
                | Kind::Pong
                | Kind::ReadSplit
                | Kind::ReadSplits => {
                    let request = self.read_control_body(header)?;
                    self.handle_control(header.request_id, request)?;
                }
                kind => {
                    return Err(self.refuse(
                        header.request_id,
                        ErrorCode::Unsupported,
                        format!("{kind:?} is not a request a node accepts"),
                    ))
                }
            }
        }
    }

    fn handle_control(&mut self, request_id: u64, request: Control) -> Result<(), ConnectionEnd> {
        let client_id = self.client_id;
        let reply = match request {
            Control::Ping => Control::Pong,
            // A Pong answers nothing the node asked; ignore it rather than reply to a reply.
            Control::Pong => return Ok(()),
            Control::NodeInfo => Control::NodeInfoReply(self.node_info()),
            Control::MapSlab { split_bytes, split_index, first_page, range_id } => {
                let label = SlabLabel { split_bytes, split_index, first_page, range_id };
                match self.shared.table.map(client_id, label) {
                    Ok((slab_id, slots)) => {
                        tracing::info!(
                            client_id,
                            slab_id,
                            slots,
                            split_bytes,
                            split_index,
                            first_page,
                            range_id,
                            "slab mapped"
                        );
                        Control::SlabMapped { slab_id, slots }
                    }
                    Err(error) => self.refusal_reply(error),
                }
            }
            Control::UnmapSlab { slab_id } => match self.shared.table.unmap(client_id, slab_id) {
                Ok(label) => {
                    tracing::info!(
                        client_id,
                        slab_id,
                        split_index = label.split_index,
                        first_page = label.first_page,
                        range_id = label.range_id,
                        "slab unmapped"
                    );
                    Control::Ok
                }
                Err(error) => self.refusal_reply(error),
            },
            Control::ReadSplit { slab_id, slot } => {
                return match self.read_splits(request_id, slab_id, slot, 1, false) {
                    Ok(()) => Ok(()),
                    Err(RequestError::Refused(error)) => {
                        let reply = self.refusal_reply(error);
                        self.send_control(request_id, &reply)
                    }
                    Err(RequestError::End(end)) => Err(end),
                };
            }
            Control::ReadSplits { slab_id, first_slot, count } => {
                return match self.read_splits(request_id, slab_id, first_slot, count, true) {
                    Ok(()) => Ok(()),
                    Err(RequestError::Refused(error)) => {
                        let reply = self.refusal_reply(error);
                        self.send_control(request_id, &reply)
                    }
                    Err(RequestError::End(end)) => Err(end),
                };
            }
            other => unreachable!("serve_requests only passes requests, got {other:?}"),
        };
        self.send_control(request_id, &reply)
    }

    fn refusal_reply(&self, error: SlabError) -> Control {
        tracing::debug!(client_id = self.client_id, %error, "request refused");
        Control::error(error.code(), error.to_string())
    }

    fn node_info(&self) -> NodeInfo {
        let stats = self.shared.table.stats();
        NodeInfo {
            node_id: self.shared.node_id,
            capacity_bytes: self.shared.capacity_bytes,
            free_bytes: self.shared.capacity_bytes - stats.used_bytes,
            slab_size_bytes: self.shared.slab_size_bytes,
            slabs_mapped: stats.slabs_mapped,
            metadata_bytes: stats.metadata_bytes,
            requests_served: self.shared.requests_served.load(Ordering::Relaxed),
            failure_domain: self.shared.failure_domain.clone(),
        }
    }

    /// Validates the prefix, then receives the payload straight into the slot, then publishes the
    /// metadata. Any refusal closes the connection: the unread payload makes the stream unusable.
    fn write_split(&mut self, header: FrameHeader) -> Result<(), ConnectionEnd> {
        let mut prefix_bytes = [0u8; WRITE_SPLIT_PREFIX_BYTES];
        read_exact_or_end(&mut self.stream, &mut prefix_bytes)?;
        let prefix = match WriteSplitPrefix::decode(&prefix_bytes) {
            Ok(prefix) => prefix,
            Err(error) => return Err(self.refuse_malformed(header.request_id, error)),
        };
        let slab = match self.shared.table.get(self.client_id, prefix.slab_id) {
            Ok(slab) => slab,
            Err(error) => return Err(self.refuse(header.request_id, error.code(), error.to_string())),
        };
        let payload_bytes = header.body_len - WRITE_SPLIT_PREFIX_BYTES as u32;
        let refusal = if prefix.slot >= slab.slots() {
            Some(SlabError::SlotOutOfRange {
                slab_id: prefix.slab_id,
                first_slot: prefix.slot,
                count: 1,
                slots: slab.slots(),
            })
        } else if payload_bytes != slab.split_bytes() {
            Some(SlabError::PayloadSize {
                slab_id: prefix.slab_id,
                payload_bytes,
                split_bytes: slab.split_bytes(),
            })
        } else {
            None
        };
        if let Some(error) = refusal {
            return Err(self.refuse(header.request_id, error.code(), error.to_string()));
        }
        // SAFETY: slot < slots was checked above, so slot_ptr points at split_bytes writable bytes
        // of a mapping kept alive by `slab` for this whole call; only the kernel writes them.
        unsafe { raw_io::recv_exact(&self.stream, slab.slot_ptr(prefix.slot), payload_bytes as usize) }
            .map_err(end_of_io)?;
        slab.set_meta(
            prefix.slot,
            remem_proto::SplitMeta { version: prefix.version, checksum: prefix.checksum },
        );
        self.send_control(header.request_id, &Control::WriteSplitOk)
    }

    /// Serves `ReadSplit` (`many == false`, count 1) and `ReadSplits`: header and metadata from
    /// per-connection buffers, payloads straight from slab memory, in one `sendmsg` loop.
    fn read_splits(
        &mut self,
        request_id: u64,
        slab_id: u32,
        first_slot: u32,
        count: u32,
        many: bool,
    ) -> Result<(), RequestError> {
        let slab = self.shared.table.get(self.client_id, slab_id)?;
        let split_bytes = slab.split_bytes();
        let in_range = u64::from(first_slot) + u64::from(count) <= u64::from(slab.slots());
        if !in_range || (many && count > max_read_splits_count(split_bytes)) {
            return Err(SlabError::SlotOutOfRange { slab_id, first_slot, count, slots: slab.slots() }.into());
        }
        self.out.clear();
        if many {
            encode_read_splits_reply_head(request_id, count, split_bytes, &mut self.out);
        } else {
            let header = FrameHeader {
                kind: Kind::ReadSplitReply,
                body_len: SPLIT_META_BYTES as u32 + split_bytes,
                request_id,
            };
            self.out.extend_from_slice(&header.encode());
        }
        self.metas.clear();
        for slot in first_slot..first_slot + count {
            self.metas.extend_from_slice(&slab.meta(slot).encode());
        }
        self.iovecs.clear();
        self.iovecs.push(iovec(self.out.as_ptr(), self.out.len()));
        for (index, slot) in (first_slot..first_slot + count).enumerate() {
            let meta = &self.metas[index * SPLIT_META_BYTES..(index + 1) * SPLIT_META_BYTES];
            self.iovecs.push(iovec(meta.as_ptr(), SPLIT_META_BYTES));
            self.iovecs.push(iovec(slab.slot_ptr(slot), split_bytes as usize));
        }
        // SAFETY: the iovecs point into `self.out` and `self.metas`, which are not touched until
        // the call returns, and into slots < slots of `slab`, whose mapping the local Arc keeps
        // alive; the kernel only reads them. Concurrent writers of those slots are the documented
        // torn-read case (slab module docs), caught by the end-to-end checksum.
        unsafe { raw_io::send_all(&self.stream, &mut self.iovecs) }
            .map_err(|error| RequestError::End(end_of_io(error)))
    }

    fn read_header(&mut self) -> Result<FrameHeader, ConnectionEnd> {
        let mut bytes = [0u8; HEADER_BYTES];
        let mut filled = 0;
        while filled < HEADER_BYTES {
            match self.stream.read(&mut bytes[filled..]) {
                Ok(0) if filled == 0 => return Err(ConnectionEnd::PeerClosed),
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => filled += n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(end_of_io(error)),
            }
        }
        FrameHeader::decode(&bytes)
            .map_err(|error| self.refuse_malformed(FrameHeader::raw_request_id(&bytes), error))
    }

    /// Reads and decodes a control body; the header already bounded its length.
    fn read_control_body(&mut self, header: FrameHeader) -> Result<Control, ConnectionEnd> {
        self.body.clear();
        self.body.resize(header.body_len as usize, 0);
        read_exact_or_end(&mut self.stream, &mut self.body)?;
        Control::decode_body(header.kind, &self.body)
            .map_err(|error| self.refuse_malformed(header.request_id, error))
    }

    fn send_control(&mut self, request_id: u64, message: &Control) -> Result<(), ConnectionEnd> {
        self.out.clear();
        message.encode(request_id, &mut self.out);
        self.stream.write_all(&self.out).map_err(end_of_io)
    }

    fn refuse_malformed(&mut self, request_id: u64, error: DecodeError) -> ConnectionEnd {
        self.refuse(request_id, ErrorCode::Malformed, error.to_string())
    }

    /// Replies `Error(code)` (best effort: the peer may be gone) and ends the connection.
    fn refuse(&mut self, request_id: u64, code: ErrorCode, message: impl Into<String>) -> ConnectionEnd {
        let message = message.into();
        if let Err(error) = self.send_control(request_id, &Control::error(code, message.clone())) {
            tracing::debug!(peer = %self.peer, %error, "could not send the refusal");
        }
        self.linger();
        ConnectionEnd::Refused { code, message }
    }
}

impl Connection {
    /// Half-closes, then briefly discards what the peer still sends: closing a socket with unread
    /// input makes the kernel send a reset, which can destroy the `Error` reply before the peer
    /// reads it. Bounded in time and bytes so a hostile peer cannot hold the thread.
    fn linger(&mut self) {
        const LINGER: Duration = Duration::from_millis(200);
        const LINGER_MAX_BYTES: usize = 2 * 1024 * 1024;
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        if self.stream.set_read_timeout(Some(LINGER)).is_err() {
            return;
        }
        let started = std::time::Instant::now();
        let mut discarded = 0;
        let mut sink = [0u8; 4096];
        while discarded < LINGER_MAX_BYTES && started.elapsed() < LINGER {
            match self.stream.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(n) => discarded += n,
            }
        }
    }
}

/// A refusal that keeps the connection open, or the end of it.
enum RequestError {
    Refused(SlabError),
    End(ConnectionEnd),
}

impl From<SlabError> for RequestError {
    fn from(error: SlabError) -> RequestError {
        RequestError::Refused(error)
    }
}

fn end_of_io(error: io::Error) -> ConnectionEnd {
    ConnectionEnd::Io(error)
}

fn read_exact_or_end(stream: &mut TcpStream, buffer: &mut [u8]) -> Result<(), ConnectionEnd> {
    stream.read_exact(buffer).map_err(end_of_io)
}
