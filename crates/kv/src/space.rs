//! Where values live: page allocators over the server's regions and chunk classes that pack
//! small values into pages.
//!
//! A value of n bytes takes n / 4096 whole pages and, for the remaining n % 4096 bytes, either
//! one more page (more than [`CHUNK_MAX_BYTES`]) or a chunk of the smallest class that fits.
//! Chunk classes grow by 1.25x from 64 bytes, as memcached's slab classes do, so a small value
//! wastes at most a fifth of its chunk; a page holds chunks of one class and one scheme only, so
//! a page's redundancy is its objects' (docs/KV.md "Memory").
//!
//! Invariant: a page or chunk is handed out again only after [`Space::free_pages`] or
//! [`Space::free_chunk`] was called for it, which the index does only when no request still reads
//! it (locations are reference counted there). Nothing here does I/O.

use crate::scheme::Scheme;

pub const PAGE_BYTES: usize = 4096;
/// Tails and small values up to this size go to chunks; larger ones take a page.
pub const CHUNK_MAX_BYTES: usize = 2048;
const CHUNK_MIN_BYTES: usize = 64;

/// How the client cuts a region into ranges, and how many of them have slabs: ranges are
/// mapped from the first up as values need room and given back from the last down when they
/// hold nothing (`crate::cache::growth`), so the mapped ones are always a prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeGrid {
    /// The region's first page (range 0 starts there; its value pages may start later).
    pub origin: u64,
    pub pages_per_range: u64,
    /// The client's index of range 0.
    pub first_range: usize,
    /// Ranges 0..mapped have their slabs.
    pub mapped: u64,
}

/// One region of the client's page space: `page_count` value pages from `first_page`.
///
/// Pages are handed out lowest first (freed ones before new ones), so values gather in the
/// first ranges and the last one empties when values go.
#[derive(Debug)]
struct RegionPages {
    first_page: u64,
    page_count: u64,
    grid: RangeGrid,
    /// Offset of the first page never handed out since its range was mapped.
    next_unused: u64,
    free: std::collections::BTreeSet<u64>,
    /// Pages handed out (whole-value pages and chunk pages), per range of the grid.
    in_use: Vec<u64>,
}

impl RegionPages {
    fn new(first_page: u64, page_count: u64, grid: RangeGrid) -> RegionPages {
        assert!(first_page >= grid.origin && grid.pages_per_range > 0);
        let ranges = (first_page + page_count - grid.origin).div_ceil(grid.pages_per_range);
        assert!(grid.mapped <= ranges);
        RegionPages {
            first_page,
            page_count,
            grid,
            next_unused: 0,
            free: Default::default(),
            in_use: vec![0; ranges as usize],
        }
    }

    /// Offset of the first value page of range `range` (0 for range 0, whose first pages may
    /// be the region's own).
    fn range_start(&self, range: u64) -> u64 {
        (self.grid.origin + range * self.grid.pages_per_range)
            .saturating_sub(self.first_page)
            .min(self.page_count)
    }

    /// Value pages of the mapped ranges.
    fn mapped_count(&self) -> u64 {
        self.range_start(self.grid.mapped)
    }

    fn range_of(&self, page: u64) -> usize {
        ((page - self.grid.origin) / self.grid.pages_per_range) as usize
    }

    fn allocate(&mut self) -> Option<u64> {
        let page = match self.free.pop_first() {
            Some(page) => page,
            None if self.next_unused < self.mapped_count() => {
                self.next_unused += 1;
                self.first_page + self.next_unused - 1
            }
            None => return None,
        };
        let range = self.range_of(page);
        self.in_use[range] += 1;
        Some(page)
    }

    fn release(&mut self, page: u64) {
        debug_assert!(page >= self.first_page && page - self.first_page < self.mapped_count());
        let range = self.range_of(page);
        self.in_use[range] -= 1;
        self.free.insert(page);
    }

