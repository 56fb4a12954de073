//! `remem node`: run one memory node until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_node::{Node, NodeConfig};
use remem_proto::auth::Secret;

use crate::units::parse_bytes;

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Address to listen on. Port 0 picks a free port; the address is printed on stdout as
    /// `listening ADDRESS`.
    #[arg(long, default_value = "127.0.0.1:7100")]
    pub listen: SocketAddr,
    /// Most memory this node lends, slabs plus their metadata (e.g. 4GiB).
    #[arg(long, default_value = "2GiB", value_parser = parse_bytes)]
    pub capacity: u64,
    /// Size of one slab (e.g. 64MiB). Every node of a cluster must use the same size.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub slab_size: u64,
    /// Failure domain (rack, host...) that clients use to spread splits.
    #[arg(long, default_value = "")]
    pub failure_domain: String,
    /// File holding the cluster secret. Without it, the REMEM_SECRET environment variable.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Identifier reported to clients (random if omitted).
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Most client connections served at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// accept fault-injection commands (tests and benchmarks only)
    #[arg(long)]
    pub fault_injection: bool,
    /// Also listen on this Unix socket, where same-host clients may map their slabs as shared
    /// memory after the handshake (docs/SHM.md). Keep it in a directory only the cluster's
    /// user can reach.
    #[arg(long)]
    pub unix: Option<PathBuf>,
}

pub fn run(args: NodeArgs) -> Result<()> {
    if !args.listen.ip().is_loopback() {
        tracing::warn!(address = %args.listen, "listening beyond loopback: make sure the network is trusted");
    }
    if args.slab_size == 0 || !args.slab_size.is_power_of_two() {
        bail!("--slab-size must be a power of two, got {}", args.slab_size);
    }
    if args.capacity < args.slab_size {
        bail!("--capacity ({}) is smaller than one slab ({})", args.capacity, args.slab_size);
    }
    let secret = Secret::load(args.secret_file.as_deref()).context("loading the cluster secret")?;
    let config = NodeConfig {
        listen: args.listen,
        capacity_bytes: args.capacity,
        slab_size_bytes: args.slab_size,
        failure_domain: args.failure_domain,
        secret,
        node_id: args.node_id.unwrap_or_else(rand::random),
        max_connections: args.max_connections,
        fault_injection: args.fault_injection,
        unix_socket: args.unix,
    };
    let node = Node::bind(config).with_context(|| format!("binding {}", args.listen))?;
    let shutdown = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&shutdown))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&shutdown))?;
    // The launcher reads this line to learn the port; keep its format.
    println!("listening {}", node.local_addr());
    use std::io::Write;
    std::io::stdout().flush()?;
    tracing::info!(address = %node.local_addr(), "node serving");
    node.run(shutdown).context("serving")?;
    tracing::info!("node stopped");
    Ok(())
}
