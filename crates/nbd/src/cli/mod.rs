//! `remem nbd`: serve one remem address space as an NBD export until SIGTERM or Ctrl-C.
//!
//! Thin: take what can fail first (memory lock, TLS, the listener, the metrics port), then open
//! the export (a client on the cluster, its slab map saved), print `listening ADDRESS` as the
//! first stdout line once nothing can fail (tests, scripts and supervisors wait for it), and hand
//! over to `crate::serve`. The protocol lives in the rest of this crate; the semantics in
//! docs/NBD.md. `metrics` counts page ops for `--metrics`. The cli keeps only the `remem nbd`
//! subcommand and its dispatch.

pub mod metrics;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_client::cluster::ClusterFile;
use remem_client::{Client, ClientConfig, SlabMapFile};
use remem_frontend::client_args::{ClientArgs, Cluster};
use remem_frontend::export_home::{ExportHome, FileHome};
use remem_frontend::units::{format_bytes, parse_bytes};

use crate::{Export, Listener, ServerConfig};

#[derive(Args, Debug)]
pub struct NbdArgs {
    /// Size of the export (a multiple of 4 KiB). The whole address space is mapped on the
    /// nodes at start: (k+r)/k times this size of node memory.
    #[arg(long, value_parser = parse_bytes)]
    pub size: u64,
    /// Export name clients ask for (the empty name also selects it).
    #[arg(long, default_value = "remem")]
    pub export: String,
    /// Listen on TCP at this address instead of a Unix socket (port 0 picks one; the address is
    /// printed as `listening ...`), e.g. 127.0.0.1:10809. Whoever can reach it may connect: any
    /// local user on 127.0.0.1, and other hosts on other addresses, unless TLS with client
    /// certificates (`--tls-ca`) keeps them out (docs/SECURITY.md).
    #[arg(long, value_name = "ADDRESS", conflicts_with = "unix")]
    pub listen: Option<SocketAddr>,
    /// The Unix socket to listen on (default, without --listen: `nbd-EXPORT.sock` beside the
    /// cluster file, or in the `remem up` default directory with --etcd). The recommended mode
    /// on one host (qemu, nbdcopy, nbd-client speak NBD over Unix sockets). Only the socket's
    /// owner may connect unless `--unix-mode`/`--unix-group` say otherwise.
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Permissions of the Unix socket, in octal (connecting needs write permission).
    #[arg(long, default_value = "600", value_parser = parse_mode, conflicts_with = "listen")]
    pub unix_mode: u32,
    /// Group of the Unix socket (a name or a number), for `--unix-mode 660`.
    #[arg(long, conflicts_with = "listen")]
    pub unix_group: Option<String>,
    /// Offer TLS (NBD_OPT_STARTTLS) with this certificate chain (PEM) on the TCP listener
    /// (`--listen`).
    #[arg(long, requires_all = ["tls_key", "listen"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Ask clients for a certificate signed by this CA (PEM) and refuse those without one
    /// (implies --tls-required: a plain client has no certificate either).
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Serve nothing before STARTTLS (NBD_REP_ERR_TLS_REQD; NBD_OPT_EXPORT_NAME disconnects).
    #[arg(long, requires = "tls_cert")]
    pub tls_required: bool,
    /// Where the cluster is (a cluster file, or `--etcd`: the nodes registered there, the slab
    /// map kept there under the export's name), the coding shape and placement, timeouts,
    /// transport and encryption.
    #[command(flatten)]
    pub client: ClientArgs,
    /// Pages in flight at once (per engine).
    #[arg(long, default_value_t = 32, value_parser = remem_frontend::units::parse_count)]
    pub queue_depth: usize,
    /// Engines, one per core: remem clients with the export's pages dealt across them in 128
    /// KiB chunks, each its own slabs, under one client identity. Connections on different
    /// cores then run different engines at once (docs/NBD.md "Engines"). Each engine's slab
    /// map is saved apart (STATE.engine-I-of-N); a saved export reopens only with the same
    /// count. Not with --etcd or --metrics yet.
    #[arg(long, default_value_t = 1, value_parser = parse_engines)]
    pub engines: usize,
    /// Lock all memory (mlockall): needed when the export backs swap (docs/NBD.md).
    #[arg(long)]
    pub mlock: bool,
    /// Write this value to /proc/self/oom_score_adj (-1000: never chosen by the OOM killer).
    #[arg(long, allow_hyphen_values = true)]
    pub oom_score_adj: Option<i32>,
    /// Most NBD connections served at once.
    #[arg(long, default_value_t = 16, value_parser = remem_frontend::units::parse_count)]
    pub max_connections: usize,
    /// Where the export's slab map is kept, so a restarted `remem nbd` (after a crash, SIGKILL
    /// or a clean stop) reopens the same pages instead of an empty export (default:
    /// `nbd-EXPORT.slabmap` beside the cluster file). The export's slabs stay on the nodes
    /// after it stops; `--fresh` gives them back and starts empty. With --etcd the map is kept
    /// in etcd instead.
    #[arg(long, conflicts_with = "etcd")]
    pub state: Option<PathBuf>,
    /// Start an empty export: the slabs of a saved one (`--state`) are unmapped first.
    #[arg(long)]
    pub fresh: bool,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (e.g. 127.0.0.1:9102): page reads
    /// and writes, errors, latency histograms, ranges healthy/degraded/rebuilding/lost.
    #[arg(long, value_name = "ADDRESS")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// The export's client: the saved one reopened (its pages as they were), or a new one whose map
/// is saved at once (`remem_frontend::open`).
fn open_export(
    args: &NbdArgs,
    cluster: &ClusterFile,
    cluster_path: &Path,
    secret: &remem_client::Secret,
    config: ClientConfig,
    state_path: &Path,
) -> Result<Client> {
    let what = format!("the export {:?} saved in {}", args.export, state_path.display());
    let (client, reopened) = remem_frontend::open::open_or_reopen(remem_frontend::open::OpenRequest {
        what: &what,
        map_path: state_path,
        fresh: args.fresh,
        cluster,
        cluster_path,
        secret,
        config,
        placement: &args.client.placement,
        other_choices: "",
    })?;
    if reopened {
        eprintln!("reopened the export saved in {} (--fresh to start empty)", state_path.display());
    }
    Ok(client)
}

/// `--tls-cert`, `--tls-key` and `--tls-ca`: the server's TLS, required with a CA.
fn tls_settings(args: &NbdArgs) -> Result<Option<crate::TlsSettings>> {
    Ok(match (&args.tls_cert, &args.tls_key) {
        (Some(certificate), Some(key)) => {
            let config = crate::tls::server_config(certificate, key, args.tls_ca.as_deref())
                .context("loading the TLS certificate")?;
            // A CA asks every client for a certificate: a plain client has none, so TLS is
            // required whether or not --tls-required says so.
            let required = args.tls_required || args.tls_ca.is_some();
            Some(crate::TlsSettings { config, required })
        }
        _ => None,
    })
}

/// The listener: the owner-only Unix socket by default, TCP with `--listen` (with a warning
/// without TLS). Returns it, how `listening` names it, and the socket's path to remove at exit.
fn bind_listener(args: &NbdArgs, tls: bool) -> Result<(Listener, String, Option<PathBuf>)> {
    let unix_path = match args.listen {
        Some(_) => None,
        None => Some(unix_socket_path(args)?),
    };
    let (listener, shown) = match (&unix_path, args.listen) {
        (Some(path), _) => {
            let listener = bind_unix(path, args.unix_mode, args.unix_group.as_deref())?;
            (Listener::Unix(listener), format!("unix:{}", path.display()))
        }
        (None, Some(address)) => {
            let listener = TcpListener::bind(address).with_context(|| format!("binding {address}"))?;
            let address = listener.local_addr()?;
            if !tls {
                tracing::warn!(
                    "NBD on TCP {address} without TLS: any local user (and any host that reaches it) \
                     can connect and read or overwrite the export; leave out --listen for an \
                     owner-only Unix socket, or add --tls-cert/--tls-key/--tls-ca"
                );
            }
            (Listener::Tcp(listener), address.to_string())
        }
        (None, None) => unreachable!("a Unix path is chosen whenever --listen is absent"),
    };
    Ok((listener, shown, unix_path))
}

pub fn run(args: NbdArgs) -> Result<()> {
    if args.size == 0 || !args.size.is_multiple_of(4096) {
        bail!("--size {} is not a positive multiple of 4096 bytes", args.size);
    }
    let mut config = args.client.config(args.size, args.queue_depth, false)?;
    // The slabs outlive the process: a restart reopens them (the state file names them).
    config.release_on_drop = false;
    if args.engines > 1 && args.metrics.is_some() {
        bail!("--metrics serves one engine's figures: use it with --engines 1");
    }
    // What can fail without touching the export comes first (the process's limits, TLS, the
    // listener, the metrics port): a start that fails leaves no slab map behind, and `listening`
    // is printed only once nothing can fail any more.
    if let Some(value) = args.oom_score_adj {
        remem_host::process::set_oom_score_adj(value).context("setting oom_score_adj")?;
    }
    if args.mlock {
        remem_host::process::lock_all_memory()
            .context("mlockall (needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)")?;
    }
    let tls = tls_settings(&args)?;
    let (listener, shown, unix_path) = bind_listener(&args, tls.is_some())?;
    let stop = Arc::new(AtomicBool::new(false));
    let snapshot = Arc::new(Mutex::new(String::new()));
    let opened = metrics_then_export(&args, config, &stop, &snapshot).inspect_err(|_| {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        remove_socket(unix_path.as_deref());
    })?;
    let client = &opened[0].0;
    let page_bytes = client.page_bytes() as u32;
    let export = Export {
        name: args.export.clone(),
        description: format!(
            "remem EC({},{}) delta {}, {}",
            args.client.code.data_splits,
            args.client.code.parity_splits,
            args.client.code.delta,
            format_bytes(args.size)
        ),
        size_bytes: args.size,
        max_request_bytes: 32 << 20,
        page_bytes,
    };
    let mut server_config = ServerConfig::new(export);
    server_config.max_connections = args.max_connections.max(1);
    server_config.tls = tls;

    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    println!("listening {shown}");
    std::io::stdout().flush()?;
    eprintln!(
        "serving export {:?}: {} on EC({},{}) across {} nodes, {} engine{}",
        args.export,
        format_bytes(args.size),
        args.client.code.data_splits,
        args.client.code.parity_splits,
        client.slab_map().nodes.len(),
        args.engines,
        if args.engines == 1 { "" } else { "s" }
    );
    let mut watched: Vec<WatchedClient> = opened
        .into_iter()
        .map(|(client, home, report_to)| WatchedClient::new(client, report_to, home, Arc::clone(&stop)))
        .collect();
    let fenced = if let [one] = &mut watched[..] {
        one.metrics = args.metrics.map(|_| metrics::NbdMetrics::new(snapshot));
        let store = Mutex::new(watched.pop().expect("one engine"));
        let result = crate::serve(&listener, &store, &server_config, &stop);
        remove_socket(unix_path.as_deref());
        result.context("serving NBD")?;
        store.into_inner().ok().and_then(|store| store.home.fenced())
    } else {
        let store = crate::Shards::new(watched, args.size / 4096);
        let result = crate::serve(&listener, &store, &server_config, &stop);
        remove_socket(unix_path.as_deref());
        result.context("serving NBD")?;
        store.into_inner().iter().find_map(|engine| engine.home.fenced())
    };
    match fenced {
        Some(reason) => bail!("stopped: {reason}"),
        None => Ok(()),
    }
}

/// Binds `--metrics` (its page serves `snapshot`), then opens the export: its engines' clients,
/// each reopened from its saved map or new (`--etcd`: the map kept in etcd).
fn metrics_then_export(
    args: &NbdArgs,
    config: ClientConfig,
    stop: &Arc<AtomicBool>,
    snapshot: &Arc<Mutex<String>>,
) -> Result<Vec<Opened>> {
    if let Some(address) = args.metrics {
        let served = Arc::clone(snapshot);
        let render = move || served.lock().map(|text| text.clone()).unwrap_or_default();
        let bound = remem_frontend::metrics::serve(address, Arc::clone(stop), render)?;
        eprintln!("metrics at http://{bound}/metrics");
    }
    Ok(match args.client.cluster()? {
        Cluster::Etcd { etcd, secret } => {
            if args.engines > 1 {
                bail!("--etcd keeps one slab map per export: use it with --engines 1");
            }
            let request = remem_frontend::export_home::EtcdExportRequest {
                etcd: *etcd,
                export: &args.export,
                secret: &secret,
                config,
                fresh: args.fresh,
                placement: args.client.placement.build(rand::random()),
            };
            let (client, home) = remem_frontend::export_home::open_export(request)?;
            eprintln!("export {:?} kept in {}", args.export, home.describe());
            vec![(client, Box::new(home), None)]
        }
        Cluster::File { path, cluster, secret } => open_engines(args, config, (&path, &cluster, &secret))?,
    })
}

fn remove_socket(path: Option<&Path>) {
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
}

/// The Unix socket to serve on: `--unix`, else `nbd-EXPORT.sock` beside the cluster file (with
/// `--etcd`, in the `remem up` default directory, created private if missing).
fn unix_socket_path(args: &NbdArgs) -> Result<PathBuf> {
    if let Some(path) = &args.unix {
        return Ok(path.clone());
    }
    let directory = match (&args.client.connect.cluster, args.client.connect.etcd.etcd.is_some()) {
        (Some(cluster), _) => cluster.parent().map(Path::to_path_buf).unwrap_or_default(),
        (None, false) => remem_frontend::cluster_file::default_dir(),
        (None, true) => {
            let directory = remem_frontend::cluster_file::default_dir();
            remem_frontend::cluster_file::private_directory(&directory)?;
            directory
        }
    };
    let path = directory.join(format!("nbd-{}.sock", args.export));
    // sun_path holds 108 bytes with its terminating NUL.
    if path.as_os_str().len() > 107 {
        bail!(
            "the default socket path {} is too long for a Unix socket: pass a shorter --unix PATH",
            path.display()
        );
    }
    Ok(path)
}

/// An engine's client, where its nodes and slab map live, and where its status report goes.
type Opened = (Client, Box<dyn ExportHome>, Option<(PathBuf, String)>);

fn parse_engines(text: &str) -> Result<usize, String> {
    match remem_frontend::units::parse_count(text)? {
        engines if engines > MAX_ENGINES => Err(format!("at most {MAX_ENGINES} engines")),
        engines => Ok(engines),
    }
}

/// More engines than cores only adds slabs and connections.
const MAX_ENGINES: usize = 64;

/// Where engine `engine` of `engines` keeps its slab map, beside the single engine's `base`.
fn engine_state_path(base: &Path, engine: usize, engines: usize) -> PathBuf {
    match engines {
        1 => base.to_path_buf(),
        _ => PathBuf::from(format!("{}.engine-{engine}-of-{engines}", base.display())),
    }
}

/// Slab maps beside `base` saved with another engine count than `engines`.
fn other_layouts(base: &Path, engines: usize) -> Vec<PathBuf> {
    let directory = base.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Some(name) = base.file_name().map(|name| name.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let ours = format!("-of-{engines}");
    let mut found: Vec<PathBuf> = std::fs::read_dir(directory)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|file| match file.strip_prefix(&name) {
            Some("") => engines != 1,
            Some(rest) => rest.starts_with(".engine-") && !rest.ends_with(&ours),
            None => false,
        })
        .map(|file| directory.join(file))
        .collect();
    found.sort();
    found
}

/// The engines' clients over a cluster file: each reopened from its saved map, or new.
fn open_engines(
    args: &NbdArgs,
    mut config: ClientConfig,
    (cluster_path, cluster, secret): (&Path, &ClusterFile, &remem_client::Secret),
) -> Result<Vec<Opened>> {
    // A cluster started with `remem up --encrypt` says so in its file.
    config.encrypt |= cluster.encrypt;
    let base = args.state.clone().unwrap_or_else(|| {
        let directory = cluster_path.parent().map(Path::to_path_buf).unwrap_or_default();
        directory.join(format!("nbd-{}.slabmap", args.export))
    });
    let others = other_layouts(&base, args.engines);
    for other in &others {
        if !args.fresh {
            bail!(
                "{} holds this export saved with another --engines count than {}: serve it with that \
                 count, or pass --fresh to drop it and start empty",
                other.display(),
                args.engines
            );
        }
        let map = SlabMapFile::load(other)?;
        if let Err(error) = Client::release_saved(&map, secret, config.clone()) {
            tracing::warn!(%error, "cannot reach the saved export to unmap its slabs");
        }
        std::fs::remove_file(other).with_context(|| format!("removing {}", other.display()))?;
    }
    let layout = crate::ShardLayout::new(args.engines, args.size / 4096);
    if args.engines > 1 {
        // One identity at the nodes: the same client id and session for every engine.
        config.address_space_bytes = layout.engine_pages() * 4096;
        config.session = rand::random::<u64>() | 1;
    }
    let stem = base.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
    let mut opened = Vec::with_capacity(args.engines);
    for engine in 0..args.engines {
        let state_path = engine_state_path(&base, engine, args.engines);
        let client = open_export(args, cluster, cluster_path, secret, config.clone(), &state_path)?;
        let watch = remem_frontend::cluster_watch::ClusterWatch::new(cluster_path.to_owned(), cluster);
        let report_name = match args.engines {
            1 => stem.clone(),
            engines => format!("{stem}.engine-{engine}-of-{engines}"),
        };
        opened.push((
            client,
            Box::new(FileHome { watch, state_path }) as Box<dyn ExportHome>,
            Some((cluster_path.to_owned(), report_name)),
        ));
    }
    Ok(opened)
}

fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!("{text:?} is not an octal file mode such as 600 or 660")),
    }
}

