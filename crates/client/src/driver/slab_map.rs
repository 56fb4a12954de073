//! The slab map on disk: what a client needs to find its pages again after a restart.
//!
//! Written by [`Client::save_map`] after connecting (and after rebuilds), read by
//! [`Client::reopen`]. A reopened client does not know its pages' versions: each read
//! discovers the version first (every split asked, the newest version with k valid splits wins),
//! so pages torn by a crash mid-write read as either their old or new contents, or as lost,
//! never as a mix.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_codec::CodecParams;
use remem_placement::LeastLoaded;
use remem_proto::auth::Secret;
use serde::{Deserialize, Serialize};

use super::{Client, ClientConfig, NodeAddress};
use crate::core::Shape;
use crate::engine::SlabRef;
use crate::error::ConnectError;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlabMapFile {
    pub client_id: u64,
    pub data_splits: usize,
    pub parity_splits: usize,
    pub extra_reads: usize,
    pub page_bytes: usize,
    pub address_space_bytes: u64,
    pub pages_per_range: u64,
    /// Node addresses; `ranges` refer to them by index.
    pub nodes: Vec<SocketAddr>,
    /// Per range, per split: (node index, slab id).
    pub ranges: Vec<Vec<(usize, u32)>>,
    /// Per node, its Unix socket on this host if it has one (for shared memory after a
    /// restart); empty in maps written before there were any.
    #[serde(default)]
    pub unix_sockets: Vec<Option<PathBuf>>,
    /// The regions after the first, in the order they were created (a front end with several
    /// regions, such as `remem kv`); empty for one region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_regions: Vec<RegionMap>,
    /// The cluster it was saved on ([`Secret::cluster_tag`]); absent in maps written before
    /// there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Pages lost when it was saved, as runs of (first page, count) over all its regions in
    /// order: a client reopened from it reads them as lost, not as never written, when no split
    /// has a version of them (docs/FAILURES.md "Regions without redundancy").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_pages: Vec<(u64, u64)>,
}

/// One more region of a slab map: its shape, size and, per range, per split, (node index, slab id).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMap {
    pub data_splits: usize,
    pub parity_splits: usize,
    pub extra_reads: usize,
    pub page_count: u64,
    pub pages_per_range: u64,
    pub ranges: Vec<Vec<(usize, u32)>>,
    /// The region (0: the first) and split this one is laid beside, for its ranges mapped
    /// later (`Client::create_region_beside` with lazy ranges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beside: Option<(usize, usize)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SlabMapError {
    #[error("cannot read slab map {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("slab map {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("cannot write slab map {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

