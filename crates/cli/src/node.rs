//! `remem node`: run one memory node until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_node::{Node, NodeConfig, ResourceMonitorConfig};
use remem_proto::auth::Secret;

use crate::units::parse_duration;

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Address to listen on. Port 0 picks a free port; the address is printed on stdout as
    /// `listening ADDRESS`.
    #[arg(long, default_value = "127.0.0.1:7100")]
    pub listen: SocketAddr,
    /// Most memory this node lends, slabs plus their metadata (e.g. 4GiB).
    #[arg(long, default_value = "2GiB", value_parser = crate::units::parse_positive_bytes)]
    pub capacity: u64,
    /// Size of one slab (e.g. 64MiB). Every node of a cluster must use the same size.
    #[arg(long, default_value = "64MiB", value_parser = crate::units::parse_positive_bytes)]
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
    #[arg(long, default_value_t = 1024, value_parser = crate::units::parse_count)]
    pub max_connections: usize,
    /// accept fault-injection commands (tests and benchmarks only)
    #[arg(long)]
    pub fault_injection: bool,
    /// Turn the resource monitor off: lend up to --capacity whatever the host has left, never
    /// pre-allocate or evict. Use it when several nodes share one host (`remem up` does), since
    /// each monitor would see the same memory and all of them would evict at once.
    #[arg(long)]
    pub no_monitor: bool,
    /// Resource monitor: how often host memory is read (cgroup v2 or v1 limit of this process
    /// if it has one, else /proc/meminfo) and acted on, e.g. 200ms or 1s.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub monitor_period: Duration,
    /// Resource monitor: free memory kept for local applications, in percent of the limit
    /// (0-90). Below it the node frees pre-allocated slabs, then evicts its least active slabs
    /// (their clients rebuild them elsewhere) and refuses new ones.
    #[arg(long, default_value_t = 25)]
    pub headroom_percent: u8,
    /// Resource monitor: E', the extra slabs sampled at random beyond the E to evict, so that
    /// the E least active of the sample go (batch eviction).
    #[arg(long, default_value_t = 2)]
    pub eviction_extra: u32,
    /// Resource monitor: slabs kept pre-allocated (mapped and faulted in, within --capacity)
    /// while memory is above the headroom, so that a new slab is ready at once; 0 turns it off.
    #[arg(long, default_value_t = 2)]
    pub prealloc_slabs: u32,
    /// Also listen on this Unix socket, where same-host clients may map their slabs as shared
    /// memory after the handshake (docs/SHM.md). Keep it in a directory only the cluster's
    /// user can reach.
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (e.g. 127.0.0.1:9100).
    #[arg(long, value_name = "ADDRESS")]
    pub metrics: Option<std::net::SocketAddr>,
    /// How long the slabs of a client that went away (its last connection closed, or its host
    /// stopped answering TCP keepalive for about 10 s) are kept for the same client, restarted
    /// with its saved slab map (`remem nbd`, `remem fs`), to re-attach; then they are freed.
    /// While it holds them, another process claiming the same client id is refused.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_grace: Duration,
    /// A client connection that sends nothing for this long, not even the heartbeat an idle
    /// client sends every second, is closed: a stopped process (SIGSTOP, a debugger, a hung
    /// event loop) loses its lease like a dead one, so another process can take its slabs over.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_timeout: Duration,
    /// Read settings from this TOML file: keys are the long flag names (`capacity = "4GiB"`,
    /// `no_monitor = true`); a flag on the command line wins over the file. The file may name
    /// the secret's file (`secret_file`), never hold the secret. Example: contrib/node.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Start even when --capacity is more than the host's memory (its cgroup limit, else
    /// MemTotal), or with --no-monitor more than 80% of what it has available.
    #[arg(long)]
    pub force: bool,
    /// Require authenticated encryption on every TCP connection (Noise, keyed by the cluster
    /// secret: clients and nodes then need `--encrypt` too), and use it for this node's own
    /// connections to the other nodes during rebuilds. Unix sockets and shared memory stay on
    /// the host and are never encrypted (docs/SECURITY.md).
    #[arg(long)]
    pub encrypt: bool,
    #[command(flatten)]
    pub etcd: crate::etcd_cluster::EtcdArgs,
}

