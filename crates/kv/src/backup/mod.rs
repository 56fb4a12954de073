//! The backup region: every acknowledged item's essential state (index entry, place in remote
//! memory, value checksum) written by the serving process into memory that outlives it, so that
//! a restarted `remem kv` (and, later, a standby: seed 004, MacR) rebuilds its index by scanning
//! it, with no work done by anyone while the primary serves.
//!
//! The region is a file mapped shared (`kv-NAME/backup` in the state directory): stores into it
//! are in the page cache the moment they execute, so they survive a SIGKILL, an OOM kill or a
//! panic of the process (not a crash of the host: docs/KV.md "Restarts").
//!
//! Layout (docs/KV.md has the argument):
//! - a header: `magic (8) | version: u32 | chunk_count: u32 | crc: u32` over the first 16 bytes,
//!   then one class byte per chunk (0: unassigned, c + 1: slots of `128 << c` bytes);
//! - chunks of [`CHUNK_BYTES`], each cut into slots of one size class, as memcached's slab
//!   allocator cuts its slabs (MacR's allocator-cooperative layout: the backup's allocator
//!   state is one byte per chunk, and is the primary's);
//! - a slot: `state: u32 | len: u32 | crc: u32 | payload`, `crc = crc32c(len ++ payload)`,
//!   `state` [`LIVE`] or 0 (free).
//!
//! No phantom, no torn item: an item's record is written only once its value is in remote
//! memory (all splits acknowledged), into a free slot, payload first and `state` last, and
//! before the reply that acknowledges it. An update is written out of place (new slot, then the
//! old one freed), so a crash leaves the old record, the new one, or both (the higher `seq`
//! wins). A record is freed before its pages can be reused (the record holds a reference on
//! its location). A slot whose CRC does not hold is a write cut short or damage: never served.

mod dirty;
pub mod record;
pub mod replica;
mod sync;
pub mod wire;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use memmap2::MmapMut;
pub use record::{ItemRecord, RecordView};
pub use replica::{Change, Replica, ReplicaError, RingError};
pub use sync::{ApplyError, SyncPolicy, SyncProgress};

pub const MAGIC: &[u8; 8] = b"REMEMKVB";
/// 2: the EC region's journal moved to its first pages and chunk classes cut a page evenly
/// (ranges are mapped as values arrive); a state of version 1 is refused, naming `--fresh`.
pub const VERSION: u32 = 2;
pub const CHUNK_BYTES: usize = 1 << 20;
/// Slot sizes: 128 bytes to a whole chunk, doubling.
pub const CLASS_COUNT: usize = 14;
/// A live slot's state word.
pub const LIVE: u32 = u32::from_le_bytes(*b"REK1");
const SLOT_HEADER_BYTES: usize = 12;
/// The header before the class bytes: magic, version, chunk count, CRC.
pub const HEADER_FIXED_BYTES: usize = 20;
/// The most chunks a region has (64 GiB): the header stays small, and a damaged chunk count
/// cannot make the scan walk past the file.
pub const MAX_CHUNKS: u32 = 1 << 16;

pub fn class_bytes(class: usize) -> usize {
    128 << class
}

/// Where a record lives: byte offset of its slot, and the slot's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub offset: u64,
    pub class: u8,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("backup region {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("backup region {path} is not one: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("the backup region is full ({chunks} chunks of 1 MiB): start with a larger --backup-size")]
    Full { chunks: u32 },
    #[error("an item record of {0} bytes is larger than a chunk")]
    TooLarge(usize),
}

/// What a scan found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    pub live: u64,
    /// Slots marked live whose checksum does not hold: a write cut short by a crash, or damage.
    pub damaged: u64,
    /// Slots whose checksum holds but whose record does not decode (hostile or a bug).
    pub invalid: u64,
}

/// A region opened: the region, every live record that checks out with its slot, what the
/// scan found.
pub type Opened = (Backup, Vec<(Slot, ItemRecord)>, ScanReport);

