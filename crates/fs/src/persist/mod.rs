//! The metadata on local disk, so that a restarted `remem fs` finds its files (docs/FS.md).
//!
//! A state directory holds `lock` (flock: one `remem fs` at a time), `slabmap.json` (where the
//! remem pages live, saved by the caller), `snapshot` (the whole metadata, [`snapshot`]) and
//! `journal` (every metadata change since the snapshot, [`record`]).
//!
//! Fault model: the process may be SIGKILLed at any instruction and the host may crash. Every
//! metadata change is appended to the journal (one `write(2)`) before the reply that makes it
//! visible, so a SIGKILL loses nothing a caller saw; `fdatasync` on fsync, fsyncdir, unmount
//! and every `SYNC_INTERVAL` bounds what a host crash loses. Compaction writes a new snapshot
//! to a temporary file, fsyncs and renames it, fsyncs the directory, and only then empties the
//! journal; records are numbered, so a journal left behind by a crash between the two is
//! recognised (its records are already in the snapshot) and skipped. Everything read back is
//! input: checked before it is used, and an error (never a panic, never served) when it does
//! not hold, except a torn last record, which a crash mid-append leaves and which is dropped
//! and reported.

pub mod codec;
pub mod record;
pub mod remote;
mod replay;
pub mod snapshot;

#[cfg(test)]
mod remote_tests;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use remem_frontend::state_dir::{LockError, LockedDir};

use crate::filesystem::FileSystem;
use crate::namespace::{Creator, FileKind, Namespace};
use crate::store::PageStore;
use record::{decode_journal, JournalError, Record, TornTail};
use remote::RemoteArea;

/// How often the journal is fdatasync'ed (and lazily kept times journaled) when idle.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// A journal larger than this is compacted into a new snapshot.
pub const COMPACT_AT_BYTES: u64 = 8 << 20;

pub use remem_frontend::state_dir::LOCK_FILE;
pub const SLAB_MAP_FILE: &str = "slabmap.json";
/// The remote metadata area's slab map (`--metadata remote` without etcd).
pub const META_MAP_FILE: &str = "metamap.json";
pub const SNAPSHOT_FILE: &str = "snapshot";
pub const JOURNAL_FILE: &str = "journal";
/// How errors name the remote area's snapshot and journal (they have no path).
const REMOTE_SNAPSHOT: &str = "the remote metadata area's snapshot";
const REMOTE_JOURNAL: &str = "the remote metadata area's journal";

/// Why the saved metadata cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("state directory {path} is in use by another remem fs (pid {holder}); stop it first")]
    Locked { path: PathBuf, holder: String },
    #[error("snapshot {path}: {source}")]
    Snapshot { path: PathBuf, source: snapshot::SnapshotError },
    #[error("journal {path}: {source}")]
    Journal { path: PathBuf, source: JournalError },
    #[error("journal {path}: record {seq} at byte {offset} cannot be applied: {reason}")]
    Replay { path: PathBuf, seq: u64, offset: u64, reason: String },
    #[error("the remote metadata area: {0}")]
    Remote(remote::AreaError),
    #[error(
        "journal {path}: record at byte {offset} has number {seq}, {expected} expected (records missing)"
    )]
    Sequence { path: PathBuf, offset: u64, seq: u64, expected: u64 },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> PersistError + '_ {
    move |source| PersistError::Io { path: path.to_owned(), source }
}

/// A state directory, locked for this process for as long as this value lives (the lock is
/// remem-frontend's [`LockedDir`], which `remem kv` takes too).
pub struct StateDir {
    dir: LockedDir,
}

