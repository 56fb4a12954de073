//! `remem kv`: a memcached-compatible cache on remem until SIGTERM or Ctrl-C.
//!
//! Thin: parse the policy flags, connect a client to the cluster with the EC region first, let
//! remem-kv add the other schemes' regions, bind, print `listening ADDRESS` as the first stdout
//! line (tests and scripts wait for it), and run the server. Semantics: docs/KV.md.
//!
//! `state` is the locked state directory a restart reopens, `standby` the `--standby` side of a
//! primary-standby pair. The cli keeps only the `remem kv` subcommand and its dispatch; the
//! shared front-end pieces (cluster file, `--transport`, metrics endpoint, region report) are
//! remem-frontend's. Nothing of the engine or the command layer imports this module.

pub mod etcd;
mod etcd_standby;
mod remote_state;
pub mod standby;
pub mod state;

use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_client::{Client, ClientConfig};
use remem_frontend::client_args::{Cluster, ConnectArgs};
use remem_frontend::units::{format_bytes, parse_bytes};

use crate::cache::durability::RestoreReport;
use crate::{CacheConfig, EcShape, Policy, Scheme, Server, ServerConfig};
use state::{KvState, ReopenTimes};

#[derive(Args, Debug)]
pub struct KvArgs {
    /// Where the cluster is (`--cluster`, or `--etcd` with `--secret-file`), the request timeout,
    /// the transport and encryption: every front end's flags. With --etcd the kv's name is
    /// claimed and its slab map kept in etcd, its items' records in its own remote memory, so
    /// that the same command on another host serves every item it acknowledged (docs/KV.md
    /// "Host loss", docs/ETCD.md).
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// With --etcd: the name the kv's keys are kept under in etcd (`clients/NAME/...`).
    #[arg(long, requires = "etcd")]
    pub export: Option<String>,
    /// Shell command run (sh -c) once this process serves, as keepalived's notify scripts: a
    /// standby that took over moves the service address to its host with it (`ip addr replace ...;
    /// arping -U ...`). Its environment has REMEM_KV_ADDRESS and REMEM_KV_NAME. docs/KV.md.
    #[arg(long, value_name = "CMD")]
    pub takeover_command: Option<String>,
    /// TCP address to listen on (port 0 picks one; printed as `listening ADDRESS`).
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub listen: SocketAddr,
    /// Also listen on this Unix socket (created 0600: only this user may connect).
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Bytes of items kept (keys, values and a 56-byte header each); the least recently used go
    /// beyond it, as memcached's -m. A limit, not a reservation: node memory is mapped as values
    /// arrive and given back as they go (about the scheme's overhead times what is stored); the
    /// start refuses a limit the nodes could not hold at the policy's costliest scheme.
    #[arg(short = 'm', long, default_value = "64MiB", value_parser = parse_bytes)]
    pub memory_limit: u64,
    /// Largest value accepted (memcached's -I).
    #[arg(short = 'I', long, default_value = "1MiB", value_parser = parse_bytes)]
    pub max_item_size: u64,
    /// Every object's scheme: auto (the policy: size, prefix rules, hotness), none, rep2, rep3,
    /// ec (the -k/-r shape, also written ec8+2) or eor (EOR(2,k)).
    #[arg(long, default_value = "auto")]
    pub scheme: String,
    /// Keys starting with PREFIX get SCHEME (repeatable; the longest prefix wins), e.g.
    /// --prefix-scheme session:=none.
    #[arg(long = "prefix-scheme", value_name = "PREFIX=SCHEME")]
    pub prefix_schemes: Vec<String>,
    /// auto: values below this size start as --small-scheme, others as --large-scheme.
    #[arg(long, default_value = "4KiB", value_parser = parse_bytes)]
    pub small_below: u64,
    #[arg(long, default_value = "rep2")]
    pub small_scheme: String,
    #[arg(long, default_value = "eor")]
    pub large_scheme: String,
    /// auto: an object not read for this many seconds moves to EC.
    #[arg(long, default_value_t = 60)]
    pub cold_after_secs: u64,
    /// auto: an EC object read this many times within 10 s moves back (0: no hotness moves).
    #[arg(long, default_value_t = 3)]
    pub hot_reads: u32,
    /// Data splits of the EC scheme (k).
    #[arg(short = 'k', long, default_value_t = 8, value_parser = remem_frontend::code_args::parse_data_splits)]
    pub data_splits: usize,
    /// Parities of the EC scheme (m): EC objects survive m failed nodes.
    #[arg(short = 'r', long, default_value_t = 2, value_parser = remem_frontend::code_args::parse_parity_splits)]
    pub parity_splits: usize,
    /// Turn off data bypassing (gets of a value being written wait for the write and read it
    /// back; concurrent gets each fetch): for measuring what bypassing saves.
    #[arg(long)]
    pub no_bypass: bool,
    /// memcached's ASCII authentication (memcached -Y): a file of `user:password` lines, mode
    /// 0600; connections must send `set <key> 0 0 <len>` with `<user> <password>` first.
    #[arg(short = 'Y', long)]
    pub auth_file: Option<PathBuf>,
    /// TLS on the TCP port (memcached's -Z): every TCP connection must speak it, with the
    /// certificate of --ssl-chain-cert and --ssl-key; the Unix socket stays plain. docs/KV.md
    /// "Security".
    #[arg(short = 'Z', long, requires_all = ["ssl_chain_cert", "ssl_key"])]
    pub enable_ssl: bool,
    /// The server's certificate chain, PEM, leaf first (memcached's -o ssl_chain_cert).
    #[arg(long, value_name = "FILE", requires = "enable_ssl")]
    pub ssl_chain_cert: Option<PathBuf>,
    /// The private key of --ssl-chain-cert, PEM (memcached's -o ssl_key).
    #[arg(long, value_name = "FILE", requires = "enable_ssl")]
    pub ssl_key: Option<PathBuf>,
    /// Ask every client for a certificate and accept only those this CA (PEM) signed, as
    /// memcached's -o ssl_ca_cert with ssl_verify_mode=2: who holds one may use the cache.
    #[arg(long, value_name = "FILE", requires = "enable_ssl")]
    pub ssl_ca_cert: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (refreshed every second).
    #[arg(long, value_name = "ADDRESS")]
    pub metrics: Option<SocketAddr>,
    /// Most client connections at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Bytes held for replies by all connections together: values fetched for gets, replies
    /// waiting for their turn, output not yet written. A connection may hold a quarter of it (at
    /// most 64 MiB); beyond, it stops reading and fetching until its client reads. One holding
    /// nothing may always start one value, so the worst case is this plus one item per
    /// connection (docs/KV.md "Bounds").
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub output_budget: u64,
    /// Microseconds the server polls for node replies before it sleeps, while page ops are in
    /// flight and nothing else is due (0: never). A sleeping server costs a wake-up per reply; a
    /// polling one a share of the core the nodes run on.
    #[arg(long, default_value_t = 20)]
    pub spin_us: u64,
    /// Threads (memcached's -t): 1 serves everything on one thread; N adds N - 1 threads that
    /// write replies to the sockets, which is most of the CPU at many connections. The cache
    /// stays one, on the first thread. More than the cores given slows it down.
    #[arg(short = 't', long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Name of this server's state directory `kv-NAME/` beside the cluster file (several
    /// servers on one cluster need different names).
    #[arg(long, default_value = "default")]
    pub name: String,
    /// State directory (default: `kv-NAME/` beside the cluster file): the slab map and the backup
    /// region every acknowledged item is recorded in, so a restarted server (after SIGKILL, a
    /// crash or a clean stop) serves every item it acknowledged. docs/KV.md "Restarts".
    #[arg(long, conflicts_with = "ephemeral")]
    pub state: Option<PathBuf>,
    /// Drop the saved items and their slabs, and start empty.
    #[arg(long, conflicts_with = "ephemeral")]
    pub fresh: bool,
    /// Keep nothing: no state directory, and the slabs go back to the nodes at exit (a plain
    /// cache that starts empty, as memcached).
    #[arg(long)]
    pub ephemeral: bool,
    /// Stand by for the running `remem kv` of the same state directory (same cluster and --name
    /// or --state, same -m, -k, -r, schemes and --auth-file: a standby with others is refused,
    /// naming them): lend it a backup region in this process's memory, and take over its address
    /// with every item it acknowledged when it dies. With no primary yet, waits for one, saying
    /// so every 5 s. docs/KV.md "Standby". With --etcd, on any host: wait while the primary holds
    /// the name, take it over when its owner lease lapses (docs/KV.md "Standby on another host").
    #[arg(long, conflicts_with_all = ["ephemeral", "fresh"])]
    pub standby: bool,
    /// How a standby's region is kept (this server's, when a standby attaches): one-sided (this
    /// server stores into the standby's memory; the standby's CPU idles), rpc (each change sent,
    /// replies wait for the standby's acknowledgement) or log (a ring the standby drains by
    /// polling; replies do not wait).
    #[arg(long, default_value = "one-sided", value_parser = ["one-sided", "rpc", "log"])]
    pub replication: String,
    /// How a new standby's region is filled while this server serves: adaptive (whole chunks
    /// where they are dense, record by record where sparse), bulk or per-item.
    #[arg(long, default_value = "adaptive", value_parser = ["adaptive", "bulk", "per-item"])]
    pub sync: String,
    /// Size of the backup region (a sparse file: only records written take memory). Default:
    /// 2.5 x --memory-limit + 16 MiB, room for every item the limit allows.
    #[arg(long, value_parser = parse_bytes)]
    pub backup_size: Option<u64>,
    /// Slab placement: least-loaded, p2c-slab or ec-cache. The CodingSets policies form their
    /// groups for one range width, and the kv's regions have several (1 to k+r).
    #[arg(long, default_value = "least-loaded")]
    pub placement: String,
    /// Accept ranges with more than r splits in one failure domain when the cluster's domains
    /// allow no better (losing that domain then loses data). Without it such a start is refused,
    /// naming the -k that fits.
    #[arg(long)]
    pub allow_shared_domains: bool,
}