/// The region, mapped, with the allocator of its slots.
pub struct Backup {
    path: PathBuf,
    _file: File,
    map: MmapMut,
    chunk_count: u32,
    header_bytes: usize,
    /// Free slots per class (offsets), taken from the end.
    free: Vec<Vec<u64>>,
    next_chunk: u32,
    next_seq: u64,
    /// The standby's copy, kept equal to this region from the moment it attaches.
    replica: Option<Replica>,
    /// The copy of what the region held when the standby attached, made a few chunks at a
    /// time while the primary serves.
    sync: Option<sync::Cursor>,
    /// With a durable copy in remote memory (`remem kv --etcd`): the pages changed since the
    /// last copy-out, and frees held back (`dirty.rs`).
    dirty: Option<dirty::Dirty>,
}

/// The header's size with its class bytes, rounded up to a page.
pub fn header_bytes(chunk_count: u32) -> usize {
    (HEADER_FIXED_BYTES + chunk_count as usize).next_multiple_of(4096)
}

impl Backup {
    /// Creates an empty region of at least `bytes` of chunks (a sparse file: only slots written
    /// take memory), replacing what `path` held.
    pub fn create(path: &Path, bytes: u64) -> Result<Backup, BackupError> {
        let chunk_count =
            bytes.div_ceil(CHUNK_BYTES as u64).clamp(CLASS_COUNT as u64, MAX_CHUNKS as u64) as u32;
        let io = |source| BackupError::Io { path: path.to_owned(), source };
        let _ = std::fs::remove_file(path);
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
        let header = header_bytes(chunk_count);
        file.set_len((header + chunk_count as usize * CHUNK_BYTES) as u64).map_err(io)?;
        // SAFETY: the file is ours (created above, 0600, the state directory is locked), so no
        // one else changes its size while it is mapped; bytes in it are only read as input.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
        map[..8].copy_from_slice(MAGIC);
        map[8..12].copy_from_slice(&VERSION.to_le_bytes());
        map[12..16].copy_from_slice(&chunk_count.to_le_bytes());
        let crc = crc32c::crc32c(&map[..16]);
        map[16..20].copy_from_slice(&crc.to_le_bytes());
        Ok(Backup::mapped(path, file, map, chunk_count))
    }

    /// A mapped region of `chunk_count` chunks with nothing assigned yet (its allocator state is
    /// found by `scan`, or starts empty).
    fn mapped(path: &Path, file: File, map: MmapMut, chunk_count: u32) -> Backup {
        Backup {
            path: path.to_owned(),
            _file: file,
            map,
            chunk_count,
            header_bytes: header_bytes(chunk_count),
            free: vec![Vec::new(); CLASS_COUNT],
            next_chunk: 0,
            next_seq: 1,
            replica: None,
            sync: None,
            dirty: None,
        }
    }

    /// Maps an existing region and scans it: every live record that checks out, with its slot,
    /// in no particular order. Damaged and invalid slots are counted and freed.
    pub fn open(path: &Path) -> Result<Opened, BackupError> {
        let io = |source| BackupError::Io { path: path.to_owned(), source };
        let invalid = |reason: String| BackupError::Invalid { path: path.to_owned(), reason };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io)?;
        let length = file.metadata().map_err(io)?.len();
        if length < 4096 {
            return Err(invalid(format!("{length} bytes, shorter than a header")));
        }
        // SAFETY: as in `create`: our file in our locked directory; its bytes are treated as input.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
        if &map[..8] != MAGIC {
            return Err(invalid("bad magic".into()));
        }
        let version = u32::from_le_bytes(map[8..12].try_into().expect("4 bytes"));
        let chunk_count = u32::from_le_bytes(map[12..16].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(map[16..20].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&map[..16]) {
            return Err(invalid("header checksum does not hold".into()));
        }
        if version != VERSION {
            return Err(invalid(format!("format version {version}, this remem reads {VERSION}")));
        }
        let header = header_bytes(chunk_count);
        if chunk_count == 0
            || chunk_count > MAX_CHUNKS
            || length != (header + chunk_count as usize * CHUNK_BYTES) as u64
        {
            return Err(invalid(format!("{chunk_count} chunks do not match a file of {length} bytes")));
        }
        let mut backup = Backup::mapped(path, file, map, chunk_count);
        let (records, report) = backup.scan();
        Ok((backup, records, report))
    }

