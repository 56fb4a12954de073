//! One simulated memory node: its slab table and how it answers each frame, modelled on
//! `crates/node` (`connection.rs`, `slab.rs`, the checks of `regenerate::prepare`).
//!
//! Job: turn the bytes that arrived on one connection into the bytes the real node would write
//! back, and into state changes of its slabs. It knows no time, no network and no other node:
//! the cluster delivers input, schedules the output and runs the rebuilds this module accepts.
//!
//! Fault model: the client may send anything. A header that does not decode, a body that does not
//! decode, a kind the node does not accept, and every refused `WriteSplit` get an `Error` reply
//! and close the connection (the real node cannot resynchronise the stream); other refusals get
//! an `Error` reply and the connection stays open. Nothing here panics on input.
//!
//! Deliberate simplifications, each harmless to a client: capacity counts whole slabs (the real
//! node also counts 5 bytes of metadata per slot and the shared-memory header); there is no
//! fault-injection command (`InjectFault` is refused as by a node started without
//! `--fault-injection`; the simulator injects faults through its own API), no shared memory
//! (`ExportSlab` is refused as on a TCP connection), no resource monitor and no handshake (the
//! cluster's `connect` stands for it).

use crate::SimTime;
use remem_codec::{CodecParams, ParamsError};
use remem_proto::{
    encode_read_split_reply, encode_read_splits_reply_head, max_read_splits_count, Control, DecodeError,
    ErrorCode, FrameHeader, Kind, NodeInfo, RegenerationSource, SplitMeta, WriteSplitPrefix, HEADER_BYTES,
    MAX_SPLIT_BYTES, MIN_SPLIT_BYTES, WRITE_SPLIT_PREFIX_BYTES,
};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

/// Bytes of metadata per slot (version u8 + checksum u32), as the real node reports them.
const METADATA_BYTES_PER_SLOT: u64 = 5;
/// Most rebuilds one node runs at once, as `regenerate::MAX_CONCURRENT_REGENERATIONS`.
pub(crate) const MAX_CONCURRENT_REGENERATIONS: u32 = 4;

/// Why the node refused a request; each maps to one protocol error code, and the `Display` text
/// is the `Error` frame's message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("{0}")]
    Malformed(DecodeError),
    #[error("{kind:?} is not a request a node accepts")]
    NotARequest { kind: Kind },
    #[error("slab {slab_id} is not mapped")]
    UnknownSlab { slab_id: u32 },
    #[error("slab {slab_id} belongs to another client")]
    NotOwner { slab_id: u32 },
    #[error("slots {first_slot}..{first_slot}+{count} outside slab {slab_id} of {slots} slots (or reply too large)")]
    SlotOutOfRange { slab_id: u32, first_slot: u32, count: u32, slots: u32 },
    #[error("no capacity: {slabs_mapped} of {capacity_slabs} slabs mapped")]
    NoCapacity { slabs_mapped: u32, capacity_slabs: u32 },
    #[error("split size {split_bytes} is not a power of two in {min}..={max}")]
    BadSplitSize { split_bytes: u32, min: u32, max: u32 },
    #[error("payload of {payload_bytes} bytes, slab {slab_id} holds splits of {split_bytes}")]
    PayloadSize { slab_id: u32, payload_bytes: u32, split_bytes: u32 },
    #[error("fault injection is off: the simulator injects faults through its own API")]
    NoFaultInjection,
    #[error("ExportSlab needs a Unix-socket connection (the simulator has none)")]
    NoSharedMemory,
    #[error("regeneration code: {0}")]
    BadCode(ParamsError),
    #[error("code splits of {code_split_bytes} bytes, slab {slab_id} holds {split_bytes}")]
    CodeSplitSize { code_split_bytes: usize, slab_id: u32, split_bytes: u32 },
    #[error("{pages} pages, slab has {slots} slots")]
    TooManyPages { pages: u32, slots: u32 },
    #[error("slab {slab_id} holds split {split_index}, the code has {total}")]
    TargetOutsideCode { slab_id: u32, split_index: u8, total: usize },
    #[error("source split {split_index} is out of range or repeated")]
    BadSource { split_index: u8 },
    #[error("{sources} sources, at least k = {k} needed")]
    TooFewSources { sources: usize, k: usize },
    #[error("{MAX_CONCURRENT_REGENERATIONS} regenerations already running")]
    RegenerationsBusy,
    #[error("slab {slab_id} is already being rebuilt")]
    AlreadyRegenerating { slab_id: u32 },
}