fn parse_scheme(text: &str, ec: EcShape) -> Result<Scheme> {
    Scheme::parse(text.as_bytes(), ec).map_err(|error| anyhow::anyhow!("{error}"))
}

/// The limits clap cannot check alone, before anything is connected or mapped.
fn check_args(args: &KvArgs) -> Result<()> {
    if args.max_item_size == 0 || args.max_item_size > 128 << 20 {
        bail!("--max-item-size must be between 1 byte and 128 MiB");
    }
    if args.memory_limit < 1 << 20 {
        bail!("--memory-limit must be at least 1 MiB");
    }
    if args.spin_us > 10_000 {
        bail!("--spin-us must be at most 10000 (10 ms)");
    }
    if args.max_connections == 0 {
        bail!("--max-connections must be positive");
    }
    if args.output_budget < 1 << 20 || args.output_budget > 1 << 40 {
        bail!("--output-budget must be between 1 MiB and 1 TiB");
    }
    if args.connect.etcd.etcd.is_some() && args.ephemeral {
        bail!(
            "--etcd keeps the kv's state in etcd and remote memory for a restart on any host: not with \
             --ephemeral (which keeps none)"
        );
    }
    Ok(())
}

/// The scheme policy of `--scheme`, `--small-*`, `--large-scheme`, `--prefix-scheme` and the
/// hotness flags.
fn scheme_policy(args: &KvArgs, ec: EcShape) -> Result<Policy> {
    let mut policy = Policy {
        small_below_bytes: args.small_below as usize,
        small_scheme: parse_scheme(&args.small_scheme, ec)?,
        large_scheme: parse_scheme(&args.large_scheme, ec)?,
        cold_after: Duration::from_secs(args.cold_after_secs),
        hot_reads: args.hot_reads,
        ..Policy::default()
    };
    if args.scheme != "auto" {
        policy.fixed = Some(parse_scheme(&args.scheme, ec)?);
    }
    for rule in &args.prefix_schemes {
        let Some((prefix, scheme)) = rule.split_once('=') else {
            bail!("--prefix-scheme {rule:?}: expected PREFIX=SCHEME");
        };
        policy.prefixes.push((prefix.as_bytes().to_vec(), parse_scheme(scheme, ec)?));
    }
    Ok(policy)
}