    fn scan(&mut self) -> (Vec<(Slot, ItemRecord)>, ScanReport) {
        let mut records = Vec::new();
        let mut report = ScanReport::default();
        // Chunks are assigned in order; the first unassigned one ends the assigned part. A
        // class byte out of range is damage: that chunk's slots cannot be found.
        for chunk in 0..self.chunk_count {
            let class_byte = self.map[HEADER_FIXED_BYTES + chunk as usize];
            if class_byte == 0 {
                break;
            }
            self.next_chunk = chunk + 1;
            let Some(class) = (class_byte as usize).checked_sub(1).filter(|&class| class < CLASS_COUNT)
            else {
                report.damaged += 1;
                continue;
            };
            let size = class_bytes(class);
            let start = self.chunk_offset(chunk);
            for slot_index in (0..CHUNK_BYTES / size).rev() {
                let offset = start + (slot_index * size) as u64;
                let slot = Slot { offset, class: class as u8 };
                match self.read_slot(slot) {
                    SlotContent::Free => self.free[class].push(offset),
                    SlotContent::Damaged => {
                        report.damaged += 1;
                        self.free_slot(slot);
                        self.free[class].push(offset);
                    }
                    SlotContent::Invalid => {
                        report.invalid += 1;
                        self.free_slot(slot);
                        self.free[class].push(offset);
                    }
                    SlotContent::Live(record) => {
                        report.live += 1;
                        self.next_seq = self.next_seq.max(record.seq + 1);
                        records.push((slot, record));
                    }
                }
            }
        }
        (records, report)
    }

    fn chunk_offset(&self, chunk: u32) -> u64 {
        (self.header_bytes + chunk as usize * CHUNK_BYTES) as u64
    }

