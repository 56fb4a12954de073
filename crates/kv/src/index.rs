//! The server's own memory: keys, flags, cas, expiry and where each value is, in LRU order,
//! and the reference-counted locations of values in remote memory.
//!
//! Invariants: a location's pages are freed only when its count drops to zero: the index holds
//! one reference while an entry names it, and every request reading or rewriting it holds one
//! more, so a page is never handed to a new value while a read of the old one is in flight.
//! `bytes_used` is the sum of [`item_bytes`] of the entries.

use std::collections::HashMap;

use crate::scheme::Scheme;
use crate::space::Extent;

pub type EntryId = u32;
pub type LocationId = u64;
const NIL: EntryId = u32::MAX;

/// Bytes an item counts against `--memory-limit`: key, value and a fixed overhead for the
/// entry (as memcached counts its item header).
pub fn item_bytes(key_len: usize, value_len: usize) -> u64 {
    (key_len + value_len + 56) as u64
}

#[derive(Debug)]
pub struct Location {
    pub scheme: Scheme,
    pub extent: Extent,
    pub value_bytes: usize,
    /// CRC32C of the value (what its backup record holds).
    pub value_crc: u32,
    /// Restored from the backup region and not read since: the first read checks `value_crc`.
    pub verify: bool,
    refs: u32,
}

/// An entry's record in the backup region: its slot and the location it names. The record
/// holds a reference on that location, so its pages are not reused while it names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub slot: crate::backup::Slot,
    pub location: LocationId,
}

#[derive(Debug)]
pub struct Entry {
    pub key: Box<[u8]>,
    pub flags: u32,
    /// Unix seconds after which the item is gone; 0: never.
    pub expires_at: u64,
    pub cas: u64,
    pub value_bytes: usize,
    pub location: LocationId,
    /// The write of this value is still in flight (its bytes are in the work table).
    pub pending: Option<u64>,
    /// The client or a prefix rule chose the scheme: hotness leaves it alone.
    pub pinned: bool,
    /// The newest acknowledged value of the key in the backup region, when there is one (it
    /// may be older than `location` while a write is in flight).
    pub recorded: Option<Recorded>,
    /// The first location of this key since it was last absent: completions of older writes
    /// (before a delete) are not recorded.
    pub floor: LocationId,
    /// Reads since `window_start` (unix seconds), for the hotness policy.
    pub reads_in_window: u32,
    pub window_start: u64,
    pub last_access: u64,
    /// Fetched at least once (meta `h`).
    pub fetched: bool,
    /// Meta stale-while-revalidate: invalidated (`md ... I`, or stored by `ms ... I` with an
    /// older cas): gets see it with `X` until a valid store replaces it.
    pub stale: bool,
    /// Meta: a get was handed the win (`W`) to recache this item; later gets see `Z`.
    pub win_sent: bool,
    /// A transition of this value is in flight (one at a time).
    pub moving: bool,
    prev: EntryId,
    next: EntryId,
}

#[derive(Debug, Default)]
pub struct Index {
    map: HashMap<Box<[u8]>, EntryId>,
    entries: Vec<Option<Entry>>,
    free: Vec<EntryId>,
    head: Option<EntryId>,
    tail: Option<EntryId>,
    locations: HashMap<LocationId, Location, foldhash::fast::RandomState>,
    next_location: LocationId,
    bytes_used: u64,
}

/// Locations whose last reference went away: their space is to be freed.
pub type Released = Vec<Location>;

impl Index {
    pub fn new() -> Index {
        Index { next_location: 1, ..Default::default() }
    }