impl StateDir {
    /// Creates (0700) and locks the directory. Errors: I/O, or `Locked` when another process
    /// holds it.
    pub fn open(path: &Path) -> Result<StateDir, PersistError> {
        match LockedDir::open(path) {
            Ok(dir) => Ok(StateDir { dir }),
            Err(LockError::Io { path, source }) => Err(PersistError::Io { path, source }),
            Err(LockError::Locked { path, holder }) => Err(PersistError::Locked { path, holder }),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn slab_map_path(&self) -> PathBuf {
        self.path().join(SLAB_MAP_FILE)
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.path().join(SNAPSHOT_FILE)
    }

    pub fn journal_path(&self) -> PathBuf {
        self.path().join(JOURNAL_FILE)
    }

    /// Whether a snapshot or a journal is here.
    pub fn has_metadata(&self) -> bool {
        self.snapshot_path().exists() || self.journal_path().exists()
    }

    /// Removes the slab maps, the snapshot and the journal (`--fresh`).
    pub fn clear(&self) -> Result<(), PersistError> {
        let meta_map = self.path().join(META_MAP_FILE);
        for path in [self.slab_map_path(), meta_map, self.snapshot_path(), self.journal_path()] {
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(PersistError::Io { path, source: error })
                }
                _ => {}
            }
        }
        sync_directory(self.path())
    }
}

fn sync_directory(path: &Path) -> Result<(), PersistError> {
    File::open(path).and_then(|directory| directory.sync_all()).map_err(io_error(path))
}

/// Writes `bytes` to `path` atomically and durably: temporary file, fsync, rename, fsync of
/// the directory.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let temporary = path.with_extension("tmp");
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(io_error(&temporary))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io_error(&temporary))?;
    std::fs::rename(&temporary, path).map_err(io_error(path))?;
    sync_directory(path.parent().unwrap_or(Path::new(".")))
}

/// Where the journal and the snapshot live.
enum Sink {
    /// The state directory's `journal` and `snapshot` files.
    Local { file: File, path: PathBuf, snapshot_path: PathBuf },
    /// A remem region of its own client ([`remote`]): an append is on the nodes when it returns.
    Remote(Box<RemoteArea>),
}

/// Where [`FileSystem::open_saved`] finds the saved metadata and keeps it from then on.
pub enum Metadata<'a> {
    /// The state directory (the default).
    Local(&'a StateDir),
    /// The remote metadata area (`--metadata remote`, `--etcd`).
    Remote(RemoteArea),
}

/// What [`Journal::append`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Appended {
    Written,
    /// The remote area's half has no room for the records: they are numbered, and the caller
    /// must compact (a snapshot of the metadata, which includes them) before replying.
    NoRoom,
}

/// The journal being appended to.
pub struct Journal {
    sink: Sink,
    bytes: u64,
    next_seq: u64,
    /// Every record up to this number is durable (fdatasynced, or in a synced snapshot).
    synced_seq: u64,
    last_sync: Instant,
    buffer: Vec<u8>,
    /// Remote: records of appends the area's nodes did not take (their requests failed), to be
    /// written before the next ones (so the numbering has no gap).
    unwritten: Vec<u8>,
    /// Set after a failed append: the journal no longer matches memory, so every later
    /// change is refused (EIO) rather than acknowledged and lost at the next restart.
    failed: bool,
    pub compact_at_bytes: u64,
}

/// Remote: how many bytes of records may wait for the area's nodes before the journal gives up.
const MAX_UNWRITTEN_BYTES: usize = 4 << 20;
/// Remote, flushed on sync only: records are written anyway once this many wait.
const LAZY_FLUSH_BYTES: usize = 256 << 10;