    fn free_count(&self) -> u64 {
        self.free.len() as u64 + (self.mapped_count() - self.next_unused)
    }

    fn can_grow(&self) -> bool {
        (self.grid.mapped as usize) < self.in_use.len()
    }

    /// The last mapped range, if it holds nothing, is not the only one and holds none of the
    /// region's own pages before its values.
    fn shrinkable(&self) -> Option<u64> {
        let last = self.grid.mapped.checked_sub(1).filter(|&last| last > 0)?;
        (self.in_use[last as usize] == 0 && self.range_start(last) > 0).then_some(last)
    }

    /// Forgets the last mapped range ([`RegionPages::shrinkable`]): its pages are no longer
    /// handed out.
    fn shrink(&mut self) {
        let last = self.shrinkable().expect("checked by the caller");
        let start = self.range_start(last);
        drop(self.free.split_off(&(self.first_page + start)));
        self.next_unused = self.next_unused.min(start);
        self.grid.mapped = last;
    }
}

/// The pages of a region that hold chunks of one (scheme, class).
#[derive(Debug, Default)]
struct ClassPages {
    /// Pages with at least one free slot (may hold stale entries: checked when taken).
    partial: Vec<u64>,
}

#[derive(Debug)]
struct ChunkPage {
    scheme: Scheme,
    class: u8,
    used: u64,
    /// A read of the page failed: its free slots are not handed out again (filling one would
    /// mean writing the page without its other chunks) until its last chunk is freed.
    unreadable: bool,
}

/// A small value's place: slot `slot` of class `class` in `page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub page: u64,
    pub class: u8,
    pub slot: u8,
}

impl Chunk {
    pub fn offset(&self) -> usize {
        self.slot as usize * class_bytes(self.class)
    }
}

/// Where one value's bytes are: whole pages in order, then the tail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    pub pages: Vec<u64>,
    pub tail: Option<Chunk>,
}

/// Chunk sizes: a page cut into n equal chunks for n from 64 down to 2 (each rounded down to 8
/// bytes), so that a page of a class wastes at most 7 bytes per chunk plus its empty slots:
/// 64, 72, ..., 512 (n = 8), 584, 680, 816, 1024, 1360, 2048. A value takes the smallest that
/// fits, so a page holds as many values of its size as any class table could fit (1 KiB values
/// four to a page, where memcached-style 1.25x classes put three in 1096-byte chunks).
pub fn class_sizes() -> &'static [usize] {
    static SIZES: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    SIZES.get_or_init(|| {
        let mut sizes: Vec<usize> =
            (2..=PAGE_BYTES / CHUNK_MIN_BYTES).rev().map(|chunks| PAGE_BYTES / chunks / 8 * 8).collect();
        sizes.dedup();
        debug_assert_eq!((sizes[0], *sizes.last().expect("classes")), (CHUNK_MIN_BYTES, CHUNK_MAX_BYTES));
        sizes
    })
}

pub fn class_bytes(class: u8) -> usize {
    class_sizes()[class as usize]
}

fn class_for(bytes: usize) -> u8 {
    class_sizes().iter().position(|&size| size >= bytes).expect("bytes <= CHUNK_MAX_BYTES") as u8
}

fn slots_of(class: u8) -> u8 {
    (PAGE_BYTES / class_bytes(class)).min(64) as u8
}

/// The region a scheme's pages come from: EOR shares the EC region (its pages are EC stripes
/// whose parities are not written yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    None,
    Rep2,
    Rep3,
    Ec,
}

impl RegionKind {
    pub fn of(scheme: Scheme) -> RegionKind {
        match scheme {
            Scheme::None => RegionKind::None,
            Scheme::Rep2 => RegionKind::Rep2,
            Scheme::Rep3 => RegionKind::Rep3,
            Scheme::Ec | Scheme::Eor => RegionKind::Ec,
        }
    }
}

