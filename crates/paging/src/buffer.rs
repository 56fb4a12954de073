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
    pub fn discard(&self, page: usize) {
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
