//! The standby's copy of the backup region, kept by the primary (seed 004, MacR): the three
//! ways of [`Mode`], behind one [`Replica`] that [`Backup`](super::Backup) calls on every change
//! of its region, and the log ring the third way uses.
//!
//! Every change of the region is one of two kinds, and the replica sees them in order:
//! - bytes at an offset (a slot's `len | crc | payload`, coalesced into one contiguous write; a
//!   chunk's class byte; a whole chunk during a sync);
//! - a slot's state word, always after the bytes it vouches for.
//!
//! The standby's region is a file in the state directory created by the standby (its memory;
//! `kv-NAME/standby-ID-backup`, ID the attach's). One-sided, the primary maps it and stores into
//! it; RPC, it sends each change and waits at [`Replica::barrier`]; log, it appends each change
//! to the ring (`kv-NAME/standby-ID-ring`, also the standby's) and never waits unless the ring
//! is full.
//!
//! **The fence.** A standby that stops answering is given up ([`STANDBY_TIMEOUT`]) and the
//! primary serves on without it, so from then on its copy lacks what the primary acknowledges.
//! It may not know (it may be stopped), so before anything else happens the primary removes the
//! standby's files from the state directory: a standby takes over only by renaming its region
//! to the directory's `backup`, under the directory's lock (the primary gone), so a given-up
//! standby's rename finds nothing, whenever it wakes up. The removal is done in [`Replica::lose`],
//! before it returns to the change or the barrier that gave the standby up, so no reply that
//! acknowledges a change the standby lacks leaves while the standby could still take over. A
//! removal that fails (never in a directory this process owns and has locked, short of I/O
//! errors) stops the process: the standby then takes over with every acknowledged change.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::wire::{self, Message, Mode};

/// Bytes of the log ring's data area (a power of two; an entry is at most a chunk).
pub const RING_BYTES: usize = 8 << 20;
/// Where the data area starts: `head` at 0, `tail` at 64 (separate cache lines).
const RING_DATA: usize = 128;
/// An entry: `len: u32 | kind: u32 | offset: u64 | bytes_len: u32 | 0: u32 | bytes`, `len`
/// counting all of it padded to [`ENTRY_ALIGN`] (so a pad entry always has room for a header).
const ENTRY_HEADER: usize = 24;
const ENTRY_ALIGN: usize = 32;
const KIND_WRITE: u32 = 1;
const KIND_STATE: u32 = 2;
/// Fills the rest of the ring's end when an entry does not fit there.
const KIND_PAD: u32 = 3;
/// How long the primary waits for a standby (an acknowledgement, room in the ring) before it
/// gives the standby up and serves on without one.
pub const STANDBY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a standby is given up, or could not be attached (the primary's side).
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("{}: {source}", path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Metadata(std::io::Error),
    #[error("{} has {length} bytes, not {expected}", path.display())]
    Size { path: PathBuf, length: u64, expected: u64 },
    #[error("mapping {}: {source}", path.display())]
    Map { path: PathBuf, source: std::io::Error },
    #[error("the standby's log ring is not new")]
    RingNotNew,
    #[error("{0}")]
    Timeouts(std::io::Error),
    #[error("the standby did not say it was ready")]
    NotReady,
    #[error("waiting for the standby's acknowledgement: {0}")]
    AckRead(std::io::Error),
    #[error("{0}")]
    AckFrame(wire::WireError),
    #[error("the standby sent something other than an acknowledgement")]
    NotAnAck,
    #[error("expected acknowledgement {expected}, got {got}")]
    WrongAck { expected: u64, got: String },
    #[error("writing to the standby: {0}")]
    Write(std::io::Error),
    #[error("the standby does not drain its log ring")]
    RingFull,
    #[error("its socket closed")]
    SocketClosed,
}

/// Why the standby stopped draining its log ring: an entry that does not make sense, or a
/// change the region refused. The ring is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("log ring head {head} and tail {tail} are inconsistent")]
    Inconsistent { head: u64, tail: u64 },
    #[error("log ring entry at {at} has length {len}")]
    Length { at: u64, len: usize },
    #[error("log ring entry at {at} of {len} bytes claims {bytes}")]
    Bytes { at: u64, len: usize, bytes: usize },
    #[error("a state entry without its word")]
    StateWord,
    #[error("log ring entry at {at} has kind {kind}")]
    Kind { at: u64, kind: u32 },
    #[error("{0}")]
    Apply(#[from] super::sync::ApplyError),
}

/// The file size of a log ring.
pub fn ring_file_bytes() -> u64 {
    (RING_DATA + RING_BYTES) as u64
}

/// The primary's side of the standby's copy.
pub struct Replica {
    pub mode: Mode,
    stream: UnixStream,
    /// Frames not sent yet (RPC changes, heartbeats); reused, so no allocation per change once
    /// it has grown.
    out: Vec<u8>,
    target: Target,
    barriers: u64,
    /// Why the standby was given up, once it was.
    pub lost: Option<ReplicaError>,
    /// Changes sent since the last barrier (RPC).
    unacknowledged: bool,
    /// The standby's files (its region, its ring), removed when it is given up: the fence.
    files: Vec<PathBuf>,
}

enum Target {
    Mapped(MmapMut),
    Rpc,
    Ring(Ring),
}

fn map_file(path: &Path, bytes: u64) -> Result<MmapMut, ReplicaError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| ReplicaError::Open { path: path.to_owned(), source })?;
    let length = file.metadata().map_err(ReplicaError::Metadata)?.len();
    if length != bytes {
        return Err(ReplicaError::Size { path: path.to_owned(), length, expected: bytes });
    }
    // SAFETY: the file is the standby's in our own state directory (0700); its size was checked
    // and neither side truncates it while attached. What the standby changes in it is never read
    // here (the primary only stores).
    unsafe { MmapMut::map_mut(&file) }.map_err(|source| ReplicaError::Map { path: path.to_owned(), source })
}