/// What a restart found in the state directory `dir`, and how long reopening took.
fn report_reopened(dir: &Path, report: &RestoreReport, times: &ReopenTimes) {
    eprintln!(
        "reopened {}: {} items restored ({} superseded, {} expired, {} refused; {} damaged and \
         {} invalid records dropped); --fresh starts empty",
        dir.display(),
        report.restored,
        report.superseded,
        report.expired,
        report.refused,
        report.scan.damaged,
        report.scan.invalid
    );
    eprintln!(
        "reopening took {:.3} s: slabs {:.3} s, region scan {:.3} s, index rebuilt {:.3} s",
        (times.slabs + times.scan + times.restore).as_secs_f64(),
        times.slabs.as_secs_f64(),
        times.scan.as_secs_f64(),
        times.restore.as_secs_f64()
    );
    if report.refused + report.scan.damaged + report.scan.invalid > 0 {
        tracing::warn!(?report, "the backup region held records that were not restored");
    }
}

/// A new cache on the cluster: its regions, and with a state directory its backup region, an
/// empty rewrites file and the slab map saved.
fn new_cache(
    cluster: &remem_client::cluster::ClusterFile,
    cluster_path: &Path,
    secret: &remem_client::Secret,
    (config, placement): (ClientConfig, Box<dyn remem_placement::Placement>),
    cache_config: CacheConfig,
    state: Option<&KvState>,
    args: &KvArgs,
) -> Result<crate::Cache> {
    // No region yet: the limit is checked against the nodes first (a region of terabytes
    // costs its page table even unmapped).
    let config = ClientConfig { address_space_bytes: 0, ..config };
    let client = Client::connect(&cluster.addresses(), secret, config, placement)
        .with_context(|| format!("connecting to the cluster of {}", cluster_path.display()))?;
    check_node_memory(&client, &cache_config, args.memory_limit)?;
    let region_bytes = args.memory_limit.div_ceil(4096) * 4096;
    let mut cache = crate::cache::open::build_cache(client, cache_config, region_bytes)
        .context("creating the regions")?;
    if let Some(state) = state {
        let bytes = args.backup_size.unwrap_or(state::default_backup_bytes(args.memory_limit));
        cache.set_backup(state.create_backup(bytes)?);
        // A new server: no rewrite of its pages was cut short; anything in the file is
        // another server's.
        let (mut log, intents) = state.open_rewrites()?;
        for intent in intents {
            log.clear(intent.slot).context("clearing the rewrites file")?;
        }
        cache.set_rewrites(log);
        let map_path = state.map_path();
        cache
            .client_mut()
            .client()
            .save_map(&map_path)
            .with_context(|| format!("saving the slab map to {}", map_path.display()))?;
        cache.set_map_path(map_path);
    }
    Ok(cache)
}