impl Refusal {
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            Refusal::Malformed(_) => ErrorCode::Malformed,
            Refusal::UnknownSlab { .. } => ErrorCode::UnknownSlab,
            Refusal::NotOwner { .. } => ErrorCode::NotOwner,
            Refusal::SlotOutOfRange { .. } | Refusal::TooManyPages { .. } => ErrorCode::SlotOutOfRange,
            Refusal::NoCapacity { .. } | Refusal::RegenerationsBusy => ErrorCode::NoCapacity,
            Refusal::BadSplitSize { .. }
            | Refusal::PayloadSize { .. }
            | Refusal::BadCode(_)
            | Refusal::CodeSplitSize { .. } => ErrorCode::BadSplitSize,
            Refusal::NotARequest { .. }
            | Refusal::NoFaultInjection
            | Refusal::NoSharedMemory
            | Refusal::TargetOutsideCode { .. }
            | Refusal::BadSource { .. }
            | Refusal::TooFewSources { .. }
            | Refusal::AlreadyRegenerating { .. } => ErrorCode::Unsupported,
        }
    }

    fn reply(&self) -> Control {
        Control::error(self.code(), self.to_string())
    }
}

/// One mapped slab: `slots` splits of `split_bytes`, each with its version and checksum.
pub(crate) struct SimSlab {
    pub(crate) owner_client_id: u64,
    pub(crate) split_bytes: u32,
    pub(crate) split_index: u8,
    pub(crate) first_page: u64,
    pub(crate) range_id: u64,
    pub(crate) slots: u32,
    /// `slots * split_bytes` bytes, zeroed on map (calloc: untouched pages cost nothing).
    bytes: Vec<u8>,
    versions: Vec<u8>,
    checksums: Vec<u32>,
    /// Set while a rebuild fills this slab.
    pub(crate) regenerating: bool,
}

impl SimSlab {
    pub(crate) fn meta(&self, slot: u32) -> SplitMeta {
        let slot = slot as usize;
        SplitMeta { version: self.versions[slot], checksum: self.checksums[slot] }
    }

    pub(crate) fn payload(&self, slot: u32) -> &[u8] {
        let at = slot as usize * self.split_bytes as usize;
        &self.bytes[at..at + self.split_bytes as usize]
    }

    /// A client write: payload and metadata as given. The caller checked slot and length.
    fn write(&mut self, slot: u32, payload: &[u8], meta: SplitMeta) {
        assert_eq!(payload.len(), self.split_bytes as usize, "payload checked against split_bytes");
        let at = slot as usize * self.split_bytes as usize;
        self.bytes[at..at + payload.len()].copy_from_slice(payload);
        self.versions[slot as usize] = meta.version;
        self.checksums[slot as usize] = meta.checksum;
    }

    /// A rebuilt split, stored only if the slot is still unwritten; returns whether it was.
    pub(crate) fn store_if_unwritten(&mut self, slot: u32, payload: &[u8], meta: SplitMeta) -> bool {
        assert!(self.regenerating, "only a rebuild stores conditionally");
        assert_ne!(meta.version, 0, "a stored split has a written version");
        if self.versions[slot as usize] != 0 {
            return false;
        }
        self.write(slot, payload, meta);
        true
    }

    /// Flips bit `bit` (below `split_bytes * 8`) of a slot's bytes; metadata is untouched.
    pub(crate) fn flip_bit(&mut self, slot: u32, bit: usize) {
        assert!(bit < self.split_bytes as usize * 8);
        self.bytes[slot as usize * self.split_bytes as usize + bit / 8] ^= 1 << (bit % 8);
    }

    fn metadata_bytes(&self) -> u64 {
        u64::from(self.slots) * METADATA_BYTES_PER_SLOT
    }
}

/// A `Regenerate` the node accepted (it already replied `Ok`); the cluster runs it.
pub(crate) struct AcceptedRegeneration {
    pub(crate) connection: u64,
    pub(crate) request_id: u64,
    pub(crate) client_id: u64,
    pub(crate) slab_id: u32,
    pub(crate) params: CodecParams,
    pub(crate) target_split: u8,
    pub(crate) pages: u32,
    pub(crate) sources: Vec<RegenerationSource>,
}