impl Journal {
    /// Appends records: to the local file with one `write(2)` (in the page cache, so a SIGKILL
    /// keeps them), or to the remote area's fresh pages (on the nodes when this returns).
    pub fn append(&mut self, records: &[Record]) -> std::io::Result<Appended> {
        if self.failed {
            return Err(std::io::Error::other("an earlier journal append failed"));
        }
        self.buffer.clear();
        for record in records {
            record.encode(self.next_seq, &mut self.buffer);
            self.next_seq += 1;
        }
        let area = match &mut self.sink {
            Sink::Local { file, .. } => {
                if let Err(error) = file.write_all(&self.buffer) {
                    self.failed = true;
                    return Err(error);
                }
                self.bytes += self.buffer.len() as u64;
                return Ok(Appended::Written);
            }
            Sink::Remote(area) => area,
        };
        if self.unwritten.is_empty() {
            // The usual case: the records move over, not copied (both keep their allocations).
            std::mem::swap(&mut self.unwritten, &mut self.buffer);
        } else {
            self.unwritten.extend_from_slice(&self.buffer);
        }
        if !area.has_room_for(self.unwritten.len()) {
            return Ok(Appended::NoRoom);
        }
        if area.flushes_on_sync_only() && self.unwritten.len() < LAZY_FLUSH_BYTES {
            // `--metadata-sync fsync`: on the nodes at the next sync (fsync, the timer, unmount).
            return Ok(Appended::Written);
        }
        self.flush_remote()
    }

    /// Writes the records waiting for the remote area (its caller checked there is room).
    fn flush_remote(&mut self) -> std::io::Result<Appended> {
        let Sink::Remote(area) = &mut self.sink else { return Ok(Appended::Written) };
        if self.unwritten.is_empty() {
            return Ok(Appended::Written);
        }
        if !area.has_room_for(self.unwritten.len()) {
            return Ok(Appended::NoRoom);
        }
        if let Err(error) = area.append(&self.unwritten) {
            // The nodes may come back (a pause, a partition): these records are written before
            // the next ones, up to a bound; the caller's request fails meanwhile.
            if self.unwritten.len() > MAX_UNWRITTEN_BYTES {
                self.failed = true;
            }
            return Err(std::io::Error::other(error.to_string()));
        }
        self.bytes += self.unwritten.len() as u64;
        self.unwritten.clear();
        self.synced_seq = self.next_seq - 1;
        Ok(Appended::Written)
    }

    /// Whether records wait for the remote area and do not fit in its half any more.
    fn needs_compaction_to_sync(&self) -> bool {
        match &self.sink {
            Sink::Local { .. } => false,
            Sink::Remote(area) => !self.unwritten.is_empty() && !area.has_room_for(self.unwritten.len()),
        }
    }

    /// Marks the journal failed (an append that could not be compacted in its place).
    pub(crate) fn fail(&mut self) {
        self.failed = true;
    }

    /// fdatasync if anything was appended since the last one.
    pub fn sync(&mut self) -> std::io::Result<()> {
        if let Some((file, seq)) = self.start_sync()? {
            file.sync_data()?;
            self.synced(seq);
        }
        Ok(())
    }

    /// [`Journal::sync`] without the flush itself: if a record is not known durable, the
    /// journal's file to fdatasync (another descriptor of it) and the last record's number,
    /// for [`Journal::synced`] once the flush succeeded. Two such flushes may overlap; each
    /// caller waits for its own, so none returns before its records are durable. A remote
    /// journal is durable at every append: never anything to flush.
    fn start_sync(&mut self) -> std::io::Result<Option<(File, u64)>> {
        self.last_sync = Instant::now();
        let last_seq = self.last_seq();
        if last_seq <= self.synced_seq {
            return Ok(None);
        }
        match &self.sink {
            Sink::Local { file, .. } => Ok(Some((file.try_clone()?, last_seq))),
            // Records not written yet (an append the nodes did not take, or waiting for a sync
            // with `--metadata-sync fsync`): written now.
            Sink::Remote(_) => match self.flush_remote()? {
                Appended::Written => Ok(None),
                Appended::NoRoom => Err(std::io::Error::other("the remote journal needs a compaction first")),
            },
        }
    }

    /// Records up to `seq` are durable.
    fn synced(&mut self, seq: u64) {
        self.synced_seq = self.synced_seq.max(seq);
    }

