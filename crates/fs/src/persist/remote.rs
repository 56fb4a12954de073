//! The metadata in remote memory (`remem fs --metadata remote`, which `--etcd` implies): the
//! snapshot and the journal kept in a region of remem pages of their own client instead of a
//! local state directory, so that a `remem fs` on any host with the secret (and the slab maps,
//! in etcd) mounts the same file system after the host that served it is gone.
//!
//! Layout of the area (`page_bytes` pages, numbered from 0):
//! - pages 0 and 1: headers. Generation `g` is described by the header in page `g % 2`:
//!   `magic (8) | version u32 | crc32c u32 | generation u64 | nonce u64 | area_pages u64 |
//!   snapshot_first u64 | snapshot_len u64 | snapshot_crc u32`, the crc over every byte after
//!   it up to the end of the fields;
//! - the rest in two halves; generation `g` uses half `g % 2`: its snapshot's bytes from the
//!   half's first page, then its journal, one or more fresh pages per append, each
//!   `magic u32 | crc32c u32 | nonce u64 | index u64 | used u32 | 0 u32 | payload`, `index`
//!   counting the generation's journal pages from 0 and the crc over everything after it.
//!
//! Fault model: the process may be killed in the middle of any write, and a page of an EC
//! region rewritten in place can then be torn (fewer than k splits of either version:
//! unreadable). So no write here ever rewrites a page that something acknowledged depends on:
//! - an append writes fresh pages only, after the last page of the journal; a torn append is
//!   the end of the journal (its records were not acknowledged: the append had not returned);
//! - a new generation (compaction) writes its snapshot into the *other* half, then its header
//!   into the *other* header page; until that header is whole the old generation, untouched,
//!   is the one a reader takes. The reader takes the newest whole header; a header page that is
//!   torn or holds an older generation is passed over.
//! - every generation has a random nonce that its journal pages carry: pages left in a half by
//!   an older generation, or by an attempt whose header never became whole, end the journal.
//!
//! A page that cannot be read because nodes failed (beyond r, or unreachable) is an error, never
//! taken for the end of the journal: it could hold acknowledged records. Torn is told from lost by
//! the client's error: every node answered but no k splits agree on a version.

use remem_client::{PageError, PageOp};

use crate::store::PageStore;

pub const MAGIC: &[u8; 8] = b"REMEMFSM";
pub const VERSION: u32 = 1;
const HEADER_PAGES: u64 = 2;
const HEADER_FIELDS_BYTES: usize = 68;
const JOURNAL_MAGIC: u32 = u32::from_le_bytes(*b"RFSJ");
const JOURNAL_HEADER_BYTES: usize = 32;
/// Pages written or read per batch (the staging buffer holds this many).
const BATCH_PAGES: usize = 64;
/// A half must leave at least this many journal pages after its snapshot.
const MIN_JOURNAL_PAGES: u64 = 16;

/// Why the remote metadata cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AreaError {
    #[error("the metadata area has {pages} pages; it needs at least {needed} (a larger --metadata-size)")]
    TooSmall { pages: u64, needed: u64 },
    #[error("metadata page {page} cannot be read ({source}): refusing to guess what it held")]
    Unreadable { page: u64, source: PageError },
    #[error("writing metadata page {page}: {source}")]
    Write { page: u64, source: PageError },
    #[error("metadata header in page {page} is invalid: {reason}")]
    BadHeader { page: u64, reason: String },
    #[error("the snapshot of generation {generation} ({bytes} bytes) does not match its checksum")]
    SnapshotChecksum { generation: u64, bytes: u64 },
    #[error(
        "the metadata snapshot ({bytes} bytes) does not fit in half of the metadata area ({half} bytes) \
         with room for a journal: pass a larger --metadata-size"
    )]
    Full { bytes: u64, half: u64 },
}

