//! Slabs: memfd-backed memory (`shared_memory`) carved into equal slots, with per-slot metadata in
//! the same shared mapping, and the table of slabs a node has mapped. A slab's owner may map it
//! too (`ExportSlab`); it then reads and writes slots with the same ordering as the node.
//!
//! Concurrency and fault model: a slab may be used by several connection threads at once (one
//! client may hold several connections), by a rebuild thread (`regenerate`) and by fault
//! injection. Slot bytes are only ever touched through the word-wise relaxed atomic copies of
//! `slot_copy`; Rust code never forms a reference to slab memory, so a racing write and read are
//! not a data race in the Rust memory model, only a word-level race. A reader racing a writer of
//! the same slot may therefore see torn payload bytes, or a payload from one write with the
//! metadata of another. Metadata is two atomics per slot in the memfd; a writer stores the payload first, then
//! the checksum, then the version (release), and a reader loads the version (acquire) and checksum
//! before copying the payload. Any torn combination fails the end-to-end checksum at the client,
//! which treats the split as an erasure; the client orders its own writes and reads of one slot on
//! one connection, where requests are served in order, so it never races itself.
//!
//! A slab under regeneration is the one exception to lock-free slots: its client writes and the
//! rebuild's stores take the slab's `regeneration_lock`, so that "store the rebuilt split only if
//! the slot is still unwritten" is atomic with respect to a client write of the same slot (the
//! client's newer page must win). Other slabs take no lock on the data path.
//!
//! Invariant: `SlabTable::used_bytes` is the sum of `footprint_bytes` over mapped slabs, plus the
//! slab bytes of pre-allocated (pooled) memory, plus in-flight reservations, and never exceeds the
//! node's capacity. The pool (filled by the resource monitor, `monitor`) only ever holds fresh
//! memfds, which the kernel zeroes: memory a client used is unmapped, never pooled, so no
//! client's bytes or metadata can reach another client.

use crate::shared_memory::{HeaderFields, Region};
use crate::slot_copy;
use remem_proto::shm::ShmLayout;
use remem_proto::{ErrorCode, SplitMeta, MAX_SPLIT_BYTES, MIN_SPLIT_BYTES};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of metadata per slot: version u8 and checksum u32.
pub const METADATA_BYTES_PER_SLOT: u64 = 5;

/// Why a slab operation was refused; each maps to one protocol error code.
#[derive(Debug, thiserror::Error)]
pub enum SlabError {
    #[error("slab {slab_id} is not mapped")]
    UnknownSlab { slab_id: u32 },
    #[error("slab {slab_id} belongs to another client")]
    NotOwner { slab_id: u32 },
    #[error("slots {first_slot}..{first_slot}+{count} outside slab {slab_id} of {slots} slots (or reply too large)")]
    SlotOutOfRange { slab_id: u32, first_slot: u32, count: u32, slots: u32 },
    #[error("no capacity: slab needs {needed_bytes} bytes, {free_bytes} free")]
    NoCapacity { needed_bytes: u64, free_bytes: u64 },
    #[error(
        "no capacity: host memory is low (slab needs {needed_bytes} bytes, {spare_bytes} above the headroom)"
    )]
    HostMemoryLow { needed_bytes: u64, spare_bytes: u64 },
    #[error("split size {split_bytes} is not a power of two in {min}..={max}")]
    BadSplitSize { split_bytes: u32, min: u32, max: u32 },
    #[error("payload of {payload_bytes} bytes, slab {slab_id} holds splits of {split_bytes}")]
    PayloadSize { slab_id: u32, payload_bytes: u32, split_bytes: u32 },
    #[error("mmap of {bytes} bytes failed: {source}")]
    MapFailed { bytes: u64, source: io::Error },
}

