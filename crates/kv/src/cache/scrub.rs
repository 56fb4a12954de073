//! The scrub of EOR main copies. A main copy lost with its node (its range has no redundancy:
//! it comes back empty) or left stale by a failed write is written back by the next read of its
//! value (read repair), but a value nobody reads would keep only its k data splits, parity-stale:
//! one more failure, after the cluster healed, would lose it. So once main copies are lost or
//! stale, housekeeping walks the LRU list from its tail, a bounded stretch a second, and reads
//! every EOR value with such a page; each read repairs what it reads from the data splits.
//!
//! A walk starts when more main-copy pages are lost or stale than when the last one started, or
//! [`AGAIN_AFTER`] after the last one ended while some still are (a repair that failed, say while
//! the range had no slab yet; or pages no value uses any more), and ends at the LRU head. Its
//! cursor is the key of the next entry: when that entry is gone, the walk starts again from the
//! tail.

use super::{Cache, Waiter};
use crate::page_client::PageClient;
use crate::scheme::Scheme;

/// Entries looked at per housekeeping call.
const LOOK_PER_CALL: usize = 4096;
/// Reads started per housekeeping call (each one page or a few, and its repair).
const READS_PER_CALL: usize = 64;
/// A walk again this long after the last one ended, while main-copy pages are still missing.
const AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Scrub {
    /// The key of the next entry to look at, while a walk is on.
    next: Option<Box<[u8]>>,
    walking: bool,
    /// Main-copy pages lost or stale when the last walk started.
    missing_at_start: u64,
    /// When the last walk ended.
    ended: Option<std::time::Instant>,
}

impl<P: PageClient> Cache<P> {
    /// Main-copy pages lost (unreadable) or stale now.
    fn main_copies_missing(&mut self) -> u64 {
        let Some(first) = self.main_first_page else { return 0 };
        let engine = self.client.engine();
        let Some(region) = engine.region_of(first) else { return 0 };
        let lost: u64 = engine
            .ranges()
            .iter()
            .filter(|range| range.region == region)
            .map(|range| range.unreadable_pages)
            .sum();
        lost + self.stale_main.len() as u64
    }

    /// Whether a read of EOR page `page` would repair its main copy.
    fn main_copy_missing(&mut self, page: u64) -> bool {
        let main = self.main_page(page);
        self.stale_main.contains(&page) || self.client.engine().page_is_unreadable(main)
    }

    /// One bounded stretch of the walk (housekeeping, once a second).
    pub(super) fn scrub_main_copies(&mut self) {
        if !self.scrub.walking {
            let missing = self.main_copies_missing();
            let now = self.client.now();
            let due =
                self.scrub.ended.is_none_or(|ended| now.saturating_duration_since(ended) >= AGAIN_AFTER);
            if missing == 0 || (missing <= self.scrub.missing_at_start && !due) {
                self.scrub.missing_at_start = self.scrub.missing_at_start.min(missing);
                return;
            }
            if missing > self.scrub.missing_at_start {
                tracing::info!(
                    pages = missing,
                    "EOR main copies lost or stale: reading their values to write them back"
                );
            }
            self.scrub = Scrub { next: None, walking: true, missing_at_start: missing, ended: None };
        }
        let mut id = match self.scrub.next.take() {
            Some(key) => self.index.find(&key).or_else(|| self.index.lru_tail()),
            None => self.index.lru_tail(),
        };
        let (mut looked, mut started) = (0, 0);
        while let Some(current) = id {
            if looked == LOOK_PER_CALL || started == READS_PER_CALL {
                self.scrub.next = Some(self.index.entry(current).key.clone());
                return;
            }
            looked += 1;
            id = self.index.newer(current);
            let entry = self.index.entry(current);
            if entry.pending.is_some() || entry.moving {
                continue;
            }
            let location_id = entry.location;
            let location = self.index.location(location_id);
            if location.scheme != Scheme::Eor {
                continue;
            }
            let key = entry.key.clone();
            let pages: Vec<u64> = location
                .extent
                .pages
                .iter()
                .copied()
                .chain(location.extent.tail.map(|chunk| chunk.page))
                .collect();
            if pages.into_iter().any(|page| self.main_copy_missing(page)) {
                self.fetch(&key, location_id, Waiter::Scrub);
                started += 1;
            }
        }
        self.scrub.walking = false;
        self.scrub.ended = Some(self.client.now());
    }
}
