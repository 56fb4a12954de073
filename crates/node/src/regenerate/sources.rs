//! The sources of a rebuild: one connection per surviving split, asked for batches of slots
//! (`ReadSplits`) up to [`PIPELINE_DEPTH`] batches ahead of the one being rebuilt, so the sources
//! read and send the next batches while the rebuild thread judges, decodes and stores the current
//! one. Replies come back in request order on each connection, so a source's queue of asked
//! batches is matched front first; a batch the rebuild skipped (the client rewrote every slot of
//! it) is read off the connection and dropped.
//!
//! On a node with `--encrypt` these connections encrypt too (`remem_proto::encryption`): the
//! sources are nodes of the same cluster, which require it.
//!
//! [`read_floor`] reads the same slabs through the same code, in the same batches and depth, and
//! does nothing with what it reads: the floor `remem bench regen` measures a rebuild against.

use remem_proto::auth::Secret;
use remem_proto::blocking::{self, FrameError, HandshakeError};
use remem_proto::encryption::{self, EncryptionError, SecureStream};
use remem_proto::{
    max_read_splits_count, payload_crcs, read_splits_reply_body_len, Control, ErrorCode, Kind, SplitMeta,
    READ_SPLITS_COUNT_BYTES, SPLIT_META_BYTES,
};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Batches asked ahead per source. One batch is ~135 KB of replies (256 slots of 512-byte splits
/// and their metadata), so four keep a source busy through a batch's decoding while staying
/// within what the kernel buffers on loopback.
pub const PIPELINE_DEPTH: u32 = 4;
const SOURCE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A source that does not answer a batch within this is treated as failed.
const SOURCE_IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Whom a rebuild connects to its sources as: the requester's client id and session, proven with
/// the cluster secret, so the sources' ownership and lease checks pass.
pub struct Claim<'a> {
    pub secret: &'a Secret,
    pub client_id: u64,
    pub session: u64,
    /// Encrypt the connections (the node has `--encrypt`).
    pub encrypt: bool,
}

/// A source connection: plaintext, or encrypted.
enum SourceStream {
    Plain(TcpStream),
    Encrypted(Box<SecureStream<TcpStream>>),
}

impl Read for SourceStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            SourceStream::Plain(stream) => stream.read(buf),
            SourceStream::Encrypted(stream) => stream.read(buf),
        }
    }
}