impl Replica {
    /// The primary's side, once the standby said its region (`region`, of `region_bytes`) and
    /// its ring (`ring`, log mode) exist. Both paths are removed if the standby is given up.
    pub fn attach(
        mode: Mode,
        stream: UnixStream,
        region: &Path,
        region_bytes: u64,
        ring: &Path,
    ) -> Result<Replica, ReplicaError> {
        let target = match mode {
            Mode::OneSided => Target::Mapped(map_file(region, region_bytes)?),
            Mode::Rpc => Target::Rpc,
            Mode::Log => Target::Ring(Ring { map: map_file(ring, ring_file_bytes())?, head: 0 }),
        };
        if let Target::Ring(ring) = &target {
            ring.check_empty()?;
        }
        stream.set_write_timeout(Some(STANDBY_TIMEOUT)).map_err(ReplicaError::Timeouts)?;
        stream.set_read_timeout(Some(STANDBY_TIMEOUT)).map_err(ReplicaError::Timeouts)?;
        Ok(Replica {
            mode,
            stream,
            out: Vec::with_capacity(64 << 10),
            target,
            barriers: 0,
            lost: None,
            unacknowledged: false,
            files: vec![region.to_owned(), ring.to_owned()],
        })
    }

    /// Whether the standby closed its end of the socket (it died): a standby that sends nothing
    /// unasked is found gone here without waiting for a write to fail.
    pub fn peer_closed(&self) -> bool {
        let mut poll = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one pollfd, a live local; a zero timeout never blocks.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
    }

    /// Bytes at `offset` of the region.
    pub fn write(&mut self, offset: u64, bytes: &[u8]) {
        if self.lost.is_some() {
            return;
        }
        match &mut self.target {
            Target::Mapped(map) => {
                let at = offset as usize;
                map[at..at + bytes.len()].copy_from_slice(bytes);
            }
            Target::Rpc => {
                wire::encode(&Message::Write { offset, bytes }, &mut self.out);
                self.unacknowledged = true;
                if self.out.len() >= 1 << 20 {
                    self.send();
                }
            }
            Target::Ring(_) => self.append(KIND_WRITE, offset, bytes),
        }
    }

    /// A slot's state word, after the bytes before it.
    pub fn state(&mut self, offset: u64, state: u32) {
        if self.lost.is_some() {
            return;
        }
        match &mut self.target {
            Target::Mapped(map) => {
                assert!(offset as usize + 4 <= map.len() && offset.is_multiple_of(4));
                // SAFETY: inside the mapping (checked) and 4-aligned; the release store orders the
                // slot's bytes (stored before) before the word for the standby reading it.
                let word = unsafe { AtomicU32::from_ptr(map.as_mut_ptr().add(offset as usize) as *mut u32) };
                word.store(state, Ordering::Release);
            }
            Target::Rpc => {
                wire::encode(&Message::State { offset, state }, &mut self.out);
                self.unacknowledged = true;
            }
            Target::Ring(_) => self.append(KIND_STATE, offset, &state.to_le_bytes()),
        }
    }