/// Something a stalled node has not read yet, in arrival order.
pub(crate) enum Inbox {
    Bytes {
        connection: u64,
        bytes: Vec<u8>,
    },
    /// The client closed the connection after what it sent before.
    Closed {
        connection: u64,
    },
}

/// How serving the bytes of one connection ended.
pub(crate) struct Served {
    /// Bytes of complete frames served; the rest is a partial frame to keep.
    pub(crate) consumed: usize,
    /// The node refused in a way that closes the connection (after its `Error` reply).
    pub(crate) close: bool,
}

pub(crate) struct SimNode {
    pub(crate) node_id: u64,
    pub(crate) address: SocketAddr,
    pub(crate) failure_domain: String,
    pub(crate) capacity_slabs: u32,
    pub(crate) slab_size_bytes: u64,
    pub(crate) alive: bool,
    /// Bumped by every kill, so work of a previous life is recognised as stale.
    pub(crate) incarnation: u64,
    /// Like SIGSTOP: nothing is read or answered before this time.
    pub(crate) stalled_until: SimTime,
    /// No message reaches the node or leaves it before this time.
    pub(crate) partitioned_until: SimTime,
    /// A straggler's extra delay on every reply, plus up to `extra_jitter_ns`.
    pub(crate) extra_delay_ns: SimTime,
    pub(crate) extra_jitter_ns: SimTime,
    /// `WriteSplit` frames still to drop silently (`SimCluster::drop_next_writes`).
    pub(crate) writes_to_drop: u32,
    /// Writes dropped that way over the node's whole history (kept across restarts).
    pub(crate) writes_dropped: u64,
    pub(crate) slabs: BTreeMap<u32, SimSlab>,
    next_slab_id: u32,
    pub(crate) requests_served: u64,
    pub(crate) inbox: VecDeque<Inbox>,
    /// Rebuilds running on this node, and their progress for `NodeInfoReply`.
    pub(crate) regenerations_running: u32,
    pub(crate) regeneration_pages_done: u64,
    pub(crate) regeneration_pages_total: u64,
    /// Rebuilds accepted while serving, for the cluster to start.
    pub(crate) accepted: Vec<AcceptedRegeneration>,
}

impl SimNode {
    pub(crate) fn new(
        node_id: u64,
        address: SocketAddr,
        failure_domain: String,
        capacity_slabs: u32,
        slab_size_bytes: u64,
    ) -> SimNode {
        SimNode {
            node_id,
            address,
            failure_domain,
            capacity_slabs,
            slab_size_bytes,
            alive: true,
            incarnation: 0,
            stalled_until: 0,
            partitioned_until: 0,
            extra_delay_ns: 0,
            extra_jitter_ns: 0,
            writes_to_drop: 0,
            writes_dropped: 0,
            slabs: BTreeMap::new(),
            next_slab_id: 1,
            requests_served: 0,
            inbox: VecDeque::new(),
            regenerations_running: 0,
            regeneration_pages_done: 0,
            regeneration_pages_total: 0,
            accepted: Vec::new(),
        }
    }

    pub(crate) fn is_stalled(&self, now: SimTime) -> bool {
        self.stalled_until > now
    }

    pub(crate) fn is_partitioned(&self, now: SimTime) -> bool {
        self.partitioned_until > now
    }

    /// The process dies: memory, queued input and running rebuilds are gone. What belongs to the
    /// host or the network (address, straggler delay, partition) stays.
    pub(crate) fn die(&mut self) {
        self.alive = false;
        self.incarnation += 1;
        self.stalled_until = 0;
        self.writes_to_drop = 0;
        self.slabs.clear();
        self.next_slab_id = 1;
        self.requests_served = 0;
        self.inbox.clear();
        self.regenerations_running = 0;
        self.regeneration_pages_done = 0;
        self.regeneration_pages_total = 0;
        self.accepted.clear();
    }

    pub(crate) fn info(&self) -> NodeInfo {
        let slabs_mapped = self.slabs.len() as u32;
        NodeInfo {
            node_id: self.node_id,
            capacity_bytes: u64::from(self.capacity_slabs) * self.slab_size_bytes,
            free_bytes: u64::from(self.capacity_slabs.saturating_sub(slabs_mapped)) * self.slab_size_bytes,
            slab_size_bytes: self.slab_size_bytes,
            slabs_mapped,
            metadata_bytes: self.slabs.values().map(SimSlab::metadata_bytes).sum(),
            requests_served: self.requests_served,
            regenerating_slabs: self.regenerations_running,
            regeneration_pages_done: self.regeneration_pages_done,
            regeneration_pages_total: self.regeneration_pages_total,
            clients_live: 0,
            clients_in_grace: 0,
            slabs_in_grace: 0,
            failure_domain: self.failure_domain.clone(),
        }
    }

