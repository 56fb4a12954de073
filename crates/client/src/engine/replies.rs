//! Frames from nodes: replies to splits (judged, then copied to their place), control replies
//! (to a rebuild or to the driver that waits), and what nodes send unasked (eviction notices,
//! activity questions, heartbeat answers).
//!
//! Every frame is hostile until checked: its length against what its kind may carry, its
//! request id against an op in flight (a late reply of a finished op is dropped), the split it
//! names against the node it came from.

use std::time::Instant;

use remem_proto::{judge_split, Control, FrameHeader, Kind, SplitMeta, SplitVerdict, SPLIT_META_BYTES};

use super::ops::{parse_request_id, Outcome, SlotKind, SplitEvent};
use super::{Engine, OpBuffers, CONTROL_REQUEST, MAX_CONTROL_BODY_BYTES, MAX_SPLITS};
use crate::core::SplitOutcome;
use crate::error::FrameError;

impl Engine {
    /// The largest body a frame of `kind` from a node may have for this client.
    pub fn max_reply_body(&self, kind: Kind) -> usize {
        match kind {
            Kind::ReadSplitReply => {
                let largest_split = self.regions.iter().map(|region| region.split_bytes).max().unwrap_or(0);
                SPLIT_META_BYTES + largest_split.max(self.config.page_bytes)
            }
            _ => MAX_CONTROL_BODY_BYTES,
        }
    }

    /// One whole frame from `node`. An error means the node broke the protocol: the driver
    /// drops the connection and reports [`Engine::connection_lost`].
    pub fn on_frame(
        &mut self,
        now: Instant,
        node: usize,
        header: FrameHeader,
        body: &[u8],
        buffers: &mut dyn OpBuffers,
    ) -> Result<(), FrameError> {
        self.now = now;
        self.heard_from(node);
        let result = self.handle_frame(node, header, body, buffers);
        self.process_events(buffers);
        result
    }

    pub(super) fn handle_frame(
        &mut self,
        node: usize,
        header: FrameHeader,
        body: &[u8],
        buffers: &mut dyn OpBuffers,
    ) -> Result<(), FrameError> {
        if body.len() > self.max_reply_body(header.kind) {
            return Err(FrameError::TooLong { kind: header.kind, len: body.len() });
        }
        match header.kind {
            Kind::SlabActivityQuery => {
                // Unsolicited: a node's resource monitor asks how active one of our slabs is.
                if let Control::SlabActivityQuery { slab_id } = Control::decode_body(header.kind, body)? {
                    let accesses = self
                        .ranges
                        .iter()
                        .position(|range| {
                            range.slabs.iter().any(|slab| slab.node == node && slab.slab_id == slab_id)
                        })
                        .map_or(0, |range| self.range_accesses[range]);
                    Control::SlabActivity { slab_id, accesses }
                        .encode(header.request_id, &mut self.nodes[node].out);
                    self.mark_queued(node);
                }
                return Ok(());
            }
            Kind::SlabEvicted => {
                // Unsolicited: the node evicts one of our slabs (memory pressure or command).
                if let Control::SlabEvicted { slab_id } = Control::decode_body(header.kind, body)? {
                    self.slab_evicted(node, slab_id);
                }
                return Ok(());
            }
            Kind::Pong => {
                self.nodes[node].ping_sent = None;
                return Ok(());
            }
            _ => {}
        }
        if header.request_id & CONTROL_REQUEST != 0 {
            let message = Control::decode_body(header.kind, body)?;
            if !self.regeneration_reply(node, header.request_id, &message) {
                if let Some(index) = self.awaited_replies.iter().position(|id| *id == header.request_id) {
                    self.awaited_replies.swap_remove(index);
                    self.control_replies.push((node, header.request_id, message));
                }
            }
            return Ok(());
        }
        let (slot_index, generation, split) = parse_request_id(header.request_id);
        if split >= MAX_SPLITS {
            return Err(FrameError::Malformed(format!("reply names split {split}")));
        }
        let Some(slot) =
            self.slots.get(slot_index).filter(|slot| slot.generation == generation && slot.in_use())
        else {
            // A late reply of a finished op: dropped.
            return Ok(());
        };
        let width = match slot.kind {
            SlotKind::Probe => self.probes[slot.probe].targets.len(),
            _ => self.ranges[slot.range].slabs.len(),
        };
        let expected_node = (split < width).then(|| self.slot_split_node(slot, split));
        if expected_node != Some(node) {
            return Err(FrameError::Malformed(format!("reply for split {split} from the wrong node")));
        }
        let kind = if slot.reading() { SlotKind::Read } else { slot.kind };
        let places = slot.kind == SlotKind::Read;
        let outcome = match (header.kind, kind) {
            (Kind::WriteSplitOk, SlotKind::Write) => Outcome::Write(true),
            (Kind::Error, SlotKind::Write) => {
                self.log_node_error(node, header, body);
                Outcome::Write(false)
            }
            (Kind::Error, SlotKind::Read) => {
                self.log_node_error(node, header, body);
                Outcome::Read(SplitOutcome::Failed)
            }
            (Kind::Error, SlotKind::Probe) => return Err(FrameError::Malformed("probe read failed".into())),
            (Kind::ReadSplitReply, SlotKind::Probe) => Outcome::ProbeReply,
            (Kind::ReadSplitReply, SlotKind::Read) => {
                let split_bytes = self.regions[slot.region].split_bytes;
                if body.len() != SPLIT_META_BYTES + split_bytes {
                    return Err(FrameError::Malformed(format!("split reply of {} bytes", body.len())));
                }
                let meta_bytes: &[u8; SPLIT_META_BYTES] = body[..SPLIT_META_BYTES].try_into().expect("meta");
                let meta = SplitMeta::decode(meta_bytes)?;
                let payload = &body[SPLIT_META_BYTES..];
                let verdict = judge_split(payload, meta, slot.page, split as u8);
                self.record_split_read(node);
                match verdict {
                    SplitVerdict::NeverWritten => Outcome::Read(SplitOutcome::Valid { version: 0 }),
                    SplitVerdict::Corrupt => {
                        self.record_corruption(node);
                        Outcome::Read(SplitOutcome::Corrupt)
                    }
                    SplitVerdict::Valid { version } => {
                        if places {
                            self.place_split(slot_index, split, payload, buffers);
                        }
                        Outcome::Read(SplitOutcome::Valid { version })
                    }
                }
            }
            (other, _) => return Err(FrameError::Malformed(format!("unexpected {other:?} reply"))),
        };
        self.events.push(SplitEvent { slot: slot_index, generation, split, outcome });
        Ok(())
    }