    fn append(&mut self, kind: u32, offset: u64, bytes: &[u8]) {
        let Target::Ring(ring) = &mut self.target else { return };
        if let Err(error) = ring.append(kind, offset, bytes) {
            self.lose(error);
        }
    }

    /// Returns once every change before it is in the standby's memory (one-sided, log: at once,
    /// the stores are there; RPC: the standby acknowledged them). Called before replies leave.
    pub fn barrier(&mut self) {
        if self.lost.is_some() {
            return;
        }
        match &mut self.target {
            Target::Mapped(_) => {}
            Target::Ring(ring) => ring.publish(),
            Target::Rpc => {
                if !self.unacknowledged {
                    return;
                }
                self.barriers += 1;
                wire::encode(&Message::Barrier { seq: self.barriers }, &mut self.out);
                self.send();
                if self.lost.is_none() {
                    if let Err(error) = self.wait_ack(self.barriers) {
                        self.lose(error);
                    }
                }
                self.unacknowledged = false;
            }
        }
    }

    fn wait_ack(&mut self, seq: u64) -> Result<(), ReplicaError> {
        let mut ack = [0u8; 13];
        std::io::Read::read_exact(&mut self.stream, &mut ack).map_err(ReplicaError::AckRead)?;
        match wire::frame_len(&ack).map_err(ReplicaError::AckFrame)? {
            Some(13) => {}
            _ => return Err(ReplicaError::NotAnAck),
        }
        match wire::decode(&ack[4..]) {
            Ok(Message::Ack { seq: acked }) if acked == seq => Ok(()),
            other => Err(ReplicaError::WrongAck { expected: seq, got: format!("{other:?}") }),
        }
    }

    /// A message for the standby (heartbeat, progress), sent now.
    pub fn tell(&mut self, message: &Message) {
        if self.lost.is_some() {
            return;
        }
        wire::encode(message, &mut self.out);
        self.send();
    }

    fn send(&mut self) {
        if self.out.is_empty() {
            return;
        }
        let result = self.stream.write_all(&self.out);
        self.out.clear();
        if let Err(error) = result {
            self.lose(ReplicaError::Write(error));
        }
    }

    /// Gives the standby up: fences it (its files removed, see the module docs) before the
    /// caller goes on to serve without it.
    pub fn lose(&mut self, why: ReplicaError) {
        if self.lost.is_some() {
            return;
        }
        for path in &self.files {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    eprintln!(
                        "cannot remove {} of the standby given up ({why}): {error}; stopping rather than \
                         acknowledge a change the standby lacks while it may take over",
                        path.display()
                    );
                    std::process::abort();
                }
            }
        }
        tracing::error!(%why, "the standby is given up (its files removed: it can never take over); serving on without one");
        self.lost = Some(why);
    }
}

/// The log ring, in the standby's memory: the primary appends and moves `head`; the standby
/// applies and moves `tail`. Positions count bytes forever (they never wrap; the offset in the
/// data area is `position % RING_BYTES`).
pub struct Ring {
    map: MmapMut,
    /// The primary's next position (published to the shared `head` at a barrier).
    head: u64,
}

fn shared_u64(map: &mut MmapMut, at: usize) -> &AtomicU64 {
    assert!(at + 8 <= map.len() && at.is_multiple_of(8));
    // SAFETY: inside the mapping and 8-aligned (checked; the mapping is page-aligned); the word
    // is only ever accessed atomically, by both processes.
    unsafe { AtomicU64::from_ptr(map.as_mut_ptr().add(at) as *mut u64) }
}

impl Ring {
    fn check_empty(&self) -> Result<(), ReplicaError> {
        if self.map[..RING_DATA].iter().any(|&byte| byte != 0) {
            return Err(ReplicaError::RingNotNew);
        }
        Ok(())
    }

    fn append(&mut self, kind: u32, offset: u64, bytes: &[u8]) -> Result<(), ReplicaError> {
        let len = (ENTRY_HEADER + bytes.len()).next_multiple_of(ENTRY_ALIGN);
        assert!(len <= RING_BYTES / 2, "a ring entry is at most a chunk");
        let at = (self.head % RING_BYTES as u64) as usize;
        if at + len > RING_BYTES {
            let pad = RING_BYTES - at;
            self.wait_room(pad)?;
            self.put_header(at, pad, KIND_PAD, 0, 0);
            self.head += pad as u64;
        }
        self.wait_room(len)?;
        let at = (self.head % RING_BYTES as u64) as usize;
        self.put_header(at, len, kind, offset, bytes.len());
        let data = RING_DATA + at + ENTRY_HEADER;
        self.map[data..data + bytes.len()].copy_from_slice(bytes);
        self.head += len as u64;
        Ok(())
    }

