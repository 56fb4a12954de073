//! The backup region against its own reopening, damage and hostile files.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::scheme::Scheme;
use crate::space::{Chunk, Extent};

/// A file path in a directory of its own, removed with the directory when dropped.
struct Temporary {
    dir: PathBuf,
    path: PathBuf,
}

impl std::ops::Deref for Temporary {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for Temporary {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temporary(name: &str) -> Temporary {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "remem-kv-backup-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    Temporary { dir, path }
}

fn item(seq: u64, key: &str, pages: Vec<u64>) -> ItemRecord {
    let value_bytes = pages.len() * 4096 + 100;
    ItemRecord {
        seq,
        cas: seq * 10,
        expires_at: 0,
        flags: 3,
        value_bytes,
        value_crc: seq as u32,
        scheme: Scheme::Rep2,
        pinned: false,
        extent: Extent {
            pages,
            tail: Some(Chunk {
                page: 500 + seq,
                class: crate::backup::record::tests::class_of(100),
                slot: 0,
            }),
        },
        key: key.as_bytes().into(),
    }
}

fn sorted(mut records: Vec<(Slot, ItemRecord)>) -> Vec<ItemRecord> {
    records.sort_by_key(|(_, record)| record.seq);
    records.into_iter().map(|(_, record)| record).collect()
}

#[test]
fn records_put_are_found_again_and_freed_ones_are_not() {
    let path = temporary("backup");
    let mut backup = Backup::create(&path, 32 << 20).unwrap();
    let a = item(1, "a", vec![1, 2, 3]);
    let b = item(2, "b", vec![]);
    let big = item(3, &"k".repeat(250), (0..2000).map(|page| page * 2).collect());
    let slot_a = backup.put(&a.view()).unwrap();
    let slot_b = backup.put(&b.view()).unwrap();
    backup.put(&big.view()).unwrap();
    let c = item(4, "c", vec![9]);
    assert_eq!(backup.put(&c.view()).unwrap().class, slot_a.class, "small records share a class");
    backup.free(slot_b);
    drop(backup);
    let (mut reopened, records, report) = Backup::open(&path).unwrap();
    let records = sorted(records);
    assert_eq!(records, vec![a, big, c]);
    assert_eq!(report, ScanReport { live: 3, damaged: 0, invalid: 0 });
    assert!(reopened.next_seq() > 4, "sequence numbers go on after the newest record");
}

#[test]
fn a_damaged_or_torn_slot_is_counted_and_never_returned() {
    let path = temporary("backup");
    let mut backup = Backup::create(&path, 16 << 20).unwrap();
    let slot = backup.put(&item(1, "a", vec![1]).view()).unwrap();
    backup.put(&item(2, "b", vec![2]).view()).unwrap();
    drop(backup);
    // One payload byte changed under a live state word: a write cut short, or damage.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[slot.offset as usize + SLOT_HEADER_BYTES + 3] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (_, records, report) = Backup::open(&path).unwrap();
    assert_eq!(sorted(records).iter().map(|record| record.seq).collect::<Vec<_>>(), vec![2]);
    assert_eq!(report, ScanReport { live: 1, damaged: 1, invalid: 0 });
    // The damaged slot was freed by the scan: a second open finds one record and no damage.
    let (_, records, report) = Backup::open(&path).unwrap();
    assert_eq!((records.len(), report.damaged), (1, 0));
}

#[test]
fn a_checksummed_record_that_does_not_decode_is_invalid() {
    let path = temporary("backup");
    let mut backup = Backup::create(&path, 16 << 20).unwrap();
    let slot = backup.put(&item(1, "a", vec![1]).view()).unwrap();
    drop(backup);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = slot.offset as usize;
    let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    bytes[at + SLOT_HEADER_BYTES + 36] = 200; // an unknown scheme, with a checksum that holds
    let crc = crc32c::crc32c_append(
        crc32c::crc32c(&(len as u32).to_le_bytes()),
        &bytes[at + SLOT_HEADER_BYTES..at + SLOT_HEADER_BYTES + len],
    );
    bytes[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let (_, records, report) = Backup::open(&path).unwrap();
    assert!(records.is_empty());
    assert_eq!(report.invalid, 1);
}

#[test]
fn files_that_are_not_a_backup_region_are_refused() {
    let path = temporary("backup");
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    assert!(matches!(Backup::open(&path), Err(BackupError::Invalid { .. })));
    drop(Backup::create(&path, 16 << 20).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[12] ^= 1; // the chunk count, under the header checksum
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(Backup::open(&path), Err(BackupError::Invalid { .. })));
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, &good[..good.len() - 4096]).unwrap();
    assert!(matches!(Backup::open(&path), Err(BackupError::Invalid { .. })));
    std::fs::write(&path, b"short").unwrap();
    assert!(matches!(Backup::open(&path), Err(BackupError::Invalid { .. })));
}

#[test]
fn a_full_region_says_so() {
    let path = temporary("backup");
    let mut backup = Backup::create(&path, 1).unwrap();
    let (_, chunks) = backup.chunks_used();
    assert_eq!(chunks as usize, CLASS_COUNT);
    let mut stored = 0;
    let error = loop {
        match backup.put(&item(stored + 1, "a", vec![]).view()) {
            Ok(_) => stored += 1,
            Err(error) => break error,
        }
    };
    assert!(matches!(error, BackupError::Full { .. }), "{error}");
    assert_eq!(stored as usize, CLASS_COUNT * (CHUNK_BYTES / 128));
}

/// The standby's side for a test: applies what arrives on `stream` (RPC) or in the ring (log)
/// to the region at `path`, until the stream closes.
fn standby_side(
    mode: wire::Mode,
    (path, chunks): (PathBuf, u32),
    ring_path: PathBuf,
    stream: std::os::unix::net::UnixStream,
    ready: std::sync::mpsc::Sender<()>,
) {
    // As the standby does: a new region of the primary's chunk count (never scanned while
    // the primary stores into it).
    let mut region = Backup::create(&path, chunks as u64 * CHUNK_BYTES as u64).unwrap();
    let mut ring = (mode == wire::Mode::Log).then(|| replica::RingReader::create(&ring_path).unwrap());
    ready.send(()).unwrap();
    let mut stream = stream;
    stream.set_read_timeout(Some(std::time::Duration::from_millis(1))).unwrap();
    let mut reader = wire::FrameReader::default();
    let mut out = Vec::new();
    loop {
        if let Some(ring) = ring.as_mut() {
            ring.drain(|change| region.apply(change)).unwrap();
        }
        match reader.fill(&mut stream) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => continue,
            Err(error) => panic!("{error}"),
        }
        while let Some(frame) = reader.next_frame().unwrap() {
            match wire::decode(frame).unwrap() {
                wire::Message::Write { offset, bytes } => {
                    region.apply(Change::Write { offset, bytes }).unwrap()
                }
                wire::Message::State { offset, state } => {
                    region.apply(Change::State { offset, state }).unwrap()
                }
                wire::Message::Barrier { seq } => {
                    out.clear();
                    wire::encode(&wire::Message::Ack { seq }, &mut out);
                    std::io::Write::write_all(&mut stream, &out).unwrap();
                }
                _ => {}
            }
        }
    }
    if let Some(ring) = ring.as_mut() {
        ring.drain(|change| region.apply(change)).unwrap();
    }
}

#[test]
fn a_standby_region_kept_in_each_mode_equals_the_primary_s() {
    for (mode, policy) in [
        (wire::Mode::OneSided, SyncPolicy::Adaptive),
        (wire::Mode::Rpc, SyncPolicy::Bulk),
        (wire::Mode::Log, SyncPolicy::PerItem),
        (wire::Mode::Log, SyncPolicy::Adaptive),
    ] {
        let path = temporary("primary");
        let standby_path = path.with_file_name("standby");
        let ring_path = path.with_file_name("ring");
        let mut primary = Backup::create(&path, 32 << 20).unwrap();
        let mut slots = Vec::new();
        // Before the standby: a dense class (many small records) and a sparse one.
        for seq in 1..12_000u64 {
            slots.push(primary.put(&item(seq, &format!("k{seq}"), vec![seq]).view()).unwrap());
        }
        for seq in 12_000..12_010u64 {
            primary
                .put(&item(seq, &format!("{seq}{}", "big".repeat(60)), (0..300).collect()).view())
                .unwrap();
        }
        for slot in slots.drain(..1000) {
            primary.free(slot);
        }
        let (here, there) = std::os::unix::net::UnixStream::pair().unwrap();
        let region = (standby_path.clone(), primary.chunks_used().1);
        let ring_for_standby = ring_path.clone();
        let (ready, is_ready) = std::sync::mpsc::channel();
        let standby = std::thread::spawn(move || standby_side(mode, region, ring_for_standby, there, ready));
        is_ready.recv().unwrap();
        let replica = Replica::attach(mode, here, &standby_path, primary.file_bytes(), &ring_path).unwrap();
        primary.attach_replica(replica, policy);
        // Changes while the sync runs, and after.
        let mut steps = 0;
        loop {
            let progress = primary.sync_step(std::time::Duration::from_micros(50)).unwrap();
            let seq = 100_000 + steps;
            slots.push(primary.put(&item(seq, &format!("during{seq}"), vec![seq]).view()).unwrap());
            primary.free(slots.remove(0));
            primary.barrier();
            steps += 1;
            if progress.done {
                assert!(progress.records >= 11_000, "{progress:?}");
                match policy {
                    SyncPolicy::Bulk => assert_eq!(progress.item_chunks, 0, "{progress:?}"),
                    SyncPolicy::PerItem => assert_eq!(progress.bulk_chunks, 0, "{progress:?}"),
                    SyncPolicy::Adaptive => {
                        assert!(progress.bulk_chunks >= 1 && progress.item_chunks >= 1, "{progress:?}")
                    }
                }
                break;
            }
        }
        for seq in 200_000..200_100u64 {
            slots.push(primary.put(&item(seq, &format!("after{seq}"), vec![seq]).view()).unwrap());
            primary.free(slots.remove(0));
        }
        primary.barrier();
        assert!(primary.replica_mut().unwrap().lost.is_none());
        drop(primary.detach_replica());
        standby.join().unwrap();
        drop(primary);
        let (_, expected, primary_report) = Backup::open(&path).unwrap();
        assert_eq!(primary_report.damaged + primary_report.invalid, 0, "{mode:?}: the primary's own region");
        let (_, got, report) = Backup::open(&standby_path).unwrap();
        assert_eq!(report.damaged + report.invalid, 0, "{mode:?}");
        assert_eq!(sorted(got), sorted(expected), "{mode:?} {policy:?} after {steps} sync steps");
    }
}

#[test]
fn a_hostile_log_ring_or_change_is_refused_not_applied() {
    let path = temporary("standby");
    let (mut region, _, _) = {
        drop(Backup::create(&path, 16 << 20).unwrap());
        Backup::open(&path).unwrap()
    };
    let length = region.file_bytes();
    assert!(region.apply(Change::Write { offset: length - 2, bytes: &[1, 2, 3] }).is_err());
    assert!(region.apply(Change::Write { offset: 0, bytes: b"XXXX" }).is_err(), "the magic is the standby's");
    assert!(region.apply(Change::Write { offset: u64::MAX, bytes: b"X" }).is_err());
    assert!(region.apply(Change::State { offset: 8192 + 4, state: LIVE }).is_err());
    assert!(region.apply(Change::State { offset: length, state: LIVE }).is_err());
    let ring_path = path.with_file_name("ring");
    let mut ring = replica::RingReader::create(&ring_path).unwrap();
    // A head far beyond the tail, then an entry with a length that runs off the ring.
    let file = std::fs::OpenOptions::new().write(true).open(&ring_path).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&(1u64 << 40).to_le_bytes(), 0).unwrap();
    assert!(ring.drain(|change| region.apply(change)).is_err());
    file.write_all_at(&64u64.to_le_bytes(), 0).unwrap();
    file.write_all_at(&u32::MAX.to_le_bytes(), 128).unwrap();
    assert!(ring.drain(|change| region.apply(change)).is_err());
}

