//! The cluster file: which nodes make up a local cluster and where its secret is.
//!
//! `remem up` writes it; every other command reads it. JSON, so people and scripts can read it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// File holding the cluster secret (mode 0600).
    pub secret_file: PathBuf,
    pub nodes: Vec<ClusterNode>,
    /// The nodes require encrypted TCP (`remem up --encrypt`): the front ends that read this
    /// file encrypt without being told `--encrypt`. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    pub address: SocketAddr,
    pub failure_domain: String,
    /// Process id when the node was started by `remem up`.
    pub pid: Option<u32>,
    /// The node's Unix socket, when it has one (same-host clients may use shared memory
    /// through it, docs/SHM.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_socket: Option<PathBuf>,
    /// Where the node serves Prometheus metrics (`remem node --metrics`), when `remem up
    /// --metrics` started it so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterFileError {
    #[error("cannot read cluster file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cluster file {path} is not valid: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("cannot write cluster file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cluster file {path} lists no node")]
    Empty { path: PathBuf },
}

impl ClusterFile {
    pub fn load(path: &Path) -> Result<ClusterFile, ClusterFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ClusterFileError::Read { path: path.to_owned(), source })?;
        let cluster: ClusterFile = serde_json::from_str(&text)
            .map_err(|source| ClusterFileError::Parse { path: path.to_owned(), source })?;
        if cluster.nodes.is_empty() {
            return Err(ClusterFileError::Empty { path: path.to_owned() });
        }
        Ok(cluster)
    }

    /// Writes atomically (temporary file, then rename) so readers never see half a file.
    pub fn save(&self, path: &Path) -> Result<(), ClusterFileError> {
        let error = |source| ClusterFileError::Write { path: path.to_owned(), source };
        let text = serde_json::to_string_pretty(self).expect("cluster file serializes");
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, text).map_err(error)?;
        std::fs::rename(&temporary, path).map_err(error)
    }

    pub fn addresses(&self) -> Vec<crate::NodeAddress> {
        self.nodes
            .iter()
            .map(|node| crate::NodeAddress { address: node.address, unix_socket: node.unix_socket.clone() })
            .collect()
    }
}