impl NodeArgs {
    fn resource_monitor(&self) -> Option<ResourceMonitorConfig> {
        (!self.no_monitor).then(|| ResourceMonitorConfig {
            period: self.monitor_period,
            headroom_percent: self.headroom_percent,
            eviction_extra: self.eviction_extra,
            prealloc_slabs: self.prealloc_slabs,
            ..ResourceMonitorConfig::default()
        })
    }
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
    let resource_monitor = args.resource_monitor();
    if let Some(host) = crate::host_memory::HostMemory::read() {
        let what = format!("--capacity {}", crate::units::format_bytes(args.capacity));
        if let Err(message) = host.check(&what, args.capacity, resource_monitor.is_some()) {
            if !args.force {
                bail!("{message}");
            }
            tracing::warn!("starting as told by --force: {message}");
        }
    }
    if let Some(monitor) = &resource_monitor {
        monitor.validate().map_err(|message| anyhow::anyhow!("resource monitor: {message}"))?;
    }
    let secret = Secret::load(args.secret_file.as_deref()).context("loading the cluster secret")?;
    let etcd = args.etcd.connect()?;
    let unix_socket = args.unix.clone();
    let config = NodeConfig {
        listen: args.listen,
        capacity_bytes: args.capacity,
        slab_size_bytes: args.slab_size,
        failure_domain: args.failure_domain,
        secret,
        node_id: args.node_id.unwrap_or_else(rand::random),
        max_connections: args.max_connections,
        fault_injection: args.fault_injection,
        resource_monitor,
        unix_socket: args.unix,
        lease_grace: args.lease_grace,
        lease_timeout: args.lease_timeout,
        encrypt: args.encrypt,
    };
    let node = Node::bind(config).with_context(|| format!("binding {}", args.listen))?;
    // Registered while it serves; dropped after `run`, which revokes the lease.
    let _registration = match &etcd {
        Some(etcd) => {
            Some(crate::etcd_cluster::register_node(etcd, node.handle(), node.local_addr(), unix_socket)?)
        }
        None => None,
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&shutdown))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&shutdown))?;
    // The launcher reads this line to learn the port; keep its format.
    if let Some(address) = args.metrics {
        let handle = node.handle();
        let bound = crate::metrics::serve(address, Arc::clone(&shutdown), move || node_metrics(&handle))?;
        eprintln!("metrics at http://{bound}/metrics");
    }
    println!("listening {}", node.local_addr());
    use std::io::Write;
    std::io::stdout().flush()?;
    tracing::info!(address = %node.local_addr(), "node serving");
    node.run(shutdown).context("serving")?;
    tracing::info!("node stopped");
    Ok(())
}

/// The node's metrics, from its own account of itself.
pub fn node_metrics(handle: &remem_node::NodeHandle) -> String {
    let info = handle.info();
    let mut out = crate::metrics::Exposition::default();
    out.gauge("remem_node_capacity_bytes", "Memory the node lends (--capacity).", info.capacity_bytes as f64)
        .gauge("remem_node_free_bytes", "Capacity not mapped to a client.", info.free_bytes as f64)
        .gauge("remem_node_slab_size_bytes", "Slab size of the node.", info.slab_size_bytes as f64)
        .gauge("remem_node_slabs_mapped", "Slabs mapped to clients.", f64::from(info.slabs_mapped))
        .gauge(
            "remem_node_slabs_pooled",
            "Populated slabs kept ready by the resource monitor.",
            f64::from(handle.pooled_slabs()),
        )
        .gauge(
            "remem_node_metadata_bytes",
            "Bytes of split versions and checksums.",
            info.metadata_bytes as f64,
        )
        .counter("remem_node_requests_total", "Requests served since start.", info.requests_served as f64)
        .gauge(
            "remem_node_rebuilds_running",
            "Slab rebuilds running on the node.",
            f64::from(info.regenerating_slabs),
        )
        .gauge(
            "remem_node_rebuild_pages_done",
            "Pages handled by the running rebuilds.",
            info.regeneration_pages_done as f64,
        )
        .gauge(
            "remem_node_rebuild_pages_planned",
            "Pages the running rebuilds have to handle.",
            info.regeneration_pages_total as f64,
        )
        .gauge(
            "remem_node_connection_buffer_bytes",
            "Connection buffer bytes beyond the small per-connection ones (node-wide budget).",
            handle.connection_buffer_bytes() as f64,
        )
        .gauge(
            "remem_node_leases_live",
            "Clients with a live lease (a process connected).",
            f64::from(info.clients_live),
        )
        .gauge(
            "remem_node_leases_in_grace",
            "Clients that went away whose slabs are kept until the lease grace period ends.",
            f64::from(info.clients_in_grace),
        )
        .gauge(
            "remem_node_slabs_in_grace",
            "Slabs of the clients in their lease grace period.",
            f64::from(info.slabs_in_grace),
        )
        .counter(
            "remem_node_slabs_freed_by_lease_expiry_total",
            "Slabs freed because their client did not come back within the lease grace period.",
            handle.slabs_freed_by_lease_expiry() as f64,
        );
    out.finish()
}