/// The fence (replica.rs): a standby given up has its files removed before the change or the
/// barrier that gave it up returns, so before any reply acknowledges what its copy lacks. Log:
/// a ring nobody drains; RPC: a standby that never acknowledges.
#[test]
fn a_standby_given_up_has_its_files_removed_before_the_primary_goes_on() {
    for mode in [wire::Mode::Log, wire::Mode::Rpc] {
        let path = temporary("primary");
        let standby_path = path.with_file_name("standby-0000000000000001-backup");
        let ring_path = path.with_file_name("standby-0000000000000001-ring");
        let mut primary = Backup::create(&path, 64 << 20).unwrap();
        drop(Backup::create(&standby_path, 64 << 20).unwrap());
        let _ring = (mode == wire::Mode::Log).then(|| replica::RingReader::create(&ring_path).unwrap());
        // The standby's end stays open and silent: stopped, not dead.
        let (here, _there) = std::os::unix::net::UnixStream::pair().unwrap();
        let replica = Replica::attach(mode, here, &standby_path, primary.file_bytes(), &ring_path).unwrap();
        primary.attach_replica(replica, SyncPolicy::Adaptive);
        // Records of a few KiB each (300 pages apart), so the ring fills in a few hundred.
        let mut seq = 1;
        while primary.replica_mut().unwrap().lost.is_none() {
            assert!(seq < 5_000, "{mode:?}: the standby was never given up");
            let pages = (0..300).map(|page| seq * 1000 + page * 2).collect();
            primary.put(&item(seq, &format!("k{seq}"), pages).view()).unwrap();
            primary.barrier();
            seq += 1;
        }
        assert!(!standby_path.exists(), "{mode:?}: the given-up standby's region is removed");
        assert!(!ring_path.exists(), "{mode:?}: and its ring");
        assert!(path.exists(), "{mode:?}: the primary's own region stays");
    }
}