    pub(super) fn log_node_error(&self, node: usize, header: FrameHeader, body: &[u8]) {
        let address = self.nodes[node].address;
        match Control::decode_body(header.kind, body) {
            Ok(Control::Error { code, message }) => {
                tracing::warn!(node = %address, ?code, %message, "node refused a split")
            }
            _ => tracing::warn!(node = %address, "node sent a malformed error"),
        }
    }

    /// Copies a verified split to its place: a data split into the caller's page, a parity into
    /// the op's parity buffer.
    pub(super) fn place_split(
        &mut self,
        slot_index: usize,
        split: usize,
        payload: &[u8],
        buffers: &mut dyn OpBuffers,
    ) {
        let slot = &mut self.slots[slot_index];
        let k = self.regions[slot.region].shape.data_splits;
        let split_bytes = payload.len();
        if split >= k {
            slot.parity[(split - k) * split_bytes..(split - k + 1) * split_bytes].copy_from_slice(payload);
        } else {
            buffers.read_buffer(slot.tag)[split * split_bytes..(split + 1) * split_bytes]
                .copy_from_slice(payload);
        }
    }

    /// Reads one split of a shared-memory slab straight into its place and judges it like a
    /// split from a socket.
    pub(super) fn read_shm_split(
        &mut self,
        slot_index: usize,
        split: usize,
        buffers: &mut dyn OpBuffers,
    ) -> SplitOutcome {
        let slot = &self.slots[slot_index];
        let (range, page, slot_in_range, region, tag) =
            (slot.range, slot.page, slot.slot_in_range, slot.region, slot.tag);
        let k = self.regions[region].shape.data_splits;
        let split_bytes = self.regions[region].split_bytes;
        let Some(mapping) = self.live_shm(range, split) else {
            return SplitOutcome::Failed;
        };
        let node = mapping.node;
        let page_bytes = self.config.page_bytes;
        let target = if self.slots[slot_index].kind == SlotKind::Write {
            // A write finding out its page's version only needs the split's version.
            &mut self.slots[slot_index].staging[page_bytes..page_bytes + split_bytes]
        } else if split >= k {
            &mut self.slots[slot_index].parity[(split - k) * split_bytes..(split - k + 1) * split_bytes]
        } else {
            &mut buffers.read_buffer(tag)[split * split_bytes..(split + 1) * split_bytes]
        };
        // Re-borrow: the mapping lives in `self.shm`, the target in a slot or the caller's page.
        let mapping = self.shm[range * MAX_SPLITS + split].as_ref().expect("live mapping");
        let Some(meta) = mapping.read_split(slot_in_range, target) else {
            if mapping.is_revoked() {
                self.schedule_regeneration(range, split, "shared-memory slab revoked", false);
                return SplitOutcome::Failed;
            }
            // A write overlapped the copy (not ours: we never race ourselves): an erasure.
            return SplitOutcome::Corrupt;
        };
        let verdict = judge_split(target, meta, page, split as u8);
        self.record_split_read(node);
        match verdict {
            SplitVerdict::NeverWritten => SplitOutcome::Valid { version: 0 },
            SplitVerdict::Valid { version } => SplitOutcome::Valid { version },
            SplitVerdict::Corrupt => {
                self.record_corruption(node);
                SplitOutcome::Corrupt
            }
        }
    }
}