/// Removes the socket a killed server left at `path` (nothing accepts on it), so the next start
/// binds; refuses when a server still listens there, or when `path` is not a socket.
fn remove_stale_socket(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => bail!(
                    "{} is the socket of a running server: stop it, or choose another --unix path",
                    path.display()
                ),
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "removing the socket a stopped server left");
                    std::fs::remove_file(path)
                        .with_context(|| format!("removing the stale socket {}", path.display()))
                }
                Err(error) => {
                    Err(error).with_context(|| format!("checking the existing socket {}", path.display()))
                }
            }
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("checking {}", path.display())),
    }
}

/// Binds the Unix socket so that it never exists with wider permissions than `mode`: created
/// under a umask that leaves only the owner, then given `mode` and `group`.
fn bind_unix(path: &std::path::Path, mode: u32, group: Option<&str>) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    remove_stale_socket(path)?;
    // SAFETY: umask has no preconditions; no other thread creates files while the server starts.
    let previous = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(previous) };
    let listener = bound.with_context(|| format!("binding the Unix socket {}", path.display()))?;
    if let Some(group) = group {
        let gid = match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let name = std::ffi::CString::new(group).context("group name")?;
                // SAFETY: a valid C string; the returned entry is read at once, before any other
                // getgr* call could overwrite it.
                let entry = unsafe { libc::getgrnam(name.as_ptr()) };
                if entry.is_null() {
                    bail!("no group named {group:?}");
                }
                // SAFETY: non-null, points at libc's static group entry.
                unsafe { (*entry).gr_gid }
            }
        };
        std::os::unix::fs::lchown(path, None, Some(gid))
            .with_context(|| format!("giving {} to group {group}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(listener)
}

/// The export's client, which also follows the cluster file: nodes that appear in it (`add` in
/// `remem up`) join the client at run time, so rebuilt slabs can go there. Checked from the
/// server's background work, at most once a second.
struct WatchedClient {
    client: Client,
    /// Where the nodes come from and the slab map goes (cluster file or etcd).
    home: Box<dyn ExportHome>,
    /// Saves the slab map after rebuilds.
    rebuilds: remem_frontend::export_home::RebuildSaves,
    /// Raised when `home` says another process owns the export now.
    stop: Arc<AtomicBool>,
    /// The client's region health for `remem status`, beside a cluster file.
    reporter: Option<remem_frontend::client_report::ClientReporter>,
    /// Counted only with `--metrics`.
    metrics: Option<metrics::NbdMetrics>,
}

impl WatchedClient {
    fn new(
        client: Client,
        report_to: Option<(PathBuf, String)>,
        home: Box<dyn ExportHome>,
        stop: Arc<AtomicBool>,
    ) -> WatchedClient {
        let rebuilds = remem_frontend::export_home::RebuildSaves::new(&client);
        let reporter = report_to.map(|(cluster_path, name)| {
            remem_frontend::client_report::ClientReporter::new(
                &cluster_path,
                "nbd",
                &name,
                client.client_id(),
            )
        });
        WatchedClient { client, home, rebuilds, stop, reporter, metrics: None }
    }

    /// A rebuild moved slabs: save the map again, so a restart finds them where they are now.
    fn save_map_after_rebuilds(&mut self) {
        let home = &mut self.home;
        self.rebuilds.after_rebuilds(&self.client, |client| home.save_map(&client.slab_map()));
    }

    fn follow_cluster_file(&mut self) {
        let nodes = self.home.new_nodes();
        let home = &mut self.home;
        remem_frontend::cluster_watch::hand_new_nodes(
            nodes,
            &mut self.client,
            "the export's client",
            |address| home.joined(address),
        );
    }
}

impl crate::PageStore for WatchedClient {
    fn page_bytes(&self) -> usize {
        self.client.page_bytes()
    }

    fn page_count(&self) -> u64 {
        self.client.page_count()
    }

    fn execute(
        &mut self,
        ops: &mut [remem_client::PageOp<'_>],
        on_done: &mut dyn FnMut(remem_client::OpDone),
    ) {
        match &mut self.metrics {
            Some(metrics) => {
                metrics.start_batch(ops);
                self.client.execute(ops, &mut |done| {
                    metrics.op_done(&done);
                    on_done(done)
                })
            }
            None => self.client.execute(ops, on_done),
        }
    }

    fn discard_page(&mut self, page: u64) -> Result<(), remem_client::PageError> {
        self.client.discard_page(page)
    }

    fn background(&mut self) {
        let fenced = self
            .home
            .fenced()
            .or_else(|| self.client.fenced_at_node().map(|reason| format!("at a node: {reason}")));
        if let Some(reason) = fenced {
            if !self.stop.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!("fenced: {reason}; stopping");
            }
            return;
        }
        self.follow_cluster_file();
        self.save_map_after_rebuilds();
        self.client.poll_background(Duration::ZERO);
        let client = &self.client;
        if let Some(reporter) = &mut self.reporter {
            reporter.publish(|| client.region_health());
        }
        if let Some(metrics) = &mut self.metrics {
            metrics.render(client);
        }
    }
}