/// What the allocator could not do.
#[derive(Debug, PartialEq, Eq)]
pub enum SpaceError {
    /// The scheme's region has no room left.
    Full,
    /// Not enough room in the mapped ranges of the scheme's region: map its next range
    /// ([`Space::next_range`]) and ask again.
    NeedsRange(RegionKind),
    /// This server was started without the scheme.
    NotOffered,
}

/// All regions' allocators and the chunk classes.
#[derive(Debug)]
pub struct Space {
    regions: [Option<RegionPages>; 4],
    chunk_pages: std::collections::HashMap<u64, ChunkPage>,
    classes: Vec<ClassPages>,
    /// Pages given to whole values or chunk pages, per region.
    pages_in_use: [u64; 4],
}

impl Space {
    pub fn new() -> Space {
        let classes = (0..Scheme::ALL.len() * class_sizes().len()).map(|_| ClassPages::default()).collect();
        Space {
            regions: [None, None, None, None],
            chunk_pages: Default::default(),
            classes,
            pages_in_use: [0; 4],
        }
    }

    /// Declares the pages of a region, all mapped.
    pub fn add_region(&mut self, kind: RegionKind, first_page: u64, page_count: u64) {
        let grid = RangeGrid { origin: first_page, pages_per_range: page_count, first_range: 0, mapped: 1 };
        self.add_ranged_region(kind, first_page, page_count, grid);
    }

    /// Declares `page_count` value pages from `first_page` of a region whose ranges are cut
    /// and mapped as `grid` says.
    pub fn add_ranged_region(&mut self, kind: RegionKind, first_page: u64, page_count: u64, grid: RangeGrid) {
        self.regions[kind as usize] = Some(RegionPages::new(first_page, page_count, grid));
    }

    /// The region's grid, with how many ranges are mapped now.
    pub fn grid(&self, kind: RegionKind) -> Option<RangeGrid> {
        self.regions[kind as usize].as_ref().map(|region| region.grid)
    }

    /// The client's index of the next range of the region to map, if it has one left.
    pub fn next_range(&self, kind: RegionKind) -> Option<usize> {
        let region = self.regions[kind as usize].as_ref()?;
        region.can_grow().then(|| region.grid.first_range + region.grid.mapped as usize)
    }

    /// The caller mapped [`Space::next_range`]: its pages are handed out from now on.
    pub fn range_mapped(&mut self, kind: RegionKind) {
        let region = self.regions[kind as usize].as_mut().expect("a region of the space");
        assert!(region.can_grow());
        region.grid.mapped += 1;
    }

    /// The client's index of the region's last mapped range if it holds nothing (and is not
    /// the only one): the caller may unmap it, then call [`Space::shrink`].
    pub fn shrinkable(&self, kind: RegionKind) -> Option<usize> {
        let region = self.regions[kind as usize].as_ref()?;
        region.shrinkable().map(|last| region.grid.first_range + last as usize)
    }

    /// Forgets the range [`Space::shrinkable`] named: its pages are no longer handed out.
    pub fn shrink(&mut self, kind: RegionKind) {
        self.regions[kind as usize].as_mut().expect("a region of the space").shrink();
    }

    /// Value pages of a region's mapped ranges: (first page, count).
    pub fn mapped_pages(&self, kind: RegionKind) -> Option<(u64, u64)> {
        self.regions[kind as usize].as_ref().map(|region| (region.first_page, region.mapped_count()))
    }

    pub fn offers(&self, scheme: Scheme) -> bool {
        self.regions[RegionKind::of(scheme) as usize].is_some()
    }

    /// Pages of a region: (first page, count).
    pub fn region_pages(&self, kind: RegionKind) -> Option<(u64, u64)> {
        self.regions[kind as usize].as_ref().map(|region| (region.first_page, region.page_count))
    }

    pub fn pages_in_use(&self, kind: RegionKind) -> u64 {
        self.pages_in_use[kind as usize]
    }

