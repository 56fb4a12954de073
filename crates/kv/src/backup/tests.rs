//! The backup region against its own reopening, damage and hostile files.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::scheme::Scheme;
use crate::space::{Chunk, Extent};

fn temporary(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "remem-kv-backup-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
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
        extent: Extent { pages, tail: Some(Chunk { page: 500 + seq, class: 2, slot: 0 }) },
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
