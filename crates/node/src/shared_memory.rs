//! The memory behind one slab: a memfd laid out as `remem_proto::shm::ShmLayout` says (split
//! bytes, per-slot checksums and versions, a 64-byte header), mapped shared and populated.
//!
//! Why a memfd: the same pages can be handed to the owning client over a Unix socket
//! (`ExportSlab`, SCM_RIGHTS), which then reads and writes splits with plain loads and stores
//! while this node's CPU stays off the data path (`docs/SHM.md`). A slab never exported costs the
//! same as anonymous memory.
//!
//! Fault model: the client that holds the fd may store anything into the mapping at any time, so
//! the node never trusts what it reads there (it never did: payloads and metadata are the
//! client's), and accesses it only through atomics (`slot_copy`, the metadata accessors), never
//! through Rust references. The memfd is sealed against shrinking and growing, so a client cannot
//! truncate it under the node (which would turn the node's next access into SIGBUS).
//!
//! Heap regions: [`Region::heap`] lays the same bytes out in zeroed process memory, with no memfd,
//! for a node core driven by the simulator (crates/simnet), which has no files and never exports.
//!
//! Revocation: [`Region::revoke`] sets the header's `revoked` flag and punches the whole file out
//! (FALLOC_FL_PUNCH_HOLE), so the memory returns to the OS at once even though the client still
//! maps it; the client sees the flag (or zeros, which fail the end-to-end checksum) and unmaps.

