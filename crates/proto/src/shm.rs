//! The layout of an exported slab: one memfd that holds the slab's split bytes, its per-slot
//! metadata and a small header, shared by the node and its owning client (`docs/SHM.md`).
//!
//! Pure arithmetic, no I/O: the node lays its memfd out with [`ShmLayout::new`], sends the
//! result in `SlabExported`, and the client accepts a memfd only if the message equals what
//! [`ShmLayout::new`] computes for the same slab and split size and the file is that long.
//!
//! Layout (offsets from the start of the memfd):
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | slab_bytes | `slots` splits of `split_bytes`, slot `s` at `s * split_bytes` |
//! | checksums_offset = slab_bytes | 4 × slots | checksum u32 per slot (native endian, atomic) |
//! | versions_offset | slots | version u8 per slot (atomic) |
//! | header_offset (64-aligned) | 64 | the header below |
//! | total_bytes | | header end rounded up to 4 KiB |
//!
//! Header fields (native endian; the node writes them before it exports the slab and changes
//! only `revoked` afterwards): magic u64 at 0, layout_version u32 at 8, revoked u32 at 12
//! (atomic: 0 live, 1 revoked), epoch u64 at 16, owner client_id u64 at 24, slab_id u32 at 32,
//! split_bytes u32 at 36, slots u32 at 40, reserved u32 at 44, slab_bytes u64 at 48, reserved
//! \[8\] at 56.
//!
//! Memory: 5 bytes of metadata per slot plus at most one page for the header and the rounding.
//! With 512-byte splits that is 0.977% plus 4 KiB: under 1% for slabs of 32 MiB and more
//! (0.983% at the default 64 MiB; `docs/SHM.md`, "Memory").

use crate::sizes::{MAX_SPLIT_BYTES, MIN_SPLIT_BYTES};

/// Bytes of the header at `header_offset`.
pub const SHM_HEADER_BYTES: u64 = 64;
/// `b"REMEMSHM"` read as a native-endian u64 (both ends are on one host).
pub const SHM_MAGIC: u64 = u64::from_ne_bytes(*b"REMEMSHM");
/// Version of this layout; a client refuses any other.
pub const SHM_LAYOUT_VERSION: u32 = 1;
/// Header field offsets, from the header's start.
pub const SHM_HEADER_MAGIC: u64 = 0;
pub const SHM_HEADER_LAYOUT_VERSION: u64 = 8;
pub const SHM_HEADER_REVOKED: u64 = 12;
pub const SHM_HEADER_EPOCH: u64 = 16;
pub const SHM_HEADER_OWNER: u64 = 24;
pub const SHM_HEADER_SLAB_ID: u64 = 32;
pub const SHM_HEADER_SPLIT_BYTES: u64 = 36;
pub const SHM_HEADER_SLOTS: u64 = 40;
pub const SHM_HEADER_SLAB_BYTES: u64 = 48;
/// The memfd is a whole number of these.
pub const SHM_PAGE_BYTES: u64 = 4096;
/// Largest slab the layout describes (the node's own limit).
pub const SHM_MAX_SLAB_BYTES: u64 = 1 << 32;

/// Where everything of one exported slab lives in its memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmLayout {
    pub slab_bytes: u64,
    pub split_bytes: u32,
    pub slots: u32,
    pub checksums_offset: u64,
    pub versions_offset: u64,
    pub header_offset: u64,
    pub total_bytes: u64,
}

impl ShmLayout {
    /// The layout of a slab of `slab_bytes` (a power of two in 4 KiB..=4 GiB) cut into splits of
    /// `split_bytes` (a power of two in 64..=min(slab_bytes, 1 MiB)); `None` otherwise.
    pub fn new(slab_bytes: u64, split_bytes: u32) -> Option<ShmLayout> {
        let slab_ok =
            slab_bytes.is_power_of_two() && (SHM_PAGE_BYTES..=SHM_MAX_SLAB_BYTES).contains(&slab_bytes);
        let split_ok = split_bytes.is_power_of_two()
            && (MIN_SPLIT_BYTES..=MAX_SPLIT_BYTES).contains(&split_bytes)
            && u64::from(split_bytes) <= slab_bytes;
        if !slab_ok || !split_ok {
            return None;
        }
        let slots = u32::try_from(slab_bytes / u64::from(split_bytes)).ok()?;
        let checksums_offset = slab_bytes;
        let versions_offset = checksums_offset + 4 * u64::from(slots);
        let header_offset = (versions_offset + u64::from(slots)).next_multiple_of(SHM_HEADER_BYTES);
        let total_bytes = (header_offset + SHM_HEADER_BYTES).next_multiple_of(SHM_PAGE_BYTES);
        Some(ShmLayout {
            slab_bytes,
            split_bytes,
            slots,
            checksums_offset,
            versions_offset,
            header_offset,
            total_bytes,
        })
    }

    /// Bytes of the memfd that are not split bytes: metadata, header and rounding.
    pub fn metadata_bytes(&self) -> u64 {
        self.total_bytes - self.slab_bytes
    }
}