    pub fn sync_due(&self) -> bool {
        self.last_seq() > self.synced_seq && self.last_sync.elapsed() >= SYNC_INTERVAL
    }

    pub fn wants_compaction(&self) -> bool {
        let large = match &self.sink {
            Sink::Local { .. } => self.bytes >= self.compact_at_bytes,
            Sink::Remote(area) => self.bytes >= self.compact_at_bytes || area.half_used(),
        };
        large && !self.failed
    }

    /// The number of the last record appended (0: none ever).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the journal and snapshot are in remote memory.
    pub fn is_remote(&self) -> bool {
        matches!(self.sink, Sink::Remote(_))
    }

    /// The remote area's generation (0 for a local journal).
    pub fn generation(&self) -> u64 {
        match &self.sink {
            Sink::Local { .. } => 0,
            Sink::Remote(area) => area.generation(),
        }
    }

    /// Replaces the snapshot with `snapshot_bytes` (which must include every record appended
    /// so far), then empties the journal.
    pub fn compact(&mut self, snapshot_bytes: &[u8]) -> Result<(), PersistError> {
        match &mut self.sink {
            Sink::Local { file, path, snapshot_path } => {
                write_durably(snapshot_path, snapshot_bytes)?;
                file.set_len(0).and_then(|()| file.sync_all()).map_err(io_error(path))?;
            }
            Sink::Remote(area) => area.replace(snapshot_bytes).map_err(PersistError::Remote)?,
        }
        self.unwritten.clear();
        self.bytes = 0;
        self.synced_seq = self.last_seq();
        Ok(())
    }

    /// Background work of the remote area's client.
    fn background(&mut self) {
        if let Sink::Remote(area) = &mut self.sink {
            area.background();
        }
    }
}

/// What opening the saved metadata found.
#[derive(Debug)]
pub struct OpenReport {
    /// Whether saved metadata was found (else the file system is new).
    pub found_saved: bool,
    /// Inodes other than the root.
    pub files: u64,
    pub records_replayed: u64,
    pub torn_tail: Option<TornTail>,
    /// Files that had no name left and were open when the previous process stopped: freed.
    pub orphans_freed: u64,
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, PersistError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(PersistError::Io { path: path.to_owned(), source: error }),
    }
}

