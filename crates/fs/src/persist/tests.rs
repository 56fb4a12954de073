//! The journal and snapshot decoders against arbitrary and damaged input, and the whole
//! persistence against its model: a file system reopened from its state directory has exactly
//! the metadata (compared as canonical snapshot bytes) and the bytes of the live one.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::record::{decode_journal, JournalError, Record, Run, FRAME_HEADER_BYTES};
use super::{snapshot, Metadata, StateDir};
use crate::filesystem::{FileSystem, SetAttributes};
use crate::namespace::{Creator, FileKind, ROOT_INODE};
use crate::store::MemoryStore;

pub(super) const ME: Creator = Creator { uid: 1000, gid: 1000, mode: 0o644 };

/// A state directory path of its own, removed when dropped (also when a test fails).
struct TemporaryState(PathBuf);

impl std::ops::Deref for TemporaryState {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TemporaryState {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TemporaryState {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temporary_state() -> TemporaryState {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "remem-fs-unit-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&path);
    TemporaryState(path)
}

pub(super) fn store(pages: u64) -> MemoryStore {
    MemoryStore::new(4096, pages)
}

fn sample_records() -> Vec<Record> {
    let time = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123);
    vec![
        Record::Create {
            parent: 1,
            name: "a".into(),
            inode: 2,
            kind: FileKind::File,
            mode: 0o644,
            uid: 1,
            gid: 2,
            time,
            target: None,
            rdev: 0,
        },
        Record::Allocate {
            inode: 2,
            runs: vec![Run { file_page: 0, remote: 0, len: 3 }],
            size_bytes: 0,
            time: None,
        },
        Record::Write { inode: 2, size_bytes: 9000, time, first_page: 0, end_page: 3 },
        Record::Create {
            parent: 1,
            name: "l".into(),
            inode: 3,
            kind: FileKind::Symlink,
            mode: 0o777,
            uid: 1,
            gid: 2,
            time: SystemTime::UNIX_EPOCH - Duration::new(5, 1),
            target: Some("a".into()),
            rdev: 0,
        },
        Record::Create {
            parent: 1,
            name: "tty".into(),
            inode: 4,
            kind: FileKind::CharDevice,
            mode: 0o620,
            uid: 0,
            gid: 5,
            time,
            target: None,
            rdev: 0x8801,
        },
        Record::Rename {
            parent: 1,
            name: "a".into(),
            new_parent: 1,
            new_name: "b".into(),
            no_replace: false,
            exchange: false,
            time,
        },
    ]
}

fn encoded(records: &[Record]) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = Vec::new();
    let mut ends = Vec::new();
    for (index, record) in records.iter().enumerate() {
        record.encode(index as u64 + 1, &mut bytes);
        ends.push(bytes.len());
    }
    (bytes, ends)
}

#[test]
fn records_round_trip_times_before_the_epoch_included() {
    let records = sample_records();
    let (bytes, _) = encoded(&records);
    let scan = decode_journal(&bytes).expect("decodes");
    assert!(scan.torn_tail.is_none());
    let decoded: Vec<Record> = scan.records.into_iter().map(|(_, _, record)| record).collect();
    assert_eq!(decoded, records);
}

#[test]
fn a_journal_cut_anywhere_recovers_every_whole_record_before_the_cut() {
    let records = sample_records();
    let (bytes, ends) = encoded(&records);
    for cut in 0..bytes.len() {
        let scan = decode_journal(&bytes[..cut]).expect("a cut is a torn tail, not corruption");
        let whole = ends.iter().filter(|&&end| end <= cut).count();
        assert_eq!(scan.records.len(), whole, "cut at {cut}");
        assert_eq!(scan.valid_bytes as usize, if whole == 0 { 0 } else { ends[whole - 1] });
        assert_eq!(scan.torn_tail.is_some(), cut != scan.valid_bytes as usize);
    }
}

#[test]
fn a_flipped_byte_before_the_last_record_is_corruption() {
    let records = sample_records();
    let (bytes, ends) = encoded(&records);
    let last_start = ends[ends.len() - 2];
    for position in 0..last_start {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x40;
        match decode_journal(&damaged) {
            Err(JournalError::CorruptMiddle { .. }) => {}
            other => panic!("flip at {position}: {other:?}"),
        }
    }
    // In the last record it cannot be told from a torn append: dropped and reported.
    let mut damaged = bytes.clone();
    damaged[last_start + FRAME_HEADER_BYTES + 3] ^= 1;
    let scan = decode_journal(&damaged).expect("torn tail");
    assert_eq!(scan.records.len(), records.len() - 1);
    assert!(scan.torn_tail.is_some());
}

#[test]
fn a_valid_checksum_over_an_undecodable_payload_is_an_error() {
    let payload = [1u8, 0, 0, 0, 0, 0, 0, 0, 99];
    let len = (payload.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &payload);
    let mut bytes = len.to_vec();
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes.extend_from_slice(&payload);
    assert!(matches!(decode_journal(&bytes), Err(JournalError::Undecodable { .. })));
}

proptest! {
    /// Any bytes: a result or an error, never a panic, and never records past the input.
    #[test]
    fn the_journal_decoder_is_total(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        if let Ok(scan) = decode_journal(&bytes) {
            prop_assert!(scan.valid_bytes as usize <= bytes.len());
        }
    }

    /// Frames with valid checksums around arbitrary payloads (the decoder past the checksum).
    #[test]
    fn record_payloads_decode_totally(payload in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = Record::decode_payload(&payload);
    }

    /// Any bytes, and a valid snapshot with any one byte changed, are refused or decoded,
    /// never a panic.
    #[test]
    fn the_snapshot_decoder_is_total(bytes in prop::collection::vec(any::<u8>(), 0..2048), flip in any::<usize>()) {
        let _ = snapshot::decode(&bytes, 4096, 64);
        let mut fs = FileSystem::new(store(64), ME);
        let inode = fs.create_file(ROOT_INODE, OsStr::new("f"), ME).expect("create").inode;
        fs.write(inode, 5000, b"hello").expect("write");
        let mut valid = fs.snapshot_bytes(7);
        prop_assert!(snapshot::decode(&valid, 4096, 64).is_ok());
        let index = flip % valid.len();
        valid[index] ^= 0x10;
        prop_assert!(snapshot::decode(&valid, 4096, 64).is_err(), "a damaged snapshot is refused");
    }
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    Create(u8),
    Mkdir(u8),
    Write {
        file: u8,
        offset: u64,
        len: usize,
    },
    Truncate {
        file: u8,
        size: u64,
    },
    Punch {
        file: u8,
        offset: u64,
        len: u64,
    },
    Fallocate {
        file: u8,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
    Unlink(u8),
    Rename(u8, u8),
    Link(u8, u8),
    Symlink(u8),
    Chmod(u8),
    OpenUnlinkWrite(u8),
    /// A FIFO, device or socket (the kind chosen by the second number).
    Mknod(u8, u8),
    /// The kernel holds the node while its name goes (unlink or rmdir) and a snapshot is
    /// taken, then forgets it: orphans of every kind in snapshot and journal.
    HeldRemove(u8),
    /// A set-group-ID directory and a node created in it.
    SetGroupIdDirectory(u8),
    Sync,
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    const SPAN: u64 = 40 * 4096;
    prop_oneof![
        3 => (0u8..6).prop_map(Op::Create),
        1 => (0u8..3).prop_map(Op::Mkdir),
        6 => (0u8..6, 0..SPAN, 1usize..20_000).prop_map(|(file, offset, len)| Op::Write { file, offset, len }),
        1 => (0u8..6, 0..SPAN).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (0u8..6, 0..SPAN, 1..8 * 4096u64).prop_map(|(file, offset, len)| Op::Punch { file, offset, len }),
        1 => (0u8..6, 0..SPAN, 1..8 * 4096u64, any::<bool>())
            .prop_map(|(file, offset, len, keep_size)| Op::Fallocate { file, offset, len, keep_size }),
        1 => (0u8..6).prop_map(Op::Unlink),
        1 => (0u8..6, 0u8..6).prop_map(|(from, to)| Op::Rename(from, to)),
        1 => (0u8..6, 0u8..6).prop_map(|(from, to)| Op::Link(from, to)),
        1 => (0u8..6).prop_map(Op::Symlink),
        1 => (0u8..6).prop_map(Op::Chmod),
        1 => (0u8..6).prop_map(Op::OpenUnlinkWrite),
        1 => (0u8..6, 0u8..4).prop_map(|(index, kind)| Op::Mknod(index, kind)),
        1 => (0u8..6).prop_map(Op::HeldRemove),
        1 => (0u8..3).prop_map(Op::SetGroupIdDirectory),
        1 => Just(Op::Sync),
    ]
}

fn name(index: u8) -> String {
    format!("n{index}")
}

/// Runs `ops` (errors are part of the run: they must be journaled as faithfully as successes).
pub(super) fn run_ops(fs: &mut FileSystem<MemoryStore>, ops: &[Op]) {
    let lookup = |fs: &FileSystem<MemoryStore>, index: u8| fs.lookup(ROOT_INODE, OsStr::new(&name(index)));
    for op in ops {
        match op {
            Op::Create(index) => drop(fs.create_file(ROOT_INODE, OsStr::new(&name(*index)), ME)),
            Op::Mkdir(index) => drop(fs.mkdir(ROOT_INODE, OsStr::new(&name(*index)), ME)),
            Op::Write { file, offset, len } => {
                if let Ok(attributes) = lookup(fs, *file) {
                    let data: Vec<u8> = (0..*len).map(|index| (index as u8) ^ *file | 1).collect();
                    let _ = fs.write(attributes.inode, *offset, &data);
                }
            }
            Op::Truncate { file, size } => {
                if let Ok(attributes) = lookup(fs, *file) {
                    let _ = fs.truncate(attributes.inode, *size);
                }
            }
            Op::Punch { file, offset, len } => {
                if let Ok(attributes) = lookup(fs, *file) {
                    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                    let _ = fs.fallocate(attributes.inode, *offset, *len, mode);
                }
            }
            Op::Fallocate { file, offset, len, keep_size } => {
                if let Ok(attributes) = lookup(fs, *file) {
                    let mode = if *keep_size { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
                    let _ = fs.fallocate(attributes.inode, *offset, *len, mode);
                }
            }
            Op::Unlink(index) => drop(fs.unlink(ROOT_INODE, OsStr::new(&name(*index)))),
            Op::Rename(from, to) => drop(fs.rename(
                ROOT_INODE,
                OsStr::new(&name(*from)),
                ROOT_INODE,
                OsStr::new(&name(*to)),
                false,
                false,
            )),
            Op::Link(from, to) => {
                if let Ok(attributes) = lookup(fs, *from) {
                    let _ = fs.link(attributes.inode, ROOT_INODE, OsStr::new(&name(*to)));
                }
            }
            Op::Symlink(index) => {
                drop(fs.symlink(ROOT_INODE, OsStr::new(&name(*index)), OsStr::new("target"), ME))
            }
            Op::Chmod(index) => {
                if let Ok(attributes) = lookup(fs, *index) {
                    let changes = SetAttributes { mode: Some(0o600), ..SetAttributes::default() };
                    let _ = fs.setattr(attributes.inode, changes);
                }
            }
            Op::OpenUnlinkWrite(index) => {
                if let Ok(attributes) = lookup(fs, *index) {
                    if attributes.kind == FileKind::File && fs.open(attributes.inode).is_ok() {
                        let _ = fs.unlink(ROOT_INODE, OsStr::new(&name(*index)));
                        let _ = fs.write(attributes.inode, 100, b"still open");
                        let _ = fs.release(attributes.inode);
                    }
                }
            }
            Op::Mknod(index, kind) => {
                let kinds = [FileKind::Fifo, FileKind::CharDevice, FileKind::BlockDevice, FileKind::Socket];
                let rdev = 0x0800 + u32::from(*index);
                let _ = fs.mknod(ROOT_INODE, OsStr::new(&name(*index)), ME, kinds[usize::from(*kind)], rdev);
            }
            Op::HeldRemove(index) => held_remove(fs, *index),
            Op::SetGroupIdDirectory(index) => {
                let creator = Creator { mode: 0o2775, ..ME };
                if let Ok(directory) = fs.mkdir(ROOT_INODE, OsStr::new(&name(*index)), creator) {
                    let changes = SetAttributes { gid: Some(77), ..SetAttributes::default() };
                    let _ = fs.setattr(directory.inode, changes);
                    let _ = fs.mkdir(directory.inode, OsStr::new("sub"), ME);
                }
            }
            Op::Sync => fs.sync().expect("sync"),
        }
    }
}

/// Removes the name of a node the kernel holds, compacts (the snapshot has an orphan), forgets.
fn held_remove(fs: &mut FileSystem<MemoryStore>, index: u8) {
    let Ok(attributes) = fs.lookup(ROOT_INODE, OsStr::new(&name(index))) else { return };
    fs.remember(attributes.inode).expect("remember");
    let removed = if attributes.kind == FileKind::Directory {
        fs.rmdir(ROOT_INODE, OsStr::new(&name(index)))
    } else {
        fs.unlink(ROOT_INODE, OsStr::new(&name(index)))
    };
    if removed.is_ok() && fs.journal.is_some() {
        fs.compact().expect("compact with an orphan");
    }
    fs.forget(attributes.inode, 1).expect("forget");
}

/// Every regular file's inode number and bytes.
pub(super) fn file_contents(fs: &mut FileSystem<MemoryStore>) -> Vec<(u64, Vec<u8>)> {
    let sizes: Vec<(u64, u64)> = fs
        .namespace
        .iter()
        .filter(|(_, inode)| inode.attributes.kind == FileKind::File)
        .map(|(number, inode)| (number, inode.attributes.size_bytes))
        .collect();
    sizes
        .into_iter()
        .map(|(number, size)| (number, fs.read(number, 0, size as usize).expect("read").to_vec()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The reopened file system has the live one's metadata exactly, and every file reads the
    /// same bytes (the page store survives, as remem does; only the process restarts). Half
    /// the runs compact after every operation, so snapshot + journal is exercised too.
    #[test]
    fn a_reopened_file_system_equals_the_live_one(ops in prop::collection::vec(op(), 1..50), compact_often in any::<bool>()) {
        let path = temporary_state();
        let state = StateDir::open(&path).expect("state directory");
        let (mut live, _) = FileSystem::open_saved(store(96), ME, Metadata::Local(&state)).expect("open empty");
        if compact_often {
            live.journal.as_mut().expect("journal").compact_at_bytes = 1;
        }
        for op in &ops {
            run_ops(&mut live, std::slice::from_ref(op));
            live.maintain();
        }
        live.sync().expect("sync");
        let expected = live.snapshot_bytes(0);
        let files = file_contents(&mut live);
        let pages = std::mem::take(&mut live.store.pages);
        drop(live);
        drop(state);
        let state = StateDir::open(&path).expect("state directory again");
        let mut reopened_store = store(96);
        reopened_store.pages = pages;
        let (mut reopened, report) = FileSystem::open_saved(reopened_store, ME, Metadata::Local(&state)).expect("reopen");
        prop_assert!(report.torn_tail.is_none());
        prop_assert_eq!(reopened.snapshot_bytes(0), expected, "metadata differs after reopening");
        for (number, bytes) in files {
            let size = bytes.len();
            prop_assert_eq!(reopened.read(number, 0, size).expect("read").to_vec(), bytes, "inode {}", number);
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// A record payload as the code before special files wrote a `Create` (tag 1, no device).
fn version_1_create(seq: u64, name: &str, inode: u64, kind: u8) -> Vec<u8> {
    let mut payload = seq.to_le_bytes().to_vec();
    payload.push(1);
    payload.extend_from_slice(&ROOT_INODE.to_le_bytes());
    payload.extend_from_slice(&(name.len() as u16).to_le_bytes());
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(&inode.to_le_bytes());
    payload.push(kind);
    payload.extend_from_slice(&0o640u16.to_le_bytes());
    payload.extend_from_slice(&7u32.to_le_bytes());
    payload.extend_from_slice(&8u32.to_le_bytes());
    payload.extend_from_slice(&1_700_000_000i64.to_le_bytes());
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.push(0);
    let len = (payload.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &payload);
    let mut frame = len.to_vec();
    frame.extend_from_slice(&crc.to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

#[test]
fn state_written_before_special_files_existed_still_opens() {
    let path = temporary_state();
    let state = StateDir::open(&path).expect("state");
    let (mut fs, _) = FileSystem::open_saved(store(8), ME, Metadata::Local(&state)).expect("open empty");
    fs.create_file(ROOT_INODE, OsStr::new("before"), ME).expect("create");
    let mut snapshot = fs.snapshot_bytes(0);
    drop((fs, state));
    // Version 1 snapshot: the same encoding under the old magic.
    snapshot[..8].copy_from_slice(b"REMEMFS\x01");
    std::fs::write(path.join("snapshot"), &snapshot).expect("write snapshot");
    std::fs::write(path.join("journal"), version_1_create(1, "old", 3, 1)).expect("write journal");
    let state = StateDir::open(&path).expect("state");
    let (fs, report) =
        FileSystem::open_saved(store(8), ME, Metadata::Local(&state)).expect("a version 1 state opens");
    assert_eq!((report.files, report.records_replayed), (2, 1));
    let old = fs.lookup(ROOT_INODE, OsStr::new("old")).expect("replayed");
    assert_eq!((old.kind, old.mode, old.uid, old.gid, old.rdev), (FileKind::File, 0o640, 7, 8, 0));
    assert!(fs.lookup(ROOT_INODE, OsStr::new("before")).is_ok());
    let _ = std::fs::remove_dir_all(&path);
}

#[test]
fn a_special_kind_under_the_old_create_tag_is_refused() {
    // Kind 4 (a FIFO) only comes with its device number, under tag 13.
    let bytes = version_1_create(1, "fifo", 2, 4);
    match decode_journal(&bytes) {
        Err(JournalError::Undecodable { error, .. }) => {
            assert!(error.to_string().contains("Fifo"), "{error}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_opener_of_a_state_directory_is_refused() {
    let path = temporary_state();
    let first = StateDir::open(&path).expect("first");
    let error = StateDir::open(&path).err().expect("second is refused");
    assert!(error.to_string().contains("in use"), "{error}");
    drop(first);
    StateDir::open(&path).expect("free again");
    let _ = std::fs::remove_dir_all(&path);
}

#[test]
fn fallocated_pages_read_as_zeros_after_a_restart_even_if_they_held_old_bytes() {
    let path = temporary_state();
    let state = StateDir::open(&path).expect("state");
    let (mut fs, _) = FileSystem::open_saved(store(8), ME, Metadata::Local(&state)).expect("open");
    let old = fs.create_file(ROOT_INODE, OsStr::new("old"), ME).expect("old").inode;
    fs.write(old, 0, &[0xAB; 8 * 4096]).expect("fill every page");
    fs.unlink(ROOT_INODE, OsStr::new("old")).expect("unlink");
    let new = fs.create_file(ROOT_INODE, OsStr::new("new"), ME).expect("new").inode;
    fs.fallocate(new, 0, 4 * 4096, 0).expect("fallocate");
    fs.write(new, 0, b"written").expect("write page 0");
    let mut pages = std::mem::take(&mut fs.store.pages);
    drop((fs, state));
    // Remem still holds the old file's bytes in the freed pages (a discard is the client's
    // own bookkeeping): simulate that by putting them back.
    for page in 0..8 {
        pages.entry(page).or_insert_with(|| vec![0xAB; 4096]);
    }
    let state = StateDir::open(&path).expect("state");
    let mut reopened_store = store(8);
    reopened_store.pages = pages;
    let (mut fs, report) =
        FileSystem::open_saved(reopened_store, ME, Metadata::Local(&state)).expect("reopen");
    assert_eq!(report.files, 1);
    let bytes = fs.read(new, 0, 4 * 4096).expect("read").to_vec();
    assert_eq!(&bytes[..7], b"written");
    assert!(bytes[7..].iter().all(|&byte| byte == 0), "no old byte shows through");
    let _ = std::fs::remove_dir_all(&path);
}

#[test]
fn a_sync_started_before_another_finished_still_flushes_its_own_records() {
    let path = temporary_state();
    let state = StateDir::open(&path).expect("state directory");
    let (mut fs, _) = FileSystem::open_saved(store(8), ME, Metadata::Local(&state)).expect("open empty");
    assert!(fs.start_sync(true).expect("nothing to sync").is_none(), "a fresh journal is durable");
    fs.create_file(ROOT_INODE, OsStr::new("a"), ME).expect("create a");
    let (_, first) = fs.start_sync(true).expect("start").expect("the create is not yet durable");
    // A second fsync while the first one's flush runs: its create is not covered by the first.
    fs.create_file(ROOT_INODE, OsStr::new("b"), ME).expect("create b");
    let (journal, second) = fs.start_sync(true).expect("start").expect("b is not durable either");
    assert!(second > first, "the second flush covers a later record ({second} > {first})");
    // The first flush finishing does not make the second's records durable.
    fs.synced(first);
    assert!(fs.start_sync(true).expect("start").is_some(), "b is still to be flushed after the first sync");
    journal.sync_data().expect("fdatasync");
    fs.synced(second);
    assert!(fs.start_sync(true).expect("start").is_none(), "everything is durable after the second sync");
}
