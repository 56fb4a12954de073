//! The pager's own memory: buffers it reads and writes itself (staging pages, the fetch buffer,
//! a page of zeros), never managed, and the free list of staging pages.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::pager::{DISCARD_BATCH, PAGE};

/// A private buffer of the pager: pages it reads and writes itself, never managed.
pub struct Buffer {
    base: *mut u8,
    bytes: usize,
}

impl Buffer {
    pub fn new(bytes: usize) -> io::Result<Buffer> {
        // SAFETY: a fresh private anonymous mapping.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Buffer { base: base.cast(), bytes })
    }

    pub fn range(&self) -> (u64, u64) {
        (self.base as u64, self.base as u64 + self.bytes as u64)
    }

    pub fn address(&self, page: usize) -> u64 {
        self.base as u64 + page as u64 * PAGE
    }

    /// Page `page` of the buffer, which must be present (written by the pager or moved in).
    pub fn page(&self, page: usize) -> &[u8] {
        assert!((page + 1) * PAGE as usize <= self.bytes);
        // SAFETY: in bounds (checked above) of a mapping this pager owns for its whole life.
        unsafe { std::slice::from_raw_parts(self.base.add(page * PAGE as usize), PAGE as usize) }
    }

    pub fn pages_mut(&mut self, first: usize, count: usize) -> &mut [u8] {
        assert!((first + count) * PAGE as usize <= self.bytes);
        // SAFETY: as above, and `&mut self` makes it the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(first * PAGE as usize), count * PAGE as usize) }
    }

    /// Gives the page's memory back (the next move into it finds it missing).
    fn discard(&self, page: usize) {
        // SAFETY: a page of this pager's own mapping; nothing refers to its bytes any more.
        unsafe {
            libc::madvise(self.base.add(page * PAGE as usize).cast(), PAGE as usize, libc::MADV_DONTNEED)
        };
    }

    /// Gives the memory of `pages` back with one call, so with one TLB flush: a flush reaches
    /// every CPU that runs the process (an interrupt to the program's vCPU), and one madvise per
    /// page made one per page. process_madvise on the process itself takes any advice since
    /// Linux 6.13 and flushes once per call since 6.16; where it fails, `pidfd` is dropped and
    /// pages go one madvise each from then on.
    pub fn discard_many(&self, pidfd: &mut Option<OwnedFd>, pages: &[u32]) {
        if let Some(fd) = pidfd {
            let mut vector = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; DISCARD_BATCH];
            if pages.len() <= vector.len() {
                for (entry, &page) in vector.iter_mut().zip(pages) {
                    assert!((page as usize + 1) * PAGE as usize <= self.bytes);
                    // SAFETY: in bounds (checked above) of this pager's own mapping.
                    entry.iov_base = unsafe { self.base.add(page as usize * PAGE as usize) }.cast();
                    entry.iov_len = PAGE as usize;
                }
                // SAFETY: `vector` holds `pages.len()` valid entries, each a page of this pager's
                // own mapping that nothing refers to any more; the call reads the vector only.
                let advised = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        fd.as_raw_fd(),
                        vector.as_ptr(),
                        pages.len(),
                        libc::MADV_DONTNEED,
                        0,
                    )
                };
                if advised == (pages.len() as u64 * PAGE) as i64 {
                    return;
                }
                *pidfd = None;
            }
        }
        for &page in pages {
            self.discard(page as usize);
        }
    }
}

/// A pidfd of this process, for process_madvise (`Buffer::discard_many`), if the kernel has
/// pidfd_open (5.3).
pub fn own_pidfd() -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    // SAFETY: a descriptor the kernel just gave us and nobody else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The free staging pages, one bit each: a page, or a run of consecutive pages for a run of
/// evictions moved by one UFFDIO_MOVE (one TLB flush for the run).
pub struct StagingFree {
    words: Vec<u64>,
    pages: usize,
    free: usize,
}

impl StagingFree {
    /// Every one of `pages` staging pages free.
    pub fn new(pages: usize) -> StagingFree {
        let mut words = vec![u64::MAX; pages.div_ceil(64)];
        if !pages.is_multiple_of(64) {
            *words.last_mut().expect("at least one word") = (1u64 << (pages % 64)) - 1;
        }
        StagingFree { words, pages, free: pages }
    }

    pub fn is_empty(&self) -> bool {
        self.free == 0
    }

    /// A free page, the lowest.
    pub fn take(&mut self) -> Option<u32> {
        let (index, word) = self.words.iter().enumerate().find(|(_, word)| **word != 0)?;
        let page = index * 64 + word.trailing_zeros() as usize;
        self.words[index] &= !(1u64 << (page % 64));
        self.free -= 1;
        Some(page as u32)
    }

    /// `count` consecutive free pages, the lowest such run: its first page.
    pub fn take_run(&mut self, count: usize) -> Option<u32> {
        assert!(count >= 1);
        if self.free < count {
            return None;
        }
        let (mut start, mut length) = (0, 0);
        let mut page = 0;
        while page < self.pages {
            let word = self.words[page / 64];
            if page % 64 == 0 && word == 0 {
                (length, page) = (0, page + 64);
                continue;
            }
            if word & (1u64 << (page % 64)) == 0 {
                length = 0;
            } else {
                if length == 0 {
                    start = page;
                }
                length += 1;
                if length == count {
                    for taken in start..start + count {
                        self.words[taken / 64] &= !(1u64 << (taken % 64));
                    }
                    self.free -= count;
                    return Some(start as u32);
                }
            }
            page += 1;
        }
        None
    }

    /// `page` is free again (it was taken).
    pub fn give(&mut self, page: u32) {
        let page = page as usize;
        assert!(
            page < self.pages && self.words[page / 64] & (1u64 << (page % 64)) == 0,
            "staging page {page} freed twice"
        );
        self.words[page / 64] |= 1u64 << (page % 64);
        self.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::StagingFree;

    #[test]
    fn runs_are_consecutive_free_pages_and_every_page_is_taken_once() {
        let mut free = StagingFree::new(130);
        assert_eq!(free.take_run(3), Some(0));
        assert_eq!(free.take(), Some(3));
        free.give(1);
        assert_eq!(free.take_run(2), Some(4), "page 1 alone is no run of two");
        assert_eq!(free.take(), Some(1));
        let mut taken = vec![0, 2, 3, 4, 5, 1];
        while let Some(page) = free.take() {
            taken.push(page);
        }
        taken.sort_unstable();
        assert_eq!(taken, (0..130).collect::<Vec<u32>>(), "each page once");
        assert!(free.is_empty() && free.take_run(1).is_none());
        free.give(64);
        free.give(63);
        assert_eq!(free.take_run(2), Some(63), "a run across two words");
        free.give(129);
        assert_eq!(free.take_run(2), None);
        assert_eq!(free.take_run(1), Some(129));
    }
}