impl SlabMapFile {
    pub fn load(path: &Path) -> Result<SlabMapFile, SlabMapError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SlabMapError::Read { path: path.to_owned(), source })?;
        let map: SlabMapFile = serde_json::from_str(&text)
            .map_err(|error| SlabMapError::Invalid { path: path.to_owned(), message: error.to_string() })?;
        map.validate().map_err(|message| SlabMapError::Invalid { path: path.to_owned(), message })?;
        Ok(map)
    }

    /// A hand-edited or truncated map must not make the client index out of bounds (also
    /// called on maps read from elsewhere, such as etcd).
    pub fn validate(&self) -> Result<(), String> {
        let width = self.data_splits + self.parity_splits;
        if self.pages_per_range == 0 || self.page_bytes == 0 {
            return Err("pages_per_range and page_bytes must be positive".into());
        }
        let pages = self.address_space_bytes / self.page_bytes as u64;
        if pages.div_ceil(self.pages_per_range) != self.ranges.len() as u64 {
            return Err(format!(
                "{} ranges listed, the address space needs {}",
                self.ranges.len(),
                pages.div_ceil(self.pages_per_range)
            ));
        }
        if !self.unix_sockets.is_empty() && self.unix_sockets.len() != self.nodes.len() {
            return Err(format!(
                "{} unix sockets listed for {} nodes",
                self.unix_sockets.len(),
                self.nodes.len()
            ));
        }
        for (index, range) in self.ranges.iter().enumerate() {
            // No slabs: a range not mapped yet (`ClientConfig::lazy_ranges`).
            if !range.is_empty() && range.len() != width {
                return Err(format!("range {index} lists {} slabs, k+r = {width}", range.len()));
            }
            if let Some((node, _)) = range.iter().find(|(node, _)| *node >= self.nodes.len()) {
                return Err(format!("range {index} names node {node}, only {} listed", self.nodes.len()));
            }
        }
        for (number, region) in self.more_regions.iter().enumerate() {
            region
                .validate(number + 1, self.page_bytes, self.nodes.len())
                .map_err(|message| format!("region {}: {message}", number + 1))?;
            if let Some((beside, split)) = region.beside {
                let beside_width = match beside {
                    0 => width,
                    other => {
                        self.more_regions[other - 1].data_splits + self.more_regions[other - 1].parity_splits
                    }
                };
                if split >= beside_width {
                    return Err(format!(
                        "region {}: laid beside split {split} of {beside_width}",
                        number + 1
                    ));
                }
            }
        }
        let total_pages = pages + self.more_regions.iter().map(|region| region.page_count).sum::<u64>();
        for &(first, count) in &self.lost_pages {
            if count == 0 || first.checked_add(count).is_none_or(|end| end > total_pages) {
                return Err(format!("lost pages {first}+{count} outside its {total_pages} pages"));
            }
        }
        Ok(())
    }

    /// Whether this map is of an address space of `address_space_bytes` with `shape`'s k and r
    /// (what a front end asked for must match what it reopens).
    pub fn fits(&self, address_space_bytes: u64, shape: &Shape) -> bool {
        self.address_space_bytes == address_space_bytes
            && (self.data_splits, self.parity_splits) == (shape.data_splits, shape.parity_splits)
    }

    /// Writes the map to `path` atomically and durably: a new file, synced, renamed into place,
    /// and the directory synced, so that after a crash (of the process or of the host) `path`
    /// holds this map or the one before, whole. Every front end saves through here.
    pub fn save(&self, path: &Path) -> Result<(), SlabMapError> {
        let error = |source| SlabMapError::Write { path: path.to_owned(), source };
        let text = serde_json::to_string_pretty(self).expect("slab map serializes");
        let temporary = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&temporary)?;
            std::io::Write::write_all(&mut file, text.as_bytes())?;
            file.sync_all()
        };
        write().map_err(error)?;
        std::fs::rename(&temporary, path).map_err(error)?;
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        std::fs::File::open(directory).and_then(|directory| directory.sync_all()).map_err(error)
    }
}

impl RegionMap {
    /// Checks region `index` of a map (1: the first after the map's own).
    fn validate(&self, index: usize, page_bytes: usize, nodes: usize) -> Result<(), String> {
        let width = self.data_splits + self.parity_splits;
        if self.pages_per_range == 0 || self.page_count == 0 {
            return Err("page_count and pages_per_range must be positive".into());
        }
        if width == 0 || width > crate::engine::MAX_SPLITS || self.extra_reads > self.parity_splits {
            return Err(format!(
                "shape k={} r={} delta={} is not valid",
                self.data_splits, self.parity_splits, self.extra_reads
            ));
        }
        CodecParams::new(self.data_splits, self.parity_splits, page_bytes)
            .map_err(|error| error.to_string())?;
        if self.beside.is_some_and(|(region, _)| region >= index) {
            return Err(format!("laid beside region {:?}, not an earlier one", self.beside));
        }
        if self.page_count.div_ceil(self.pages_per_range) != self.ranges.len() as u64 {
            return Err(format!(
                "{} ranges listed, {} pages need {}",
                self.ranges.len(),
                self.page_count,
                self.page_count.div_ceil(self.pages_per_range)
            ));
        }
        for (index, range) in self.ranges.iter().enumerate() {
            // No slabs: a range not mapped yet (`ClientConfig::lazy_ranges`).
            if !range.is_empty() && range.len() != width {
                return Err(format!("range {index} lists {} slabs, k+r = {width}", range.len()));
            }
            if let Some((node, _)) = range.iter().find(|(node, _)| *node >= nodes) {
                return Err(format!("range {index} names node {node}, only {nodes} listed"));
            }
        }
        Ok(())
    }
}