    /// Pages ever handed out, all regions together: each region's high-water mark (a freed
    /// page is handed out again before a new one), as memcached's `total_malloced` counts the
    /// slab pages it has taken and never gives back.
    pub fn pages_ever_used(&self) -> u64 {
        self.regions.iter().flatten().map(|region| region.next_unused).sum()
    }

    /// Allocates the place of a value of `bytes` for `scheme`. On `Full` nothing was taken.
    /// The bool is true when the tail's chunk page holds no other live chunk (its old content
    /// does not matter).
    pub fn allocate(&mut self, scheme: Scheme, bytes: usize) -> Result<(Extent, bool), SpaceError> {
        let kind = RegionKind::of(scheme) as usize;
        if self.regions[kind].is_none() {
            return Err(SpaceError::NotOffered);
        }
        let whole = bytes / PAGE_BYTES;
        let rest = bytes % PAGE_BYTES;
        let (extra_page, chunk_bytes) = match rest {
            0 => (0, 0),
            rest if rest > CHUNK_MAX_BYTES => (1, 0),
            rest => (0, rest),
        };
        let needed = (whole + extra_page) as u64;
        // A chunk may need a fresh page too.
        let chunk_class = (chunk_bytes > 0).then(|| class_for(chunk_bytes));
        let chunk_needs_page = chunk_class.is_some_and(|class| !self.has_partial(scheme, class));
        let region = self.regions[kind].as_mut().expect("checked above");
        if region.free_count() < needed + u64::from(chunk_needs_page) {
            if region.can_grow() {
                return Err(SpaceError::NeedsRange(RegionKind::of(scheme)));
            }
            return Err(SpaceError::Full);
        }
        let region = self.regions[kind].as_mut().expect("checked above");
        let pages: Vec<u64> = (0..needed).map(|_| region.allocate().expect("counted free pages")).collect();
        self.pages_in_use[kind] += needed;
        let mut fresh = false;
        let tail = match chunk_class {
            None => None,
            Some(class) => {
                let (chunk, was_empty) =
                    self.take_chunk(scheme, class).expect("counted a page for the chunk");
                fresh = was_empty;
                Some(chunk)
            }
        };
        Ok((Extent { pages, tail }, fresh))
    }

    fn class_index(scheme: Scheme, class: u8) -> usize {
        scheme.index() * class_sizes().len() + class as usize
    }

    fn has_partial(&mut self, scheme: Scheme, class: u8) -> bool {
        let index = Self::class_index(scheme, class);
        while let Some(&page) = self.classes[index].partial.last() {
            match self.chunk_pages.get(&page) {
                Some(chunk_page)
                    if chunk_page.scheme == scheme
                        && chunk_page.class == class
                        && !chunk_page.unreadable
                        && chunk_page.used.count_ones() < u32::from(slots_of(class)) =>
                {
                    return true
                }
                _ => {
                    self.classes[index].partial.pop();
                }
            }
        }
        false
    }

    /// A free slot of the class, from a partial page or a new one. The bool: the page was empty.
    fn take_chunk(&mut self, scheme: Scheme, class: u8) -> Option<(Chunk, bool)> {
        let index = Self::class_index(scheme, class);
        let page = if self.has_partial(scheme, class) {
            *self.classes[index].partial.last().expect("has_partial checked")
        } else {
            let kind = RegionKind::of(scheme) as usize;
            let page = self.regions[kind].as_mut()?.allocate()?;
            self.pages_in_use[kind] += 1;
            self.chunk_pages.insert(page, ChunkPage { scheme, class, used: 0, unreadable: false });
            self.classes[index].partial.push(page);
            page
        };
        let chunk_page = self.chunk_pages.get_mut(&page).expect("partial pages are chunk pages");
        let was_empty = chunk_page.used == 0;
        let slot = (!chunk_page.used).trailing_zeros() as u8;
        debug_assert!(slot < slots_of(class));
        chunk_page.used |= 1 << slot;
        if chunk_page.used.count_ones() == u32::from(slots_of(class)) {
            self.classes[index].partial.pop();
        }
        Some((Chunk { page, class, slot }, was_empty))
    }

