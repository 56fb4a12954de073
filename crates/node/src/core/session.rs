//! One authenticated connection's requests, served in order: frames in, replies and effects out.
//!
//! [`Session::serve_one`] looks at the bytes a shell has buffered for the connection and serves
//! the frame at their front if it can: it appends the reply to the shell's output buffer and
//! returns how many bytes it consumed, and at most one [`Effect`] the shell must carry out. A
//! `WriteSplit` is validated as soon as its prefix is there, before the shell waits for its
//! payload; its payload is copied once, from the shell's input buffer into the slot, and a read's
//! payloads once, from the slots into the shell's output buffer.
//!
//! Fault model: the peer may send anything. A header or body that does not decode, a kind the node
//! does not accept, and every refused `WriteSplit` get an `Error` reply and close the connection
//! ([`Served::Close`]): an unconsumed payload leaves the stream unusable. Other refusals (unknown
//! slab, not owner, slot out of range, no capacity, bad split size, a refused fault or rebuild)
//! get an `Error` reply and the connection stays open. Nothing here panics on input.
//!
//! Invariant: no allocation per request in steady state (the output buffer keeps its capacity),
//! and no lock but the slab table's on the data path.

use super::rebuild::RebuildRequest;
use super::{Admission, NodeCore, Refusal, Slab, SlabError, SlabLabel};
use crate::fault::{self, DelayFault};
use remem_proto::{
    encode_read_splits_reply_head, max_read_splits_count, Control, FaultKind, FrameHeader, Kind, SplitMeta,
    WriteSplitPrefix, HEADER_BYTES, SPLIT_META_BYTES, WRITE_SPLIT_PREFIX_BYTES,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What carries a session's bytes; only a Unix socket can pass a memfd (`ExportSlab`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Unix,
    /// The simulator's connections: like TCP.
    Simulated,
}

/// Something the shell must do for a served request.
pub enum Effect {
    /// A rebuild was admitted and its `Ok` is in the output: send it before the rebuild can
    /// report, then run the rebuild; it reports `RegenerationDone` with `request_id`.
    Rebuild { request_id: u64, admission: Admission },
    /// Send `SlabExported` for `slab` with its memfd attached (after the output so far).
    Export { request_id: u64, slab_id: u32, slab: Arc<Slab> },
    /// Evict `slab_id` (the core checked this client owns it): tell the owner's other
    /// connections, unmap it ([`NodeCore::evict_slab`]), then [`Session::evicted`].
    Evict { request_id: u64, slab_id: u32 },
    /// Set the node's standing reply delay (`DelayFault::default()` clears it).
    SetDelay(DelayFault),
    /// This connection answers the resource monitor's `SlabActivityQuery`s.
    AnswersActivity,
    /// The owner's answer to a `SlabActivityQuery` (no reply).
    ActivityAnswer { request_id: u64, slab_id: u32, accesses: u64 },
}

/// What [`Session::serve_one`] did with the front of the input.
pub enum Served {
    /// No complete frame (or `WriteSplit` prefix) yet: read more.
    Wait,
    /// One frame served: `consumed` bytes, `replies` frames appended to the output.
    Done { consumed: usize, replies: u32, effect: Option<Effect> },
    /// A refusal that closes the connection; its `Error` reply is the last frame of the output.
    Close(Refusal),
}

/// One authenticated connection's view of the node.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    pub client_id: u64,
    /// The session that claimed `client_id` (`leases`), 0 for a tool's connection.
    pub session: u64,
    /// The shell's number for the connection (rebuild reports go back to it).
    pub connection: u64,
    pub transport: Transport,
}