/// Refuses a `-m` the cluster could not hold: items of `memory_limit` bytes all at the
/// costliest scheme the policy starts values in (EOR: its main copies and a whole EC page
/// each, as during its move to EC), against the free memory of the nodes that answered. Nothing
/// is mapped at the start (ranges are mapped as values arrive), so this is the only early word.
fn check_node_memory(client: &Client, config: &CacheConfig, memory_limit: u64) -> Result<()> {
    let policy = &config.policy;
    let mut starting = match policy.fixed {
        Some(fixed) => vec![fixed],
        None => vec![policy.small_scheme, policy.large_scheme],
    };
    starting.extend(policy.prefixes.iter().map(|(_, scheme)| *scheme));
    let nodes = client.engine().nodes().iter().filter(|node| node.connected);
    let slab_size = nodes.clone().map(|node| node.info.slab_size_bytes).max().unwrap_or(0);
    let (answered, free_bytes) =
        nodes.fold((0, 0u64), |(count, free), node| (count + 1, free + node.info.free_bytes));
    let bytes_of = |scheme: Scheme| {
        let shape = |scheme| crate::scheme::region_shape(scheme, config.ec);
        let bytes = |scheme| remem_client::region_node_bytes(shape(scheme), memory_limit, slab_size, 4096);
        match scheme {
            Scheme::Eor => bytes(Scheme::Ec) + bytes(Scheme::None),
            other => bytes(other),
        }
    };
    let Some((needed, scheme)) =
        starting.into_iter().map(|scheme| (bytes_of(scheme), scheme)).max_by_key(|(bytes, _)| *bytes)
    else {
        return Ok(());
    };
    if needed > free_bytes {
        bail!(
            "-m {} of items at {} needs up to {} of node memory, and the {answered} nodes that answered have {} \
             free: lower -m, or add nodes (docs/KV.md \"Memory\")",
            format_bytes(memory_limit),
            scheme.stat_name(),
            format_bytes(needed),
            format_bytes(free_bytes)
        );
    }
    Ok(())
}

