//! What a checker asks of a run: does the engine's slab map agree with the cluster, and did the
//! client leave slabs behind that no range names.

use super::*;

impl SimDriver {
    /// Where the engine's map and the cluster disagree: a range naming a slab its node does not
    /// hold for this client at that split and range (skipping unavailable slabs and dead or
    /// unreachable nodes). Empty when they agree.
    pub fn map_disagreements(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (index, range) in self.engine.ranges().iter().enumerate() {
            let first_page = self.range_first_page(index);
            for (split, slab) in range.slabs.iter().enumerate() {
                if range.unavailable & (1 << split) != 0 || !self.cluster.is_alive(slab.node) {
                    continue;
                }
                match self.cluster.slab_info(slab.node, slab.slab_id) {
                    None => problems.push(format!(
                        "range {index} split {split}: node {} holds no slab {}",
                        slab.node, slab.slab_id
                    )),
                    Some(info) => {
                        if info.owner_client_id != self.config.client_id
                            || usize::from(info.split_index) != split
                            || info.first_page != first_page
                        {
                            problems.push(format!(
                                "range {index} split {split}: slab {} on node {} is {info:?}",
                                slab.slab_id, slab.node
                            ));
                        }
                    }
                }
            }
        }
        problems
    }

    /// The first page of range `range` in the client's page space.
    pub fn range_first_page(&self, range: usize) -> u64 {
        let engine = &self.engine;
        let region = engine.region_info(engine.ranges()[range].region);
        let region_first_range = engine
            .ranges()
            .iter()
            .position(|other| other.region == region.index)
            .expect("a region has ranges");
        region.first_page + (range - region_first_range) as u64 * region.pages_per_range
    }

    /// Slabs of this client on live nodes that no range names: leaked.
    pub fn leaked_slabs(&self) -> Vec<(usize, u32)> {
        let mut named: Vec<(usize, u32)> = self
            .engine
            .ranges()
            .iter()
            .flat_map(|range| range.slabs.iter().map(|slab| (slab.node, slab.slab_id)))
            .collect();
        named.sort_unstable();
        let mut leaked = Vec::new();
        for node in 0..self.cluster.node_count() {
            if !self.cluster.is_alive(node) {
                continue;
            }
            for (slab_id, owner) in self.cluster.slabs_of(node) {
                if owner == self.config.client_id && named.binary_search(&(node, slab_id)).is_err() {
                    leaked.push((node, slab_id));
                }
            }
        }
        leaked
    }
}

/// The slab-changing control requests among whole frames (`MapSlab`, `UnmapSlab`,
/// `Regenerate`), for the trace.
pub(super) fn slab_controls(mut bytes: &[u8]) -> Vec<String> {
    use remem_proto::Kind;
    let mut found = Vec::new();
    while let Some(header_bytes) = bytes.first_chunk::<HEADER_BYTES>() {
        let Ok(header) = FrameHeader::decode(header_bytes) else { break };
        let end = HEADER_BYTES + header.body_len as usize;
        if bytes.len() < end {
            break;
        }
        if matches!(header.kind, Kind::MapSlab | Kind::UnmapSlab | Kind::Regenerate) {
            match Control::decode_body(header.kind, &bytes[HEADER_BYTES..end]) {
                Ok(Control::Regenerate { slab_id, sources, .. }) => {
                    let sources: Vec<String> = sources
                        .iter()
                        .map(|source| format!("{}@{}", source.split_index, source.address))
                        .collect();
                    found.push(format!("Regenerate slab {slab_id} from [{}]", sources.join(" ")));
                }
                Ok(control) => found.push(format!("{control:?}")),
                Err(_) => {}
            }
        }
        bytes = &bytes[end..];
    }
    found
}