impl SlabError {
    pub fn code(&self) -> ErrorCode {
        match self {
            SlabError::UnknownSlab { .. } => ErrorCode::UnknownSlab,
            SlabError::NotOwner { .. } => ErrorCode::NotOwner,
            SlabError::SlotOutOfRange { .. } => ErrorCode::SlotOutOfRange,
            SlabError::NoCapacity { .. } | SlabError::HostMemoryLow { .. } => ErrorCode::NoCapacity,
            SlabError::BadSplitSize { .. } | SlabError::PayloadSize { .. } => ErrorCode::BadSplitSize,
            SlabError::MapFailed { .. } => ErrorCode::Internal,
        }
    }
}

/// What the client said about a slab when mapping it; the node keeps it for logs.
#[derive(Clone, Copy, Debug)]
pub struct SlabLabel {
    pub split_bytes: u32,
    pub split_index: u8,
    pub first_page: u64,
    pub range_id: u64,
}

/// One mapped slab. Unmapped (munmap) when the last `Arc` drops, so an unmap racing a request on
/// another connection never frees memory under a kernel copy.
pub struct Slab {
    /// The memfd with split bytes, per-slot metadata and the shared-memory header.
    region: Region,
    owner_client_id: u64,
    label: SlabLabel,
    slots: u32,
    /// Unique per slab this node ever mapped; in the header and in `SlabExported`.
    epoch: u64,
    /// Set once the memfd was handed to the owner (`ExportSlab`).
    exported: AtomicBool,
    /// Set while a rebuild fills this slab; client writes then take `regeneration_lock`.
    regenerating: AtomicBool,
    regeneration_lock: Mutex<()>,
    /// Set once the slab left the table (unmapped or evicted), so a rebuild stops filling it.
    detached: AtomicBool,
    /// Requests served on this slab since the resource monitor last looked: its activity.
    requests: AtomicU64,
    /// The owner's running total of accesses at its last `SlabActivity` answer.
    owner_reported: AtomicU64,
}

/// The split size pre-allocated slabs are laid out for: a 4 KiB page at k = 8, the default
/// code. A `MapSlab` of another split size takes no pooled slab (its layout differs: the
/// metadata area scales with the slot count) and maps fresh memory.
pub const POOL_SPLIT_BYTES: u32 = 512;

/// A populated memfd region of one slab that no client has used: the pool of pre-allocated
/// slabs. Zero-filled by the kernel, its header blank until a `MapSlab` takes it and writes the
/// owner; unmapped and closed on drop otherwise.
pub struct PooledMemory {
    region: Region,
}

impl PooledMemory {
    fn map(slab_size_bytes: u64, backing: Backing) -> Result<PooledMemory, SlabError> {
        let layout = ShmLayout::new(slab_size_bytes, POOL_SPLIT_BYTES)
            .expect("slab size checked in Node::bind; 512-byte splits fit every slab size");
        let blank = HeaderFields { epoch: 0, owner_client_id: 0, slab_id: u32::MAX };
        let region = Region::new(layout, blank, backing)
            .map_err(|source| SlabError::MapFailed { bytes: layout.total_bytes, source })?;
        Ok(PooledMemory { region })
    }
}

impl Slab {
    /// Maps a slab in `pooled` memory if given and laid out for this split size (fresh, so zero
    /// like a new memfd), else in a new memfd.
    fn map(
        layout: ShmLayout,
        owner_client_id: u64,
        label: SlabLabel,
        header: HeaderFields,
        pooled: Option<PooledMemory>,
        backing: Backing,
    ) -> Result<Slab, SlabError> {
        let region = match pooled {
            Some(PooledMemory { region }) if region.layout() == layout => {
                region.write_header(header);
                region
            }
            _ => Region::new(layout, header, backing)
                .map_err(|source| SlabError::MapFailed { bytes: layout.total_bytes, source })?,
        };
        Ok(Slab {
            region,
            owner_client_id,
            label,
            slots: layout.slots,
            epoch: header.epoch,
            exported: AtomicBool::new(false),
            regenerating: AtomicBool::new(false),
            regeneration_lock: Mutex::new(()),
            detached: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            owner_reported: AtomicU64::new(0),
        })
    }

