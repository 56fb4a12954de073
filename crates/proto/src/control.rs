//! Control messages: every message without a split payload, fully owned and small.

use crate::error::{DecodeError, ErrorCode};
use crate::frame::{FrameHeader, Kind};
use crate::shm::ShmLayout;
use crate::sizes::{
    ERROR_FIXED_BYTES, HEADER_BYTES, MAX_ERROR_MESSAGE_BYTES, MAX_FAILURE_DOMAIN_BYTES, MAX_FRACTION_PPM,
    MAX_REGENERATION_SOURCES, NODE_INFO_FIXED_BYTES, READ_SPLITS_MAX_COUNT, REGENERATE_FIXED_BYTES,
    REGENERATION_SOURCE_BYTES,
};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

/// Which fault an `InjectFault` injects (`docs/PROTOCOL.md`, "Fault injection").
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// Hold back a fraction of the node's replies by `delay_us`.
    Delay = 1,
    /// Flip `flips` random bits in the written slots of slab `slab_id`.
    Corrupt = 2,
    /// Evict slab `slab_id`: tell its owner, then unmap it.
    Evict = 3,
    /// Remove every standing fault (the delay).
    ClearFaults = 4,
}

impl FaultKind {
    pub const ALL: [FaultKind; 4] =
        [FaultKind::Delay, FaultKind::Corrupt, FaultKind::Evict, FaultKind::ClearFaults];

    /// The fault for a wire value, or `None` for a value this version does not define.
    pub fn from_u8(value: u8) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|fault| *fault as u8 == value)
    }
}

/// One surviving split a `Regenerate` may read from: slab `slab_id` on the node at `address`,
/// holding split `split_index` of the same range.
///
/// On the wire the address is 16 bytes of IPv6 (IPv4 as IPv4-mapped IPv6) and a port; IPv6 flow
/// info and scope id are not carried, and a mapped address decodes as [`SocketAddr::V4`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegenerationSource {
    pub split_index: u8,
    pub slab_id: u32,
    pub address: SocketAddr,
}

/// What a node reports about itself in `NodeInfoReply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub node_id: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub slab_size_bytes: u64,
    pub slabs_mapped: u32,
    pub metadata_bytes: u64,
    pub requests_served: u64,
    /// Rebuilds (`Regenerate`) running on this node now.
    pub regenerating_slabs: u32,
    /// Pages handled (rebuilt, skipped or lost) by the rebuilds running now, summed.
    pub regeneration_pages_done: u64,
    /// Pages to handle by the rebuilds running now, summed.
    pub regeneration_pages_total: u64,
    /// Client ids whose lease is live (a session with a connection open).
    pub clients_live: u32,
    /// Client ids whose lease lapsed and whose slabs are kept until their grace period ends.
    pub clients_in_grace: u32,
    /// Slabs of the clients in grace.
    pub slabs_in_grace: u32,
    /// At most [`MAX_FAILURE_DOMAIN_BYTES`] bytes of UTF-8.
    pub failure_domain: String,
}