    /// What the entries count against `--memory-limit`: the sum of their [`item_bytes`].
    pub fn bytes_used(&self) -> u64 {
        self.bytes_used
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Room for `additional` more entries and locations (a restore knows how many come: the
    /// tables grow once instead of rehashing all the way up).
    pub fn reserve(&mut self, additional: usize) {
        self.map.reserve(additional);
        self.entries.reserve(additional);
        self.locations.reserve(additional);
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn find(&self, key: &[u8]) -> Option<EntryId> {
        self.map.get(key).copied()
    }

    pub fn entry(&self, id: EntryId) -> &Entry {
        self.entries[id as usize].as_ref().expect("live entry")
    }

    pub fn entry_mut(&mut self, id: EntryId) -> &mut Entry {
        self.entries[id as usize].as_mut().expect("live entry")
    }

    /// A new location holding one reference (the caller's).
    pub fn new_location(
        &mut self,
        scheme: Scheme,
        extent: Extent,
        value_bytes: usize,
        value_crc: u32,
    ) -> LocationId {
        let id = self.next_location;
        self.next_location += 1;
        self.locations
            .insert(id, Location { scheme, extent, value_bytes, value_crc, verify: false, refs: 1 });
        id
    }

    /// The value at `id` was read and matched its checksum (or is no longer restored).
    pub fn mark_verified(&mut self, id: LocationId) {
        if let Some(location) = self.locations.get_mut(&id) {
            location.verify = false;
        }
    }

    /// A location restored from the backup region: its first read checks the value's checksum.
    pub fn mark_restored(&mut self, id: LocationId) {
        self.locations.get_mut(&id).expect("referenced location").verify = true;
    }

    pub fn location(&self, id: LocationId) -> &Location {
        self.locations.get(&id).expect("referenced location")
    }

    /// An in-place transition: the same pages now carry `scheme` (EOR and EC share pages).
    pub fn set_scheme(&mut self, id: LocationId, scheme: Scheme) {
        self.locations.get_mut(&id).expect("referenced location").scheme = scheme;
    }

    /// A value's tail moved to another chunk before any byte of it was written there.
    pub fn move_tail(&mut self, id: LocationId, chunk: crate::space::Chunk) {
        let location = self.locations.get_mut(&id).expect("referenced location");
        assert!(location.extent.tail.is_some(), "only a value with a tail moves its tail");
        location.extent.tail = Some(chunk);
    }

    pub fn retain(&mut self, id: LocationId) {
        self.locations.get_mut(&id).expect("referenced location").refs += 1;
    }

    /// Drops one reference; the location is returned when it was the last.
    pub fn release(&mut self, id: LocationId, released: &mut Released) {
        let location = self.locations.get_mut(&id).expect("referenced location");
        assert!(location.refs > 0, "location {id} released more often than retained");
        location.refs -= 1;
        if location.refs == 0 {
            released.push(self.locations.remove(&id).expect("present"));
        }
    }

    /// Inserts or replaces the entry of `key`, at the head of the LRU. The entry takes over the
    /// caller's reference to `location`; the replaced entry's reference is released.
    pub fn upsert(&mut self, mut entry: Entry, released: &mut Released) -> EntryId {
        if let Some(old) = self.find(&entry.key) {
            let old_entry = self.remove(old, released);
            entry.fetched = false;
            // The key's lineage goes on: its acknowledged record stays until the new value's
            // replaces it.
            entry.recorded = old_entry.recorded;
            entry.floor = old_entry.floor;
        }
        self.bytes_used += item_bytes(entry.key.len(), entry.value_bytes);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.entries.push(None);
                (self.entries.len() - 1) as EntryId
            }
        };
        entry.prev = NIL;
        entry.next = NIL;
        self.map.insert(entry.key.clone(), id);
        self.entries[id as usize] = Some(entry);
        self.push_front(id);
        id
    }

    /// Removes an entry and releases its location reference.
    pub fn remove(&mut self, id: EntryId, released: &mut Released) -> Entry {
        self.unlink(id);
        let entry = self.entries[id as usize].take().expect("live entry");
        self.free.push(id);
        self.map.remove(&entry.key);
        self.bytes_used -= item_bytes(entry.key.len(), entry.value_bytes);
        self.release(entry.location, released);
        entry
    }

    /// Moves an entry to the head of the LRU.
    pub fn touch_lru(&mut self, id: EntryId) {
        if self.head != Some(id) {
            self.unlink(id);
            self.push_front(id);
        }
    }

    /// The least recently used entry.
    pub fn lru_tail(&self) -> Option<EntryId> {
        self.tail
    }

    /// The entry used just before `id` (towards the head).
    pub fn newer(&self, id: EntryId) -> Option<EntryId> {
        let prev = self.entry(id).prev;
        (prev != NIL).then_some(prev)
    }

    /// Every live entry id (for flush_all).
    pub fn ids(&self) -> Vec<EntryId> {
        self.map.values().copied().collect()
    }

    /// Checks the counted state (tests and debug builds' housekeeping call it; it walks every
    /// entry): `bytes_used` is the sum of the entries' [`item_bytes`], the key map and the LRU
    /// list hold exactly the live entries, the free list the other slots, and every location
    /// an entry names or records is live with at least that many references (`extra`: the
    /// references the work table holds, per location).
    pub fn check_invariants(&self, extra: &HashMap<LocationId, u32>) {
        let mut live = 0;
        let mut bytes = 0;
        let mut references: HashMap<LocationId, u32> = extra.clone();
        for (id, entry) in self.entries.iter().enumerate() {
            let Some(entry) = entry else { continue };
            live += 1;
            assert_eq!(self.map.get(&entry.key), Some(&(id as EntryId)), "the key map names entry {id}");
            bytes += item_bytes(entry.key.len(), entry.value_bytes);
            *references.entry(entry.location).or_default() += 1;
            if let Some(recorded) = entry.recorded {
                *references.entry(recorded.location).or_default() += 1;
            }
        }
        assert_eq!(live, self.map.len(), "every live entry is in the key map");
        assert_eq!(live + self.free.len(), self.entries.len(), "a slot is live or free");
        assert_eq!(bytes, self.bytes_used, "bytes_used is the sum of the entries' item bytes");
        let (mut listed, mut at, mut older) = (0, self.tail, NIL);
        while let Some(id) = at {
            listed += 1;
            assert!(listed <= live, "the LRU list has no cycle");
            assert_eq!(self.entry(id).next, older, "the LRU list links both ways");
            older = id;
            at = self.newer(id);
        }
        assert_eq!(listed, live, "the LRU list holds every live entry");
        assert_eq!(self.head, (older != NIL).then_some(older), "the LRU list ends at its head");
        for (location, held) in references {
            let refs = self.locations.get(&location).map_or(0, |location| location.refs);
            assert!(refs >= held, "location {location} has {refs} references, {held} holders");
        }
        assert!(
            self.locations.values().all(|location| location.refs > 0),
            "an unreferenced location is released"
        );
    }

    fn push_front(&mut self, id: EntryId) {
        let old_head = self.head;
        {
            let entry = self.entry_mut(id);
            entry.prev = NIL;
            entry.next = old_head.unwrap_or(NIL);
        }
        if let Some(head) = old_head {
            self.entry_mut(head).prev = id;
        }
        self.head = Some(id);
        if self.tail.is_none() {
            self.tail = Some(id);
        }
    }

    fn unlink(&mut self, id: EntryId) {
        let (prev, next) = {
            let entry = self.entry(id);
            (entry.prev, entry.next)
        };
        if prev != NIL {
            self.entry_mut(prev).next = next;
        } else if self.head == Some(id) {
            self.head = (next != NIL).then_some(next);
        }
        if next != NIL {
            self.entry_mut(next).prev = prev;
        } else if self.tail == Some(id) {
            self.tail = (prev != NIL).then_some(prev);
        }
        let entry = self.entry_mut(id);
        entry.prev = NIL;
        entry.next = NIL;
    }
}

impl Entry {
    /// A new entry (not yet in the index).
    pub fn new(
        key: &[u8],
        flags: u32,
        expires_at: u64,
        cas: u64,
        value_bytes: usize,
        location: LocationId,
    ) -> Entry {
        Entry {
            key: key.into(),
            flags,
            expires_at,
            cas,
            value_bytes,
            location,
            pending: None,
            pinned: false,
            recorded: None,
            floor: location,
            reads_in_window: 0,
            window_start: 0,
            last_access: 0,
            fetched: false,
            stale: false,
            win_sent: false,
            moving: false,
            prev: NIL,
            next: NIL,
        }
    }