    /// A chunk in a page other than `avoid` for a value whose tail was to go to `avoid` (a page
    /// that could not be read); `avoid` takes no new chunk from now on. The bool: the new
    /// chunk's page was empty. `None` when the region is full.
    pub fn move_chunk(&mut self, scheme: Scheme, avoid: Chunk) -> Option<(Chunk, bool)> {
        if let Some(page) = self.chunk_pages.get_mut(&avoid.page) {
            page.unreadable = true;
        }
        let (chunk, fresh) = self.take_chunk(scheme, avoid.class)?;
        debug_assert_ne!(chunk.page, avoid.page);
        self.free_chunk(scheme, avoid);
        Some((chunk, fresh))
    }

    /// Gives whole pages back to their region.
    pub fn free_pages(&mut self, scheme: Scheme, pages: &[u64]) {
        let kind = RegionKind::of(scheme) as usize;
        let region = self.regions[kind].as_mut().expect("pages came from this region");
        for &page in pages {
            region.release(page);
        }
        debug_assert!(self.pages_in_use[kind] >= pages.len() as u64, "freed more pages than were in use");
        self.pages_in_use[kind] -= pages.len() as u64;
    }

    /// Gives back everything of an extent just allocated and not used.
    pub fn free_extent(&mut self, scheme: Scheme, extent: &Extent) {
        self.free_pages(scheme, &extent.pages);
        if let Some(chunk) = extent.tail {
            self.free_chunk(scheme, chunk);
        }
    }

    /// Gives a chunk back; its page goes back to the region when its last chunk does.
    pub fn free_chunk(&mut self, scheme: Scheme, chunk: Chunk) {
        let page = self.chunk_pages.get_mut(&chunk.page).expect("the chunk's page is a chunk page");
        assert!(page.used & (1 << chunk.slot) != 0, "chunk {chunk:?} freed twice");
        let was_full = page.used.count_ones() == u32::from(slots_of(chunk.class));
        page.used &= !(1 << chunk.slot);
        if page.used == 0 {
            self.chunk_pages.remove(&chunk.page);
            self.free_pages(scheme, &[chunk.page]);
        } else if was_full && !page.unreadable {
            self.classes[Self::class_index(scheme, chunk.class)].partial.push(chunk.page);
        }
    }

    /// Marks a restored value's pages and chunk as taken (a restart: `crate::cache::durability`). The
    /// caller has checked that they are inside the scheme's region and that no two values
    /// share a page or a chunk slot. Call [`Space::finish_restore`] after the last one.
    pub fn take(&mut self, scheme: Scheme, extent: &Extent) {
        let kind = RegionKind::of(scheme) as usize;
        let Some(region) = self.regions[kind].as_mut() else { return };
        for &page in extent.pages.iter().chain(extent.tail.as_ref().map(|chunk| &chunk.page)) {
            let offset = page - region.first_page;
            region.next_unused = region.next_unused.max(offset + 1);
        }
        // Taken pages are collected in `free` for now (finish_restore turns it around).
        region.free.extend(&extent.pages);
        for &page in &extent.pages {
            let range = region.range_of(page);
            region.in_use[range] += 1;
        }
        self.pages_in_use[kind] += extent.pages.len() as u64;
        if let Some(chunk) = extent.tail {
            let page = self.chunk_pages.entry(chunk.page).or_insert_with(|| {
                self.pages_in_use[kind] += 1;
                let range = region.range_of(chunk.page);
                region.in_use[range] += 1;
                ChunkPage { scheme, class: chunk.class, used: 0, unreadable: false }
            });
            page.used |= 1 << chunk.slot;
        }
    }