/// Every message without a split payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    Hello {
        client_id: u64,
        client_nonce: [u8; 32],
        /// The claiming process's session (random, fixed for its lifetime). A node lets one
        /// session at a time hold a client id and its slabs: the holder's lease lives while it
        /// has a connection open; another session is refused (`ClientIdInUse`) until then, and
        /// takes over after. 0 claims nothing: a tool acting for whoever holds the id.
        session: u64,
    },
    Challenge {
        node_nonce: [u8; 32],
        node_proof: [u8; 32],
    },
    Auth {
        client_proof: [u8; 32],
    },
    AuthOk {
        node_id: u64,
    },
    MapSlab {
        split_bytes: u32,
        split_index: u8,
        first_page: u64,
        range_id: u64,
    },
    SlabMapped {
        slab_id: u32,
        slots: u32,
    },
    UnmapSlab {
        slab_id: u32,
    },
    Ok,
    NodeInfo,
    NodeInfoReply(NodeInfo),
    Ping,
    Pong,
    Error {
        code: ErrorCode,
        /// At most [`MAX_ERROR_MESSAGE_BYTES`] bytes of UTF-8 after encoding.
        message: String,
    },
    WriteSplitOk,
    ReadSplit {
        slab_id: u32,
        slot: u32,
    },
    ReadSplits {
        slab_id: u32,
        first_slot: u32,
        /// 1..=[`READ_SPLITS_MAX_COUNT`].
        count: u32,
    },
    InjectFault {
        fault: FaultKind,
        /// The slab of `Corrupt` and `Evict`; 0 otherwise.
        slab_id: u32,
        delay_us: u32,
        /// 0..=[`MAX_FRACTION_PPM`]: the share of replies a `Delay` holds back.
        fraction_ppm: u32,
        flips: u32,
        seed: u64,
    },
    /// Unsolicited (request id 0): the node evicted this slab of the receiving client.
    SlabEvicted {
        slab_id: u32,
    },
    Regenerate {
        /// The new, empty slab on the receiving node that takes the lost split.
        slab_id: u32,
        data_splits: u8,
        parity_splits: u8,
        page_bytes: u32,
        /// Slots to rebuild, from slot 0.
        pages: u32,
        /// 1..=[`MAX_REGENERATION_SOURCES`] entries.
        sources: Vec<RegenerationSource>,
    },
    /// Sent when a rebuild ends, with the request id of its `Regenerate`.
    RegenerationDone {
        slab_id: u32,
        pages_rebuilt: u64,
        /// Pages with nothing to rebuild, left as they are: written by the client since the
        /// rebuild began, or never written (the newest version that k sources agree on is 0).
        pages_skipped: u64,
        /// Pages that were, or may have been, written and could not be rebuilt, left unwritten:
        /// fewer than k consistent valid splits among the sources, or not reached because the
        /// rebuild ended early (fewer than k sources left, node stopping, slab gone). A requester
        /// that sees any lost page must treat the slab as not rebuilt.
        pages_lost: u64,
    },
    /// Asks the node to pass slab `slab_id`'s memfd over this Unix connection (`docs/SHM.md`).
    ExportSlab {
        slab_id: u32,
    },
    /// The reply to `ExportSlab`; the frame travels with exactly one file descriptor
    /// (SCM_RIGHTS), the slab's memfd laid out as `layout` says.
    SlabExported {
        slab_id: u32,
        /// Nonzero, unique per slab the node ever mapped: a reused slab id has a new epoch.
        epoch: u64,
        /// Always what [`ShmLayout::new`] computes for its `slab_bytes` and `split_bytes`.
        layout: ShmLayout,
    },
    /// A client's main connection volunteers to answer `SlabActivityQuery` (reply `Ok`). Other
    /// connections of the same client id (a rebuild reading sources, tools) never get queries.
    AnswerActivity,
    /// From the node's resource monitor to a slab's owner, on the connection that volunteered:
    /// how active is this slab? (Seed 000 batch eviction asks the owners; the node cannot see
    /// shared-memory accesses itself.) The request id is the node's.
    SlabActivityQuery {
        slab_id: u32,
    },
    /// The owner's answer, with the query's request id: page operations on the slab's range
    /// since the client started (a running total; the node takes differences).
    SlabActivity {
        slab_id: u32,
        accesses: u64,
    },
}

