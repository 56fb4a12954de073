//! The shared-memory transport: splits of an exported slab read and written with plain loads and
//! stores into the node's memfd, mapped here (`docs/SHM.md`). The node's CPU is not on this path;
//! map, unmap, eviction notices and rebuilds stay on the node's Unix socket.
//!
//! Trust: the node is authenticated (cluster secret) before it can hand us a memfd, but what
//! arrives is still checked as hostile: exactly one descriptor with the `SlabExported` frame, a
//! memfd sealed against shrinking (so it can never be truncated under our mapping, which would
//! turn a load into SIGBUS), exactly as long as the layout the message names, which must be the
//! layout the client computes itself, and a header that names this client as owner, the slab id
//! asked for and the epoch of the message, not revoked.
//!
//! Ordering (the argument, also in docs/SHM.md). Per slot, the writer (this client; the node only
//! for a rebuild, which never targets an exported slab) stores the payload words (relaxed), then
//! the checksum (relaxed), then the version with Release. A reader loads the version with
//! Acquire (v1), the checksum, copies the payload words (relaxed), issues an Acquire fence and
//! loads the version again (v2). If v1 != v2 a write overlapped: the split is an erasure. If
//! v1 == v2 the payload may still mix two writes (a writer that had stored payload words but not
//! yet its version, or several writes that wrapped the one-byte version): then the checksum
//! either belongs to another payload or binds another version, so `split_checksum(payload, v1,
//! page, split)` fails and the split is an erasure. Only a copy whose checksum matches is used,
//! exactly as on the socket path; a torn combination is never data (up to CRC32C collisions,
//! the same bound as the socket path). All accesses are atomics through raw pointers, never Rust
//! references to shared memory, so a racing peer is not undefined behaviour here.
//!
//! Revocation: the node sets the header's `revoked` flag before it punches the memory out. A
//! writer issues a SeqCst fence after publishing its version and then loads the flag: a store
//! that may have landed after the punch is reported as failed, never as acknowledged. A reader
//! checks the flag after its copy. Either way the slab is then dropped (unmapped) for good.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};

use remem_proto::shm::{
    ShmLayout, SHM_HEADER_EPOCH, SHM_HEADER_LAYOUT_VERSION, SHM_HEADER_MAGIC, SHM_HEADER_OWNER,
    SHM_HEADER_REVOKED, SHM_HEADER_SLAB_BYTES, SHM_HEADER_SLAB_ID, SHM_HEADER_SLOTS, SHM_HEADER_SPLIT_BYTES,
    SHM_LAYOUT_VERSION, SHM_MAGIC,
};
use remem_proto::SplitMeta;

/// Most descriptors kept between a `recvmsg` and the `SlabExported` frame they belong to.
pub(super) const MAX_PENDING_FDS: usize = 4;
const WORD: usize = std::mem::size_of::<u64>();

/// What the client expects of an exported slab before it maps it.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub owner_client_id: u64,
    pub slab_id: u32,
    pub epoch: u64,
    pub layout: ShmLayout,
}