    /// The slab `slab_id` if `client_id` owns it.
    fn owned(&self, client_id: u64, slab_id: u32) -> Result<&SimSlab, Refusal> {
        let slab = self.slabs.get(&slab_id).ok_or(Refusal::UnknownSlab { slab_id })?;
        if slab.owner_client_id != client_id {
            return Err(Refusal::NotOwner { slab_id });
        }
        Ok(slab)
    }

    fn owned_mut(&mut self, client_id: u64, slab_id: u32) -> Result<&mut SimSlab, Refusal> {
        self.owned(client_id, slab_id)?;
        Ok(self.slabs.get_mut(&slab_id).expect("present: checked above"))
    }

    /// Serves every complete frame at the front of `input`, which arrived on `connection` of
    /// `client_id`, appending all replies to `out`. Stops at a partial frame (the caller keeps
    /// it for the next arrival) or at a refusal that closes the connection.
    pub(crate) fn serve(
        &mut self,
        client_id: u64,
        connection: u64,
        input: &[u8],
        out: &mut Vec<u8>,
        answers_activity: &mut bool,
    ) -> Served {
        let mut at = 0;
        loop {
            let rest = &input[at..];
            let waiting = Served { consumed: at, close: false };
            let Some(header_bytes) = rest.first_chunk::<HEADER_BYTES>() else {
                return waiting;
            };
            let request_id = FrameHeader::raw_request_id(header_bytes);
            let header = match FrameHeader::decode(header_bytes) {
                Ok(header) => header,
                Err(error) => return refuse(out, request_id, &Refusal::Malformed(error), at),
            };
            let frame_bytes = HEADER_BYTES + header.body_len as usize;
            match header.kind {
                Kind::WriteSplit => {
                    // Validated as soon as the prefix is there, like the real node, which answers
                    // a refusal without waiting for the payload.
                    let Some(prefix_bytes) = rest[HEADER_BYTES..].first_chunk::<WRITE_SPLIT_PREFIX_BYTES>()
                    else {
                        return waiting;
                    };
                    if self.writes_to_drop > 0 {
                        if rest.len() < frame_bytes {
                            return waiting;
                        }
                        self.writes_to_drop -= 1;
                        self.writes_dropped += 1;
                        at += frame_bytes;
                        continue;
                    }
                    let prefix = match self.check_write(client_id, header, prefix_bytes) {
                        Ok(prefix) => prefix,
                        Err(refusal) => return refuse(out, request_id, &refusal, at),
                    };
                    if rest.len() < frame_bytes {
                        return waiting;
                    }
                    let payload = &rest[HEADER_BYTES + WRITE_SPLIT_PREFIX_BYTES..frame_bytes];
                    let meta = SplitMeta { version: prefix.version, checksum: prefix.checksum };
                    self.slabs.get_mut(&prefix.slab_id).expect("checked").write(prefix.slot, payload, meta);
                    Control::WriteSplitOk.encode(request_id, out);
                }
                Kind::MapSlab
                | Kind::UnmapSlab
                | Kind::NodeInfo
                | Kind::Ping
                | Kind::Pong
                | Kind::ReadSplit
                | Kind::ReadSplits
                | Kind::InjectFault
                | Kind::Regenerate
                | Kind::ExportSlab
                | Kind::AnswerActivity
                | Kind::SlabActivity => {
                    if rest.len() < frame_bytes {
                        return waiting;
                    }
                    let request = match Control::decode_body(header.kind, &rest[HEADER_BYTES..frame_bytes]) {
                        Ok(request) => request,
                        Err(error) => return refuse(out, request_id, &Refusal::Malformed(error), at),
                    };
                    self.handle_control(client_id, connection, request_id, request, out, answers_activity);
                }
                kind => return refuse(out, request_id, &Refusal::NotARequest { kind }, at),
            }
            self.requests_served += 1;
            at += frame_bytes;
        }
    }