impl Control {
    pub fn kind(&self) -> Kind {
        match self {
            Control::Hello { .. } => Kind::Hello,
            Control::Challenge { .. } => Kind::Challenge,
            Control::Auth { .. } => Kind::Auth,
            Control::AuthOk { .. } => Kind::AuthOk,
            Control::MapSlab { .. } => Kind::MapSlab,
            Control::SlabMapped { .. } => Kind::SlabMapped,
            Control::UnmapSlab { .. } => Kind::UnmapSlab,
            Control::Ok => Kind::Ok,
            Control::NodeInfo => Kind::NodeInfo,
            Control::NodeInfoReply(_) => Kind::NodeInfoReply,
            Control::Ping => Kind::Ping,
            Control::Pong => Kind::Pong,
            Control::Error { .. } => Kind::Error,
            Control::WriteSplitOk => Kind::WriteSplitOk,
            Control::ReadSplit { .. } => Kind::ReadSplit,
            Control::ReadSplits { .. } => Kind::ReadSplits,
            Control::InjectFault { .. } => Kind::InjectFault,
            Control::SlabEvicted { .. } => Kind::SlabEvicted,
            Control::Regenerate { .. } => Kind::Regenerate,
            Control::RegenerationDone { .. } => Kind::RegenerationDone,
            Control::ExportSlab { .. } => Kind::ExportSlab,
            Control::SlabExported { .. } => Kind::SlabExported,
            Control::AnswerActivity => Kind::AnswerActivity,
            Control::SlabActivityQuery { .. } => Kind::SlabActivityQuery,
            Control::SlabActivity { .. } => Kind::SlabActivity,
        }
    }

