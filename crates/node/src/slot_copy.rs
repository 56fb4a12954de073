//! Copies between connection buffers and slab slots, word by word through relaxed atomics.
//!
//! Why atomics: one client may hold several connections, so a slot can be written by one thread
//! while another thread copies it out (or a fault flips a bit in it). Plain `memcpy` on both sides
//! would be a data race in the Rust memory model; relaxed `AtomicU64` loads and stores are not,
//! compile to plain moves, and still let a racing reader see a torn mix of two writes. The torn
//! case is the documented one (slab module docs): the end-to-end checksum turns it into an
//! erasure at the client.
//!
//! Invariant: every slot starts 8-byte aligned and is a multiple of 8 bytes long (slabs are page
//! aligned and splits are powers of two of at least 64 bytes), which the functions assert.

use std::sync::atomic::{AtomicU64, Ordering};

const WORD: usize = std::mem::size_of::<u64>();

/// Copies `source` into the slot memory at `slot`.
///
/// # Safety
/// `slot..slot + source.len()` must be valid for writes, 8-byte aligned, and stay mapped for the
/// whole call; every other access to those bytes must be atomic (this module) too.
pub unsafe fn copy_to_slot(source: &[u8], slot: *mut u8) {
    assert!(slot.cast::<u64>().is_aligned() && source.len().is_multiple_of(WORD), "slots are word aligned");
    for (index, chunk) in source.chunks_exact(WORD).enumerate() {
        let word = u64::from_ne_bytes(chunk.try_into().expect("chunks_exact yields words"));
        // SAFETY: index * 8 + 8 <= source.len(), so the word lies inside the slot the caller
        // vouches for; it is aligned because the slot is; all concurrent accesses are atomic.
        let target = unsafe { AtomicU64::from_ptr(slot.cast::<u64>().add(index)) };
        target.store(word, Ordering::Relaxed);
    }
}

/// Copies the slot memory at `slot` into `target` (`target.len()` bytes).
///
/// # Safety
/// As for [`copy_to_slot`], with `slot..slot + target.len()` valid for reads.
pub unsafe fn copy_from_slot(slot: *const u8, target: &mut [u8]) {
    assert!(slot.cast::<u64>().is_aligned() && target.len().is_multiple_of(WORD), "slots are word aligned");
    for (index, chunk) in target.chunks_exact_mut(WORD).enumerate() {
        // SAFETY: as in `copy_to_slot`; `from_ptr` needs a `*mut`, but the word is only loaded.
        let source = unsafe { AtomicU64::from_ptr(slot.cast::<u64>().cast_mut().add(index)) };
        chunk.copy_from_slice(&source.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Flips bit `bit` (counted from the slot's first byte, least significant bit first) of the slot.
///
/// # Safety
/// As for [`copy_to_slot`], with `bit / 8` inside the slot.
pub unsafe fn flip_bit(slot: *mut u8, bit: usize) {
    assert!(slot.cast::<u64>().is_aligned(), "slots are word aligned");
    let byte = bit / 8;
    let word_index = byte / WORD;
    // Build the mask in memory order so the same byte flips on any endianness.
    let mut mask = [0u8; WORD];
    mask[byte % WORD] = 1 << (bit % 8);
    // SAFETY: the byte, hence its aligned word, lies inside the slot the caller vouches for.
    let word = unsafe { AtomicU64::from_ptr(slot.cast::<u64>().add(word_index)) };
    word.fetch_xor(u64::from_ne_bytes(mask), Ordering::Relaxed);
}