/// The door a standby attaches through (`standby.sock` in the state directory).
fn serve_standbys(
    server: &mut Server,
    state: &KvState,
    args: &KvArgs,
    (address, unix): (SocketAddr, Option<&Path>),
    cluster_path: &Path,
) -> Result<()> {
    let mode = crate::backup::wire::Mode::parse(&args.replication).expect("checked by clap");
    let policy = crate::backup::SyncPolicy::parse(&args.sync).expect("checked by clap");
    let unix_text = unix.map(|path| path.display().to_string()).unwrap_or_default();
    let settings = standby::standby_settings(cluster_path, server.cache.config(), args.auth_file.as_deref());
    let port = crate::standby::StandbyPort::bind(
        &state.dir,
        mode,
        policy,
        (address.to_string(), unix_text),
        settings,
    )
    .context("listening for a standby")?;
    server.serve_standbys(port).context("listening for a standby")?;
    Ok(())
}

/// What the server does once a second beside its own housekeeping: stop when a node says
/// another process serves the cache's client id now (a standby took over: `stop` is set and
/// `fenced` says why), publish the client's report for `remem status` and the metrics
/// snapshot, save the slab map after rebuilds (so a restart finds the slabs where they are
/// now), and hand new nodes of the cluster file to the client.
fn housekeeping(
    cache: &mut crate::Cache,
    (cluster_path, cluster): (PathBuf, &remem_client::cluster::ClusterFile),
    map_path: Option<PathBuf>,
    metrics: Option<Arc<std::sync::Mutex<String>>>,
    name: String,
    (stop, fenced): (Arc<AtomicBool>, Rc<RefCell<Option<String>>>),
) -> Box<dyn FnMut(&mut crate::Cache)> {
    let mut watch = remem_frontend::cluster_watch::ClusterWatch::new(cluster_path.clone(), cluster);
    let mut reporter = None;
    let mut rebuilds = remem_frontend::export_home::RebuildSaves::new(cache.client_mut().client());
    Box::new(move |cache: &mut crate::Cache| {
        let client = cache.client_mut().client();
        if let Some(reason) = client.fenced_at_node() {
            tracing::error!(%reason, "fenced at a node: stopping");
            *fenced.borrow_mut() = Some(reason.to_string());
            stop.store(true, Ordering::Relaxed);
            return;
        }
        let reporter = reporter.get_or_insert_with(|| {
            remem_frontend::client_report::ClientReporter::new(&cluster_path, "kv", &name, client.client_id())
        });
        reporter.publish(|| client.region_health());
        if let Some(snapshot) = &metrics {
            let text = crate::report::prometheus(cache);
            if let Ok(mut shared) = snapshot.lock() {
                *shared = text;
            }
        }
        if let Some(map_path) = &map_path {
            rebuilds.after_rebuilds(cache.client_mut().client(), |client| client.save_map(map_path));
        }
        let nodes = watch.new_nodes();
        let client = cache.client_mut().client();
        remem_frontend::cluster_watch::hand_new_nodes(nodes, client, "the cache's client", |address| {
            watch.joined(address)
        });
    })
}

/// The client of the cache's regions: its placement policy and settings. `cluster_encrypts`:
/// the cluster file says its nodes require encryption (`remem up --encrypt`), so the client
/// encrypts without `--encrypt`.
fn client_config(
    args: &KvArgs,
    ec: EcShape,
    cluster_encrypts: bool,
) -> Result<(ClientConfig, Box<dyn remem_placement::Placement>)> {
    let placement = match remem_placement::Policy::parse(&args.placement) {
        Some(policy) if !policy.name().starts_with("codingsets") => policy.build(rand::random(), 0),
        Some(_) => bail!(
            "--placement {}: CodingSets needs one range width; use least-loaded, p2c-slab or ec-cache",
            args.placement
        ),
        None => bail!("unknown --placement {:?}", args.placement),
    };
    let region_bytes = args.memory_limit.div_ceil(4096) * 4096;
    let shape = crate::scheme::region_shape(Scheme::Ec, ec);
    let mut config = args.connect.config(shape, region_bytes, cluster_encrypts);
    config.allow_shared_domains = args.allow_shared_domains;
    config.release_on_drop = args.ephemeral;
    // Node memory in proportion to what is stored: ranges are mapped as values need them.
    config.lazy_ranges = true;
    Ok((config, placement))
}