    /// Ends a restore: every page below the highest taken one that no value holds is free, and
    /// chunk pages with a free slot take new chunks.
    pub fn finish_restore(&mut self) {
        for region in self.regions.iter_mut().flatten() {
            let mut taken: std::collections::HashSet<u64> =
                std::mem::take(&mut region.free).into_iter().collect();
            taken.extend(
                self.chunk_pages.keys().filter(|&&page| {
                    page >= region.first_page && page - region.first_page < region.page_count
                }),
            );
            region.free = (0..region.next_unused)
                .map(|offset| region.first_page + offset)
                .filter(|page| !taken.contains(page))
                .collect();
        }
        let mut partial: Vec<(u64, Scheme, u8)> = self
            .chunk_pages
            .iter()
            .filter(|(_, page)| page.used.count_ones() < u32::from(slots_of(page.class)))
            .map(|(&number, page)| (number, page.scheme, page.class))
            .collect();
        partial.sort_unstable();
        for (page, scheme, class) in partial {
            self.classes[Self::class_index(scheme, class)].partial.push(page);
        }
    }

    /// Whether a chunk page holds live chunks other than `except`.
    pub fn chunk_page_shared(&self, page: u64, except: Chunk) -> bool {
        self.chunk_pages.get(&page).is_some_and(|chunk_page| chunk_page.used & !(1 << except.slot) != 0)
    }

    pub fn is_chunk_page(&self, page: u64) -> bool {
        self.chunk_pages.contains_key(&page)
    }

    /// Node bytes the allocated pages take, by region (page bytes times the region's
    /// overhead is the caller's business).
    pub fn chunk_pages_count(&self) -> usize {
        self.chunk_pages.len()
    }
}