impl Write for SourceStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SourceStream::Plain(stream) => stream.write(buf),
            SourceStream::Encrypted(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    #[error("handshake failed: {0}")]
    Handshake(#[from] HandshakeError),
    #[error("{0}")]
    Encryption(#[from] EncryptionError),
    #[error("frame I/O failed: {0}")]
    Frame(#[from] FrameError),
    #[error("refused: {code}: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("unexpected reply: {0}")]
    BadReply(String),
}

impl From<io::Error> for SourceError {
    fn from(error: io::Error) -> SourceError {
        SourceError::Frame(FrameError::Io(error))
    }
}

/// One surviving split's slab and the connection to it.
pub struct Source {
    pub split_index: u8,
    pub slab_id: u32,
    pub address: SocketAddr,
    stream: Option<SourceStream>,
    pub failed: bool,
    /// The last `ReadSplitsReply` body, and the batch it holds.
    body: Vec<u8>,
    batch_first_slot: Option<u32>,
    /// CRC-32C of each payload of the buffered batch, and the batch they belong to
    /// (`checksum_entries`).
    crcs: Vec<u32>,
    crcs_first_slot: Option<u32>,
    next_request_id: u64,
    /// Batches asked and not yet read, in order: (request id, first slot, count).
    in_flight: VecDeque<(u64, u32, u32)>,
    /// The first slot not asked yet on this connection.
    next_ask: u32,
    /// Why the source failed, once it has.
    pub error: Option<String>,
}

impl Source {
    pub fn new(split_index: u8, slab_id: u32, address: SocketAddr) -> Source {
        Source {
            split_index,
            slab_id,
            address,
            stream: None,
            failed: false,
            body: Vec::new(),
            batch_first_slot: None,
            crcs: Vec::new(),
            crcs_first_slot: None,
            next_request_id: 2,
            in_flight: VecDeque::with_capacity(PIPELINE_DEPTH as usize),
            next_ask: 0,
            error: None,
        }
    }

    /// Connects if not connected; `on_connect` sees the new stream (the node keeps a clone to
    /// shut it down when it stops).
    pub fn connect(&mut self, claim: &Claim<'_>, on_connect: &dyn Fn(&TcpStream)) -> Result<(), SourceError> {
        if self.stream.is_some() {
            return Ok(());
        }
        let stream = TcpStream::connect_timeout(&self.address, SOURCE_CONNECT_TIMEOUT)
            .map_err(SourceError::Connect)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(SOURCE_IO_TIMEOUT))?;
        stream.set_write_timeout(Some(SOURCE_IO_TIMEOUT))?;
        on_connect(&stream);
        let mut stream = if claim.encrypt {
            SourceStream::Encrypted(Box::new(encryption::initiate(stream, claim.secret)?))
        } else {
            SourceStream::Plain(stream)
        };
        blocking::handshake_session(&mut stream, claim.secret, claim.client_id, claim.session)?;
        self.stream = Some(stream);
        self.next_request_id = 2;
        self.in_flight.clear();
        self.next_ask = 0;
        Ok(())
    }

    fn stream(&mut self) -> &mut SourceStream {
        self.stream.as_mut().expect("connected before use")
    }

    fn request_id(&mut self) -> u64 {
        self.next_request_id += 1;
        self.next_request_id
    }

    /// True when the buffered batch is the one starting at `first_slot`.
    pub fn holds(&self, first_slot: u32) -> bool {
        self.batch_first_slot == Some(first_slot)
    }

    /// Asks for the batches of `batch` slots from `from` up to `depth` batches ahead (not past
    /// `end`) that this connection has not asked for yet.
    fn ask_ahead(&mut self, from: u32, batch: u32, end: u32, depth: u32) -> Result<(), SourceError> {
        if self.next_ask < from {
            // A fresh connection, or the rebuild skipped past everything asked.
            self.next_ask = from;
        }
        let limit = from.saturating_add(depth.saturating_mul(batch)).min(end);
        while self.next_ask < limit {
            let (first_slot, count) = (self.next_ask, batch.min(end - self.next_ask));
            let request_id = self.request_id();
            let message = Control::ReadSplits { slab_id: self.slab_id, first_slot, count };
            blocking::write_control(self.stream(), request_id, &message)?;
            self.in_flight.push_back((request_id, first_slot, count));
            self.next_ask = first_slot + count;
        }
        Ok(())
    }

    /// Reads replies off the connection until the batch starting at `first_slot` is buffered,
    /// dropping those of batches the rebuild skipped.
    fn receive(&mut self, first_slot: u32, split_bytes: u32) -> Result<(), SourceError> {
        while !self.holds(first_slot) {
            let Some((request_id, first, count)) = self.in_flight.pop_front() else {
                return Err(SourceError::BadReply(format!("slot {first_slot} was never asked for")));
            };
            if first > first_slot {
                return Err(SourceError::BadReply(format!("slot {first_slot} is behind the batches asked")));
            }
            self.batch_first_slot = None;
            let stream = self.stream.as_mut().expect("connected before use");
            let header = blocking::read_frame(stream, &mut self.body)?;
            check_reply(header, request_id, Kind::ReadSplitsReply, &self.body)?;
            if Some(header.body_len) != read_splits_reply_body_len(count, split_bytes) {
                return Err(SourceError::BadReply(format!(
                    "ReadSplitsReply of {} bytes for {count} slots",
                    header.body_len
                )));
            }
            self.batch_first_slot = Some(first);
        }
        Ok(())
    }

    /// Checksums every payload of the buffered batch, four chains at a time, right after it was
    /// read: its 135 KB are still in this core's cache then, while by the time the rebuild
    /// reaches a page the other k-1 sources' replies have been read over them (checksumming
    /// page by page, across the k bodies, spent over half the rebuild thread in the CRC loop).
    /// Does nothing if this batch is already checksummed.
    pub fn checksum_entries(&mut self, split_bytes: usize) {
        if self.batch_first_slot.is_none() || self.crcs_first_slot == self.batch_first_slot {
            return;
        }
        let entry_bytes = SPLIT_META_BYTES + split_bytes;
        let count = self.body.len().saturating_sub(READ_SPLITS_COUNT_BYTES) / entry_bytes;
        let (body, crcs) = (&self.body, &mut self.crcs);
        crcs.clear();
        crcs.resize(count, 0);
        let payload = |index: usize| {
            let at = READ_SPLITS_COUNT_BYTES + index * entry_bytes + SPLIT_META_BYTES;
            &body[at..at + split_bytes]
        };
        for first in (0..count).step_by(4) {
            let group = (count - first).min(4);
            let mut payloads: [&[u8]; 4] = [&[]; 4];
            for (offset, slot) in payloads[..group].iter_mut().enumerate() {
                *slot = payload(first + offset);
            }
            payload_crcs(&payloads[..group], &mut crcs[first..first + group]);
        }
        self.crcs_first_slot = self.batch_first_slot;
    }

    /// CRC-32C of the payload of entry `index` of the buffered batch ([`Self::checksum_entries`]
    /// must have run for it).
    pub fn crc(&self, index: usize) -> u32 {
        debug_assert_eq!(self.crcs_first_slot, self.batch_first_slot, "checksummed batch");
        self.crcs[index]
    }

    /// Metadata and payload of slot `first_slot + index` of the buffered batch. The metadata is
    /// `None` when its reserved bytes are not zero: such a split is corrupt, and must not pass
    /// for a slot never written.
    pub fn entry(&self, index: usize, split_bytes: usize) -> (Option<SplitMeta>, &[u8]) {
        let at = READ_SPLITS_COUNT_BYTES + index * (SPLIT_META_BYTES + split_bytes);
        let meta_bytes = self.body[at..at + SPLIT_META_BYTES].try_into().expect("meta length");
        let meta = SplitMeta::decode(meta_bytes).ok();
        (meta, &self.body[at + SPLIT_META_BYTES..at + SPLIT_META_BYTES + split_bytes])
    }

    /// One slot by `ReadSplit`, for a page the batch sources could not settle; the payload is
    /// left in `body` after the metadata. The metadata is `None` when its reserved bytes are not
    /// zero (a corrupt split, as in [`Source::entry`]). Only for a source with no batch in
    /// flight (one outside the active k), whose replies would otherwise come first.
    pub fn read_one(
        &mut self,
        slot: u32,
        split_bytes: u32,
        body: &mut Vec<u8>,
    ) -> Result<Option<SplitMeta>, SourceError> {
        if !self.in_flight.is_empty() {
            return Err(SourceError::BadReply("ReadSplit behind batches in flight".to_owned()));
        }
        let request_id = self.request_id();
        let message = Control::ReadSplit { slab_id: self.slab_id, slot };
        blocking::write_control(self.stream(), request_id, &message)?;
        let header = blocking::read_frame(self.stream(), body)?;
        check_reply(header, request_id, Kind::ReadSplitReply, body)?;
        if header.body_len != SPLIT_META_BYTES as u32 + split_bytes {
            return Err(SourceError::BadReply(format!("ReadSplitReply of {} bytes", header.body_len)));
        }
        Ok(SplitMeta::decode(body[..SPLIT_META_BYTES].try_into().expect("meta length")).ok())
    }

    pub fn fail(&mut self, error: &SourceError) {
        tracing::warn!(split_index = self.split_index, address = %self.address, %error, "regeneration source failed");
        self.failed = true;
        self.error = Some(error.to_string());
        self.stream = None;
        self.batch_first_slot = None;
        self.in_flight.clear();
    }
}

fn check_reply(
    header: remem_proto::FrameHeader,
    request_id: u64,
    expected: Kind,
    body: &[u8],
) -> Result<(), SourceError> {
    if header.kind == Kind::Error {
        return match Control::decode_body(Kind::Error, body) {
            Ok(Control::Error { code, message }) => Err(SourceError::Refused { code, message }),
            _ => Err(SourceError::BadReply("malformed Error".to_owned())),
        };
    }
    if header.kind != expected || header.request_id != request_id {
        return Err(SourceError::BadReply(format!(
            "{:?} for request {}, expected {expected:?} for {request_id}",
            header.kind, header.request_id
        )));
    }
    Ok(())
}

/// The batch being fetched: the slots from `first_slot`, in batches of `batch` slots up to `end`.
#[derive(Clone, Copy)]
pub struct Batch {
    pub first_slot: u32,
    pub batch: u32,
    pub end: u32,
    pub split_bytes: u32,
}

/// Makes `batch` available from each source at `positions` in `sources`: connects as needed,
/// asks each for the batches from it on (all first, so the sources work in parallel), then reads
/// each reply. A source that fails on the way is marked failed ([`Source::fail`]); the others
/// hold the batch ([`Source::holds`]). Which sources to ask, and what a failure changes, is the
/// rebuild machine's (`core::RebuildSteps`).
pub fn fetch_batch(
    claim: &Claim<'_>,
    on_connect: &dyn Fn(&TcpStream),
    sources: &mut [Source],
    positions: impl Iterator<Item = usize> + Clone,
    batch: Batch,
    checksum: bool,
) {
    for position in positions.clone() {
        let source = &mut sources[position];
        let asked = source
            .connect(claim, on_connect)
            .and_then(|()| source.ask_ahead(batch.first_slot, batch.batch, batch.end, PIPELINE_DEPTH));
        if let Err(error) = asked {
            source.fail(&error);
        }
    }
    for position in positions {
        let source = &mut sources[position];
        if source.failed {
            continue;
        }
        match source.receive(batch.first_slot, batch.split_bytes) {
            Ok(()) if checksum => source.checksum_entries(batch.split_bytes as usize),
            Ok(()) => {}
            Err(error) => source.fail(&error),
        }
    }
}

/// One slab a floor reads: its split index, slab id and node.
#[derive(Clone, Copy, Debug)]
pub struct FloorSource {
    pub split_index: u8,
    pub slab_id: u32,
    pub address: SocketAddr,
}

/// Reads slots `0..pages` of the first k of `sources` the way a rebuild does (same batches, same
/// depth, same connections, one thread) and does nothing with the bytes: the time a rebuild
/// would take if judging, decoding and storing were free. Fails if any source fails.
pub fn read_floor(
    secret: &Secret,
    client_id: u64,
    sources: &[FloorSource],
    k: usize,
    pages: u32,
    split_bytes: u32,
) -> Result<Duration, String> {
    // Session 0: no lease claim, so the floor runs beside the owner's own connections. In
    // plaintext: `remem bench regen` runs its own cluster without `--encrypt`.
    let claim = Claim { secret, client_id, session: 0, encrypt: false };
    let mut sources: Vec<Source> = sources
        .iter()
        .map(|source| Source::new(source.split_index, source.slab_id, source.address))
        .collect();
    if sources.len() < k {
        return Err(format!("{} sources, k = {k} needed", sources.len()));
    }
    let batch = max_read_splits_count(split_bytes);
    let started = Instant::now();
    let mut first_slot = 0;
    while first_slot < pages {
        let count = batch.min(pages - first_slot);
        let span = Batch { first_slot, batch, end: pages, split_bytes };
        // No checksums: the floor does nothing with the bytes.
        fetch_batch(&claim, &|_| {}, &mut sources, 0..k, span, false);
        if sources[..k].iter().any(|source| source.failed) {
            let failed = sources.iter().find(|source| source.failed);
            let why = failed.map(|source| {
                format!(
                    "split {} at {}: {}",
                    source.split_index,
                    source.address,
                    source.error.as_deref().unwrap_or("?")
                )
            });
            return Err(format!("a source failed at slot {first_slot}: {}", why.unwrap_or_default()));
        }
        first_slot += count;
    }
    Ok(started.elapsed())
}