    /// Counts one request on this slab (data path: one relaxed increment, nothing else).
    #[inline]
    pub fn record_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn split_bytes(&self) -> u32 {
        self.label.split_bytes
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The whole memfd (slab memory, metadata, header), what the slab counts against capacity.
    pub fn footprint_bytes(&self) -> u64 {
        self.region.layout().total_bytes
    }

    /// Per-slot metadata plus the header and the rounding to a page.
    pub fn metadata_bytes(&self) -> u64 {
        self.region.layout().metadata_bytes()
    }

    pub fn label(&self) -> SlabLabel {
        self.label
    }

    pub fn owner_client_id(&self) -> u64 {
        self.owner_client_id
    }

    /// Start of `slot`'s bytes: `split_bytes` writable, 8-byte aligned bytes that stay mapped
    /// while `self` lives. Only for `slot_copy`; never turn it into a reference.
    fn slot_ptr(&self, slot: u32) -> *mut u8 {
        self.region.slot_ptr(slot)
    }

    pub fn meta(&self, slot: u32) -> SplitMeta {
        let version = self.region.version(slot).load(Ordering::Acquire);
        let checksum = self.region.checksum(slot).load(Ordering::Relaxed);
        SplitMeta { version, checksum }
    }

    /// Publishes the metadata of a slot whose payload has just been written.
    fn set_meta(&self, slot: u32, meta: SplitMeta) {
        self.region.checksum(slot).store(meta.checksum, Ordering::Relaxed);
        self.region.version(slot).store(meta.version, Ordering::Release);
    }

    /// A client write: the payload, then its metadata. Takes the regeneration lock only while a
    /// rebuild fills this slab.
    ///
    /// Panics if `slot` is out of range or `payload` is not `split_bytes` long: the connection
    /// validates both before calling.
    pub fn write(&self, slot: u32, payload: &[u8], meta: SplitMeta) {
        assert_eq!(payload.len(), self.label.split_bytes as usize, "payload checked against split_bytes");
        let _guard = self.regenerating.load(Ordering::Acquire).then(|| self.lock_regeneration());
        // SAFETY: slot_ptr asserts slot < slots, so split_bytes (= payload.len()) bytes from it are
        // inside the mapping `self` keeps alive; every access to slot bytes goes through slot_copy.
        unsafe { slot_copy::copy_to_slot(payload, self.slot_ptr(slot)) };
        self.set_meta(slot, meta);
    }

    /// A rebuilt split: stored only if the slot is still unwritten (version 0), atomically with
    /// respect to client writes (which take the regeneration lock while `regenerating` is set).
    /// Returns whether it was stored.
    pub fn store_if_unwritten(&self, slot: u32, payload: &[u8], meta: SplitMeta) -> bool {
        assert!(self.regenerating.load(Ordering::Relaxed), "only a rebuild stores conditionally");
        assert_eq!(payload.len(), self.label.split_bytes as usize);
        assert_ne!(meta.version, 0, "a stored split has a written version");
        let _guard = self.lock_regeneration();
        if self.region.version(slot).load(Ordering::Acquire) != 0 {
            return false;
        }
        // SAFETY: as in `write`.
        unsafe { slot_copy::copy_to_slot(payload, self.slot_ptr(slot)) };
        self.set_meta(slot, meta);
        true
    }

    /// Reads a slot: its metadata, then its bytes into `target` (`split_bytes` long).
    pub fn read(&self, slot: u32, target: &mut [u8]) -> SplitMeta {
        assert_eq!(target.len(), self.label.split_bytes as usize);
        let meta = self.meta(slot);
        // SAFETY: as in `write`; the bytes are only loaded.
        unsafe { slot_copy::copy_from_slot(self.slot_ptr(slot), target) };
        meta
    }

    /// Flips bit `bit` (below `split_bytes * 8`) of a slot's bytes; metadata is untouched.
    pub fn flip_bit(&self, slot: u32, bit: usize) {
        assert!(bit < self.label.split_bytes as usize * 8);
        // SAFETY: as in `write`; bit / 8 < split_bytes keeps the byte inside the slot.
        unsafe { slot_copy::flip_bit(self.slot_ptr(slot), bit) };
    }

    /// Marks the slab as being rebuilt (client writes start taking the regeneration lock), or
    /// not. Returns false if it already was in the asked state.
    pub fn set_regenerating(&self, regenerating: bool) -> bool {
        self.regenerating.swap(regenerating, Ordering::SeqCst) != regenerating
    }

    /// Whether the slab has left the table (unmapped or evicted).
    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    fn lock_regeneration(&self) -> MutexGuard<'_, ()> {
        // The guarded data is the slot itself, which a panicking holder leaves at worst torn,
        // which the checksum catches: not a reason to stop serving.
        self.regeneration_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Checks that `client_id` owns this slab.
    pub fn check_owner(&self, slab_id: u32, client_id: u64) -> Result<(), SlabError> {
        if self.owner_client_id != client_id {
            return Err(SlabError::NotOwner { slab_id });
        }
        Ok(())
    }
}

impl Slab {
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn layout(&self) -> ShmLayout {
        self.region.layout()
    }