    /// Convenience constructor for an `Error` reply.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Control {
        Control::Error { code, message: message.into() }
    }

    /// Appends the whole frame (header and body) to `out`.
    ///
    /// An `Error` message longer than [`MAX_ERROR_MESSAGE_BYTES`] is truncated at a character
    /// boundary. Panics if a `NodeInfoReply` failure domain is longer than
    /// [`MAX_FAILURE_DOMAIN_BYTES`], a `ReadSplits` count is outside 1..=256, a `Regenerate` has
    /// no source or more than [`MAX_REGENERATION_SOURCES`], or an `InjectFault` fraction exceeds
    /// [`MAX_FRACTION_PPM`]: those are configuration or programmer errors of the sender.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        let header_at = out.len();
        out.extend_from_slice(&[0u8; HEADER_BYTES]);
        let body_at = out.len();
        match self {
            Control::Hello { client_id, client_nonce, session } => {
                out.extend_from_slice(&client_id.to_le_bytes());
                out.extend_from_slice(client_nonce);
                out.extend_from_slice(&session.to_le_bytes());
            }
            Control::Challenge { node_nonce, node_proof } => {
                out.extend_from_slice(node_nonce);
                out.extend_from_slice(node_proof);
            }
            Control::Auth { client_proof } => out.extend_from_slice(client_proof),
            Control::AuthOk { node_id } => out.extend_from_slice(&node_id.to_le_bytes()),
            Control::MapSlab { split_bytes, split_index, first_page, range_id } => {
                out.extend_from_slice(&split_bytes.to_le_bytes());
                out.push(*split_index);
                out.extend_from_slice(&[0u8; 3]);
                out.extend_from_slice(&first_page.to_le_bytes());
                out.extend_from_slice(&range_id.to_le_bytes());
            }
            Control::SlabMapped { slab_id, slots } => {
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&slots.to_le_bytes());
            }
            Control::UnmapSlab { slab_id } => out.extend_from_slice(&slab_id.to_le_bytes()),
            Control::Ok | Control::NodeInfo | Control::Ping | Control::Pong => {}
            Control::WriteSplitOk => {}
            Control::NodeInfoReply(info) => encode_node_info(info, out),
            Control::Error { code, message } => {
                let message = truncate_utf8(message, MAX_ERROR_MESSAGE_BYTES);
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                out.extend_from_slice(&(message.len() as u16).to_le_bytes());
                out.extend_from_slice(message.as_bytes());
            }
            Control::ReadSplit { slab_id, slot } => {
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&slot.to_le_bytes());
            }
            Control::ReadSplits { slab_id, first_slot, count } => {
                assert!(
                    (1..=READ_SPLITS_MAX_COUNT).contains(count),
                    "ReadSplits count {count} outside 1..={READ_SPLITS_MAX_COUNT}"
                );
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&first_slot.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Control::InjectFault { fault, slab_id, delay_us, fraction_ppm, flips, seed } => {
                assert!(
                    *fraction_ppm <= MAX_FRACTION_PPM,
                    "fraction_ppm {fraction_ppm} above {MAX_FRACTION_PPM}"
                );
                out.push(*fault as u8);
                out.extend_from_slice(&[0u8; 3]);
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&delay_us.to_le_bytes());
                out.extend_from_slice(&fraction_ppm.to_le_bytes());
                out.extend_from_slice(&flips.to_le_bytes());
                out.extend_from_slice(&seed.to_le_bytes());
            }
            Control::SlabEvicted { slab_id } => out.extend_from_slice(&slab_id.to_le_bytes()),
            Control::Regenerate { slab_id, data_splits, parity_splits, page_bytes, pages, sources } => {
                encode_regenerate(
                    *slab_id,
                    (*data_splits, *parity_splits),
                    (*page_bytes, *pages),
                    sources,
                    out,
                )
            }
            Control::RegenerationDone { slab_id, pages_rebuilt, pages_skipped, pages_lost } => {
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
                out.extend_from_slice(&pages_rebuilt.to_le_bytes());
                out.extend_from_slice(&pages_skipped.to_le_bytes());
                out.extend_from_slice(&pages_lost.to_le_bytes());
            }
            Control::ExportSlab { slab_id } => out.extend_from_slice(&slab_id.to_le_bytes()),
            Control::AnswerActivity => {}
            Control::SlabActivityQuery { slab_id } => out.extend_from_slice(&slab_id.to_le_bytes()),
            Control::SlabActivity { slab_id, accesses } => {
                out.extend_from_slice(&slab_id.to_le_bytes());
                out.extend_from_slice(&[0u8; 4]);
                out.extend_from_slice(&accesses.to_le_bytes());
            }
            Control::SlabExported { slab_id, epoch, layout } => {
                encode_slab_exported(*slab_id, *epoch, layout, out)
            }
        }
        let body_len = u32::try_from(out.len() - body_at).expect("control bodies are small");
        let header = FrameHeader { kind: self.kind(), body_len, request_id };
        out[header_at..body_at].copy_from_slice(&header.encode());
    }

    /// Decodes the body of a control frame whose header has kind `kind`.
    ///
    /// Checks the body length against the kind's rule itself, so it is safe on any input;
    /// rejects payload-carrying kinds with [`DecodeError::NotControl`], non-zero reserved bytes,
    /// inner lengths that disagree with the body, non-UTF-8 text, unknown error codes and fault
    /// kinds, `ReadSplits` counts outside 1..=256, `Regenerate` source counts outside 1..=19 and
    /// `InjectFault` fractions above 1_000_000.
    pub fn decode_body(kind: Kind, body: &[u8]) -> Result<Control, DecodeError> {
        if kind.carries_payload() {
            return Err(DecodeError::NotControl { kind });
        }
        let body_len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        kind.check_body_len(body_len)?;
        let mut reader = Reader { kind, bytes: body };
        let control = match kind {
            Kind::Hello => Control::Hello {
                client_id: reader.u64(),
                client_nonce: reader.array(),
                session: reader.u64(),
            },
            Kind::Challenge => Control::Challenge { node_nonce: reader.array(), node_proof: reader.array() },
            Kind::Auth => Control::Auth { client_proof: reader.array() },
            Kind::AuthOk => Control::AuthOk { node_id: reader.u64() },
            Kind::MapSlab => {
                let split_bytes = reader.u32();
                let split_index = reader.u8();
                reader.reserved::<3>()?;
                Control::MapSlab {
                    split_bytes,
                    split_index,
                    first_page: reader.u64(),
                    range_id: reader.u64(),
                }
            }
            Kind::SlabMapped => Control::SlabMapped { slab_id: reader.u32(), slots: reader.u32() },
            Kind::UnmapSlab => Control::UnmapSlab { slab_id: reader.u32() },
            Kind::Ok => Control::Ok,
            Kind::NodeInfo => Control::NodeInfo,
            Kind::Ping => Control::Ping,
            Kind::Pong => Control::Pong,
            Kind::WriteSplitOk => Control::WriteSplitOk,
            Kind::NodeInfoReply => decode_node_info(&mut reader, body)?,
            Kind::Error => {
                let raw_code = reader.u16();
                let code =
                    ErrorCode::from_u16(raw_code).ok_or(DecodeError::UnknownErrorCode { found: raw_code })?;
                let message_len = reader.u16();
                debug_assert_eq!(body.len() - reader.bytes.len(), ERROR_FIXED_BYTES as usize);
                let message = reader.text("message_len", usize::from(message_len))?;
                Control::Error { code, message }
            }
            Kind::ReadSplit => Control::ReadSplit { slab_id: reader.u32(), slot: reader.u32() },
            Kind::ReadSplits => {
                let slab_id = reader.u32();
                let first_slot = reader.u32();
                let count = reader.u32();
                if !(1..=READ_SPLITS_MAX_COUNT).contains(&count) {
                    return Err(DecodeError::CountOutOfRange { kind, count });
                }
                Control::ReadSplits { slab_id, first_slot, count }
            }
            Kind::InjectFault => decode_inject_fault(&mut reader)?,
            Kind::SlabEvicted => Control::SlabEvicted { slab_id: reader.u32() },
            Kind::Regenerate => {
                let slab_id = reader.u32();
                let data_splits = reader.u8();
                let parity_splits = reader.u8();
                let source_count = reader.u8();
                reader.reserved::<1>()?;
                let page_bytes = reader.u32();
                let pages = reader.u32();
                debug_assert_eq!(body.len() - reader.bytes.len(), REGENERATE_FIXED_BYTES as usize);
                let sources = reader.regeneration_sources(source_count)?;
                Control::Regenerate { slab_id, data_splits, parity_splits, page_bytes, pages, sources }
            }
            Kind::RegenerationDone => {
                let slab_id = reader.u32();
                reader.reserved::<4>()?;
                Control::RegenerationDone {
                    slab_id,
                    pages_rebuilt: reader.u64(),
                    pages_skipped: reader.u64(),
                    pages_lost: reader.u64(),
                }
            }
            Kind::ExportSlab => Control::ExportSlab { slab_id: reader.u32() },
            Kind::AnswerActivity => Control::AnswerActivity,
            Kind::SlabActivityQuery => Control::SlabActivityQuery { slab_id: reader.u32() },
            Kind::SlabActivity => {
                let slab_id = reader.u32();
                reader.reserved::<4>()?;
                Control::SlabActivity { slab_id, accesses: reader.u64() }
            }
            Kind::SlabExported => decode_slab_exported(&mut reader)?,
            Kind::WriteSplit | Kind::ReadSplitReply | Kind::ReadSplitsReply => {
                unreachable!("payload kinds were rejected above")
            }
        };
        // The length rule fixed the size of every fixed-size kind and `text` consumed the rest of
        // the variable ones, so nothing may be left over.
        assert!(reader.bytes.is_empty(), "{kind:?} decoder left bytes unread");
        Ok(control)
    }
}

