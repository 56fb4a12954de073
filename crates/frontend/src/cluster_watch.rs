//! Following a cluster file while a front end runs: nodes added to it (by `remem up`'s `add`, or
//! an operator editing it) are handed to the running client, without a restart. Shared by
//! `remem nbd` and `remem kv`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use remem_client::cluster::ClusterFile;
use remem_client::NodeAddress;

/// How often the file's modification time is looked at.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

pub struct ClusterWatch {
    path: PathBuf,
    modified: Option<SystemTime>,
    last_check: Instant,
    known: Vec<SocketAddr>,
}

impl ClusterWatch {
    pub fn new(path: PathBuf, cluster: &ClusterFile) -> ClusterWatch {
        ClusterWatch {
            modified: std::fs::metadata(&path).and_then(|meta| meta.modified()).ok(),
            path,
            last_check: Instant::now(),
            known: cluster.nodes.iter().map(|node| node.address).collect(),
        }
    }

    /// Nodes the file names that the client has not joined yet, at most once a second and only
    /// when the file changed. Call [`ClusterWatch::joined`] for each one the client took; the
    /// others come back at the next change of the file.
    pub fn new_nodes(&mut self) -> Vec<NodeAddress> {
        if self.last_check.elapsed() < CHECK_INTERVAL {
            return Vec::new();
        }
        self.last_check = Instant::now();
        let modified = std::fs::metadata(&self.path).and_then(|meta| meta.modified()).ok();
        if modified.is_none() || modified == self.modified {
            return Vec::new();
        }
        let cluster = match ClusterFile::load(&self.path) {
            Ok(cluster) => cluster,
            Err(error) => {
                tracing::warn!(%error, "cannot read the changed cluster file");
                return Vec::new();
            }
        };
        let new: Vec<NodeAddress> =
            cluster.addresses().into_iter().filter(|node| !self.known.contains(&node.address)).collect();
        if new.is_empty() {
            self.modified = modified;
        }
        new
    }

    /// The client took this node.
    pub fn joined(&mut self, address: SocketAddr) {
        self.known.push(address);
        let all_known = ClusterFile::load(&self.path)
            .map(|cluster| cluster.nodes.iter().all(|node| self.known.contains(&node.address)))
            .unwrap_or(false);
        if all_known {
            self.modified = std::fs::metadata(&self.path).and_then(|meta| meta.modified()).ok();
        }
    }
}

/// Hands `nodes` (new in the cluster file or etcd) to a running front end's `client`, which
/// `owner` names in the message; `joined` hears of each node the client took. A node the
/// client cannot take yet is left for the next round.
pub fn hand_new_nodes(
    nodes: Vec<NodeAddress>,
    client: &mut remem_client::Client,
    owner: &str,
    mut joined: impl FnMut(SocketAddr),
) {
    for node in nodes {
        let address = node.address;
        match client.apply(&remem_client::MembershipChange::Added(node)) {
            Ok(()) => {
                joined(address);
                eprintln!("node {address} joined {owner}");
            }
            Err(error) => tracing::warn!(node = %address, %error, "cannot add the new node; retrying"),
        }
    }
}
