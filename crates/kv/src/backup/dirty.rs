//! The pages of the backup region changed since they were last copied to remote memory
//! (`remem kv --etcd`: the region's working copy is local, its durable copy a remem region,
//! `crate::cache::mirror`), and the frees held back until the records they make way for are
//! copied.
//!
//! Why frees wait: an update writes the new record into one slot and frees the old one, maybe
//! on another page. The pages of one copy-out are not written atomically together, so a kill
//! in the middle may leave the page of the free new and the page of the new record old: the
//! key would have neither record. So a free is applied (its state word stored, its page made
//! dirty) only after every page dirty before it has been copied ([`Dirty::take_frees`] between
//! the two phases of `Cache::durability_barrier`): a cut copy-out then leaves the old record
//! or the new one, or both (the higher sequence number wins), never neither.

use super::Slot;

/// Dirty pages (4 KiB, by index in the region file) and frees not yet applied.
#[derive(Debug, Default)]
pub struct Dirty {
    /// One bit per page: set while the page is listed in `pages`.
    marked: Vec<u64>,
    pages: Vec<u64>,
    frees: Vec<Slot>,
}

pub const PAGE_BYTES: u64 = 4096;

impl Dirty {
    /// Tracking for a region of `bytes`.
    pub fn new(bytes: u64) -> Dirty {
        let pages = bytes.div_ceil(PAGE_BYTES);
        Dirty { marked: vec![0; pages.div_ceil(64) as usize], pages: Vec::new(), frees: Vec::new() }
    }

    /// The bytes `offset..offset + len` changed.
    pub fn touch(&mut self, offset: u64, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / PAGE_BYTES;
        let last = (offset + len as u64 - 1) / PAGE_BYTES;
        for page in first..=last {
            let (word, bit) = ((page / 64) as usize, page % 64);
            assert!(word < self.marked.len(), "a change beyond the region");
            if self.marked[word] & (1 << bit) == 0 {
                self.marked[word] |= 1 << bit;
                self.pages.push(page);
            }
        }
    }

    /// Moves the dirty pages into `out` (in the order they were first changed) and clears them.
    pub fn take_pages(&mut self, out: &mut Vec<u64>) {
        for &page in &self.pages {
            self.marked[(page / 64) as usize] &= !(1 << (page % 64));
        }
        out.append(&mut self.pages);
    }

    pub fn defer_free(&mut self, slot: Slot) {
        self.frees.push(slot);
    }

    /// The frees held back, to apply now.
    pub fn take_frees(&mut self, out: &mut Vec<Slot>) {
        out.append(&mut self.frees);
    }

    pub fn has_frees(&self) -> bool {
        !self.frees.is_empty()
    }

    pub fn is_clean(&self) -> bool {
        self.pages.is_empty() && self.frees.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_pages_are_listed_once_and_cleared_when_taken() {
        let mut dirty = Dirty::new(10 * PAGE_BYTES);
        dirty.touch(4090, 10);
        dirty.touch(4096, 1);
        dirty.touch(9 * PAGE_BYTES, 4096);
        let mut out = Vec::new();
        dirty.take_pages(&mut out);
        assert_eq!(out, vec![0, 1, 9]);
        assert!(dirty.is_clean());
        out.clear();
        dirty.touch(4096, 1);
        dirty.take_pages(&mut out);
        assert_eq!(out, vec![1], "a page taken is listed again when touched again");
    }
}
