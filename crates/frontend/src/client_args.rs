//! The client arguments the front ends share, parsed once and turned into a [`ClientConfig`] one
//! way:
//! - [`ConnectArgs`], every front end's (`remem nbd`, `remem fs`, `remem kv`): where the cluster
//!   is (a cluster file, or etcd with the secret's file), the request timeout, the transport and
//!   encryption;
//! - [`ClientArgs`], the block and file front ends': those plus one coding shape and placement.
//!   The kv takes `ConnectArgs` alone: its regions have several shapes (one per scheme, from its
//!   `-k`/`-r`), and its placement cannot be CodingSets, which forms groups for one range width.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use remem_client::cluster::ClusterFile;
use remem_client::{ClientConfig, Secret, Shape};

use crate::code_args::CodeArgs;
use crate::export_home::EtcdArgs;
use crate::placement_arg::PlacementArgs;
use crate::transport_arg::Transport;

#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Cluster file written by `remem up` (default: the `remem up` default directory).
    #[arg(long, conflicts_with = "etcd")]
    pub cluster: Option<PathBuf>,
    /// etcd (`--etcd`, `--etcd-prefix`) instead of a cluster file: the nodes registered there,
    /// the slab map kept there under the front end's name (docs/ETCD.md).
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// File holding the cluster secret, with --etcd (a cluster file names its own).
    #[arg(long, requires = "etcd")]
    pub secret_file: Option<PathBuf>,
    /// A split not answered in this time counts as failed.
    #[arg(long, default_value_t = 2000, value_parser = crate::units::parse_positive_ms)]
    pub request_timeout_ms: u64,
    /// How splits reach the nodes: tcp, or shm (nodes on this host with a Unix socket, as `remem
    /// up` starts them, lend their slabs as shared memory: reads and writes are loads and stores,
    /// only control goes over the socket; other nodes are reached by TCP).
    #[arg(long, value_enum, default_value = "tcp")]
    pub transport: Transport,
    /// Encrypt the TCP connections to the nodes (Noise keyed by the cluster secret); nodes
    /// started with `--encrypt` require it, and a cluster file written by `remem up --encrypt`
    /// turns it on. Unix sockets and shared memory are never encrypted.
    #[arg(long)]
    pub encrypt: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub code: CodeArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
}

/// The cluster a front end was pointed at: its file, or etcd.
pub enum Cluster {
    File { path: PathBuf, cluster: ClusterFile, secret: Secret },
    Etcd { etcd: Box<remem_etcd::Etcd>, secret: Secret },
}

impl ClientArgs {
    /// The client settings for `size_bytes` of address space from these arguments (and the
    /// cluster file's `encrypt`), with `max_in_flight` pages in flight. The front end sets
    /// what is its own (`release_on_drop`, ...).
    pub fn config(
        &self,
        size_bytes: u64,
        max_in_flight: usize,
        cluster_encrypts: bool,
    ) -> Result<ClientConfig> {
        let mut config = self.connect.config(self.code.shape()?, size_bytes, cluster_encrypts);
        config.allow_shared_domains = self.placement.allow_shared_domains;
        config.max_in_flight = max_in_flight.max(1);
        Ok(config)
    }

    /// The cluster: see [`ConnectArgs::cluster`].
    pub fn cluster(&self) -> Result<Cluster> {
        self.connect.cluster()
    }
}

impl ConnectArgs {
    /// The client settings of `shape` for `size_bytes` of address space from these arguments
    /// (and the cluster file's `encrypt`): the request timeout, the transport, encryption.
    pub fn config(&self, shape: Shape, size_bytes: u64, cluster_encrypts: bool) -> ClientConfig {
        let mut config = ClientConfig::new(shape, size_bytes);
        config.request_timeout = Duration::from_millis(self.request_timeout_ms);
        config.shared_memory = self.transport == Transport::Shm;
        config.encrypt = self.encrypt || cluster_encrypts;
        config
    }

    /// etcd's client with `--etcd` (the secret from `--secret-file`), else none.
    pub fn etcd(&self) -> Result<Option<(remem_etcd::Etcd, Secret)>> {
        let Some(etcd) = self.etcd.connect()? else {
            return Ok(None);
        };
        let secret = Secret::load(self.secret_file.as_deref()).context("loading the cluster secret")?;
        Ok(Some((etcd, secret)))
    }

    /// The cluster: etcd with `--etcd` (the secret from `--secret-file`), else the cluster file
    /// (`--cluster` or `remem up`'s default), checked against `--transport`.
    pub fn cluster(&self) -> Result<Cluster> {
        if let Some((etcd, secret)) = self.etcd()? {
            return Ok(Cluster::Etcd { etcd: Box::new(etcd), secret });
        }
        let (path, cluster, secret) = crate::cluster_file::load_cluster(self.cluster.as_deref())?;
        crate::transport_arg::check_transport(self.transport, &cluster, &path)?;
        Ok(Cluster::File { path, cluster, secret })
    }
}