impl<S: PageStore> FileSystem<S> {
    /// Opens the file system saved in `metadata` over `store` (whose slab map the caller
    /// reopened), or an empty one owned by `owner` when nothing is saved. The state is replayed,
    /// files that were open but unlinked are freed, every page no file holds is discarded (reads
    /// as zeros), and a new snapshot is written with the journal emptied.
    pub fn open_saved(
        store: S,
        owner: Creator,
        metadata: Metadata<'_>,
    ) -> Result<(FileSystem<S>, OpenReport), PersistError> {
        let mut fs = FileSystem::new(store, owner);
        let (snapshot, journal, sink) = match metadata {
            Metadata::Local(state) => {
                let (snapshot_path, journal_path) = (state.snapshot_path(), state.journal_path());
                let snapshot = read_optional(&snapshot_path)?;
                let journal = read_optional(&journal_path)?;
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(&journal_path)
                    .map_err(io_error(&journal_path))?;
                (snapshot, journal, Sink::Local { file, path: journal_path, snapshot_path })
            }
            Metadata::Remote(mut area) => {
                let loaded = area.load().map_err(PersistError::Remote)?;
                if let Some(page) = loaded.torn_page {
                    tracing::warn!(
                        generation = loaded.generation,
                        page,
                        "the remote journal ended at a torn page, left by a crash mid-append"
                    );
                }
                (loaded.snapshot, Some(loaded.journal), Sink::Remote(Box::new(area)))
            }
        };
        let (snapshot_path, journal_path) = match &sink {
            Sink::Local { path, snapshot_path, .. } => (snapshot_path.clone(), path.clone()),
            Sink::Remote(_) => (PathBuf::from(REMOTE_SNAPSHOT), PathBuf::from(REMOTE_JOURNAL)),
        };
        let found_saved = snapshot.is_some() || journal.as_ref().is_some_and(|journal| !journal.is_empty());
        let mut last_seq = 0;
        if let Some(bytes) = snapshot {
            let restored = snapshot::decode(&bytes, fs.page_bytes, fs.store.page_count())
                .map_err(|source| PersistError::Snapshot { path: snapshot_path, source })?;
            fs.namespace = restored.namespace;
            fs.allocator = restored.allocator;
            fs.unwritten = restored.unwritten;
            last_seq = restored.last_seq;
        }
        let mut report =
            OpenReport { found_saved, files: 0, records_replayed: 0, torn_tail: None, orphans_freed: 0 };
        if let Some(bytes) = journal {
            last_seq = fs.replay_journal(&bytes, &journal_path, last_seq, &mut report)?;
        }
        for orphan in fs.namespace.take_orphans() {
            report.orphans_freed += 1;
            fs.drop_inode_pages(orphan);
        }
        // A restarted client knows no page's version: pages no file holds, and pages mapped
        // but never written, must read as zeros, not as what they held before.
        let runs: Vec<(u64, u64)> = fs.allocator.free_runs().chain(fs.unwritten.runs()).collect();
        for (start, len) in runs {
            for page in start..start + len {
                // Only fails for a page outside the address space, which the snapshot checks.
                let _ = fs.store.discard_page(page);
            }
        }
        report.files = fs.namespace.inode_count() - 1;
        let mut journal = Journal {
            sink,
            bytes: 0,
            next_seq: last_seq + 1,
            synced_seq: last_seq,
            last_sync: Instant::now(),
            buffer: Vec::new(),
            unwritten: Vec::new(),
            failed: false,
            compact_at_bytes: COMPACT_AT_BYTES,
        };
        journal.compact(&fs.snapshot_bytes(last_seq))?;
        fs.journal = Some(journal);
        Ok((fs, report))
    }

    /// Applies the journal's records after the snapshot's (`last_seq`); the last applied.
    fn replay_journal(
        &mut self,
        bytes: &[u8],
        journal_path: &Path,
        mut last_seq: u64,
        report: &mut OpenReport,
    ) -> Result<u64, PersistError> {
        let scan = decode_journal(bytes)
            .map_err(|source| PersistError::Journal { path: journal_path.to_owned(), source })?;
        self.namespace.keep_orphans = true;
        let mut expected = None;
        for (offset, seq, record) in &scan.records {
            let (offset, seq) = (*offset, *seq);
            let path = || journal_path.to_owned();
            if expected.is_some_and(|expected| seq != expected) {
                let expected = expected.unwrap_or_default();
                return Err(PersistError::Sequence { path: path(), offset, seq, expected });
            }
            expected = Some(seq + 1);
            if seq <= last_seq {
                continue; // Already in the snapshot (a crash between snapshot and truncate).
            }
            if seq != last_seq + 1 {
                return Err(PersistError::Sequence { path: path(), offset, seq, expected: last_seq + 1 });
            }
            self.apply(record).map_err(|reason| PersistError::Replay {
                path: path(),
                seq,
                offset,
                reason,
            })?;
            last_seq = seq;
            report.records_replayed += 1;
        }
        self.namespace.keep_orphans = false;
        report.torn_tail = scan.torn_tail;
        Ok(last_seq)
    }

    /// The snapshot of the current metadata, including journal records up to `last_seq`.
    pub(crate) fn snapshot_bytes(&self, last_seq: u64) -> Vec<u8> {
        snapshot::encode(last_seq, self.page_bytes, &self.namespace, &self.allocator, &self.unwritten)
    }