impl Session {
    /// Serves the frame at the front of `input`, appending its reply to `out`; see the module
    /// documentation.
    pub fn serve_one(&self, core: &NodeCore, input: &[u8], out: &mut Vec<u8>) -> Served {
        let Some(header_bytes) = input.first_chunk::<HEADER_BYTES>() else {
            return Served::Wait;
        };
        let header = match FrameHeader::decode(header_bytes) {
            Ok(header) => header,
            Err(error) => {
                return close(out, FrameHeader::raw_request_id(header_bytes), Refusal::Malformed(error))
            }
        };
        let frame_bytes = HEADER_BYTES + header.body_len as usize;
        let served = match header.kind {
            Kind::WriteSplit => return self.write_split(core, header, input, out),
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
                if input.len() < frame_bytes {
                    return Served::Wait;
                }
                match Control::decode_body(header.kind, &input[HEADER_BYTES..frame_bytes]) {
                    Ok(request) => self.handle_control(core, header.request_id, request, out),
                    Err(error) => return close(out, header.request_id, Refusal::Malformed(error)),
                }
            }
            kind => return close(out, header.request_id, Refusal::NotARequest { kind }),
        };
        core.requests_served.fetch_add(1, Ordering::Relaxed);
        let (replies, effect) = served;
        Served::Done { consumed: frame_bytes, replies, effect }
    }

    /// Validates a `WriteSplit` as soon as its prefix is there and, once the whole frame is,
    /// copies the payload into the slot and publishes its metadata.
    fn write_split(&self, core: &NodeCore, header: FrameHeader, input: &[u8], out: &mut Vec<u8>) -> Served {
        let Some(prefix_bytes) = input[HEADER_BYTES..].first_chunk::<WRITE_SPLIT_PREFIX_BYTES>() else {
            return Served::Wait;
        };
        let prefix = match WriteSplitPrefix::decode(prefix_bytes) {
            Ok(prefix) => prefix,
            Err(error) => return close(out, header.request_id, Refusal::Malformed(error)),
        };
        let slab = match core.table.get(self.client_id, prefix.slab_id) {
            Ok(slab) => slab,
            Err(error) => return close(out, header.request_id, error.into()),
        };
        let payload_bytes = header.body_len - WRITE_SPLIT_PREFIX_BYTES as u32;
        if prefix.slot >= slab.slots() {
            let error = SlabError::SlotOutOfRange {
                slab_id: prefix.slab_id,
                first_slot: prefix.slot,
                count: 1,
                slots: slab.slots(),
            };
            return close(out, header.request_id, error.into());
        }
        if payload_bytes != slab.split_bytes() {
            let error = SlabError::PayloadSize {
                slab_id: prefix.slab_id,
                payload_bytes,
                split_bytes: slab.split_bytes(),
            };
            return close(out, header.request_id, error.into());
        }
        let frame_bytes = HEADER_BYTES + header.body_len as usize;
        if input.len() < frame_bytes {
            return Served::Wait;
        }
        // Counted once the frame is complete: a frame may be looked at several times before.
        slab.record_request();
        let payload_at = HEADER_BYTES + WRITE_SPLIT_PREFIX_BYTES;
        slab.write(
            prefix.slot,
            &input[payload_at..frame_bytes],
            SplitMeta { version: prefix.version, checksum: prefix.checksum },
        );
        Control::WriteSplitOk.encode(header.request_id, out);
        core.requests_served.fetch_add(1, Ordering::Relaxed);
        Served::Done { consumed: frame_bytes, replies: 1, effect: None }
    }

    /// Serves one decoded control request; returns the replies appended and the effect.
    fn handle_control(
        &self,
        core: &NodeCore,
        request_id: u64,
        request: Control,
        out: &mut Vec<u8>,
    ) -> (u32, Option<Effect>) {
        let client_id = self.client_id;
        let reply = match request {
            Control::Ping => Ok(Control::Pong),
            // A Pong answers nothing the node asked; ignore it rather than reply to a reply.
            Control::Pong => return (0, None),
            Control::NodeInfo => Ok(Control::NodeInfoReply(core.node_info())),
            Control::MapSlab { split_bytes, split_index, first_page, range_id } => {
                self.map_slab(core, SlabLabel { split_bytes, split_index, first_page, range_id })
            }
            Control::UnmapSlab { slab_id } => self.unmap_slab(core, slab_id),
            Control::ReadSplit { slab_id, slot } => {
                match self.read_splits(core, request_id, slab_id, slot, 1, false, out) {
                    Ok(()) => return (1, None),
                    Err(error) => Err(error.into()),
                }
            }
            Control::ReadSplits { slab_id, first_slot, count } => {
                match self.read_splits(core, request_id, slab_id, first_slot, count, true, out) {
                    Ok(()) => return (1, None),
                    Err(error) => Err(error.into()),
                }
            }
            Control::InjectFault { fault, slab_id, delay_us, fraction_ppm, flips, seed } => {
                let delay = DelayFault { delay_us, fraction_ppm, seed };
                match self.inject_fault(core, request_id, fault, slab_id, delay, flips) {
                    Ok((reply, effect)) => {
                        if let Some(reply) = reply {
                            reply.encode(request_id, out);
                            return (1, effect);
                        }
                        return (0, effect);
                    }
                    Err(refusal) => Err(refusal),
                }
            }
            Control::Regenerate { slab_id, data_splits, parity_splits, page_bytes, pages, sources } => {
                let request =
                    RebuildRequest { slab_id, data_splits, parity_splits, page_bytes, pages, sources };
                match core.admit_rebuild(client_id, request) {
                    Ok(admission) => {
                        // The Ok goes out before the rebuild can possibly report, so the client
                        // always sees Ok, then RegenerationDone.
                        Control::Ok.encode(request_id, out);
                        return (1, Some(Effect::Rebuild { request_id, admission }));
                    }
                    Err(refusal) => {
                        tracing::info!(client_id, slab_id, code = %refusal.code(), message = %refusal, "regeneration refused");
                        Err(refusal)
                    }
                }
            }
            Control::ExportSlab { slab_id } => match self.export_slab(core, slab_id) {
                Ok(slab) => return (0, Some(Effect::Export { request_id, slab_id, slab })),
                Err(refusal) => Err(refusal),
            },
            Control::AnswerActivity => {
                Control::Ok.encode(request_id, out);
                return (1, Some(Effect::AnswersActivity));
            }
            // An owner's answer to the resource monitor: no reply.
            Control::SlabActivity { slab_id, accesses } => {
                return (0, Some(Effect::ActivityAnswer { request_id, slab_id, accesses }))
            }
            other => unreachable!("serve_one passes only requests, got {other:?}"),
        };
        let reply = reply.unwrap_or_else(|refusal: Refusal| {
            tracing::debug!(client_id, error = %refusal, "request refused");
            refusal.reply()
        });
        reply.encode(request_id, out);
        (1, None)
    }

    fn map_slab(&self, core: &NodeCore, label: SlabLabel) -> Result<Control, Refusal> {
        let client_id = self.client_id;
        let (slab_id, slots) = core.table.map(client_id, label)?;
        tracing::info!(
            client_id,
            slab_id,
            slots,
            split_bytes = label.split_bytes,
            split_index = label.split_index,
            first_page = label.first_page,
            range_id = label.range_id,
            "slab mapped"
        );
        Ok(Control::SlabMapped { slab_id, slots })
    }

    /// Unmaps an owned slab; a rebuild filling it finds it gone at its next batch and reports.
    fn unmap_slab(&self, core: &NodeCore, slab_id: u32) -> Result<Control, Refusal> {
        let label = core.table.unmap(self.client_id, slab_id)?;
        tracing::info!(
            client_id = self.client_id,
            slab_id,
            split_index = label.split_index,
            first_page = label.first_page,
            range_id = label.range_id,
            "slab unmapped"
        );
        Ok(Control::Ok)
    }

    /// Appends the reply to `ReadSplit` (`many == false`, count 1) or `ReadSplits`: header, then
    /// each slot's metadata and bytes copied from the slab.
    #[allow(clippy::too_many_arguments)]
    fn read_splits(
        &self,
        core: &NodeCore,
        request_id: u64,
        slab_id: u32,
        first_slot: u32,
        count: u32,
        many: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), SlabError> {
        let slab = core.table.get(self.client_id, slab_id)?;
        slab.record_request();
        let split_bytes = slab.split_bytes();
        let in_range = u64::from(first_slot) + u64::from(count) <= u64::from(slab.slots());
        if !in_range || (many && count > max_read_splits_count(split_bytes)) {
            return Err(SlabError::SlotOutOfRange { slab_id, first_slot, count, slots: slab.slots() });
        }
        if many {
            encode_read_splits_reply_head(request_id, count, split_bytes, out);
        } else {
            let header = FrameHeader {
                kind: Kind::ReadSplitReply,
                body_len: SPLIT_META_BYTES as u32 + split_bytes,
                request_id,
            };
            out.extend_from_slice(&header.encode());
        }
        for slot in first_slot..first_slot + count {
            let meta_at = out.len();
            let payload_at = meta_at + SPLIT_META_BYTES;
            out.resize(payload_at + split_bytes as usize, 0);
            let meta = slab.read(slot, &mut out[payload_at..]);
            out[meta_at..payload_at].copy_from_slice(&meta.encode());
        }
        Ok(())
    }

    /// `InjectFault`: the reply to send now (if any) and the effect, or the refusal.
    fn inject_fault(
        &self,
        core: &NodeCore,
        request_id: u64,
        fault: FaultKind,
        slab_id: u32,
        delay: DelayFault,
        flips: u32,
    ) -> Result<(Option<Control>, Option<Effect>), Refusal> {
        let client_id = self.client_id;
        if !core.fault_injection {
            return Err(Refusal::NoFaultInjection);
        }
        match fault {
            FaultKind::Delay => {
                tracing::warn!(
                    client_id,
                    delay_us = delay.delay_us,
                    fraction_ppm = delay.fraction_ppm,
                    seed = delay.seed,
                    "fault: reply delay set"
                );
                Ok((Some(Control::Ok), Some(Effect::SetDelay(delay))))
            }
            FaultKind::ClearFaults => {
                tracing::warn!(client_id, "fault: faults cleared");
                Ok((Some(Control::Ok), Some(Effect::SetDelay(DelayFault::default()))))
            }
            FaultKind::Corrupt => {
                let slab = core.table.get(client_id, slab_id)?;
                let slots = fault::corrupt(&slab, flips, delay.seed);
                tracing::warn!(client_id, slab_id, flips, seed = delay.seed, ?slots, "fault: bits flipped");
                Ok((Some(Control::Ok), None))
            }
            FaultKind::Evict => {
                core.table.get(client_id, slab_id)?;
                Ok((None, Some(Effect::Evict { request_id, slab_id })))
            }
        }
    }

    /// The shell carried out [`Effect::Evict`] with `result`: this connection, the owner's too,
    /// hears of the eviction first, then the fault's reply.
    pub fn evicted(
        &self,
        request_id: u64,
        slab_id: u32,
        result: Result<SlabLabel, SlabError>,
        out: &mut Vec<u8>,
    ) -> u32 {
        match result {
            Ok(_) => {
                Control::SlabEvicted { slab_id }.encode(0, out);
                Control::Ok.encode(request_id, out);
                2
            }
            Err(error) => {
                tracing::debug!(client_id = self.client_id, %error, "request refused");
                Refusal::from(error).reply().encode(request_id, out);
                1
            }
        }
    }

    /// The checks of `ExportSlab`: `Unsupported` on a connection that cannot pass a memfd or for
    /// a slab being rebuilt (the rebuild's conditional stores take a lock that plain stores from
    /// the client would bypass), `UnknownSlab`, `NotOwner`.
    fn export_slab(&self, core: &NodeCore, slab_id: u32) -> Result<Arc<Slab>, Refusal> {
        if self.transport != Transport::Unix {
            return Err(Refusal::NeedsUnixSocket);
        }
        let slab = core.table.get(self.client_id, slab_id)?;
        if slab.is_regenerating() {
            return Err(Refusal::ExportWhileRebuilding);
        }
        Ok(slab)
    }
}