    /// The checks of a `WriteSplit` prefix, before its payload is waited for.
    fn check_write(
        &self,
        client_id: u64,
        header: FrameHeader,
        prefix_bytes: &[u8; WRITE_SPLIT_PREFIX_BYTES],
    ) -> Result<WriteSplitPrefix, Refusal> {
        let prefix = WriteSplitPrefix::decode(prefix_bytes).map_err(Refusal::Malformed)?;
        let slab = self.owned(client_id, prefix.slab_id)?;
        let payload_bytes = header.body_len - WRITE_SPLIT_PREFIX_BYTES as u32;
        if prefix.slot >= slab.slots {
            return Err(Refusal::SlotOutOfRange {
                slab_id: prefix.slab_id,
                first_slot: prefix.slot,
                count: 1,
                slots: slab.slots,
            });
        }
        if payload_bytes != slab.split_bytes {
            return Err(Refusal::PayloadSize {
                slab_id: prefix.slab_id,
                payload_bytes,
                split_bytes: slab.split_bytes,
            });
        }
        Ok(prefix)
    }

    fn handle_control(
        &mut self,
        client_id: u64,
        connection: u64,
        request_id: u64,
        request: Control,
        out: &mut Vec<u8>,
        answers_activity: &mut bool,
    ) {
        let reply = match request {
            Control::Ping => Ok(Control::Pong),
            // A Pong answers nothing the node asked, and an owner's activity answer goes to a
            // resource monitor the simulator does not have: no reply to either.
            Control::Pong | Control::SlabActivity { .. } => return,
            Control::NodeInfo => Ok(Control::NodeInfoReply(self.info())),
            Control::MapSlab { split_bytes, split_index, first_page, range_id } => {
                self.map_slab(client_id, split_bytes, split_index, first_page, range_id)
            }
            Control::UnmapSlab { slab_id } => self.unmap_slab(client_id, slab_id),
            Control::ReadSplit { slab_id, slot } => {
                match self.read_splits(client_id, request_id, slab_id, slot, 1, false, out) {
                    Ok(()) => return,
                    Err(refusal) => Err(refusal),
                }
            }
            Control::ReadSplits { slab_id, first_slot, count } => {
                match self.read_splits(client_id, request_id, slab_id, first_slot, count, true, out) {
                    Ok(()) => return,
                    Err(refusal) => Err(refusal),
                }
            }
            Control::InjectFault { .. } => Err(Refusal::NoFaultInjection),
            Control::ExportSlab { .. } => Err(Refusal::NoSharedMemory),
            Control::AnswerActivity => {
                *answers_activity = true;
                Ok(Control::Ok)
            }
            Control::Regenerate { slab_id, data_splits, parity_splits, page_bytes, pages, sources } => self
                .accept_regeneration(
                    client_id,
                    connection,
                    request_id,
                    slab_id,
                    (data_splits, parity_splits, page_bytes),
                    pages,
                    sources,
                )
                .map(|()| Control::Ok),
            other => unreachable!("serve passes only requests, got {other:?}"),
        };
        let reply = reply.unwrap_or_else(|refusal| refusal.reply());
        reply.encode(request_id, out);
    }

    fn map_slab(
        &mut self,
        client_id: u64,
        split_bytes: u32,
        split_index: u8,
        first_page: u64,
        range_id: u64,
    ) -> Result<Control, Refusal> {
        let max_split_bytes = MAX_SPLIT_BYTES.min(u32::try_from(self.slab_size_bytes).unwrap_or(u32::MAX));
        if !split_bytes.is_power_of_two() || !(MIN_SPLIT_BYTES..=max_split_bytes).contains(&split_bytes) {
            return Err(Refusal::BadSplitSize { split_bytes, min: MIN_SPLIT_BYTES, max: max_split_bytes });
        }
        let slabs_mapped = self.slabs.len() as u32;
        if slabs_mapped >= self.capacity_slabs {
            return Err(Refusal::NoCapacity { slabs_mapped, capacity_slabs: self.capacity_slabs });
        }
        let slots = u32::try_from(self.slab_size_bytes / u64::from(split_bytes))
            .expect("add_node bounds the slab size, so slots fit in u32");
        let slab_id = self.next_slab_id;
        self.next_slab_id += 1;
        let slab = SimSlab {
            owner_client_id: client_id,
            split_bytes,
            split_index,
            first_page,
            range_id,
            slots,
            bytes: vec![0; self.slab_size_bytes as usize],
            versions: vec![0; slots as usize],
            checksums: vec![0; slots as usize],
            regenerating: false,
        };
        self.slabs.insert(slab_id, slab);
        Ok(Control::SlabMapped { slab_id, slots })
    }