    /// The memfd to pass to the owner, or `None` if the slab already left the table (or lives on
    /// the heap, `Backing::Heap`, and has none). Marks the
    /// slab exported, so that leaving the table revokes it. `export` and `detach` each store
    /// their flag, then load the other's (SeqCst), so at least one of them sees both and
    /// revokes: an unmap racing an export never leaves a live mapping of a forgotten slab.
    pub fn export(&self) -> Option<BorrowedFd<'_>> {
        self.exported.store(true, Ordering::SeqCst);
        if self.detached.load(Ordering::SeqCst) {
            self.region.revoke();
            return None;
        }
        self.region.memfd()
    }

    /// Accesses the owner reports since its previous answer, from its running `total` (a
    /// restarted owner counts from zero again: then the total itself).
    pub fn owner_accesses_since_last(&self, total: u64) -> u64 {
        let last = self.owner_reported.swap(total, Ordering::Relaxed);
        total.checked_sub(last).unwrap_or(total)
    }

    pub fn is_regenerating(&self) -> bool {
        self.regenerating.load(Ordering::SeqCst)
    }

    /// Called once the slab left the table: stops rebuilds and, if a client maps the memfd,
    /// revokes it there and returns its memory to the OS now (`shared_memory`).
    fn detach(&self) {
        self.detached.store(true, Ordering::SeqCst);
        if self.exported.load(Ordering::SeqCst) {
            self.region.revoke();
        }
    }
}

/// Counters reported in `NodeInfoReply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableStats {
    pub used_bytes: u64,
    pub slabs_mapped: u32,
    pub metadata_bytes: u64,
    /// Pre-allocated slabs waiting for a `MapSlab`, and their bytes (part of `used_bytes`).
    pub pooled_slabs: u32,
    pub pooled_bytes: u64,
    /// What a `MapSlab` of fresh memory may still take before the monitor's next reading; `None`
    /// without a monitor.
    pub host_budget_bytes: Option<u64>,
}

/// Where a table's slabs live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Each slab a memfd, mapped shared and populated, exportable (the real node).
    Memfd,
    /// Each slab zeroed heap memory of the same layout, never exported (the simulator).
    Heap,
}

/// All slabs of a node, by id (a `BTreeMap`: iteration in id order, the same every run).
pub struct SlabTable {
    backing: Backing,
    slab_size_bytes: u64,
    /// Memory of one pre-allocated slab: its memfd laid out for [`POOL_SPLIT_BYTES`].
    pool_slab_bytes: u64,
    capacity_bytes: u64,
    /// The epoch of the next slab mapped: 1, 2, ... never reused while the node runs.
    next_epoch: AtomicU64,
    inner: Mutex<TableInner>,
}

struct TableInner {
    slabs: BTreeMap<u32, Arc<Slab>>,
    /// Ids reserved by a map in progress (mmap runs outside the lock).
    reserved_ids: Vec<u32>,
    next_slab_id: u32,
    used_bytes: u64,
    metadata_bytes: u64,
    /// Pre-allocated memory, each one slab (counted in `used_bytes`).
    pool: Vec<PooledMemory>,
    /// Set by the resource monitor each period: bytes of fresh memory mappings may still take
    /// before the host falls below its headroom. `None`: no monitor, no host limit.
    host_budget_bytes: Option<u64>,
}