/// The state directory (locked), or with `--standby` the one taken over; none with `--ephemeral`.
fn open_state(
    args: &KvArgs,
    cluster_path: &Path,
    cache_config: &CacheConfig,
    gauges: &standby::StandbyGauges,
) -> Result<(Option<KvState>, Option<standby::Takeover>)> {
    if args.ephemeral {
        return Ok((None, None));
    }
    let dir = match &args.state {
        Some(dir) => dir.clone(),
        None => {
            let name = &args.name;
            if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.len() > 200 {
                bail!("--name {name:?} must be a plain file name");
            }
            cluster_path.parent().unwrap_or(Path::new(".")).join(format!("kv-{}", args.name))
        }
    };
    if args.standby {
        let settings = standby::standby_settings(cluster_path, cache_config, args.auth_file.as_deref());
        let (found, state) = standby::stand_by(&dir, &settings, gauges)?;
        Ok((Some(state), Some(found)))
    } else {
        Ok((Some(KvState::lock(&dir)?), None))
    }
}

/// The cache's settings from the flags.
fn cache_config(args: &KvArgs, policy: Policy, ec: EcShape) -> CacheConfig {
    CacheConfig {
        memory_limit_bytes: args.memory_limit,
        max_item_bytes: args.max_item_size as usize,
        policy,
        ec,
        bypass: !args.no_bypass,
        max_background_transitions: 8,
    }
}

/// `--enable-ssl`: the TLS settings of the TCP port, checked before anything is mapped.
pub(crate) fn tls_config(args: &KvArgs) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let (true, Some(certificate), Some(key)) = (args.enable_ssl, &args.ssl_chain_cert, &args.ssl_key) else {
        return Ok(None);
    };
    let config = remem_frontend::tls::server_config(certificate, key, args.ssl_ca_cert.as_deref())
        .context("--enable-ssl")?;
    Ok(Some(config))
}

/// The server's settings from the flags.
fn server_config(
    args: &KvArgs,
    listen: SocketAddr,
    unix: Option<PathBuf>,
    (auth, tls): (Option<crate::auth::Credentials>, Option<Arc<rustls::ServerConfig>>),
) -> ServerConfig {
    ServerConfig {
        listen: Some(listen),
        unix,
        max_connections: args.max_connections,
        limits: remem_memcache::Limits { max_item_bytes: args.max_item_size as usize, ..Default::default() },
        auth,
        output_budget_bytes: args.output_budget as usize,
        spin: Duration::from_micros(args.spin_us),
        threads: usize::from(args.threads),
        tls,
    }
}

/// The start's summary line, after `listening`.
fn announce(args: &KvArgs, policy: &Policy, ec: EcShape, nodes: usize) {
    eprintln!(
        "remem kv: {} of items, schemes {}, across {} nodes{}",
        format_bytes(args.memory_limit),
        crate::scheme::schemes_needed(policy)
            .iter()
            .map(|scheme| scheme.label(ec))
            .collect::<Vec<_>>()
            .join(", "),
        nodes,
        args.unix.as_ref().map(|path| format!(", unix socket {}", path.display())).unwrap_or_default()
    );
}

/// What a standby that took over says.
fn took_over(takeover: &standby::Takeover) -> String {
    format!(
        "took over from the primary{}, found dead because {}: serving {} ms after",
        takeover.primary_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
        takeover.how,
        takeover.detected_at.elapsed().as_millis()
    )
}

/// The metrics endpoint of a server with a cluster file: the standby's gauges until `serving`
/// is set, then the cache's snapshot.
fn serve_metrics(
    args: &KvArgs,
    stop: &Arc<AtomicBool>,
    snapshot: &Arc<std::sync::Mutex<String>>,
) -> Result<(Arc<standby::StandbyGauges>, Arc<AtomicBool>)> {
    let gauges = Arc::new(standby::StandbyGauges::default());
    let serving = Arc::new(AtomicBool::new(!args.standby));
    if let Some(address) = args.metrics {
        let (served, gauges, serving) = (Arc::clone(snapshot), Arc::clone(&gauges), Arc::clone(&serving));
        let render = move || match serving.load(Ordering::Relaxed) {
            true => served.lock().map(|text| text.clone()).unwrap_or_default(),
            false => gauges.render(),
        };
        let bound = remem_frontend::metrics::serve(address, Arc::clone(stop), render)?;
        eprintln!("metrics at http://{bound}/metrics");
    }
    Ok((gauges, serving))
}