impl Client {
    /// The current slab map of the first region (ranges, their slabs, this client's identity).
    pub fn slab_map(&self) -> SlabMapFile {
        let region = self.engine.region_info(0);
        let ranges = self.engine.ranges();
        SlabMapFile {
            client_id: self.config.client_id,
            data_splits: region.shape.data_splits,
            parity_splits: region.shape.parity_splits,
            extra_reads: region.shape.extra_reads,
            page_bytes: self.config.page_bytes,
            address_space_bytes: region.page_count * self.config.page_bytes as u64,
            pages_per_range: region.pages_per_range,
            nodes: self.engine.nodes().iter().map(|node| node.address).collect(),
            unix_sockets: self.engine.nodes().iter().map(|node| node.unix_socket.clone()).collect(),
            ranges: ranges
                .iter()
                .filter(|range| range.region == 0)
                .map(|range| range.slabs.iter().map(|slab| (slab.node, slab.slab_id)).collect())
                .collect(),
            more_regions: self
                .engine
                .regions()
                .skip(1)
                .map(|region| RegionMap {
                    data_splits: region.shape.data_splits,
                    parity_splits: region.shape.parity_splits,
                    extra_reads: region.shape.extra_reads,
                    page_count: region.page_count,
                    pages_per_range: region.pages_per_range,
                    ranges: ranges
                        .iter()
                        .filter(|range| range.region == region.index)
                        .map(|range| range.slabs.iter().map(|slab| (slab.node, slab.slab_id)).collect())
                        .collect(),
                    beside: self.engine.region_beside(region.index),
                })
                .collect(),
            cluster: Some(self.secret.cluster_tag()),
            lost_pages: self.engine.lost_page_runs(),
        }
    }

    /// Writes the slab map to `path`, atomically and durably ([`SlabMapFile::save`]).
    pub fn save_map(&self, path: &Path) -> Result<(), SlabMapError> {
        self.slab_map().save(path)
    }

    /// Unmaps every slab of a saved map (a front end's `--fresh`): reopens it as its owner and
    /// drops it with `release_on_drop`. Errors if the cluster cannot be reached; the slabs then
    /// go when the nodes' lease grace period ends.
    pub fn release_saved(
        map: &SlabMapFile,
        secret: &Secret,
        mut config: ClientConfig,
    ) -> Result<(), ConnectError> {
        config.release_on_drop = true;
        Client::reopen(map, secret, config).map(drop)
    }