impl Default for Space {
    fn default() -> Space {
        Space::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cut_a_page_evenly_from_the_chunk_minimum_to_the_chunk_limit() {
        let sizes = class_sizes();
        assert_eq!((sizes[0], *sizes.last().unwrap()), (64, CHUNK_MAX_BYTES));
        assert!(sizes.len() < 64, "classes fit in the chunk bitmap's count");
        for pair in sizes.windows(2) {
            assert!(pair[1] > pair[0], "{pair:?}");
        }
        for (class, &size) in sizes.iter().enumerate() {
            let slots = usize::from(slots_of(class as u8));
            assert!(slots * size <= PAGE_BYTES && PAGE_BYTES - slots * size < size.max(8 * slots), "{size}");
        }
        assert_eq!(class_bytes(class_for(1024)), 1024, "1 KiB values go four to a page");
        assert_eq!(class_bytes(class_for(1025)), 1360);
    }

    #[test]
    fn values_take_whole_pages_and_a_chunk_for_the_tail() {
        let mut space = Space::new();
        space.add_region(RegionKind::Ec, 1000, 100);
        let (extent, fresh) = space.allocate(Scheme::Ec, 3 * 4096 + 100).unwrap();
        assert_eq!(extent.pages.len(), 3);
        let tail = extent.tail.unwrap();
        assert!(fresh && class_bytes(tail.class) >= 100 && class_bytes(tail.class) < 130);
        let (second, fresh) = space.allocate(Scheme::Eor, 100).unwrap();
        assert!(fresh, "EOR chunks do not share EC's chunk pages");
        assert_ne!(second.tail.unwrap().page, tail.page);
        let (third, fresh) = space.allocate(Scheme::Ec, 101).unwrap();
        assert!(!fresh);
        assert_eq!(third.tail.unwrap().page, tail.page);
        let (big_tail, _) = space.allocate(Scheme::Ec, 4096 + 3000).unwrap();
        assert_eq!((big_tail.pages.len(), big_tail.tail), (2, None));
        assert_eq!(space.pages_in_use(RegionKind::Ec), 3 + 1 + 1 + 2);
    }

    #[test]
    fn pages_ever_used_is_the_high_water_mark_of_handed_out_pages() {
        let mut space = Space::new();
        space.add_region(RegionKind::None, 0, 64);
        let (first, _) = space.allocate(Scheme::None, 3 * PAGE_BYTES).expect("room");
        assert_eq!(space.pages_ever_used(), 3);
        space.free_pages(Scheme::None, &first.pages);
        let (again, _) = space.allocate(Scheme::None, 2 * PAGE_BYTES).expect("room");
        assert_eq!(space.pages_ever_used(), 3, "freed pages are handed out again first");
        space.allocate(Scheme::None, 2 * PAGE_BYTES).expect("room");
        assert_eq!(space.pages_ever_used(), 4);
        assert_eq!(again.pages.len(), 2);
    }

    #[test]
    fn freed_space_is_reused_and_a_full_region_takes_nothing() {
        let mut space = Space::new();
        space.add_region(RegionKind::Rep2, 0, 4);
        let (a, _) = space.allocate(Scheme::Rep2, 3 * 4096).unwrap();
        assert_eq!(space.allocate(Scheme::Rep2, 2 * 4096), Err(SpaceError::Full));
        let (small, _) = space.allocate(Scheme::Rep2, 10).unwrap();
        assert_eq!(space.allocate(Scheme::Rep2, 4096), Err(SpaceError::Full));
        space.free_chunk(Scheme::Rep2, small.tail.unwrap());
        space.free_pages(Scheme::Rep2, &a.pages);
        assert_eq!(space.pages_in_use(RegionKind::Rep2), 0);
        assert!(space.allocate(Scheme::Rep2, 4 * 4096).is_ok());
        assert_eq!(space.allocate(Scheme::None, 1), Err(SpaceError::NotOffered));
    }

    #[test]
    fn a_page_that_could_not_be_read_takes_no_new_chunk() {
        let mut space = Space::new();
        space.add_region(RegionKind::None, 0, 4);
        let chunks: Vec<Chunk> =
            (0..3).map(|_| space.allocate(Scheme::None, 64).unwrap().0.tail.unwrap()).collect();
        space.free_chunk(Scheme::None, chunks[1]);
        let (again, fresh) = space.allocate(Scheme::None, 64).unwrap();
        let again = again.tail.unwrap();
        assert_eq!((again.page, again.slot, fresh), (chunks[0].page, 1, false));
        let (moved, fresh) = space.move_chunk(Scheme::None, again).unwrap();
        assert!(fresh && moved.page != chunks[0].page);
        for _ in 0..10 {
            let chunk = space.allocate(Scheme::None, 64).unwrap().0.tail.unwrap();
            assert_ne!(chunk.page, chunks[0].page, "the unreadable page takes no chunk");
        }
        space.free_chunk(Scheme::None, chunks[0]);
        space.free_chunk(Scheme::None, chunks[2]);
        assert!(!space.is_chunk_page(chunks[0].page), "emptied, the page goes back to the region");
    }

    #[test]
    fn a_full_chunk_page_comes_back_to_the_partial_list_when_a_chunk_is_freed() {
        let mut space = Space::new();
        space.add_region(RegionKind::None, 0, 2);
        let chunks: Vec<Chunk> =
            (0..64).map(|_| space.allocate(Scheme::None, 64).unwrap().0.tail.unwrap()).collect();
        assert!(chunks.iter().all(|chunk| chunk.page == chunks[0].page));
        let next = space.allocate(Scheme::None, 64).unwrap().0.tail.unwrap();
        assert_ne!(next.page, chunks[0].page);
        space.free_chunk(Scheme::None, chunks[5]);
        let reused = space.allocate(Scheme::None, 60).unwrap().0.tail.unwrap();
        assert_eq!((reused.page, reused.slot), (chunks[5].page, 5));
    }
}
