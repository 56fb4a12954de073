//! Keeping the backup region (`crate::backup`) equal to the acknowledged state, and rebuilding
//! the cache from it after a restart.
//!
//! When records are written (docs/KV.md "Restarts" has the whole argument):
//! - a store's record is written when all of its splits are acknowledged, before its reply, and
//!   only if it is the key's newest acknowledged value (`Entry::floor`, `Recorded::location`:
//!   locations are numbered in arrival order);
//! - an entry removed (delete, eviction, expiry, a failed write, flush) has its record freed
//!   before its pages can be given to another value;
//! - a change of expiry, or a transition (a new place, or the same pages with a new scheme),
//!   rewrites the record out of place.
//!
//! Restoring trusts nothing in the region: every record is checked against the regions of
//! this server (pages inside the scheme's region), against the others (no page held twice; a
//! chunk page holds one class), by key (the newest record wins), and its value is checked
//! against the record's CRC32C on its first read: what does not hold is dropped and counted,
//! never served.

use std::collections::{HashMap, HashSet};

use crate::backup::{BackupError, ItemRecord, RecordView, ScanReport, Slot};
use crate::cache::Cache;
use crate::index::{item_crc, Entry, EntryId, LocationId, Recorded, Released};
use crate::page_client::PageClient;
use crate::space::RegionKind;

/// foldhash, randomly seeded: the region is this server's own, and a hostile one is bounded by
/// its size.
type Fast = foldhash::fast::RandomState;
/// Chunk page -> (region, class, slots taken).
type ChunkPages = HashMap<u64, (RegionKind, u8, u64), Fast>;

/// What a restore did with the records it was given.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    pub scan: ScanReport,
    pub restored: u64,
    /// Older records of a key that has a newer one (an update cut short by the crash).
    pub superseded: u64,
    pub expired: u64,
    /// Records naming pages outside this server's regions, or pages another record holds.
    pub refused: u64,
}

impl<P: PageClient> Cache<P> {
    /// CRC32C of a key and its value, for the value's record (0 when there is no backup
    /// region). The key is in it so that a record naming another key's pages does not check.
    pub fn value_crc(&self, key: &[u8], value: &[u8]) -> u32 {
        if self.backup.is_some() {
            item_crc(key, value)
        } else {
            0
        }
    }

    /// Records the value at `location` as the newest acknowledged one of entry `id`, with the
    /// given flags, expiry and cas, unless a newer one is recorded already or the value is
    /// older than the key's lineage. Frees the record it replaces. Errors when the region is full.
    pub(crate) fn record(
        &mut self,
        id: EntryId,
        location: LocationId,
        (flags, expires_at, cas): (u32, u64, u64),
    ) -> Result<(), BackupError> {
        let Some(backup) = self.backup.as_mut() else { return Ok(()) };
        let entry = self.index.entry(id);
        if location < entry.floor || entry.recorded.is_some_and(|recorded| recorded.location > location) {
            return Ok(());
        }
        let place = self.index.location(location);
        let record = RecordView {
            seq: backup.next_seq(),
            cas,
            expires_at,
            flags,
            value_bytes: place.value_bytes,
            value_crc: place.value_crc,
            scheme: place.scheme,
            pinned: entry.pinned,
            extent: &place.extent,
            key: &entry.key,
        };
        let slot = backup.put(&record)?;
        self.stats.backup_records_written += 1;
        self.index.retain(location);
        let replaced = self.index.entry_mut(id).recorded.replace(Recorded { slot, location });
        if let Some(replaced) = replaced {
            self.unrecord(replaced);
        }
        Ok(())
    }

    /// Rewrites entry `id`'s record after a change of its expiry, flags or place, if its
    /// record is of its current place (a write in flight records itself when done).
    pub(crate) fn rerecord(&mut self, id: EntryId) {
        let entry = self.index.entry(id);
        let Some(recorded) = entry.recorded else { return };
        let location = entry.location;
        if entry.pending.is_some() || recorded.location > location {
            return;
        }
        let fields = (entry.flags, entry.expires_at, entry.cas);
        // Rewritten even at the same location: the record is replaced out of place.
        self.index.entry_mut(id).recorded = None;
        let result = self.record(id, location, fields);
        match result {
            Ok(()) => self.unrecord(recorded),
            Err(error) => {
                // The old record stays: a restart finds the item as it was before this change.
                self.index.entry_mut(id).recorded = Some(recorded);
                self.stats.backup_failures += 1;
                tracing::error!(%error, "the backup region could not take an item's new record");
            }
        }
    }