    /// Stores a slot's state word with release ordering: a reader of the same memory (another
    /// process) that sees it also sees the payload stored before it.
    fn set_state(&mut self, offset: u64, state: u32) {
        assert!(offset as usize + 4 <= self.map.len() && offset.is_multiple_of(4));
        // SAFETY: the word is inside the mapping (checked above) and 4-aligned (slots are
        // 128-byte aligned in a page-aligned mapping); `&mut self` means no reference into the
        // mapping is alive in this process while it is stored.
        let word = unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(offset as usize) as *mut u32) };
        word.store(state, Ordering::Release);
        if let Some(dirty) = self.dirty.as_mut() {
            dirty.touch(offset, 4);
        }
        if let Some(replica) = self.replica.as_mut() {
            replica.state(offset, state);
        }
    }

    fn read_slot(&self, slot: Slot) -> SlotContent {
        let at = slot.offset as usize;
        let size = class_bytes(slot.class as usize);
        match u32::from_ne_bytes(self.map[at..at + 4].try_into().expect("4 bytes")) {
            0 => return SlotContent::Free,
            LIVE => {}
            _ => return SlotContent::Damaged,
        }
        let len = u32::from_le_bytes(self.map[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(self.map[at + 8..at + 12].try_into().expect("4 bytes"));
        if len > size - SLOT_HEADER_BYTES {
            return SlotContent::Damaged;
        }
        let payload = &self.map[at + SLOT_HEADER_BYTES..at + SLOT_HEADER_BYTES + len];
        if crc32c::crc32c_append(crc32c::crc32c(&(len as u32).to_le_bytes()), payload) != crc {
            return SlotContent::Damaged;
        }
        match ItemRecord::decode(payload) {
            Ok(record) => SlotContent::Live(record),
            Err(error) => {
                tracing::warn!(offset = slot.offset, %error, "backup record does not decode");
                SlotContent::Invalid
            }
        }
    }

    /// The next record's sequence number.
    pub fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// Writes `record` into a free slot: payload, length and checksum, then the state word.
    pub fn put(&mut self, record: &RecordView) -> Result<Slot, BackupError> {
        let len = record.encoded_len();
        let class = (0..CLASS_COUNT)
            .find(|&class| class_bytes(class) >= len + SLOT_HEADER_BYTES)
            .ok_or(BackupError::TooLarge(len))?;
        let offset = match self.free[class].pop() {
            Some(offset) => offset,
            None => self.new_chunk(class)?,
        };
        let at = offset as usize;
        let payload = &mut self.map[at + SLOT_HEADER_BYTES..at + SLOT_HEADER_BYTES + len];
        record.encode_into(payload);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&(len as u32).to_le_bytes()), payload);
        self.map[at + 4..at + 8].copy_from_slice(&(len as u32).to_le_bytes());
        self.map[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
        if let Some(dirty) = self.dirty.as_mut() {
            dirty.touch(offset + 4, SLOT_HEADER_BYTES - 4 + len);
        }
        if let Some(replica) = self.replica.as_mut() {
            // Length, checksum and record: one contiguous write, before the state word.
            replica.write(offset + 4, &self.map[at + 4..at + SLOT_HEADER_BYTES + len]);
        }
        self.set_state(offset, LIVE);
        Ok(Slot { offset, class: class as u8 })
    }

    fn new_chunk(&mut self, class: usize) -> Result<u64, BackupError> {
        if self.next_chunk == self.chunk_count {
            return Err(BackupError::Full { chunks: self.chunk_count });
        }
        let chunk = self.next_chunk;
        self.next_chunk += 1;
        let class_at = HEADER_FIXED_BYTES + chunk as usize;
        self.map[class_at] = class as u8 + 1;
        if let Some(dirty) = self.dirty.as_mut() {
            dirty.touch(class_at as u64, 1);
        }
        if let Some(replica) = self.replica.as_mut() {
            replica.write(class_at as u64, &self.map[class_at..class_at + 1]);
        }
        let start = self.chunk_offset(chunk);
        let size = class_bytes(class) as u64;
        let slots = (CHUNK_BYTES / class_bytes(class)) as u64;
        // Lowest offsets are taken first, so the memory touched stays compact.
        self.free[class].extend((1..slots).rev().map(|index| start + index * size));
        Ok(start)
    }

    /// Frees a record's slot (one store of the state word; held back while the region is
    /// copied to remote memory, until [`Backup::apply_deferred_frees`]).
    pub fn free(&mut self, slot: Slot) {
        if let Some(dirty) = self.dirty.as_mut() {
            dirty.defer_free(slot);
            return;
        }
        self.free_slot(slot);
        self.free[slot.class as usize].push(slot.offset);
    }

    fn free_slot(&mut self, slot: Slot) {
        self.set_state(slot.offset, 0);
    }

    /// Tracks the pages changed from now on, for a copy in remote memory; with `all`, every
    /// page in use is dirty at once (a new region: its header, and chunks assigned already).
    pub fn track_dirty(&mut self, all: bool) {
        let mut dirty = dirty::Dirty::new(self.map.len() as u64);
        if all {
            let used = self.header_bytes + self.next_chunk as usize * CHUNK_BYTES;
            dirty.touch(0, used);
        }
        self.dirty = Some(dirty);
    }

    /// Moves the pages changed since the last call into `out` (indexes of 4 KiB pages).
    pub fn take_dirty_pages(&mut self, out: &mut Vec<u64>) {
        if let Some(dirty) = self.dirty.as_mut() {
            dirty.take_pages(out);
        }
    }

    /// Applies the frees held back (their pages become dirty); `scratch` is reused.
    pub fn apply_deferred_frees(&mut self, scratch: &mut Vec<Slot>) {
        let Some(dirty) = self.dirty.as_mut() else { return };
        dirty.take_frees(scratch);
        for slot in scratch.drain(..) {
            self.free_slot(slot);
            self.free[slot.class as usize].push(slot.offset);
        }
    }

    /// Frees are held back for the copy-out's second phase.
    pub fn has_deferred_frees(&self) -> bool {
        self.dirty.as_ref().is_some_and(dirty::Dirty::has_frees)
    }

    /// Nothing changed since the last copy-out.
    pub fn is_clean(&self) -> bool {
        self.dirty.as_ref().is_none_or(dirty::Dirty::is_clean)
    }

    /// Page `index` (4 KiB) of the region's bytes.
    pub fn page_bytes(&self, index: u64) -> &[u8] {
        let start = index as usize * dirty::PAGE_BYTES as usize;
        &self.map[start..start + dirty::PAGE_BYTES as usize]
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The region's size, header included (a standby's region has the same).
    pub fn file_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// Chunks assigned to a class, of all.
    pub fn chunks_used(&self) -> (u32, u32) {
        (self.next_chunk, self.chunk_count)
    }
}

enum SlotContent {
    Free,
    Damaged,
    Invalid,
    Live(ItemRecord),
}

#[cfg(test)]
mod tests;