    fn put_header(&mut self, at: usize, len: usize, kind: u32, offset: u64, bytes: usize) {
        let header = RING_DATA + at;
        self.map[header..header + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.map[header + 4..header + 8].copy_from_slice(&kind.to_le_bytes());
        self.map[header + 8..header + 16].copy_from_slice(&offset.to_le_bytes());
        self.map[header + 16..header + 20].copy_from_slice(&(bytes as u32).to_le_bytes());
    }

    /// Waits (publishing what is appended, so the standby can drain it) until `len` bytes are
    /// free, for at most [`STANDBY_TIMEOUT`].
    fn wait_room(&mut self, len: usize) -> Result<(), ReplicaError> {
        let tail = |ring: &mut Ring| shared_u64(&mut ring.map, 64).load(Ordering::Acquire);
        if self.head + len as u64 - tail(self) <= RING_BYTES as u64 {
            return Ok(());
        }
        self.publish();
        let deadline = Instant::now() + STANDBY_TIMEOUT;
        while self.head + len as u64 - tail(self) > RING_BYTES as u64 {
            if Instant::now() > deadline {
                return Err(ReplicaError::RingFull);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    fn publish(&mut self) {
        let head = self.head;
        shared_u64(&mut self.map, 0).store(head, Ordering::Release);
    }
}

/// The standby's side of the log ring: entries applied in order to the standby's region.
pub struct RingReader {
    map: MmapMut,
}

/// One change read from the ring or the socket, to apply to the standby's region.
pub enum Change<'a> {
    Write { offset: u64, bytes: &'a [u8] },
    State { offset: u64, state: u32 },
}

impl RingReader {
    /// Creates the ring file (new, empty) and maps it.
    pub fn create(path: &Path) -> std::io::Result<RingReader> {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(path);
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
        file.set_len(ring_file_bytes())?;
        // SAFETY: a file we just created in our locked-by-convention state directory; the primary
        // writes entries into it and the bytes are validated before use (`drain`).
        let map = unsafe { MmapMut::map_mut(&file) }?;
        Ok(RingReader { map })
    }

    /// Applies every published entry with `apply`, in order; returns how many. An entry that
    /// does not make sense (a length or kind out of range) is an error: the ring is not trusted.
    pub fn drain(
        &mut self,
        mut apply: impl FnMut(Change) -> Result<(), super::sync::ApplyError>,
    ) -> Result<usize, RingError> {
        let head = shared_u64(&mut self.map, 0).load(Ordering::Acquire);
        let mut tail = shared_u64(&mut self.map, 64).load(Ordering::Relaxed);
        if head < tail || head - tail > RING_BYTES as u64 {
            return Err(RingError::Inconsistent { head, tail });
        }
        let mut applied = 0;
        while tail < head {
            let at = (tail % RING_BYTES as u64) as usize;
            let header = RING_DATA + at;
            let field =
                |from: usize| u32::from_le_bytes(self.map[from..from + 4].try_into().expect("4 bytes"));
            let len = field(header) as usize;
            let kind = field(header + 4);
            let offset = u64::from_le_bytes(self.map[header + 8..header + 16].try_into().expect("8 bytes"));
            if len < ENTRY_HEADER
                || !len.is_multiple_of(ENTRY_ALIGN)
                || at + len > RING_BYTES
                || len as u64 > head - tail
            {
                return Err(RingError::Length { at: tail, len });
            }
            let bytes = field(header + 16) as usize;
            if bytes > len - ENTRY_HEADER {
                return Err(RingError::Bytes { at: tail, len, bytes });
            }
            let body = &self.map[header + ENTRY_HEADER..header + ENTRY_HEADER + bytes];
            match kind {
                KIND_PAD => {}
                KIND_WRITE => {
                    apply(Change::Write { offset, bytes: body })?;
                    applied += 1;
                }
                KIND_STATE => {
                    let state = body.get(..4).ok_or(RingError::StateWord)?;
                    apply(Change::State {
                        offset,
                        state: u32::from_le_bytes(state.try_into().expect("4 bytes")),
                    })?;
                    applied += 1;
                }
                other => return Err(RingError::Kind { at: tail, kind: other }),
            }
            tail += len as u64;
            shared_u64(&mut self.map, 64).store(tail, Ordering::Release);
        }
        Ok(applied)
    }
}