    /// Unmaps an owned slab; a rebuild filling it finds it gone at its next step and reports.
    fn unmap_slab(&mut self, client_id: u64, slab_id: u32) -> Result<Control, Refusal> {
        self.owned(client_id, slab_id)?;
        self.slabs.remove(&slab_id);
        Ok(Control::Ok)
    }

    /// Appends the reply to `ReadSplit` (`many == false`, count 1) or `ReadSplits`.
    #[allow(clippy::too_many_arguments)]
    fn read_splits(
        &self,
        client_id: u64,
        request_id: u64,
        slab_id: u32,
        first_slot: u32,
        count: u32,
        many: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let slab = self.owned(client_id, slab_id)?;
        let in_range = u64::from(first_slot) + u64::from(count) <= u64::from(slab.slots);
        if !in_range || (many && count > max_read_splits_count(slab.split_bytes)) {
            return Err(Refusal::SlotOutOfRange { slab_id, first_slot, count, slots: slab.slots });
        }
        if many {
            encode_read_splits_reply_head(request_id, count, slab.split_bytes, out);
            for slot in first_slot..first_slot + count {
                out.extend_from_slice(&slab.meta(slot).encode());
                out.extend_from_slice(slab.payload(slot));
            }
        } else {
            encode_read_split_reply(request_id, slab.meta(first_slot), slab.payload(first_slot), out);
        }
        Ok(())
    }

    /// The checks of `regenerate::prepare`, in its order; on success the slab is marked as being
    /// rebuilt and the rebuild is queued for the cluster to run.
    #[allow(clippy::too_many_arguments)]
    fn accept_regeneration(
        &mut self,
        client_id: u64,
        connection: u64,
        request_id: u64,
        slab_id: u32,
        (data_splits, parity_splits, page_bytes): (u8, u8, u32),
        pages: u32,
        sources: Vec<RegenerationSource>,
    ) -> Result<(), Refusal> {
        let slab = self.owned(client_id, slab_id)?;
        let k = usize::from(data_splits);
        let params =
            CodecParams::new(k, usize::from(parity_splits), page_bytes as usize).map_err(Refusal::BadCode)?;
        if params.split_bytes() != slab.split_bytes as usize {
            return Err(Refusal::CodeSplitSize {
                code_split_bytes: params.split_bytes(),
                slab_id,
                split_bytes: slab.split_bytes,
            });
        }
        if pages > slab.slots {
            return Err(Refusal::TooManyPages { pages, slots: slab.slots });
        }
        let total = params.total_splits();
        let target_split = slab.split_index;
        if usize::from(target_split) >= total {
            return Err(Refusal::TargetOutsideCode { slab_id, split_index: target_split, total });
        }
        // A source may name the split being rebuilt: the slab it replaces, kept by the client as a
        // source while its node is reachable (the real node's rule). Its splits are judged like
        // any other's.
        let mut seen = 0u32;
        for source in &sources {
            if usize::from(source.split_index) >= total || seen & (1 << source.split_index) != 0 {
                return Err(Refusal::BadSource { split_index: source.split_index });
            }
            seen |= 1 << source.split_index;
        }
        if sources.len() < k {
            return Err(Refusal::TooFewSources { sources: sources.len(), k });
        }
        if self.regenerations_running >= MAX_CONCURRENT_REGENERATIONS {
            return Err(Refusal::RegenerationsBusy);
        }
        if slab.regenerating {
            return Err(Refusal::AlreadyRegenerating { slab_id });
        }
        self.owned_mut(client_id, slab_id)?.regenerating = true;
        self.regenerations_running += 1;
        self.regeneration_pages_total += u64::from(pages);
        self.accepted.push(AcceptedRegeneration {
            connection,
            request_id,
            client_id,
            slab_id,
            params,
            target_split,
            pages,
            sources,
        });
        Ok(())
    }
}

/// Appends the `Error` reply of a refusal that closes the connection.
fn refuse(out: &mut Vec<u8>, request_id: u64, refusal: &Refusal, consumed: usize) -> Served {
    refusal.reply().encode(request_id, out);
    Served { consumed, close: true }
}