fn encode_node_info(info: &NodeInfo, out: &mut Vec<u8>) {
    assert!(
        info.failure_domain.len() <= MAX_FAILURE_DOMAIN_BYTES,
        "failure domain longer than {MAX_FAILURE_DOMAIN_BYTES} bytes"
    );
    out.extend_from_slice(&info.node_id.to_le_bytes());
    out.extend_from_slice(&info.capacity_bytes.to_le_bytes());
    out.extend_from_slice(&info.free_bytes.to_le_bytes());
    out.extend_from_slice(&info.slab_size_bytes.to_le_bytes());
    out.extend_from_slice(&info.slabs_mapped.to_le_bytes());
    out.extend_from_slice(&info.clients_live.to_le_bytes());
    out.extend_from_slice(&info.metadata_bytes.to_le_bytes());
    out.extend_from_slice(&info.requests_served.to_le_bytes());
    out.extend_from_slice(&info.regenerating_slabs.to_le_bytes());
    out.extend_from_slice(&info.clients_in_grace.to_le_bytes());
    out.extend_from_slice(&info.regeneration_pages_done.to_le_bytes());
    out.extend_from_slice(&info.regeneration_pages_total.to_le_bytes());
    out.extend_from_slice(&info.slabs_in_grace.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(info.failure_domain.len() as u8);
    out.extend_from_slice(info.failure_domain.as_bytes());
}

fn encode_regenerate(
    slab_id: u32,
    (data_splits, parity_splits): (u8, u8),
    (page_bytes, pages): (u32, u32),
    sources: &[RegenerationSource],
    out: &mut Vec<u8>,
) {
    assert!(
        (1..=MAX_REGENERATION_SOURCES).contains(&sources.len()),
        "Regenerate with {} sources, 1..={MAX_REGENERATION_SOURCES} allowed",
        sources.len()
    );
    out.extend_from_slice(&slab_id.to_le_bytes());
    out.push(data_splits);
    out.push(parity_splits);
    out.push(sources.len() as u8);
    out.push(0);
    out.extend_from_slice(&page_bytes.to_le_bytes());
    out.extend_from_slice(&pages.to_le_bytes());
    for source in sources {
        out.push(source.split_index);
        out.extend_from_slice(&[0u8; 3]);
        out.extend_from_slice(&source.slab_id.to_le_bytes());
        let ip = match source.address {
            SocketAddr::V4(address) => address.ip().to_ipv6_mapped(),
            SocketAddr::V6(address) => *address.ip(),
        };
        out.extend_from_slice(&ip.octets());
        out.extend_from_slice(&source.address.port().to_le_bytes());
        out.extend_from_slice(&[0u8; 2]);
    }
}

fn encode_slab_exported(slab_id: u32, epoch: u64, layout: &ShmLayout, out: &mut Vec<u8>) {
    assert_eq!(
        ShmLayout::new(layout.slab_bytes, layout.split_bytes),
        Some(*layout),
        "a SlabExported layout is the computed one"
    );
    assert_ne!(epoch, 0, "epochs start at 1");
    out.extend_from_slice(&slab_id.to_le_bytes());
    out.extend_from_slice(&layout.split_bytes.to_le_bytes());
    out.extend_from_slice(&layout.slots.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&layout.slab_bytes.to_le_bytes());
    out.extend_from_slice(&layout.checksums_offset.to_le_bytes());
    out.extend_from_slice(&layout.versions_offset.to_le_bytes());
    out.extend_from_slice(&layout.header_offset.to_le_bytes());
    out.extend_from_slice(&layout.total_bytes.to_le_bytes());
}

fn decode_node_info(reader: &mut Reader<'_>, body: &[u8]) -> Result<Control, DecodeError> {
    let node_id = reader.u64();
    let capacity_bytes = reader.u64();
    let free_bytes = reader.u64();
    let slab_size_bytes = reader.u64();
    let slabs_mapped = reader.u32();
    let clients_live = reader.u32();
    let metadata_bytes = reader.u64();
    let requests_served = reader.u64();
    let regenerating_slabs = reader.u32();
    let clients_in_grace = reader.u32();
    let regeneration_pages_done = reader.u64();
    let regeneration_pages_total = reader.u64();
    let slabs_in_grace = reader.u32();
    reader.reserved::<4>()?;
    let domain_len = reader.u8();
    debug_assert_eq!(body.len() - reader.bytes.len(), NODE_INFO_FIXED_BYTES as usize);
    let failure_domain = reader.text("domain_len", usize::from(domain_len))?;
    Ok(Control::NodeInfoReply(NodeInfo {
        node_id,
        capacity_bytes,
        free_bytes,
        slab_size_bytes,
        slabs_mapped,
        metadata_bytes,
        requests_served,
        regenerating_slabs,
        regeneration_pages_done,
        regeneration_pages_total,
        clients_live,
        clients_in_grace,
        slabs_in_grace,
        failure_domain,
    }))
}

fn decode_inject_fault(reader: &mut Reader<'_>) -> Result<Control, DecodeError> {
    let raw_fault = reader.u8();
    let fault = FaultKind::from_u8(raw_fault).ok_or(DecodeError::UnknownFault { found: raw_fault })?;
    reader.reserved::<3>()?;
    let slab_id = reader.u32();
    let delay_us = reader.u32();
    let fraction_ppm = reader.u32();
    if fraction_ppm > MAX_FRACTION_PPM {
        return Err(DecodeError::FieldOutOfRange {
            kind: reader.kind,
            field: "fraction_ppm",
            value: u64::from(fraction_ppm),
            min: 0,
            max: u64::from(MAX_FRACTION_PPM),
        });
    }
    Ok(Control::InjectFault {
        fault,
        slab_id,
        delay_us,
        fraction_ppm,
        flips: reader.u32(),
        seed: reader.u64(),
    })
}

fn decode_slab_exported(reader: &mut Reader<'_>) -> Result<Control, DecodeError> {
    let slab_id = reader.u32();
    let split_bytes = reader.u32();
    let slots = reader.u32();
    reader.reserved::<4>()?;
    let epoch = reader.u64();
    let layout = ShmLayout {
        slab_bytes: reader.u64(),
        split_bytes,
        slots,
        checksums_offset: reader.u64(),
        versions_offset: reader.u64(),
        header_offset: reader.u64(),
        total_bytes: reader.u64(),
    };
    if epoch == 0 {
        return Err(DecodeError::FieldOutOfRange {
            kind: reader.kind,
            field: "epoch",
            value: 0,
            min: 1,
            max: u64::MAX,
        });
    }
    if ShmLayout::new(layout.slab_bytes, layout.split_bytes) != Some(layout) {
        return Err(DecodeError::BadLayout { kind: reader.kind });
    }
    Ok(Control::SlabExported { slab_id, epoch, layout })
}

fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Little-endian field reader over a body whose length was already checked against the kind's
/// rule, so fixed-size reads cannot run past the end (they would panic, which is a bug here).
struct Reader<'a> {
    kind: Kind,
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) =
            self.bytes.split_first_chunk::<N>().expect("length rule guarantees the fixed fields are present");
        self.bytes = rest;
        *head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        self.take::<N>()
    }

    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    fn reserved<const N: usize>(&mut self) -> Result<(), DecodeError> {
        if self.take::<N>() != [0u8; N] {
            return Err(DecodeError::ReservedNotZero { kind: self.kind });
        }
        Ok(())
    }

    /// Consumes the rest of the body as exactly `declared` source entries; `declared` must be
    /// 1..=[`MAX_REGENERATION_SOURCES`]. Allocates only after both checks.
    fn regeneration_sources(&mut self, declared: u8) -> Result<Vec<RegenerationSource>, DecodeError> {
        if !(1..=MAX_REGENERATION_SOURCES).contains(&usize::from(declared)) {
            return Err(DecodeError::FieldOutOfRange {
                kind: self.kind,
                field: "source_count",
                value: u64::from(declared),
                min: 1,
                max: MAX_REGENERATION_SOURCES as u64,
            });
        }
        let declared_bytes = usize::from(declared) * REGENERATION_SOURCE_BYTES;
        if self.bytes.len() != declared_bytes {
            return Err(DecodeError::InnerLength {
                kind: self.kind,
                field: "source_count",
                declared: declared_bytes as u32,
                available: self.bytes.len() as u32,
            });
        }
        let mut sources = Vec::with_capacity(usize::from(declared));
        for _ in 0..declared {
            let split_index = self.u8();
            self.reserved::<3>()?;
            let slab_id = self.u32();
            let ip = Ipv6Addr::from(self.take::<16>());
            let port = self.u16();
            self.reserved::<2>()?;
            let address = match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::new(v4.into(), port),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)),
            };
            sources.push(RegenerationSource { split_index, slab_id, address });
        }
        Ok(sources)
    }

    /// Consumes the rest of the body as exactly `declared` bytes of UTF-8.
    fn text(&mut self, field: &'static str, declared: usize) -> Result<String, DecodeError> {
        if self.bytes.len() != declared {
            return Err(DecodeError::InnerLength {
                kind: self.kind,
                field,
                declared: declared as u32,
                available: self.bytes.len() as u32,
            });
        }
        let text = std::str::from_utf8(self.bytes).map_err(|_| DecodeError::BadUtf8 { kind: self.kind })?;
        self.bytes = &[];
        Ok(text.to_owned())
    }
}