/// Appends the `Error` reply of a refusal that closes the connection.
fn close(out: &mut Vec<u8>, request_id: u64, refusal: Refusal) -> Served {
    refusal.reply().encode(request_id, out);
    Served::Close(refusal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Backing, CoreConfig};
    use remem_proto::encode_write_split;
    use std::time::Duration;

    fn core() -> NodeCore {
        NodeCore::new(CoreConfig {
            node_id: 9,
            capacity_bytes: 1 << 20,
            slab_size_bytes: 64 << 10,
            failure_domain: "d".to_owned(),
            fault_injection: false,
            backing: Backing::Heap,
            lease_grace: Duration::from_secs(1),
            lease_timeout: Duration::from_secs(1),
        })
    }

    fn session(client_id: u64) -> Session {
        Session { client_id, session: 0, connection: 1, transport: Transport::Simulated }
    }

    /// Serves every frame of `input`, as a shell would; returns the output and whether it closed.
    fn serve_all(core: &NodeCore, session: &Session, input: &[u8]) -> (Vec<u8>, bool) {
        let (mut out, mut at) = (Vec::new(), 0);
        loop {
            match session.serve_one(core, &input[at..], &mut out) {
                Served::Wait => return (out, false),
                Served::Done { consumed, .. } => at += consumed,
                Served::Close(_) => return (out, true),
            }
        }
    }

    fn replies(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut frames = Vec::new();
        while let Some(header_bytes) = bytes.first_chunk::<HEADER_BYTES>() {
            let header = FrameHeader::decode(header_bytes).unwrap();
            let end = HEADER_BYTES + header.body_len as usize;
            frames.push((header, bytes[HEADER_BYTES..end].to_vec()));
            bytes = &bytes[end..];
        }
        frames
    }

    #[test]
    fn a_core_maps_writes_and_reads_back_without_io_and_fences_other_clients() {
        let core = core();
        let owner = session(7);
        let mut input = Vec::new();
        Control::MapSlab { split_bytes: 512, split_index: 0, first_page: 0, range_id: 0 }
            .encode(1, &mut input);
        let (out, closed) = serve_all(&core, &owner, &input);
        assert!(!closed);
        let (header, body) = &replies(&out)[0];
        let Ok(Control::SlabMapped { slab_id, slots: 128 }) = Control::decode_body(header.kind, body) else {
            panic!("expected SlabMapped, got {header:?}");
        };

        let payload = [0xAB; 512];
        let prefix = WriteSplitPrefix { slab_id, slot: 3, version: 2, checksum: 77 };
        let mut input = Vec::new();
        encode_write_split(2, &prefix, &payload, &mut input);
        Control::ReadSplit { slab_id, slot: 3 }.encode(3, &mut input);
        // Half a frame waits; the rest serves both.
        assert!(matches!(owner.serve_one(&core, &input[..HEADER_BYTES + 4], &mut Vec::new()), Served::Wait));
        let (out, closed) = serve_all(&core, &owner, &input);
        assert!(!closed);
        let frames = replies(&out);
        assert_eq!(frames[0].0.kind, Kind::WriteSplitOk);
        assert_eq!((frames[1].0.kind, frames[1].0.request_id), (Kind::ReadSplitReply, 3));
        let meta = SplitMeta::decode(frames[1].1[..SPLIT_META_BYTES].try_into().unwrap()).unwrap();
        assert_eq!((meta.version, meta.checksum), (2, 77));
        assert_eq!(&frames[1].1[SPLIT_META_BYTES..], &payload[..]);
        assert_eq!(core.node_info().requests_served, 3);

        // Another client id: a read is refused and the connection stays; a write closes it.
        let other = session(8);
        let mut input = Vec::new();
        Control::ReadSplit { slab_id, slot: 3 }.encode(4, &mut input);
        let (out, closed) = serve_all(&core, &other, &input);
        assert!(!closed);
        assert!(matches!(
            Control::decode_body(Kind::Error, &replies(&out)[0].1),
            Ok(Control::Error { code: remem_proto::ErrorCode::NotOwner, .. })
        ));
        let mut input = Vec::new();
        encode_write_split(5, &prefix, &payload, &mut input);
        let (_, closed) = serve_all(&core, &other, &input);
        assert!(closed, "a refused WriteSplit closes the connection");
        assert_eq!(
            core.table.get(7, slab_id).unwrap().meta(3).version,
            2,
            "the refused write stored nothing"
        );
    }
}