    /// Journals lazily kept times and fdatasyncs the journal (fsync, fsyncdir, unmount).
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.flush_times().map_err(|error| std::io::Error::other(error.to_string()))?;
        if self.journal.as_ref().is_some_and(Journal::needs_compaction_to_sync) {
            self.compact().map_err(|error| std::io::Error::other(error.to_string()))?;
        }
        match &mut self.journal {
            Some(journal) => journal.sync(),
            None => Ok(()),
        }
    }

    /// [`FileSystem::sync`] in two halves, so that the disk's flush runs without the file
    /// system's lock (other requests go on meanwhile): journals lazily kept times and returns
    /// the journal's file to fdatasync and the number of its last record, if a record is not
    /// yet durable. Once the file's fdatasync returns, every record appended before this call
    /// is durable: tell [`FileSystem::synced`] (a failed flush tells nothing, and the next
    /// sync flushes again).
    ///
    /// `with_times` journals the lazily kept mtimes first (fsync); without it (fdatasync) only
    /// what reading the data needs is made durable: sizes and page maps are journaled before
    /// every reply anyway, so an fdatasync after overwrites alone flushes nothing.
    pub fn start_sync(&mut self, with_times: bool) -> std::io::Result<Option<(File, u64)>> {
        if with_times {
            self.flush_times().map_err(|error| std::io::Error::other(error.to_string()))?;
        }
        if self.journal.as_ref().is_some_and(Journal::needs_compaction_to_sync) {
            // The records waiting for the remote area do not fit its half: a snapshot has them.
            self.compact().map_err(|error| std::io::Error::other(error.to_string()))?;
        }
        match &mut self.journal {
            Some(journal) => journal.start_sync(),
            None => Ok(None),
        }
    }

    /// The journal's records up to `seq` are durable (see [`FileSystem::start_sync`]).
    pub fn synced(&mut self, seq: u64) {
        if let Some(journal) = &mut self.journal {
            journal.synced(seq);
        }
    }

    /// Periodic work between requests: compact when the journal is large, and sync when due.
    /// When a sync is due, the journal's file to fdatasync without the lock and its last
    /// record's number (as [`FileSystem::start_sync`]: tell [`FileSystem::synced`] after).
    pub fn maintain(&mut self) -> Option<(File, u64)> {
        let journal = self.journal.as_mut()?;
        journal.background();
        let due = journal.sync_due()
            || (!self.dirty_times.is_empty() && journal.last_sync.elapsed() >= SYNC_INTERVAL);
        let pending = if due {
            self.start_sync(true).unwrap_or_else(|error| {
                tracing::warn!(%error, "cannot sync the metadata journal");
                None
            })
        } else {
            None
        };
        if self.journal.as_ref().is_some_and(Journal::wants_compaction) {
            if let Err(error) = self.compact() {
                tracing::warn!(%error, "cannot compact the metadata journal; will retry");
            }
        }
        pending
    }

    /// Writes a new snapshot and empties the journal.
    pub fn compact(&mut self) -> Result<(), PersistError> {
        let Some(mut journal) = self.journal.take() else { return Ok(()) };
        let result = journal.compact(&self.snapshot_bytes(journal.last_seq()));
        if result.is_ok() {
            self.dirty_times.clear();
        }
        self.journal = Some(journal);
        result
    }

    /// The journal, if this file system has one (tests and reports).
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// Files (inodes other than the root) by kind: (files and special files, directories,
    /// symlinks).
    pub fn count_by_kind(&self) -> (u64, u64, u64) {
        count_by_kind(&self.namespace)
    }
}

fn count_by_kind(namespace: &Namespace) -> (u64, u64, u64) {
    let mut counts = (0, 0, 0);
    for (_, inode) in namespace.iter() {
        match inode.attributes.kind {
            FileKind::File
            | FileKind::Fifo
            | FileKind::CharDevice
            | FileKind::BlockDevice
            | FileKind::Socket => counts.0 += 1,
            FileKind::Directory => counts.1 += 1,
            FileKind::Symlink => counts.2 += 1,
        }
    }
    counts.1 -= 1; // the root
    counts
}
