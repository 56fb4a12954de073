//! Tests of the simulated cluster, driven through its public API by a tiny hand-written client
//! (`Harness`) that speaks the wire protocol with `remem-proto`.

mod bad_input;
mod determinism;
mod faults;
mod protocol;
mod regeneration;

use crate::{Delivery, NetworkOptions, SimCluster, SimTime};
use remem_codec::{CodecParams, PageCodec, ReferenceCodec};
use remem_proto::{
    decode_read_splits_count, encode_write_split, split_checksum, Control, FrameHeader, Kind, SplitMeta,
    WriteSplitPrefix, HEADER_BYTES, READ_SPLITS_COUNT_BYTES, SPLIT_META_BYTES,
};

pub(crate) const CLIENT: u64 = 42;
/// 64 KiB slabs: 128 slots of 512-byte splits, 16 slots of 4 KiB.
pub(crate) const SLAB_BYTES: u64 = 64 * 1024;

/// One decoded frame the client received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Control { request_id: u64, message: Control },
    Split { request_id: u64, meta: SplitMeta, payload: Vec<u8> },
    Splits { request_id: u64, entries: Vec<(SplitMeta, Vec<u8>)> },
}

impl Reply {
    pub(crate) fn request_id(&self) -> u64 {
        match self {
            Reply::Control { request_id, .. }
            | Reply::Split { request_id, .. }
            | Reply::Splits { request_id, .. } => *request_id,
        }
    }

    pub(crate) fn control(self) -> Control {
        match self {
            Reply::Control { message, .. } => message,
            other => panic!("expected a control reply, got {other:?}"),
        }
    }
}

/// Decodes the whole frames of one delivery; panics on anything the node should never send.
pub(crate) fn parse(bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let header = FrameHeader::decode(rest.first_chunk::<HEADER_BYTES>().expect("whole frames")).unwrap();
        let body = &rest[HEADER_BYTES..HEADER_BYTES + header.body_len as usize];
        let request_id = header.request_id;
        replies.push(match header.kind {
            Kind::ReadSplitReply => Reply::Split {
                request_id,
                meta: SplitMeta::decode(body.first_chunk().unwrap()).unwrap(),
                payload: body[SPLIT_META_BYTES..].to_vec(),
            },
            Kind::ReadSplitsReply => {
                let count = decode_read_splits_count(body.first_chunk().unwrap()).unwrap() as usize;
                let entry = (body.len() - READ_SPLITS_COUNT_BYTES) / count;
                let entries = body[READ_SPLITS_COUNT_BYTES..]
                    .chunks(entry)
                    .map(|chunk| {
                        (
                            SplitMeta::decode(chunk.first_chunk().unwrap()).unwrap(),
                            chunk[SPLIT_META_BYTES..].to_vec(),
                        )
                    })
                    .collect();
                Reply::Splits { request_id, entries }
            }
            kind => Reply::Control { request_id, message: Control::decode_body(kind, body).unwrap() },
        });
        rest = &rest[HEADER_BYTES + header.body_len as usize..];
    }
    replies
}

/// A cluster, the time, and a client that sends frames and collects what comes back.
pub(crate) struct Harness {
    pub(crate) cluster: SimCluster,
    pub(crate) now: SimTime,
    next_request_id: u64,
}

impl Harness {
    /// `nodes` nodes in domains `d0`, `d1`, ... with 8 slabs of 64 KiB each, all connected.
    pub(crate) fn new(seed: u64, nodes: usize) -> Harness {
        Harness::with_options(seed, nodes, NetworkOptions::default())
    }

    pub(crate) fn with_options(seed: u64, nodes: usize, options: NetworkOptions) -> Harness {
        let mut cluster = SimCluster::new(seed, options);
        for index in 0..nodes {
            let node = cluster.add_node(format!("d{index}"), 8, SLAB_BYTES);
            cluster.connect(0, node, CLIENT).unwrap();
        }
        Harness { cluster, now: 0, next_request_id: 1 }
    }

    pub(crate) fn request_id(&mut self) -> u64 {
        self.next_request_id += 1;
        self.next_request_id
    }

    /// Sends a control request; returns its request id.
    pub(crate) fn send(&mut self, node: usize, message: &Control) -> u64 {
        let request_id = self.request_id();
        let mut frame = Vec::new();
        message.encode(request_id, &mut frame);
        self.cluster.send(self.now, node, CLIENT, &frame);
        request_id
    }

    /// Runs the simulation until nothing is left to happen; returns what arrived.
    pub(crate) fn settle(&mut self) -> Vec<Delivery> {
        let mut out = Vec::new();
        while let Some(at) = self.cluster.next_event_time() {
            self.now = self.now.max(at);
            self.cluster.poll(self.now, &mut out);
        }
        out
    }