pub fn run(args: KvArgs) -> Result<()> {
    check_args(&args)?;
    // Refused before anything is mapped on the nodes.
    let auth = match &args.auth_file {
        Some(path) => Some(crate::auth::Credentials::load(path)?),
        None => None,
    };
    let access = (auth, tls_config(&args)?);
    let ec = EcShape { data_splits: args.data_splits, parity_splits: args.parity_splits };
    let policy = scheme_policy(&args, ec)?;

    let stop = Arc::new(AtomicBool::new(false));
    let snapshot = Arc::new(std::sync::Mutex::new(String::new()));
    if args.connect.etcd.etcd.is_some() {
        if let Some(address) = args.metrics {
            let served = Arc::clone(&snapshot);
            let render = move || served.lock().map(|text| text.clone()).unwrap_or_default();
            let bound = remem_frontend::metrics::serve(address, Arc::clone(&stop), render)?;
            eprintln!("metrics at http://{bound}/metrics");
        }
        let publish = args.metrics.is_some().then_some(snapshot);
        return etcd::run(&args, access, cache_config(&args, policy, ec), stop, publish);
    }

    let Cluster::File { path: cluster_path, cluster, secret } = args.connect.cluster()? else {
        unreachable!("--etcd was handled above");
    };
    let (config, placement) = client_config(&args, ec, cluster.encrypt)?;
    let cache_config = cache_config(&args, policy, ec);
    // The metrics endpoint comes first: a standby shows its own gauges until it takes over, and
    // a busy port fails the start before anything is mapped or `listening` is printed.
    let (gauges, serving) = serve_metrics(&args, &stop, &snapshot)?;
    let (state, takeover) = open_state(&args, &cluster_path, &cache_config, &gauges)?;
    if let (Some(state), true) = (&state, args.fresh) {
        state.drop_saved(&secret, &config)?;
    }
    let reopened = match &state {
        Some(state) => {
            state.reopen(&cluster, &cluster_path, &secret, config.clone(), cache_config.clone())?
        }
        None => None,
    };
    if takeover.is_some() && reopened.is_none() {
        bail!("the primary saved no slab map: nothing to take over");
    }
    let cache = match reopened {
        Some((cache, report, times)) => {
            let dir = &state.as_ref().expect("reopened from a state").dir;
            report_reopened(dir, &report, &times);
            cache
        }
        None => new_cache(
            &cluster,
            &cluster_path,
            &secret,
            (config, placement),
            cache_config,
            state.as_ref(),
            &args,
        )?,
    };
    let (listen, unix) = match &takeover {
        Some(takeover) => (takeover.listen, takeover.unix.clone().or(args.unix.clone())),
        None => (args.listen, args.unix.clone()),
    };
    let server_config = server_config(&args, listen, unix.clone(), access);
    let mut server = Server::bind(cache, server_config).with_context(|| format!("binding {listen}"))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let address = server.local_addr().expect("a TCP listener");
    if let Some(state) = &state {
        serve_standbys(&mut server, state, &args, (address, unix.as_deref()), &cluster_path)?;
    }
    if let Some(takeover) = &takeover {
        eprintln!("{}", took_over(takeover));
    }
    // The metrics snapshot is taken on the cache's own thread (housekeeping) and served from
    // the endpoint's; a standby that took over serves it from now on.
    serving.store(true, Ordering::Relaxed);
    println!("listening {address}");
    std::io::stdout().flush()?;
    if let Some(command) = &args.takeover_command {
        etcd_standby::run_takeover_command(command, address, &args.name);
    }
    announce(&args, &server.cache.config().policy, ec, cluster.nodes.len());
    let name = args.listen.to_string();
    let saved_map = state.as_ref().map(|state| state.map_path());
    let publish = args.metrics.is_some().then_some(snapshot);
    let fenced = Rc::new(RefCell::new(None));
    let fence = (Arc::clone(&stop), Rc::clone(&fenced));
    server.on_housekeeping =
        Some(housekeeping(&mut server.cache, (cluster_path, &cluster), saved_map, publish, name, fence));
    let result = server.run(&stop);
    if let Some(path) = &unix {
        let _ = std::fs::remove_file(path);
    }
    result.context("serving")?;
    if let Some(reason) = fenced.borrow_mut().take() {
        bail!("fenced at a node: {reason}: another process serves this cache's client now; stopped serving");
    }
    Ok(())
}
