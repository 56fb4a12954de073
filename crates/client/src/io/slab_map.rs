//! The slab map on disk: what a client needs to find its pages again after a restart.
//!
//! Written by [`Client::save_map`] after connecting (and after rebuilds), read by
//! [`Client::reopen`]. A reopened client does not know its pages' versions: each read
//! discovers the version first (every split asked, the newest version with k valid splits wins),
//! so pages torn by a crash mid-write read as either their old or new contents, or as lost,
//! never as a mix.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_codec::CodecParams;
use remem_placement::LeastLoaded;
use remem_proto::auth::Secret;
use remem_proto::{Control, NodeInfo};
use serde::{Deserialize, Serialize};

use super::{
    blocking_control, unexpected, BlockingStream, Client, ClientConfig, Range, SlabRef, PAGE_VERSION_UNKNOWN,
};
use crate::core::Shape;
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

    /// A hand-edited or truncated map must not make the client index out of bounds.
    fn validate(&self) -> Result<(), String> {
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
            if range.len() != width {
                return Err(format!("range {index} lists {} slabs, k+r = {width}", range.len()));
            }
            if let Some((node, _)) = range.iter().find(|(node, _)| *node >= self.nodes.len()) {
                return Err(format!("range {index} names node {node}, only {} listed", self.nodes.len()));
            }
        }
        Ok(())
    }

    pub fn save(&self, path: &Path) -> Result<(), SlabMapError> {
        let error = |source| SlabMapError::Write { path: path.to_owned(), source };
        let text = serde_json::to_string_pretty(self).expect("slab map serializes");
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, text).map_err(error)?;
        std::fs::rename(&temporary, path).map_err(error)
    }
}

impl Client {
    pub fn client_id(&self) -> u64 {
        self.config.client_id
    }

    /// The current slab map (ranges, their slabs, this client's identity).
    pub fn slab_map(&self) -> SlabMapFile {
        SlabMapFile {
            client_id: self.config.client_id,
            data_splits: self.config.shape.data_splits,
            parity_splits: self.config.shape.parity_splits,
            extra_reads: self.config.shape.extra_reads,
            page_bytes: self.config.page_bytes,
            address_space_bytes: self.config.address_space_bytes,
            pages_per_range: self.pages_per_range,
            nodes: self.conns.iter().map(|conn| conn.address).collect(),
            unix_sockets: self.conns.iter().map(|conn| conn.unix_socket.clone()).collect(),
            ranges: self
                .ranges
                .iter()
                .map(|range| range.slabs.iter().map(|slab| (slab.node, slab.slab_id)).collect())
                .collect(),
        }
    }

    /// Writes the slab map atomically to `path`.
    pub fn save_map(&self, path: &Path) -> Result<(), SlabMapError> {
        self.slab_map().save(path)
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
        let codec_params = CodecParams::new(map.data_splits, map.parity_splits, map.page_bytes)?;
        // A node down now is like one that died: its slabs are unavailable and rebuilt, and the
        // client opens as long as the cluster answers at all.
        let mut streams = Vec::with_capacity(map.nodes.len());
        let mut unreachable = Vec::new();
        for (index, &address) in map.nodes.iter().enumerate() {
            let unix =
                map.unix_sockets.get(index).and_then(Option::as_deref).filter(|_| config.shared_memory);
            match connect_node(address, unix, secret, &config) {
                Ok((stream, info)) => streams.push((Some(stream), info, address)),
                Err(error) => {
                    tracing::warn!(node = %address, %error, "node unreachable at reopen: its slabs count as lost");
                    unreachable.push((index, error));
                    streams.push((None, unreachable_node_info(), address));
                }
            }
        }
        if unreachable.len() == map.nodes.len() && !unreachable.is_empty() {
            return Err(unreachable.swap_remove(0).1);
        }
        let ranges = map
            .ranges
            .iter()
            .map(|slabs| Range {
                slabs: slabs.iter().map(|&(node, slab_id)| SlabRef { node, slab_id }).collect(),
                unavailable: 0,
                rebuilding: 0,
            })
            .collect();
        let page_count = map.address_space_bytes / map.page_bytes as u64;
        let placement = Box::new(LeastLoaded::new(StdRng::from_entropy()));
        let mut client = Client::assemble(
            config,
            codec_params,
            streams,
            ranges,
            map.pages_per_range,
            page_count,
            placement,
        )?;
        client.page_flags.fill(PAGE_VERSION_UNKNOWN);
        for (conn, unix) in client.conns.iter_mut().zip(&map.unix_sockets) {
            conn.unix_socket = unix.clone();
        }
        for (index, error) in unreachable {
            let why = format!("unreachable at reopen: {error}");
            client.conn_died(index, &why);
        }
        client.export_slabs();
        client.volunteer_for_activity();
        Ok(client)
    }
}

/// Connects (over the Unix socket `unix` if given, else TCP), authenticates and asks a node for
/// its info.
pub(super) fn connect_node(
    address: SocketAddr,
    unix: Option<&Path>,
    secret: &Secret,
    config: &ClientConfig,
) -> Result<(BlockingStream, remem_proto::NodeInfo), ConnectError> {
    let io_error = |source| ConnectError::Io { address, source };
    let mut stream = match unix {
        Some(path) => {
            let stream = UnixStream::connect(path).map_err(io_error)?;
            stream.set_read_timeout(Some(config.connect_timeout)).map_err(io_error)?;
            stream.set_write_timeout(Some(config.connect_timeout)).map_err(io_error)?;
            BlockingStream::Unix(stream)
        }
        None => {
            let stream = TcpStream::connect_timeout(&address, config.connect_timeout).map_err(io_error)?;
            stream.set_nodelay(true).map_err(io_error)?;
            stream.set_read_timeout(Some(config.connect_timeout)).map_err(io_error)?;
            BlockingStream::Tcp(stream)
        }
    };
    remem_proto::blocking::handshake(&mut stream, secret, config.client_id)
        .map_err(|source| ConnectError::Handshake { address, message: source.to_string() })?;
    match blocking_control(&mut stream, 1, &Control::NodeInfo, address)? {
        Control::NodeInfoReply(info) => Ok((stream, info)),
        other => Err(unexpected(address, &other)),
    }
}

/// What the client assumes of a node it could not reach: nothing free, no domain.
fn unreachable_node_info() -> NodeInfo {
    NodeInfo {
        node_id: 0,
        capacity_bytes: 0,
        free_bytes: 0,
        slab_size_bytes: 0,
        slabs_mapped: 0,
        metadata_bytes: 0,
        requests_served: 0,
        regenerating_slabs: 0,
        regeneration_pages_done: 0,
        regeneration_pages_total: 0,
        failure_domain: String::new(),
    }
}