    /// Runs the simulation up to `until` (inclusive); returns what arrived.
    pub(crate) fn run_until(&mut self, until: SimTime) -> Vec<Delivery> {
        let mut out = Vec::new();
        while let Some(at) = self.cluster.next_event_time().filter(|at| *at <= until) {
            self.now = self.now.max(at);
            self.cluster.poll(self.now, &mut out);
        }
        self.now = self.now.max(until);
        self.cluster.poll(self.now, &mut out);
        out
    }

    /// Sends one request, settles, and returns the frames `node` answered (all of them).
    pub(crate) fn call_all(&mut self, node: usize, message: &Control) -> Vec<Reply> {
        self.send(node, message);
        replies_from(&self.settle(), node)
    }

    /// Sends one request and returns its single reply.
    pub(crate) fn call(&mut self, node: usize, message: &Control) -> Reply {
        let request_id = self.send(node, message);
        let replies = replies_from(&self.settle(), node);
        assert_eq!(replies.len(), 1, "one reply expected, got {replies:?}");
        assert_eq!(replies[0].request_id(), request_id);
        replies.into_iter().next().unwrap()
    }

    /// Maps a slab for split `split_index` of a range starting at `first_page`: (slab id, slots).
    pub(crate) fn map(
        &mut self,
        node: usize,
        split_bytes: u32,
        split_index: u8,
        first_page: u64,
    ) -> (u32, u32) {
        match self
            .call(node, &Control::MapSlab { split_bytes, split_index, first_page, range_id: 0 })
            .control()
        {
            Control::SlabMapped { slab_id, slots } => (slab_id, slots),
            other => panic!("MapSlab refused: {other:?}"),
        }
    }

    /// Sends one WriteSplit (no settling); returns its request id.
    pub(crate) fn write_split(
        &mut self,
        node: usize,
        slab_id: u32,
        slot: u32,
        meta: SplitMeta,
        payload: &[u8],
    ) -> u64 {
        let request_id = self.request_id();
        let mut frame = Vec::new();
        let prefix = WriteSplitPrefix { slab_id, slot, version: meta.version, checksum: meta.checksum };
        encode_write_split(request_id, &prefix, payload, &mut frame);
        self.cluster.send(self.now, node, CLIENT, &frame);
        request_id
    }

    pub(crate) fn read_split(&mut self, node: usize, slab_id: u32, slot: u32) -> (SplitMeta, Vec<u8>) {
        match self.call(node, &Control::ReadSplit { slab_id, slot }) {
            Reply::Split { meta, payload, .. } => (meta, payload),
            other => panic!("ReadSplit refused: {other:?}"),
        }
    }
}

/// The frames of every `Bytes` delivery from `node`, in order.
pub(crate) fn replies_from(deliveries: &[Delivery], node: usize) -> Vec<Reply> {
    deliveries
        .iter()
        .filter_map(|delivery| match delivery {
            Delivery::Bytes { node: from, bytes, .. } if *from == node => Some(parse(bytes)),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A range of a code laid out one split per node: node i holds split i in slab `slabs[i]`.
pub(crate) struct Range {
    pub(crate) params: CodecParams,
    pub(crate) first_page: u64,
    pub(crate) slabs: Vec<u32>,
}

impl Range {
    /// Maps one slab per split on nodes `0..k + r`.
    pub(crate) fn map(harness: &mut Harness, params: CodecParams, first_page: u64) -> Range {
        let slabs = (0..params.total_splits())
            .map(|split| harness.map(split, params.split_bytes() as u32, split as u8, first_page).0)
            .collect();
        Range { params, first_page, slabs }
    }

    /// The k + r splits of `page` (data, then parity).
    pub(crate) fn splits(&self, page: &[u8]) -> Vec<Vec<u8>> {
        let mut parity = vec![0; self.params.parity_bytes()];
        ReferenceCodec::new(self.params).encode(page, &mut parity);
        page.chunks(self.params.split_bytes())
            .chain(parity.chunks(self.params.split_bytes().max(1)))
            .map(<[u8]>::to_vec)
            .collect()
    }

    /// Sends split i of `page` at `version` to node i, for every i in `splits`; does not settle.
    pub(crate) fn write(&self, harness: &mut Harness, slot: u32, version: u8, page: &[u8], splits: &[usize]) {
        let all = self.splits(page);
        for &split in splits {
            let checksum =
                split_checksum(&all[split], version, self.first_page + u64::from(slot), split as u8);
            harness.write_split(split, self.slabs[split], slot, SplitMeta { version, checksum }, &all[split]);
        }
    }
}

/// A page of recognisable bytes for `seed`.
pub(crate) fn page_of(seed: u64, page_bytes: usize) -> Vec<u8> {
    (0..page_bytes).map(|index| (seed.wrapping_mul(31).wrapping_add(index as u64 * 7) % 251) as u8).collect()
}