/// `remem kv --etcd`: the pages a change touched are listed for the copy-out, and a free waits
/// until [`Backup::apply_deferred_frees`], so an update's old record is still live (in the file
/// and in its page) while only the new record's page has been taken.
#[test]
fn tracked_changes_list_their_pages_and_frees_wait_for_the_second_phase() {
    let path = temporary("backup");
    let mut backup = Backup::create(&path, 16 << 20).unwrap();
    backup.track_dirty(true);
    let mut pages = Vec::new();
    backup.take_dirty_pages(&mut pages);
    assert_eq!(pages, vec![0], "a new region's header");
    pages.clear();
    let old = backup.put(&item(1, "a", vec![1]).view()).unwrap();
    backup.take_dirty_pages(&mut pages);
    assert_eq!(pages, vec![0, old.offset / 4096], "the class byte of a new chunk, then the record");
    pages.clear();
    let new = backup.put(&item(2, "a", vec![2]).view()).unwrap();
    backup.free(old);
    backup.take_dirty_pages(&mut pages);
    assert_eq!(pages, vec![new.offset / 4096]);
    assert!(!backup.is_clean(), "the free is held back");
    let state_word = |offset: u64| {
        let bytes = std::fs::read(&*path).unwrap();
        u32::from_ne_bytes(bytes[offset as usize..offset as usize + 4].try_into().unwrap())
    };
    assert_eq!(state_word(old.offset), LIVE, "the old record stands until the new one is copied");
    pages.clear();
    let mut scratch = Vec::new();
    backup.apply_deferred_frees(&mut scratch);
    backup.take_dirty_pages(&mut pages);
    assert_eq!(pages, vec![old.offset / 4096]);
    assert!(backup.is_clean());
    assert_eq!(state_word(old.offset), 0);
    assert_eq!(backup.page_bytes(new.offset / 4096).len(), 4096);
    drop(backup);
    let (_, records, _) = Backup::open(&path).unwrap();
    assert_eq!(sorted(records).iter().map(|record| record.seq).collect::<Vec<_>>(), vec![2]);
}