/// What [`RemoteArea::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The newest whole generation's snapshot; `None` for an area never written.
    pub snapshot: Option<Vec<u8>>,
    /// Its journal: the payloads of its journal pages, in order.
    pub journal: Vec<u8>,
    pub generation: u64,
    /// The journal ended at a torn page (a crash mid-append): its index.
    pub torn_page: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    generation: u64,
    nonce: u64,
    snapshot_first: u64,
    snapshot_len: u64,
    snapshot_crc: u32,
}

/// The area, open for appends after [`RemoteArea::load`] and [`RemoteArea::replace`].
pub struct RemoteArea {
    store: Box<dyn PageStore>,
    page_bytes: usize,
    half_pages: u64,
    generation: u64,
    nonce: u64,
    journal_first: u64,
    journal_next: u64,
    /// Pages being written or read: [`BATCH_PAGES`] of them, allocated once.
    staging: Vec<u8>,
    /// The allocation of the op list of a write, kept between appends.
    spare_ops: Vec<PageOp<'static>>,
    /// `--metadata-sync fsync`: the journal writes here at syncs only (see [`RemoteArea::flush_on_sync_only`]).
    on_sync_only: bool,
}

/// Torn (every node answered; no k splits agree), as opposed to lost or unreachable.
fn is_torn(error: &PageError) -> bool {
    matches!(error, PageError::Lost { failed_nodes, .. } if failed_nodes.is_empty())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl RemoteArea {
    /// The area over all of `store`'s pages (the metadata client's region).
    pub fn new(store: Box<dyn PageStore>) -> Result<RemoteArea, AreaError> {
        let page_bytes = store.page_bytes();
        let pages = store.page_count();
        let needed = HEADER_PAGES + 2 * (MIN_JOURNAL_PAGES + 1);
        if pages < needed || page_bytes < HEADER_FIELDS_BYTES.max(JOURNAL_HEADER_BYTES + 1) {
            return Err(AreaError::TooSmall { pages, needed });
        }
        Ok(RemoteArea {
            store,
            page_bytes,
            half_pages: (pages - HEADER_PAGES) / 2,
            generation: 0,
            nonce: 0,
            journal_first: 0,
            journal_next: 0,
            staging: vec![0; BATCH_PAGES * page_bytes],
            spare_ops: Vec::with_capacity(BATCH_PAGES),
            on_sync_only: false,
        })
    }

    /// `--metadata-sync fsync`: the journal keeps appended records in memory and writes them
    /// here at fsync, fdatasync, fsyncdir, the one-second timer and unmount (and when 256 KiB
    /// wait), as the local journal reaches the disk: a change not synced yet is lost with the
    /// process or its host, one that was synced is not.
    pub fn flush_on_sync_only(mut self) -> RemoteArea {
        self.on_sync_only = true;
        self
    }

    pub fn flushes_on_sync_only(&self) -> bool {
        self.on_sync_only
    }

    fn half_start(&self, generation: u64) -> u64 {
        HEADER_PAGES + (generation % 2) * self.half_pages
    }

    fn half_end(&self, generation: u64) -> u64 {
        self.half_start(generation) + self.half_pages
    }

    fn payload_bytes(&self) -> usize {
        self.page_bytes - JOURNAL_HEADER_BYTES
    }

    /// Pages from `first` read into the staging buffer, each with its result.
    fn read_pages(&mut self, first: u64, count: usize) -> Vec<Result<(), PageError>> {
        let page_bytes = self.page_bytes;
        let mut results: Vec<Result<(), PageError>> = (0..count).map(|_| Ok(())).collect();
        let mut ops: Vec<PageOp<'_>> = self.staging[..count * page_bytes]
            .chunks_mut(page_bytes)
            .enumerate()
            .map(|(index, buf)| PageOp::Read { page: first + index as u64, buf })
            .collect();
        self.store.execute_each(&mut ops, &mut |index, error| results[index] = Err(error));
        results
    }

    /// Writes the staging buffer's first `count` pages from page `first`.
    fn write_pages(&mut self, first: u64, count: usize) -> Result<(), AreaError> {
        let page_bytes = self.page_bytes;
        let mut ops = crate::filesystem::recycle(std::mem::take(&mut self.spare_ops));
        let pages = self.staging[..count * page_bytes].chunks(page_bytes).enumerate();
        ops.extend(pages.map(|(index, data)| PageOp::Write { page: first + index as u64, data }));
        let mut failed = None;
        self.store.execute_each(&mut ops, &mut |index, error| {
            failed.get_or_insert((first + index as u64, error));
        });
        self.spare_ops = crate::filesystem::recycle(ops);
        match failed {
            Some((page, source)) => Err(AreaError::Write { page, source }),
            None => Ok(()),
        }
    }

    /// The header in the staging buffer's page `slot`, as read from area page `page`: `None`
    /// when the page was never written (or holds no header).
    fn parse_header(&self, slot: usize, page: u64) -> Result<Option<Header>, AreaError> {
        let bytes = &self.staging[slot * self.page_bytes..][..HEADER_FIELDS_BYTES];
        if &bytes[..8] != MAGIC {
            return Ok(None);
        }
        let bad = |reason: String| AreaError::BadHeader { page, reason };
        if crc32c::crc32c(&bytes[16..]) != u32_at(bytes, 12) {
            // A whole page whose checksum fails was damaged, not torn (a torn page is unreadable).
            return Err(bad("its checksum does not hold".into()));
        }
        let version = u32_at(bytes, 8);
        if version != VERSION {
            return Err(bad(format!("version {version}, this remem reads version {VERSION}")));
        }
        let header = Header {
            generation: u64_at(bytes, 16),
            nonce: u64_at(bytes, 24),
            snapshot_first: u64_at(bytes, 40),
            snapshot_len: u64_at(bytes, 48),
            snapshot_crc: u32_at(bytes, 56),
        };
        let area_pages = u64_at(bytes, 32);
        let expected_pages = HEADER_PAGES + 2 * self.half_pages;
        if area_pages != expected_pages {
            return Err(bad(format!(
                "it describes an area of {area_pages} pages, this one has {expected_pages}"
            )));
        }
        if header.generation == 0 || header.generation % 2 != page {
            return Err(bad(format!("generation {} does not belong in page {page}", header.generation)));
        }
        let half_bytes = self.half_pages * self.page_bytes as u64;
        if header.snapshot_first != self.half_start(header.generation) || header.snapshot_len > half_bytes {
            return Err(bad(format!(
                "its snapshot ({} bytes at page {}) is not where generation {} keeps it",
                header.snapshot_len, header.snapshot_first, header.generation
            )));
        }
        Ok(Some(header))
    }

    /// Reads the newest whole generation: its snapshot and its journal's bytes. Leaves the area
    /// at that generation; the caller replays it, then writes a new one with
    /// [`RemoteArea::replace`] before appending.
    pub fn load(&mut self) -> Result<Loaded, AreaError> {
        let results = self.read_pages(0, HEADER_PAGES as usize);
        let mut newest: Option<Header> = None;
        for (slot, result) in results.into_iter().enumerate() {
            match result {
                Err(error) if is_torn(&error) => continue,
                Err(source) => return Err(AreaError::Unreadable { page: slot as u64, source }),
                Ok(()) => {
                    if let Some(header) = self.parse_header(slot, slot as u64)? {
                        if newest.is_none_or(|newest| header.generation > newest.generation) {
                            newest = Some(header);
                        }
                    }
                }
            }
        }
        let Some(header) = newest else { return Ok(Loaded::default()) };
        let snapshot = self.read_snapshot(&header)?;
        self.generation = header.generation;
        self.nonce = header.nonce;
        self.journal_first = header.snapshot_first + header.snapshot_len.div_ceil(self.page_bytes as u64);
        self.journal_next = self.journal_first;
        let (journal, torn_page) = self.read_journal()?;
        Ok(Loaded { snapshot: Some(snapshot), journal, generation: header.generation, torn_page })
    }

    fn read_snapshot(&mut self, header: &Header) -> Result<Vec<u8>, AreaError> {
        let mut snapshot = Vec::with_capacity(header.snapshot_len as usize);
        let page_bytes = self.page_bytes;
        let mut page = header.snapshot_first;
        while (snapshot.len() as u64) < header.snapshot_len {
            let left = header.snapshot_len - snapshot.len() as u64;
            let count = left.div_ceil(page_bytes as u64).min(BATCH_PAGES as u64) as usize;
            for (index, result) in self.read_pages(page, count).into_iter().enumerate() {
                // Written whole before its header: any error is a loss, never a tear.
                result.map_err(|source| AreaError::Unreadable { page: page + index as u64, source })?;
            }
            let take = (count * page_bytes).min(left as usize);
            snapshot.extend_from_slice(&self.staging[..take]);
            page += count as u64;
        }
        if crc32c::crc32c(&snapshot) != header.snapshot_crc {
            return Err(AreaError::SnapshotChecksum {
                generation: header.generation,
                bytes: header.snapshot_len,
            });
        }
        Ok(snapshot)
    }

    /// The generation's journal pages from its first, up to the first page that is not the next
    /// one of this generation; the index of a torn page that ended it.
    fn read_journal(&mut self) -> Result<(Vec<u8>, Option<u64>), AreaError> {
        let mut journal = Vec::new();
        let end = self.half_end(self.generation);
        let mut page = self.journal_first;
        while page < end {
            let count = (end - page).min(BATCH_PAGES as u64) as usize;
            let results = self.read_pages(page, count);
            for (slot, result) in results.into_iter().enumerate() {
                let index = page + slot as u64 - self.journal_first;
                match result {
                    Err(error) if is_torn(&error) => return Ok((journal, Some(index))),
                    Err(source) => return Err(AreaError::Unreadable { page: page + slot as u64, source }),
                    Ok(()) => match self.journal_payload(slot, index) {
                        Some(payload) => journal.extend_from_slice(payload),
                        None => return Ok((journal, None)),
                    },
                }
                self.journal_next = page + slot as u64 + 1;
            }
            page += count as u64;
        }
        Ok((journal, None))
    }

    /// The payload of the journal page in staging slot `slot` if it is this generation's page
    /// `index`; `None` if it is anything else (never written, an older generation's, damaged).
    fn journal_payload(&self, slot: usize, index: u64) -> Option<&[u8]> {
        let bytes = &self.staging[slot * self.page_bytes..][..self.page_bytes];
        let used = u32_at(bytes, 24) as usize;
        let valid = u32_at(bytes, 0) == JOURNAL_MAGIC
            && crc32c::crc32c(&bytes[8..]) == u32_at(bytes, 4)
            && u64_at(bytes, 8) == self.nonce
            && u64_at(bytes, 16) == index
            && used <= self.payload_bytes();
        valid.then(|| &bytes[JOURNAL_HEADER_BYTES..JOURNAL_HEADER_BYTES + used])
    }

    /// Whether an append of `bytes` fits in this generation's half.
    pub fn has_room_for(&self, bytes: usize) -> bool {
        let pages = bytes.div_ceil(self.payload_bytes()) as u64;
        self.generation > 0 && self.journal_next + pages <= self.half_end(self.generation)
    }

    /// Whether the journal has used half of what its generation left it (time to compact).
    pub fn half_used(&self) -> bool {
        let room = self.half_end(self.generation).saturating_sub(self.journal_first);
        self.journal_next - self.journal_first >= room / 2
    }

    /// Appends `bytes` on fresh pages, durably (on the nodes) when it returns. The caller
    /// checked [`RemoteArea::has_room_for`].
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), AreaError> {
        assert!(self.has_room_for(bytes.len()), "append without room");
        let start = self.journal_next;
        let written = self.append_from(bytes);
        if written.is_err() {
            // Written again whole by the next append (none of it was acknowledged).
            self.journal_next = start;
        }
        written
    }

    fn append_from(&mut self, bytes: &[u8]) -> Result<(), AreaError> {
        let payload = self.payload_bytes();
        for group in bytes.chunks(payload * BATCH_PAGES) {
            let first = self.journal_next;
            let mut count = 0;
            for (slot, piece) in group.chunks(payload).enumerate() {
                let index = first + slot as u64 - self.journal_first;
                let page = &mut self.staging[slot * self.page_bytes..][..self.page_bytes];
                page[..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
                page[8..16].copy_from_slice(&self.nonce.to_le_bytes());
                page[16..24].copy_from_slice(&index.to_le_bytes());
                page[24..28].copy_from_slice(&(piece.len() as u32).to_le_bytes());
                page[28..32].fill(0);
                page[JOURNAL_HEADER_BYTES..][..piece.len()].copy_from_slice(piece);
                page[JOURNAL_HEADER_BYTES + piece.len()..].fill(0);
                let crc = crc32c::crc32c(&page[8..]);
                page[4..8].copy_from_slice(&crc.to_le_bytes());
                count += 1;
            }
            self.write_pages(first, count)?;
            self.journal_next = first + count as u64;
        }
        Ok(())
    }

    /// Starts a new generation whose snapshot is `snapshot` and whose journal is empty: the
    /// snapshot into the other half, then the header into the other header page.
    pub fn replace(&mut self, snapshot: &[u8]) -> Result<(), AreaError> {
        let generation = self.generation + 1;
        let first = self.half_start(generation);
        let snapshot_pages = (snapshot.len() as u64).div_ceil(self.page_bytes as u64);
        if snapshot_pages + MIN_JOURNAL_PAGES > self.half_pages {
            let half = self.half_pages * self.page_bytes as u64;
            return Err(AreaError::Full { bytes: snapshot.len() as u64, half });
        }
        let page_bytes = self.page_bytes;
        let mut page = first;
        for group in snapshot.chunks(page_bytes * BATCH_PAGES) {
            let count = group.len().div_ceil(page_bytes);
            self.staging[..group.len()].copy_from_slice(group);
            self.staging[group.len()..count * page_bytes].fill(0);
            self.write_pages(page, count)?;
            page += count as u64;
        }
        let header = Header {
            generation,
            nonce: rand::random(),
            snapshot_first: first,
            snapshot_len: snapshot.len() as u64,
            snapshot_crc: crc32c::crc32c(snapshot),
        };
        let area_pages = HEADER_PAGES + 2 * self.half_pages;
        let bytes = &mut self.staging[..page_bytes];
        bytes.fill(0);
        bytes[..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[16..24].copy_from_slice(&header.generation.to_le_bytes());
        bytes[24..32].copy_from_slice(&header.nonce.to_le_bytes());
        bytes[32..40].copy_from_slice(&area_pages.to_le_bytes());
        bytes[40..48].copy_from_slice(&header.snapshot_first.to_le_bytes());
        bytes[48..56].copy_from_slice(&header.snapshot_len.to_le_bytes());
        bytes[56..60].copy_from_slice(&header.snapshot_crc.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[16..HEADER_FIELDS_BYTES]);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        self.write_pages(generation % 2, 1)?;
        self.generation = generation;
        self.nonce = header.nonce;
        self.journal_first = first + snapshot_pages;
        self.journal_next = self.journal_first;
        Ok(())
    }

    /// Background work of the area's client (heartbeats, rebuilds, its slab map's saves).
    pub fn background(&mut self) {
        self.store.background();
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Journal pages this generation has written.
    pub fn journal_pages(&self) -> u64 {
        self.journal_next - self.journal_first
    }
}
