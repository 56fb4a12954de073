//! The pager's own allocator: every allocation of the pager (and of the remem client it runs)
//! comes from one reserved mapping the pager never manages, so serving a fault never faults on
//! managed memory and never takes the program's malloc locks (a thread of the program may hold
//! one while it waits for the fault to be served).
//!
//! Written by hand because the job is narrow and the usual allocators do not fit it: blocks of
//! power-of-two sizes, bumped from one `MAP_NORESERVE` reservation and recycled through free
//! lists, under a spin lock (the pager's threads are the only users, and briefly). Memory is
//! never returned to the kernel: the pager's footprint is its peak, a few MiB.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering};

/// Reserved address space (not memory: pages are allocated when first touched).
const RESERVED_BYTES: usize = 16 << 30;
const CLASSES: usize = 40;

struct State {
    base: usize,
    next: usize,
    free: [usize; CLASSES],
}

struct Locked {
    busy: AtomicBool,
    state: std::cell::UnsafeCell<State>,
}

// SAFETY: `state` is only reached while `busy` is held (see `with`).
unsafe impl Sync for Locked {}

static ARENA: Locked = Locked {
    busy: AtomicBool::new(false),
    state: std::cell::UnsafeCell::new(State { base: 0, next: 0, free: [0; CLASSES] }),
};

impl Locked {
    fn with<T>(&self, work: impl FnOnce(&mut State) -> T) -> T {
        while self.busy.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        // SAFETY: the lock above is held until the store below, so this is the only reference.
        let result = work(unsafe { &mut *self.state.get() });
        self.busy.store(false, Ordering::Release);
        result
    }
}

fn class_of(layout: Layout) -> usize {
    let size = layout.size().max(layout.align()).max(16).next_power_of_two();
    size.trailing_zeros() as usize
}

impl State {
    fn reserve(&mut self) -> bool {
        if self.base != 0 {
            return true;
        }
        // SAFETY: a fresh private anonymous reservation; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RESERVED_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return false;
        }
        self.base = base as usize;
        self.next = self.base;
        true
    }
}

/// The pager's global allocator (`#[global_allocator]` of the preload library).
pub struct Arena;

impl Arena {
    /// The reserved range, `[start, end)`, reserving it now if it is not yet.
    pub fn range() -> Option<(u64, u64)> {
        ARENA.with(|state| state.reserve().then(|| (state.base as u64, (state.base + RESERVED_BYTES) as u64)))
    }
}

// SAFETY: blocks are disjoint (bumped once, then only recycled through their class's free
// list), at least `layout.size()` long and aligned to their power-of-two size, which is at least
// `layout.align()` (bumps align to the block size up to a page; larger alignments are refused).
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > 4096 {
            return std::ptr::null_mut();
        }
        let class = class_of(layout);
        if class >= CLASSES {
            return std::ptr::null_mut();
        }
        ARENA.with(|state| {
            let head = state.free[class];
            if head != 0 {
                // SAFETY: a freed block of this class holds the next free block in its first word.
                state.free[class] = unsafe { *(head as *const usize) };
                return head as *mut u8;
            }
            if !state.reserve() {
                return std::ptr::null_mut();
            }
            let size = 1usize << class;
            let start = state.next.next_multiple_of(size.min(4096));
            if start + size > state.base + RESERVED_BYTES {
                return std::ptr::null_mut();
            }
            state.next = start + size;
            start as *mut u8
        })
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let class = class_of(layout);
        ARENA.with(|state| {
            // SAFETY: the block is ours, at least 16 bytes and aligned: its first word is free.
            unsafe { *(block as *mut usize) = state.free[class] };
            state.free[class] = block as usize;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_disjoint_and_recycled() {
        let arena = Arena;
        let layout = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: test of the allocator's contract: blocks are used within their layout only.
        unsafe {
            let a = arena.alloc(layout);
            let b = arena.alloc(layout);
            assert!(!a.is_null() && !b.is_null());
            assert!((a as usize).abs_diff(b as usize) >= 128, "disjoint 128-byte blocks");
            std::ptr::write_bytes(a, 0xAB, 100);
            arena.dealloc(a, layout);
            assert_eq!(arena.alloc(layout), a, "a freed block is reused");
            let page = Layout::from_size_align(4096, 4096).unwrap();
            assert_eq!(arena.alloc(page) as usize % 4096, 0);
        }
        let (start, end) = Arena::range().unwrap();
        assert_eq!(end - start, RESERVED_BYTES as u64);
    }
}