impl SlabTable {
    pub fn new(slab_size_bytes: u64, capacity_bytes: u64, backing: Backing) -> SlabTable {
        let pool_slab_bytes = ShmLayout::new(slab_size_bytes, POOL_SPLIT_BYTES)
            .map_or(slab_size_bytes, |layout| layout.total_bytes);
        SlabTable {
            backing,
            slab_size_bytes,
            pool_slab_bytes,
            capacity_bytes,
            next_epoch: AtomicU64::new(1),
            inner: Mutex::new(TableInner {
                slabs: BTreeMap::new(),
                reserved_ids: Vec::new(),
                next_slab_id: 1,
                used_bytes: 0,
                metadata_bytes: 0,
                pool: Vec::new(),
                host_budget_bytes: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TableInner> {
        // A panic while holding the lock leaves only counters and a map behind, which stay
        // consistent at every await-free step, so poisoning is not a reason to stop serving.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Maps a slab for `owner_client_id`: returns its id and slot count.
    ///
    /// Takes a pre-allocated slab from the pool if there is one; otherwise maps fresh memory.
    ///
    /// Errors: `BadSplitSize` unless `split_bytes` is a power of two in
    /// 64..=min(slab size, 1 MiB); `NoCapacity` if slab plus metadata would exceed capacity;
    /// `HostMemoryLow` if the pool is empty and fresh memory would take the host below the
    /// monitor's headroom; `MapFailed` if the kernel refuses the memory.
    pub fn map(&self, owner_client_id: u64, label: SlabLabel) -> Result<(u32, u32), SlabError> {
        let max_split_bytes = MAX_SPLIT_BYTES.min(u32::try_from(self.slab_size_bytes).unwrap_or(u32::MAX));
        if !label.split_bytes.is_power_of_two()
            || !(MIN_SPLIT_BYTES..=max_split_bytes).contains(&label.split_bytes)
        {
            return Err(SlabError::BadSplitSize {
                split_bytes: label.split_bytes,
                min: MIN_SPLIT_BYTES,
                max: max_split_bytes,
            });
        }
        let layout = ShmLayout::new(self.slab_size_bytes, label.split_bytes)
            .expect("slab size checked in Node::bind, split size just above");
        let footprint_bytes = layout.total_bytes;
        let (slab_id, pooled) = {
            let mut inner = self.lock();
            // A pooled slab's bytes are already counted: taking it needs only the metadata.
            let pooled_bytes = if inner.pool.is_empty() { 0 } else { self.pool_slab_bytes };
            let free_bytes = self.capacity_bytes - inner.used_bytes + pooled_bytes;
            if footprint_bytes > free_bytes {
                return Err(SlabError::NoCapacity { needed_bytes: footprint_bytes, free_bytes });
            }
            let pooled = inner.pool.pop();
            if pooled.is_none() {
                if let Some(spare_bytes) = inner.host_budget_bytes {
                    if footprint_bytes > spare_bytes {
                        return Err(SlabError::HostMemoryLow { needed_bytes: footprint_bytes, spare_bytes });
                    }
                    inner.host_budget_bytes = Some(spare_bytes - footprint_bytes);
                }
            }
            inner.used_bytes = inner.used_bytes - pooled_bytes + footprint_bytes;
            let slab_id = inner.allocate_id();
            inner.reserved_ids.push(slab_id);
            (slab_id, pooled)
        };
        let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
        let header = HeaderFields { epoch, owner_client_id, slab_id };
        let mapped = Slab::map(layout, owner_client_id, label, header, pooled, self.backing);
        let mut inner = self.lock();
        inner.reserved_ids.retain(|id| *id != slab_id);
        match mapped {
            Ok(slab) => {
                debug_assert_eq!(slab.footprint_bytes(), footprint_bytes);
                let slots = slab.slots();
                inner.metadata_bytes += slab.metadata_bytes();
                inner.slabs.insert(slab_id, Arc::new(slab));
                Ok((slab_id, slots))
            }
            Err(error) => {
                inner.used_bytes -= footprint_bytes;
                Err(error)
            }
        }
    }

    /// The slab `slab_id` if `client_id` owns it.
    pub fn get(&self, client_id: u64, slab_id: u32) -> Result<Arc<Slab>, SlabError> {
        let inner = self.lock();
        let slab = inner.slabs.get(&slab_id).ok_or(SlabError::UnknownSlab { slab_id })?;
        slab.check_owner(slab_id, client_id)?;
        Ok(Arc::clone(slab))
    }

    /// Removes the slab; its memory is returned when the last in-flight request drops it.
    /// Returns what the slab was mapped for.
    pub fn unmap(&self, client_id: u64, slab_id: u32) -> Result<SlabLabel, SlabError> {
        let mut inner = self.lock();
        let slab = inner.slabs.get(&slab_id).ok_or(SlabError::UnknownSlab { slab_id })?;
        slab.check_owner(slab_id, client_id)?;
        let slab = inner.slabs.remove(&slab_id).expect("present: checked above");
        inner.used_bytes -= slab.footprint_bytes();
        inner.metadata_bytes -= slab.metadata_bytes();
        slab.detach();
        Ok(slab.label)
    }

    /// The ids of the slabs `client_id` owns.
    pub fn owned_by(&self, client_id: u64) -> Vec<u32> {
        let inner = self.lock();
        inner.slabs.iter().filter(|(_, slab)| slab.owner_client_id == client_id).map(|(&id, _)| id).collect()
    }

    /// Every mapped slab's id and owner, by slab id.
    pub fn owners(&self) -> Vec<(u32, u64)> {
        let inner = self.lock();
        inner.slabs.iter().map(|(&id, slab)| (id, slab.owner_client_id)).collect()
    }

    /// The slab `slab_id`, whoever owns it (for eviction, which tells the owner first).
    pub fn get_any(&self, slab_id: u32) -> Result<Arc<Slab>, SlabError> {
        let inner = self.lock();
        inner.slabs.get(&slab_id).cloned().ok_or(SlabError::UnknownSlab { slab_id })
    }

    /// Removes the slab whoever owns it; like [`SlabTable::unmap`] otherwise. The node-internal
    /// half of eviction: callers tell the owner first (`Shared::evict_slab`).
    pub fn evict(&self, slab_id: u32) -> Result<Arc<Slab>, SlabError> {
        let mut inner = self.lock();
        let slab = inner.slabs.remove(&slab_id).ok_or(SlabError::UnknownSlab { slab_id })?;
        inner.used_bytes -= slab.footprint_bytes();
        inner.metadata_bytes -= slab.metadata_bytes();
        slab.detach();
        Ok(slab)
    }

    pub fn stats(&self) -> TableStats {
        let inner = self.lock();
        TableStats {
            used_bytes: inner.used_bytes,
            slabs_mapped: inner.slabs.len() as u32,
            metadata_bytes: inner.metadata_bytes,
            pooled_slabs: inner.pool.len() as u32,
            pooled_bytes: inner.pool.len() as u64 * self.pool_slab_bytes,
            host_budget_bytes: inner.host_budget_bytes,
        }
    }

    /// Sets what fresh mappings may take before the monitor's next reading (`None`: no limit).
    pub fn set_host_budget(&self, budget_bytes: Option<u64>) {
        self.lock().host_budget_bytes = budget_bytes;
    }

    /// Adds one fresh, populated slab to the pool if the pool holds fewer than `target` and
    /// capacity and the host budget allow it. The mmap runs outside the lock. Returns whether a
    /// slab was added.
    ///
    /// Errors: `MapFailed` if the kernel refuses the memory.
    pub fn fill_pool_one(&self, target: usize) -> Result<bool, SlabError> {
        {
            let mut inner = self.lock();
            let budget_allows = inner.host_budget_bytes.is_none_or(|budget| budget >= self.pool_slab_bytes);
            if inner.pool.len() >= target
                || self.capacity_bytes - inner.used_bytes < self.pool_slab_bytes
                || !budget_allows
            {
                return Ok(false);
            }
            inner.used_bytes += self.pool_slab_bytes;
            inner.host_budget_bytes = inner.host_budget_bytes.map(|budget| budget - self.pool_slab_bytes);
        }
        let mapped = PooledMemory::map(self.slab_size_bytes, self.backing);
        let mut inner = self.lock();
        match mapped {
            Ok(memory) => {
                inner.pool.push(memory);
                Ok(true)
            }
            Err(error) => {
                inner.used_bytes -= self.pool_slab_bytes;
                Err(error)
            }
        }
    }

    /// Takes up to `count` slabs out of the pool; their memory returns when the caller drops
    /// them (outside the lock).
    pub fn drain_pool(&self, count: usize) -> Vec<PooledMemory> {
        let mut inner = self.lock();
        let keep = inner.pool.len().saturating_sub(count);
        let drained = inner.pool.split_off(keep);
        inner.used_bytes -= drained.len() as u64 * self.pool_slab_bytes;
        drained
    }

    /// Each mapped slab's id, owner and requests since the last call (the counters restart).
    /// A slab exported as shared memory is read and written without the node seeing it, so
    /// its activity is unknown and counts as the highest: it goes only after every slab of the
    /// sample whose idleness the node can see.
    pub fn take_activity(&self) -> Vec<SlabActivity> {
        let inner = self.lock();
        inner
            .slabs
            .iter()
            .map(|(&slab_id, slab)| {
                let requests = slab.requests.swap(0, Ordering::Relaxed);
                SlabActivity {
                    slab_id,
                    owner_client_id: slab.owner_client_id,
                    requests: if slab.exported.load(Ordering::Relaxed) { u64::MAX } else { requests },
                }
            })
            .collect()
    }

    /// Drops every slab (munmap happens as the last reference of each goes) and the pool;
    /// returns how many slabs were mapped.
    pub fn clear(&self) -> usize {
        let mut inner = self.lock();
        let pooled = std::mem::take(&mut inner.pool);
        inner.used_bytes -= pooled.len() as u64 * self.pool_slab_bytes;
        let slabs = std::mem::take(&mut inner.slabs);
        for slab in slabs.values() {
            inner.used_bytes -= slab.footprint_bytes();
            slab.detach();
        }
        let count = slabs.len();
        inner.metadata_bytes = 0;
        count
    }
}

/// One mapped slab's activity over a monitor period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabActivity {
    pub slab_id: u32,
    pub owner_client_id: u64,
    pub requests: u64,
}

impl TableInner {
    fn allocate_id(&mut self) -> u32 {
        loop {
            let id = self.next_slab_id;
            self.next_slab_id = self.next_slab_id.wrapping_add(1).max(1);
            if !self.slabs.contains_key(&id) && !self.reserved_ids.contains(&id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(split_index: u8) -> SlabLabel {
        SlabLabel { split_bytes: 512, split_index, first_page: 0, range_id: 0 }
    }

    #[test]
    fn an_exported_slab_counts_as_most_active() {
        let table = SlabTable::new(1 << 20, 16 << 20, Backing::Memfd);
        let (seen, _) = table.map(7, label(0)).unwrap();
        let (exported, _) = table.map(7, label(1)).unwrap();
        let slab = table.get(7, seen).unwrap();
        slab.requests.fetch_add(5, Ordering::Relaxed);
        assert!(table.get(7, exported).unwrap().export().is_some());
        let activity = table.take_activity();
        let of = |id: u32| activity.iter().find(|slab| slab.slab_id == id).unwrap().requests;
        assert_eq!(of(seen), 5);
        assert_eq!(of(exported), u64::MAX, "unknown activity ranks as the highest");
        // Counters restart each period; the exported slab stays unknown.
        let activity = table.take_activity();
        assert_eq!(activity.iter().find(|slab| slab.slab_id == seen).unwrap().requests, 0);
    }
}