    /// Frees a record and its reference on its location.
    pub(crate) fn unrecord(&mut self, recorded: Recorded) {
        if let Some(backup) = self.backup.as_mut() {
            backup.free(recorded.slot);
        }
        let mut released = Released::new();
        self.index.release(recorded.location, &mut released);
        self.free(released);
    }

    /// Rebuilds the index and the allocators from the records of a backup region scan (see
    /// the module docs). Call once, on a new cache, before it serves.
    pub fn restore(&mut self, records: Vec<(Slot, ItemRecord)>, scan: ScanReport, now: u64) -> RestoreReport {
        let mut report = RestoreReport { scan, ..RestoreReport::default() };
        let mut records = records;
        records.sort_unstable_by_key(|(_, record)| std::cmp::Reverse(record.seq));
        // Verdicts first, over borrowed records (no key is copied), in tables sized once.
        let keep: Vec<bool> = {
            let count = records.len();
            let mut keys: HashSet<&[u8], Fast> = HashSet::with_capacity_and_hasher(count, Fast::default());
            let mut whole_pages: HashSet<u64, Fast> = HashSet::default();
            // Chunk page -> (region, class, slots taken).
            let mut chunk_pages: ChunkPages = HashMap::default();
            let (mut superseded, mut expired, mut refused) = (0, 0, 0);
            let keep: Vec<bool> = records
                .iter()
                .map(|(_, record)| {
                    // The newest record of a key decides: an older one never comes back, even
                    // when the newest is expired or refused.
                    if !keys.insert(&record.key) {
                        superseded += 1;
                        return false;
                    }
                    if record.expires_at != 0 && record.expires_at <= now {
                        expired += 1;
                        return false;
                    }
                    if !self.fits(record, &whole_pages, &chunk_pages) {
                        refused += 1;
                        return false;
                    }
                    whole_pages.extend(record.extent.pages.iter().copied());
                    if let Some(chunk) = record.extent.tail {
                        let kind = RegionKind::of(record.scheme);
                        chunk_pages.entry(chunk.page).or_insert((kind, chunk.class, 0)).2 |= 1 << chunk.slot;
                    }
                    true
                })
                .collect();
            report.superseded = superseded;
            report.expired = expired;
            report.refused = refused;
            keep
        };
        let mut kept = Vec::with_capacity(keep.iter().filter(|&&keep| keep).count());
        for ((slot, record), keep) in records.into_iter().zip(keep) {
            if keep {
                kept.push((slot, record));
            } else if let Some(backup) = self.backup.as_mut() {
                backup.free(slot);
            }
        }
        self.index.reserve(kept.len());
        // Oldest first, so the LRU order is the records' order.
        kept.reverse();
        for (_, record) in &kept {
            self.space.take(record.scheme, &record.extent);
        }
        self.space.finish_restore();
        for (slot, record) in kept {
            let location =
                self.index.new_location(record.scheme, record.extent, record.value_bytes, record.value_crc);
            self.index.mark_restored(location);
            let mut entry = Entry::new(
                &record.key,
                record.flags,
                record.expires_at,
                record.cas,
                record.value_bytes,
                location,
            );
            entry.pinned = record.pinned;
            entry.last_access = now;
            entry.window_start = now;
            self.index.retain(location);
            entry.recorded = Some(Recorded { slot, location });
            let mut released = Released::new();
            self.index.upsert(entry, &mut released);
            debug_assert!(released.is_empty(), "keys were made unique above");
            self.raise_cas(record.cas);
            report.restored += 1;
        }
        report
    }

    /// Whether a record's pages are inside its scheme's region's mapped ranges and free of every record kept
    /// so far.
    fn fits(&self, record: &ItemRecord, whole_pages: &HashSet<u64, Fast>, chunk_pages: &ChunkPages) -> bool {
        let kind = RegionKind::of(record.scheme);
        // Inside the mapped ranges: a record into a range the saved slab map has no slabs for
        // points at nothing.
        let Some((first, count)) = self.space.mapped_pages(kind) else { return false };
        let inside = |page: u64| page >= first && page - first < count;
        let mut pages = HashSet::new();
        for &page in &record.extent.pages {
            if !inside(page)
                || whole_pages.contains(&page)
                || chunk_pages.contains_key(&page)
                || !pages.insert(page)
            {
                return false;
            }
        }
        match record.extent.tail {
            None => true,
            Some(chunk) => {
                inside(chunk.page)
                    && !whole_pages.contains(&chunk.page)
                    && !pages.contains(&chunk.page)
                    && match chunk_pages.get(&chunk.page) {
                        None => true,
                        Some(&(page_kind, class, taken)) => {
                            page_kind == kind && class == chunk.class && taken & (1 << chunk.slot) == 0
                        }
                    }
            }
        }
    }
}