use remem_proto::shm::{
    ShmLayout, SHM_HEADER_EPOCH, SHM_HEADER_LAYOUT_VERSION, SHM_HEADER_MAGIC, SHM_HEADER_OWNER,
    SHM_HEADER_REVOKED, SHM_HEADER_SLAB_BYTES, SHM_HEADER_SLAB_ID, SHM_HEADER_SLOTS, SHM_HEADER_SPLIT_BYTES,
    SHM_LAYOUT_VERSION, SHM_MAGIC,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Who the slab belongs to, written into the header before the slab can be exported.
#[derive(Clone, Copy, Debug)]
pub struct HeaderFields {
    pub epoch: u64,
    pub owner_client_id: u64,
    pub slab_id: u32,
}

/// One slab's memfd and its shared mapping, unmapped and closed on drop; or the same layout in
/// zeroed heap memory (no memfd), freed on drop.
pub struct Region {
    /// `None` for a heap region.
    memfd: Option<OwnedFd>,
    base: NonNull<u8>,
    layout: ShmLayout,
}

/// Alignment of a heap region: a page, as a mapping has, so slots and metadata are aligned alike.
const HEAP_ALIGN_BYTES: usize = 4096;

// SAFETY: `base` points to a shared mapping owned by this value and unmapped only in `Drop`;
// every access to it goes through atomics (see the module docs), so the value may be shared and
// sent between threads.
unsafe impl Send for Region {}
// SAFETY: as for `Send`.
unsafe impl Sync for Region {}

impl Region {
    /// Creates, sizes, seals, allocates and maps a memfd for `layout`, with its header written.
    pub fn create(layout: ShmLayout, header: HeaderFields) -> io::Result<Region> {
        let len =
            usize::try_from(layout.total_bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a NUL-terminated name and valid flags; the result is checked before use.
        let raw = unsafe {
            libc::memfd_create(c"remem-slab".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = memfd.as_raw_fd();
        let total = layout.total_bytes as libc::off_t;
        // SAFETY: plain system calls on a descriptor we own; results are checked.
        unsafe {
            if libc::ftruncate(fd, total) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Allocate every page now, so the client is told "mapped" only for memory really held.
            if libc::fallocate(fd, 0, 0, total) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)
                != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: a shared mapping of `len` bytes of our own sealed memfd, no address hint; the
        // result is checked against MAP_FAILED. The file cannot shrink, so the mapping never
        // reaches past its end.
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
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).expect("mmap never returns null on success");
        let region = Region { memfd: Some(memfd), base, layout };
        region.write_header(header);
        Ok(region)
    }

    /// A region of `backing`: [`Region::create`] or [`Region::heap`].
    pub fn new(layout: ShmLayout, header: HeaderFields, backing: crate::core::Backing) -> io::Result<Region> {
        match backing {
            crate::core::Backing::Memfd => Region::create(layout, header),
            crate::core::Backing::Heap => Region::heap(layout, header),
        }
    }

    /// The same layout in zeroed heap memory, with its header written: no memfd, so it can be
    /// neither exported nor punched out. For the simulator, where untouched pages cost nothing.
    pub fn heap(layout: ShmLayout, header: HeaderFields) -> io::Result<Region> {
        let len =
            usize::try_from(layout.total_bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let heap_layout = std::alloc::Layout::from_size_align(len, HEAP_ALIGN_BYTES)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        assert!(len > 0, "a layout holds at least one page");
        // SAFETY: a non-zero size (asserted) and a valid power-of-two alignment; the result is
        // checked for null before use and freed with the same layout in `Drop`.
        let base = unsafe { std::alloc::alloc_zeroed(heap_layout) };
        let base = NonNull::new(base).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let region = Region { memfd: None, base, layout };
        region.write_header(header);
        Ok(region)
    }

    pub fn layout(&self) -> ShmLayout {
        self.layout
    }

    /// The memfd to hand to the owner; `None` for a heap region.
    pub fn memfd(&self) -> Option<BorrowedFd<'_>> {
        self.memfd.as_ref().map(AsFd::as_fd)
    }

    /// Start of the split bytes of `slot` (`slot < slots`): for `slot_copy` only.
    pub fn slot_ptr(&self, slot: u32) -> *mut u8 {
        assert!(slot < self.layout.slots, "slot {slot} out of {}", self.layout.slots);
        let offset = slot as usize * self.layout.split_bytes as usize;
        // SAFETY: slot < slots, so the split lies inside the slab bytes of the one mapping.
        unsafe { self.base.as_ptr().add(offset) }
    }

    pub fn version(&self, slot: u32) -> &AtomicU8 {
        assert!(slot < self.layout.slots);
        let offset = self.layout.versions_offset as usize + slot as usize;
        // SAFETY: inside the versions array of the mapping, which lives as long as `self`; the
        // byte is only ever accessed atomically (here and by the client).
        unsafe { AtomicU8::from_ptr(self.base.as_ptr().add(offset)) }
    }

    pub fn checksum(&self, slot: u32) -> &AtomicU32 {
        assert!(slot < self.layout.slots);
        let offset = self.layout.checksums_offset as usize + 4 * slot as usize;
        // SAFETY: inside the checksums array, 4-byte aligned (the array starts at slab_bytes, a
        // power of two >= 4 KiB, on a page-aligned mapping); accessed only atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn header_u64(&self, field: u64) -> &AtomicU64 {
        let offset = (self.layout.header_offset + field) as usize;
        // SAFETY: header fields lie inside the 64-byte, 64-aligned header of the mapping; u64
        // fields sit at multiples of 8. Accessed only atomically.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn header_u32(&self, field: u64) -> &AtomicU32 {
        let offset = (self.layout.header_offset + field) as usize;
        // SAFETY: as in `header_u64`, u32 fields at multiples of 4.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    pub fn write_header(&self, header: HeaderFields) {
        self.header_u64(SHM_HEADER_MAGIC).store(SHM_MAGIC, Ordering::Relaxed);
        self.header_u32(SHM_HEADER_LAYOUT_VERSION).store(SHM_LAYOUT_VERSION, Ordering::Relaxed);
        self.header_u32(SHM_HEADER_REVOKED).store(0, Ordering::Relaxed);
        self.header_u64(SHM_HEADER_EPOCH).store(header.epoch, Ordering::Relaxed);
        self.header_u64(SHM_HEADER_OWNER).store(header.owner_client_id, Ordering::Relaxed);
        self.header_u32(SHM_HEADER_SLAB_ID).store(header.slab_id, Ordering::Relaxed);
        self.header_u32(SHM_HEADER_SPLIT_BYTES).store(self.layout.split_bytes, Ordering::Relaxed);
        self.header_u32(SHM_HEADER_SLOTS).store(self.layout.slots, Ordering::Relaxed);
        self.header_u64(SHM_HEADER_SLAB_BYTES).store(self.layout.slab_bytes, Ordering::Release);
    }

    /// Marks the slab revoked for a client that maps it, then returns its memory to the OS.
    /// The flag goes first (SeqCst, paired with the client's fence after each store), so a
    /// client that stores after the punch also sees the flag and counts the store as failed.
    pub fn revoke(&self) {
        self.header_u32(SHM_HEADER_REVOKED).store(1, Ordering::SeqCst);
        // Punch everything but the header's page, so the flag stays readable.
        let header_page = self.layout.header_offset & !(remem_proto::shm::SHM_PAGE_BYTES - 1);
        let Some(memfd) = &self.memfd else {
            return;
        };
        if header_page == 0 {
            return;
        }
        // SAFETY: a system call on our own descriptor; the range lies within the file.
        let result = unsafe {
            libc::fallocate(
                memfd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                header_page as libc::off_t,
            )
        };
        if result != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "could not punch a revoked slab out");
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.memfd.is_none() {
            let heap_layout =
                std::alloc::Layout::from_size_align(self.layout.total_bytes as usize, HEAP_ALIGN_BYTES)
                    .expect("checked in `heap`");
            // SAFETY: `base` was allocated in `heap` with this very layout and is freed only here;
            // the owner is being dropped, so no pointer into it is still in use.
            unsafe { std::alloc::dealloc(self.base.as_ptr(), heap_layout) };
            return;
        }
        // SAFETY: `base`/`total_bytes` are exactly the mapping made in `create`, unmapped only here;
        // the owner (`Slab`) is being dropped, so no pointer into it is still in use.
        let result = unsafe { libc::munmap(self.base.as_ptr().cast(), self.layout.total_bytes as usize) };
        assert_eq!(result, 0, "munmap of our own mapping cannot fail");
    }
}