    pub fn expired(&self, now_unix: u64) -> bool {
        self.expires_at != 0 && self.expires_at <= now_unix
    }
}

/// CRC32C of `key` then `value`: what a location's `value_crc` holds for a restored item
/// (`durability.rs`), checked on its first read.
pub fn item_crc(key: &[u8], value: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(key), value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(index: &mut Index, key: &str, released: &mut Released) -> EntryId {
        let location = index.new_location(Scheme::Rep2, Extent::default(), 10, 0);
        index.upsert(Entry::new(key.as_bytes(), 0, 0, 1, 10, location), released)
    }

    #[test]
    fn lru_order_follows_use_and_removal_keeps_the_list_whole() {
        let mut index = Index::new();
        let mut released = Vec::new();
        let a = insert(&mut index, "a", &mut released);
        let b = insert(&mut index, "b", &mut released);
        let c = insert(&mut index, "c", &mut released);
        assert_eq!(index.lru_tail(), Some(a));
        index.touch_lru(a);
        index.check_invariants(&HashMap::new());
        assert_eq!(index.lru_tail(), Some(b));
        assert_eq!(index.newer(b), Some(c));
        index.remove(c, &mut released);
        assert_eq!(index.newer(b), Some(a));
        index.remove(b, &mut released);
        index.remove(a, &mut released);
        assert_eq!((index.lru_tail(), index.bytes_used, released.len()), (None, 0, 3));
        index.check_invariants(&HashMap::new());
    }

    #[test]
    fn a_location_is_released_only_by_its_last_reference() {
        let mut index = Index::new();
        let mut released = Vec::new();
        let a = insert(&mut index, "a", &mut released);
        let location = index.entry(a).location;
        index.retain(location); // a read in flight
        insert(&mut index, "a", &mut released); // overwritten
        assert!(released.is_empty());
        index.check_invariants(&HashMap::from([(location, 1)]));
        index.release(location, &mut released);
        assert_eq!(released.len(), 1);
        assert_eq!(index.len(), 1);
    }
}