/// Why an exported slab was refused (the slab then stays on the socket path).
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("the memfd is not what SlabExported describes: {0}")]
    Mismatch(&'static str),
    #[error("system call failed: {0}")]
    Io(#[from] io::Error),
}

/// One exported slab mapped into this process; unmapped on drop.
pub struct ShmSlab {
    base: NonNull<u8>,
    layout: ShmLayout,
    pub node: usize,
    pub slab_id: u32,
    pub epoch: u64,
}

// SAFETY: `base` is a shared mapping owned by this value and unmapped only in `Drop`; every
// access goes through atomics on raw pointers (module docs), so moving the value to another
// thread is sound.
unsafe impl Send for ShmSlab {}
// SAFETY: as for `Send`: `&self` methods only perform atomic accesses.
unsafe impl Sync for ShmSlab {}

impl std::fmt::Debug for ShmSlab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmSlab")
            .field("node", &self.node)
            .field("slab_id", &self.slab_id)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl ShmSlab {
    /// Checks `memfd` against `expected` and maps it. The descriptor is closed on return either
    /// way (the mapping keeps the memory).
    pub fn map(memfd: OwnedFd, node: usize, expected: Expected) -> Result<ShmSlab, ShmError> {
        let layout = expected.layout;
        if ShmLayout::new(layout.slab_bytes, layout.split_bytes) != Some(layout) {
            return Err(ShmError::Mismatch("layout"));
        }
        let fd = memfd.as_raw_fd();
        // SAFETY: fstat fills a stat buffer we own; the descriptor is ours.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(ShmError::Mismatch("not a regular file"));
        }
        if u64::try_from(stat.st_size).ok() != Some(layout.total_bytes) {
            return Err(ShmError::Mismatch("file size"));
        }
        // SAFETY: fcntl on our own descriptor.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(ShmError::Mismatch("memfd not sealed against shrinking"));
        }
        let len = usize::try_from(layout.total_bytes).map_err(|_| ShmError::Mismatch("size"))?;
        // SAFETY: a fresh shared mapping of a file that is exactly `len` bytes and can no longer
        // shrink, so every byte of the mapping stays backed; checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        let slab = ShmSlab {
            base: NonNull::new(base.cast()).expect("mmap never returns null on success"),
            layout,
            node,
            slab_id: expected.slab_id,
            epoch: expected.epoch,
        };
        slab.check_header(expected)?;
        Ok(slab)
    }

    fn check_header(&self, expected: Expected) -> Result<(), ShmError> {
        let layout = self.layout;
        let checks: [(bool, &'static str); 9] = [
            (self.header_u64(SHM_HEADER_MAGIC).load(Ordering::Acquire) == SHM_MAGIC, "magic"),
            (
                self.header_u32(SHM_HEADER_LAYOUT_VERSION).load(Ordering::Relaxed) == SHM_LAYOUT_VERSION,
                "version",
            ),
            (self.header_u64(SHM_HEADER_EPOCH).load(Ordering::Relaxed) == expected.epoch, "epoch"),
            (self.header_u64(SHM_HEADER_OWNER).load(Ordering::Relaxed) == expected.owner_client_id, "owner"),
            (self.header_u32(SHM_HEADER_SLAB_ID).load(Ordering::Relaxed) == expected.slab_id, "slab id"),
            (
                self.header_u32(SHM_HEADER_SPLIT_BYTES).load(Ordering::Relaxed) == layout.split_bytes,
                "split size",
            ),
            (self.header_u32(SHM_HEADER_SLOTS).load(Ordering::Relaxed) == layout.slots, "slots"),
            (
                self.header_u64(SHM_HEADER_SLAB_BYTES).load(Ordering::Relaxed) == layout.slab_bytes,
                "slab size",
            ),
            (!self.is_revoked(), "revoked"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err(ShmError::Mismatch(what)),
            None => Ok(()),
        }
    }

    pub fn is_revoked(&self) -> bool {
        self.header_u32(SHM_HEADER_REVOKED).load(Ordering::Acquire) != 0
    }

    fn header_u64(&self, field: u64) -> &AtomicU64 {
        // SAFETY: the header lies inside the mapping (the layout was checked against the file
        // size), 64-aligned; u64 fields at multiples of 8; accessed only atomically.
        unsafe {
            AtomicU64::from_ptr(self.base.as_ptr().add((self.layout.header_offset + field) as usize).cast())
        }
    }

    fn header_u32(&self, field: u64) -> &AtomicU32 {
        // SAFETY: as in `header_u64`, u32 fields at multiples of 4.
        unsafe {
            AtomicU32::from_ptr(self.base.as_ptr().add((self.layout.header_offset + field) as usize).cast())
        }
    }

    fn version(&self, slot: u32) -> &AtomicU8 {
        assert!(slot < self.layout.slots);
        // SAFETY: inside the versions array of the mapping; accessed only atomically.
        unsafe {
            AtomicU8::from_ptr(self.base.as_ptr().add(self.layout.versions_offset as usize + slot as usize))
        }
    }

    fn checksum(&self, slot: u32) -> &AtomicU32 {
        assert!(slot < self.layout.slots);
        let offset = self.layout.checksums_offset as usize + 4 * slot as usize;
        // SAFETY: inside the checksums array, 4-aligned (it starts at slab_bytes, a multiple of
        // 4 KiB, in a page-aligned mapping); accessed only atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn slot_words(&self, slot: u32) -> *mut u64 {
        assert!(slot < self.layout.slots);
        // SAFETY: slot < slots keeps the split inside the slab bytes; splits are >= 64 bytes and
        // powers of two, so 8-aligned.
        unsafe { self.base.as_ptr().add(slot as usize * self.layout.split_bytes as usize).cast() }
    }

    /// Asks the CPU to start loading a slot's cache lines and metadata. An EC page touches k+r
    /// slabs, so k+r cold pages of memory; prefetching all of them before the first copy
    /// overlaps those misses instead of paying them one after another.
    pub fn prefetch(&self, slot: u32) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let words = self.slot_words(slot).cast::<i8>();
            let version = (self.version(slot) as *const AtomicU8).cast::<i8>();
            let checksum = (self.checksum(slot) as *const AtomicU32).cast::<i8>();
            // SAFETY: SSE is part of the x86_64 baseline, and a prefetch never faults nor changes
            // memory; the addresses lie inside our mapping anyway.
            unsafe {
                for line in (0..self.layout.split_bytes as usize).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(words.wrapping_add(line).cast_const());
                }
                _mm_prefetch::<_MM_HINT_T0>(version);
                _mm_prefetch::<_MM_HINT_T0>(checksum);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// Stores one split and publishes it (see the module's ordering comment). Returns false if
    /// the slab was revoked: the store may have landed in punched-out memory and is not stored.
    pub fn write_split(&self, slot: u32, payload: &[u8], meta: SplitMeta) -> bool {
        assert_eq!(payload.len(), self.layout.split_bytes as usize, "payload is one split");
        let words = self.slot_words(slot);
        // SAFETY: `words` is the slot's first byte in our mapping, split_bytes long (a multiple
        // of 64), and `payload` is split_bytes long (asserted).
        unsafe { copy_to_shared(payload, words) };
        self.checksum(slot).store(meta.checksum, Ordering::Relaxed);
        self.version(slot).store(meta.version, Ordering::Release);
        // Store-load order: the version must be visible before we look at the flag, so that a
        // revocation we do not see happened after our store became visible to the node.
        fence(Ordering::SeqCst);
        !self.is_revoked()
    }

    /// Copies one split into `target` and returns its metadata, or `None` if a write overlapped
    /// the copy or the slab was revoked (an erasure either way). The caller still verifies the
    /// checksum: a copy that mixes two writes with one version is caught only there.
    pub fn read_split(&self, slot: u32, target: &mut [u8]) -> Option<SplitMeta> {
        assert_eq!(target.len(), self.layout.split_bytes as usize, "target is one split");
        let version = self.version(slot).load(Ordering::Acquire);
        let checksum = self.checksum(slot).load(Ordering::Relaxed);
        let words = self.slot_words(slot);
        // SAFETY: as in `write_split`; loads only.
        unsafe { copy_from_shared(words, target) };
        fence(Ordering::Acquire);
        let again = self.version(slot).load(Ordering::Relaxed);
        if again != version || self.is_revoked() {
            return None;
        }
        Some(SplitMeta { version, checksum })
    }
}

/// Copies `target.len()` bytes (a multiple of 64) out of shared memory at `words`.
///
/// With AVX, 32-byte loads in an `asm!` loop: with 8-byte atomic loads an EC(8,2) page is 1024
/// load and store instructions, and the CPU's reorder window no longer reaches the next splits'
/// loads, so their cache misses are paid one after another instead of together (a page gathered
/// from 8 scattered splits took 1.4 us with word loads and 0.87 us with 32-byte loads, cold, on
/// these machines; a contiguous page 0.84 against 0.69 us). The loads inside `asm!` are outside
/// the Rust memory model, so a racing writer is not undefined behaviour; they are ordinary x86
/// loads, which the CPU keeps in order with the version loads around them (TSO: loads are not
/// reordered with other loads), and the asm block is a compiler barrier for memory. Without AVX:
/// relaxed 8-byte atomic loads.
///
/// # Safety
/// `words` must point at `target.len()` readable bytes of a live mapping, 8-aligned.
unsafe fn copy_from_shared(words: *const u64, target: &mut [u8]) {
    debug_assert!(target.len().is_multiple_of(64));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present; the caller's contract covers the source, `target` the rest.
        unsafe { copy_lines_avx(words.cast(), target.as_mut_ptr(), target.len()) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { load_words(words, target) }
}

/// [`copy_from_shared`] without AVX: relaxed 8-byte atomic loads.
///
/// # Safety
/// As [`copy_from_shared`].
unsafe fn load_words(words: *const u64, target: &mut [u8]) {
    for (index, chunk) in target.chunks_exact_mut(WORD).enumerate() {
        // SAFETY: index < len / 8 keeps the word inside the caller's range; atomic access only.
        let word = unsafe { AtomicU64::from_ptr(words.add(index).cast_mut()) }.load(Ordering::Relaxed);
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
}

/// Copies `payload` (a multiple of 64 bytes) into shared memory at `words`: the stores of
/// [`copy_from_shared`], in program order (x86 keeps stores in order, and the asm block is a
/// compiler barrier), so the version the caller publishes afterwards follows them.
///
/// # Safety
/// `words` must point at `payload.len()` writable bytes of a live mapping, 8-aligned.
unsafe fn copy_to_shared(payload: &[u8], words: *mut u64) {
    debug_assert!(payload.len().is_multiple_of(64));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present; the caller's contract covers the target.
        unsafe { copy_lines_avx(payload.as_ptr(), words.cast(), payload.len()) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { store_words(payload, words) }
}

/// [`copy_to_shared`] without AVX: relaxed 8-byte atomic stores.
///
/// # Safety
/// As [`copy_to_shared`].
unsafe fn store_words(payload: &[u8], words: *mut u64) {
    for (index, chunk) in payload.chunks_exact(WORD).enumerate() {
        let word = u64::from_ne_bytes(chunk.try_into().expect("chunks_exact yields words"));
        // SAFETY: index < len / 8 keeps the word inside the caller's range; atomic access only.
        unsafe { AtomicU64::from_ptr(words.add(index)) }.store(word, Ordering::Relaxed);
    }
}

/// `bytes` (a nonzero multiple of 64) from `source` to `target`, 64 bytes an iteration in two
/// 32-byte loads then two stores. Written in `asm!` because a Rust copy that races a writer of
/// the other process would be undefined behaviour, and Rust has no wide atomic loads.
///
/// # Safety
/// Both ranges valid for `bytes`, not overlapping; AVX present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_lines_avx(source: *const u8, target: *mut u8, bytes: usize) {
    assert!(bytes > 0 && bytes.is_multiple_of(64), "whole lines");
    // SAFETY: the caller's contract; the loop reads and writes exactly `bytes` of each range.
    unsafe {
        std::arch::asm!(
            "2:",
            "vmovdqu {a}, ymmword ptr [{source}]",
            "vmovdqu {b}, ymmword ptr [{source} + 32]",
            "vmovdqu ymmword ptr [{target}], {a}",
            "vmovdqu ymmword ptr [{target} + 32], {b}",
            "add {source}, 64",
            "add {target}, 64",
            "sub {bytes}, 64",
            "jnz 2b",
            source = inout(reg) source => _,
            target = inout(reg) target => _,
            bytes = inout(reg) bytes => _,
            a = out(ymm_reg) _,
            b = out(ymm_reg) _,
            options(nostack),
        );
    }
}

impl Drop for ShmSlab {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`, unmapped only here; no pointer into it
        // outlives `self` (accessors borrow `self`).
        let result = unsafe { libc::munmap(self.base.as_ptr().cast(), self.layout.total_bytes as usize) };
        debug_assert_eq!(result, 0, "munmap of our own mapping");
    }
}

/// One `recvmsg` on a Unix socket: bytes into `buf`, descriptors (SCM_RIGHTS) onto `fds`, at most
/// [`MAX_PENDING_FDS`] kept; extra ones are closed and counted as a protocol error by the caller
/// through the returned flag.
///
/// Returns (bytes read, whether descriptors were dropped or truncated).
pub(super) fn recv_with_fds(
    fd: RawFd,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<(usize, bool)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for a few descriptors; aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; its pointers are set to live buffers below.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg writes at most iov_len bytes into `buf` and msg_controllen into `control`.
    let received = unsafe { libc::recvmsg(fd, &mut message, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut dropped = message.msg_flags & libc::MSG_CTRUNC != 0;
    // SAFETY: walking the control messages the kernel wrote, with the libc macros, within
    // msg_controllen; each SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for index in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(index));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fds.len() < MAX_PENDING_FDS {
                        fds.push_back(owned);
                    } else {
                        dropped = true; // closed by dropping `owned`
                    }
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok((received as usize, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_proto::split_checksum;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;

    const CLIENT: u64 = 77;

    /// A memfd laid out and headed like a node's, for tests without a node.
    fn test_memfd(layout: ShmLayout, owner: u64, slab_id: u32, epoch: u64) -> OwnedFd {
        // SAFETY: plain system calls; results checked.
        unsafe {
            let raw = libc::memfd_create(c"remem-test".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert!(raw >= 0);
            let fd = OwnedFd::from_raw_fd(raw);
            assert_eq!(libc::ftruncate(raw, layout.total_bytes as libc::off_t), 0);
            assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW), 0);
            let mut header = [0u8; 64];
            header[0..8].copy_from_slice(&SHM_MAGIC.to_ne_bytes());
            header[8..12].copy_from_slice(&SHM_LAYOUT_VERSION.to_ne_bytes());
            header[16..24].copy_from_slice(&epoch.to_ne_bytes());
            header[24..32].copy_from_slice(&owner.to_ne_bytes());
            header[32..36].copy_from_slice(&slab_id.to_ne_bytes());
            header[36..40].copy_from_slice(&layout.split_bytes.to_ne_bytes());
            header[40..44].copy_from_slice(&layout.slots.to_ne_bytes());
            header[48..56].copy_from_slice(&layout.slab_bytes.to_ne_bytes());
            let written = libc::pwrite(raw, header.as_ptr().cast(), 64, layout.header_offset as libc::off_t);
            assert_eq!(written, 64);
            fd
        }
    }

    fn duplicate(fd: &OwnedFd) -> OwnedFd {
        fd.try_clone().expect("dup")
    }

    fn expected(layout: ShmLayout) -> Expected {
        Expected { owner_client_id: CLIENT, slab_id: 3, epoch: 9, layout }
    }

    #[test]
    fn a_slab_of_another_owner_slab_id_epoch_or_size_is_refused() {
        let layout = ShmLayout::new(64 * 1024, 512).unwrap();
        let memfd = test_memfd(layout, CLIENT, 3, 9);
        assert!(ShmSlab::map(duplicate(&memfd), 0, expected(layout)).is_ok());
        for (wrong, what) in [
            (Expected { owner_client_id: CLIENT + 1, ..expected(layout) }, "owner"),
            (Expected { slab_id: 4, ..expected(layout) }, "slab id"),
            (Expected { epoch: 10, ..expected(layout) }, "epoch"),
        ] {
            match ShmSlab::map(duplicate(&memfd), 0, wrong) {
                Err(ShmError::Mismatch(found)) => assert_eq!(found, what),
                other => panic!("{what}: {other:?}"),
            }
        }
        let bigger = ShmLayout::new(128 * 1024, 512).unwrap();
        assert!(matches!(
            ShmSlab::map(duplicate(&memfd), 0, expected(bigger)),
            Err(ShmError::Mismatch("file size"))
        ));
    }

    /// The AVX copy and the word copy move exactly the same bytes, both ways, for every split
    /// size from 64 bytes to 4 KiB.
    #[test]
    fn both_copies_move_the_same_bytes() {
        for bytes in [64usize, 128, 512, 1024, 4096] {
            let source: Vec<u64> =
                (0..bytes as u64 / 8).map(|word| word.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            let mut by_words = vec![0u8; bytes];
            let mut by_default = vec![0u8; bytes];
            // SAFETY: `source` holds `bytes` bytes, 8-aligned.
            unsafe {
                load_words(source.as_ptr(), &mut by_words);
                copy_from_shared(source.as_ptr(), &mut by_default);
            }
            assert_eq!(by_words, by_default, "{bytes} bytes loaded");
            let expected: Vec<u8> = source.iter().flat_map(|word| word.to_ne_bytes()).collect();
            assert_eq!(by_words, expected, "{bytes} bytes loaded");
            let (mut stored_words, mut stored_default) = (vec![0u64; bytes / 8], vec![0u64; bytes / 8]);
            // SAFETY: both targets hold `bytes` bytes, 8-aligned.
            unsafe {
                store_words(&expected, stored_words.as_mut_ptr());
                copy_to_shared(&expected, stored_default.as_mut_ptr());
            }
            assert_eq!(stored_words, source, "{bytes} bytes stored");
            assert_eq!(stored_default, source, "{bytes} bytes stored");
        }
    }

    #[test]
    fn a_revoked_slab_refuses_writes_and_reads() {
        let layout = ShmLayout::new(64 * 1024, 512).unwrap();
        let memfd = test_memfd(layout, CLIENT, 3, 9);
        let slab = ShmSlab::map(duplicate(&memfd), 0, expected(layout)).unwrap();
        let payload = vec![7u8; 512];
        let meta = SplitMeta { version: 1, checksum: split_checksum(&payload, 1, 5, 0) };
        assert!(slab.write_split(5, &payload, meta));
        let mut copy = vec![0u8; 512];
        assert_eq!(slab.read_split(5, &mut copy), Some(meta));
        assert_eq!(copy, payload);
        slab.header_u32(SHM_HEADER_REVOKED).store(1, Ordering::SeqCst);
        assert!(!slab.write_split(5, &payload, meta));
        assert_eq!(slab.read_split(5, &mut copy), None);
        // A revoked slab is never taken on again.
        assert!(matches!(ShmSlab::map(memfd, 0, expected(layout)), Err(ShmError::Mismatch("revoked"))));
    }

    /// A writer rewrites one slot with versions 1, 2, ... (wrapping), each a payload derived from
    /// its version, while readers copy it: every copy a reader accepts (same version around the
    /// copy and a matching checksum) must be exactly the payload of that version.
    #[test]
    fn concurrent_readers_accept_only_complete_versions() {
        let layout = ShmLayout::new(64 * 1024, 512).unwrap();
        let memfd = test_memfd(layout, CLIENT, 3, 9);
        let writer_slab = ShmSlab::map(duplicate(&memfd), 0, expected(layout)).unwrap();
        const SLOT: u32 = 17;
        const PAGE: u64 = 17;
        fn payload_of(version: u8, round: u32) -> Vec<u8> {
            (0..512u32).map(|byte| (byte.wrapping_mul(31) ^ round ^ u32::from(version)) as u8).collect()
        }
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let rejected = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let slab = ShmSlab::map(duplicate(&memfd), 0, expected(layout)).unwrap();
                let (stop, accepted, rejected) =
                    (Arc::clone(&stop), Arc::clone(&accepted), Arc::clone(&rejected));
                std::thread::spawn(move || {
                    let mut copy = vec![0u8; 512];
                    while !stop.load(Ordering::Relaxed) {
                        let verified = slab.read_split(SLOT, &mut copy).filter(|meta| {
                            meta.version != 0 && split_checksum(&copy, meta.version, PAGE, 2) == meta.checksum
                        });
                        match verified {
                            Some(meta) => {
                                // Byte 0 of a payload is round ^ version, so it names its write.
                                let round = u32::from(copy[0] ^ meta.version);
                                assert!(
                                    copy == payload_of(meta.version, round),
                                    "accepted a torn split of version {}",
                                    meta.version
                                );
                                accepted.fetch_add(1, Ordering::Relaxed);
                            }
                            None => {
                                rejected.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        let mut version = 0u8;
        for round in 0..200_000u32 {
            version = remem_proto::next_version(version);
            let payload = payload_of(version, round);
            let checksum = split_checksum(&payload, version, PAGE, 2);
            assert!(writer_slab.write_split(SLOT, &payload, SplitMeta { version, checksum }));
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.join().expect("a reader saw a torn split");
        }
        assert!(accepted.load(Ordering::Relaxed) > 0, "readers never accepted a split");
        eprintln!(
            "accepted {} complete splits, rejected {} torn or overlapped copies",
            accepted.load(Ordering::Relaxed),
            rejected.load(Ordering::Relaxed)
        );
    }
}