    /// Reconnects to the slabs of a saved map as the same client id (their owner), without
    /// mapping anything. Every page's version is unknown until read (see the module docs).
    /// `config.release_on_drop` decides, as for any client, whether dropping it unmaps the slabs.
    /// The map does not record the placement policy: rebuilds of a reopened client choose the
    /// least-loaded node outside the range ([`remem_placement::Placement::replace`]'s default).
    pub fn reopen(
        map: &SlabMapFile,
        secret: &Secret,
        mut config: ClientConfig,
    ) -> Result<Client, ConnectError> {
        config.shape = Shape {
            data_splits: map.data_splits,
            parity_splits: map.parity_splits,
            extra_reads: map.extra_reads,
        };
        config.page_bytes = map.page_bytes;
        config.address_space_bytes = map.address_space_bytes;
        config.client_id = map.client_id;
        CodecParams::new(map.data_splits, map.parity_splits, map.page_bytes)?;
        let placement = Box::new(LeastLoaded::new(StdRng::from_entropy()));
        let mut client = Client::empty(secret, config, placement)?;
        // A node down now is like one that died: its slabs are unavailable and rebuilt, and the
        // client opens as long as the cluster answers at all.
        let nodes: Vec<NodeAddress> = map
            .nodes
            .iter()
            .enumerate()
            .map(|(index, &address)| NodeAddress {
                address,
                unix_socket: map.unix_sockets.get(index).cloned().flatten(),
            })
            .collect();
        let unreachable = client.join_all(&nodes)?;
        if unreachable.len() == nodes.len() {
            return Err(ConnectError::TooFewReachable { needed: 1, reachable: 0, unreachable });
        }
        super::warn_unreachable(&unreachable);
        let ranges = map
            .ranges
            .iter()
            .map(|slabs| slabs.iter().map(|&(node, slab_id)| SlabRef { node, slab_id }).collect())
            .collect();
        let page_count = map.address_space_bytes / map.page_bytes as u64;
        let shape = client.config.shape;
        client.engine.add_region(shape, page_count, map.pages_per_range, ranges, false);
        for region in &map.more_regions {
            let shape = Shape {
                data_splits: region.data_splits,
                parity_splits: region.parity_splits,
                extra_reads: region.extra_reads,
            };
            let ranges = region
                .ranges
                .iter()
                .map(|slabs| slabs.iter().map(|&(node, slab_id)| SlabRef { node, slab_id }).collect())
                .collect();
            let added =
                client.engine.add_region(shape, region.page_count, region.pages_per_range, ranges, false);
            if let Some((beside, split)) = region.beside {
                client.engine.set_region_beside(added.index, beside, split);
            }
        }
        client.engine.mark_lost_unless_found(&map.lost_pages);
        client.engine.fail_unreachable_nodes(Instant::now());
        client.export_slabs();
        client.volunteer_for_activity();
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(client_id: u64) -> SlabMapFile {
        SlabMapFile {
            client_id,
            data_splits: 2,
            parity_splits: 1,
            extra_reads: 0,
            page_bytes: 4096,
            address_space_bytes: 2 * 4096,
            pages_per_range: 2,
            nodes: vec![
                "127.0.0.1:1".parse().unwrap(),
                "127.0.0.1:2".parse().unwrap(),
                "127.0.0.1:3".parse().unwrap(),
            ],
            ranges: vec![vec![(0, 1), (1, 1), (2, 1)]],
            unix_sockets: Vec::new(),
            more_regions: Vec::new(),
            cluster: None,
            lost_pages: Vec::new(),
        }
    }

    #[test]
    fn a_save_replaces_the_map_whole_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("remem-slab-map-save-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("map.json");
        map(1).save(&path).unwrap();
        map(2).save(&path).unwrap();
        assert_eq!(SlabMapFile::load(&path).unwrap(), map(2));
        let names: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("map.json")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_save_into_a_missing_directory_names_the_path() {
        let path =
            std::env::temp_dir().join(format!("remem-no-such-dir-{}", std::process::id())).join("map.json");
        let error = map(1).save(&path).unwrap_err().to_string();
        assert!(error.contains(&path.display().to_string()), "{error}");
    }

    #[test]
    fn lost_page_runs_must_lie_within_the_maps_pages_and_survive_a_save() {
        let mut saved = map(1);
        saved.lost_pages = vec![(0, 1), (1, 1)];
        saved.validate().expect("both pages of the map");
        let text = serde_json::to_string(&saved).unwrap();
        assert_eq!(serde_json::from_str::<SlabMapFile>(&text).unwrap().lost_pages, saved.lost_pages);
        for bad in [(1, 2), (0, 0), (u64::MAX, 2)] {
            saved.lost_pages = vec![bad];
            assert!(saved.validate().unwrap_err().contains("lost pages"), "{bad:?}");
        }
    }
}
