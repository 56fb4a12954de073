//! `remem fs MOUNTPOINT`: a FUSE file system whose file contents live in remem, until SIGTERM,
//! Ctrl-C or an unmount from outside (`fusermount3 -u`, `umount`).
//!
//! Thin: check /dev/fuse and the mount point, lock the state directory, reopen the saved file
//! system (slab map, snapshot, journal) or connect a new client, optionally lock memory, mount,
//! print `mounted MOUNTPOINT` as the first stdout line (tests, scripts and `remem swap on` wait
//! for it), and unmount on a signal (lazily: the mount point is free even with files open). A
//! dead mount a SIGKILLed `remem fs` left on the mount point is detached first. The file system lives in crates/fs; the semantics and the
//! state directory in docs/FS.md. Its metrics and region report are in `metrics`. The cli keeps
//! only the `remem fs` subcommand and its dispatch (and `remem swap` asks
//! [`check_fuse_available`] here).

pub mod metrics;
pub mod open;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_client::ClientConfig;
use remem_frontend::client_args::{ClientArgs, Cluster};
use remem_frontend::units::{format_bytes, parse_bytes};

use crate::persist::remote::RemoteArea;
use crate::{Creator, FileSystem, MountOptions, StateDir};
use metrics::{FsMetrics, ReportingStore};

#[derive(Args, Debug)]
pub struct FsArgs {
    /// An existing empty directory to mount the file system on.
    pub mountpoint: PathBuf,
    /// Where the metadata (names, attributes, extent maps: the snapshot and its journal) is
    /// kept: `local`, in the state directory (the default), or `remote`, in remem pages of a
    /// client of its own (shaped as the contents), written before every reply that changes it,
    /// so that the file system survives the loss of this host (the default and the only
    /// choice with --etcd).
    #[arg(long, value_enum)]
    pub metadata: Option<MetadataHome>,
    /// When remote metadata reaches the nodes: `reply` (before the reply of every request that
    /// changes it: a change anyone saw survives the loss of this process or host) or `fsync`
    /// (at fsync, fdatasync, fsyncdir, unmount and once a second, as the local journal reaches
    /// the disk: what was not synced may be lost with the process or its host; faster over TCP).
    #[arg(long, value_enum, default_value = "reply")]
    pub metadata_sync: MetadataSync,
    /// The remote metadata's region (`--metadata remote`): two halves, each holding a snapshot
    /// and the journal written since, one page or more per change. Fixed when the file system
    /// is made.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub metadata_size: u64,
    /// Remote memory for file contents (a multiple of 4 KiB): the most that written and
    /// fallocated pages of all files together may hold. Mapped on the nodes at start, (k+r)/k
    /// times this of node memory. Files may be far larger when sparse (up to 1 PiB each).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub size: u64,
    /// Where the cluster is (a cluster file, or `--etcd`: the nodes registered there, the slab
    /// maps kept there under the file system's name, `--name`, else the mount point's, and that
    /// name with `.meta`, and the metadata in remote memory, so that another host can mount the
    /// file system after this one is gone: docs/FS.md, "Host loss"), the coding shape and
    /// placement, timeouts, transport and encryption.
    #[command(flatten)]
    pub client: ClientArgs,
    /// Pages in flight at once.
    #[arg(long, default_value_t = 32)]
    pub queue_depth: usize,
    /// Threads that take requests from the kernel. Reads and writes that arrive while the
    /// file system is busy are queued and run together as one batch of page ops (a loop
    /// device, for swap, sends many at once); 1 serves one request at a time.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Use the kernel's writeback cache: write(2) returns once the bytes are in the page cache
    /// and they reach the nodes when the kernel writes them back, at the latest on fsync,
    /// fdatasync or close (faster small and repeated writes; a SIGKILL of `remem fs` loses
    /// writes not yet written back: docs/FS.md, SEMANTICS). Off: write(2) returns once its
    /// pages are on the nodes.
    #[arg(long)]
    pub writeback: bool,
    /// Let users other than the one mounting open files here (FUSE `allow_other`; permission
    /// bits are still checked by the kernel). Off by default, a security decision: a user-space
    /// file system can stall or feed whatever it likes to whoever enters it, so only its owner
    /// may by default. Non-root users also need `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// Lock all memory (mlockall): needed when a file here backs swap (docs/FS.md, SWAP).
    #[arg(long)]
    pub mlock: bool,
    /// Write this value to /proc/self/oom_score_adj (-1000: never chosen by the OOM killer).
    #[arg(long, allow_hyphen_values = true)]
    pub oom_score_adj: Option<i32>,
    /// The state directory: slab map, metadata snapshot and journal, so that a restarted
    /// `remem fs` (after SIGKILL, a crash or an unmount) finds every file (default:
    /// `fs-NAME/` beside the cluster file). Locked while the file system is mounted.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// The file system's NAME: its default state directory is `fs-NAME`, and with --etcd its
    /// keys are `clients/NAME` and `clients/NAME.meta` (default: the mount point's path, with
    /// `/` as `-`).
    #[arg(long)]
    pub name: Option<String>,
    /// Start empty: the saved file system of the state directory is dropped and its slabs
    /// unmapped on the nodes (when they can be reached).
    #[arg(long)]
    pub fresh: bool,
    /// A scratch file system (`remem swap` uses one): starts empty as with --fresh, and gives
    /// its slabs back to the nodes when it exits instead of keeping them for a restart.
    #[arg(long)]
    pub ephemeral: bool,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (e.g. 127.0.0.1:9103): file requests
    /// and bytes by kind, errors, read/write/fsync latency histograms, page reads and writes,
    /// decoded reads, and the ranges healthy, degraded, rebuilding and lost (docs/FS.md).
    #[arg(long, value_name = "ADDRESS")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// Where `remem fs` keeps its metadata (`--metadata`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataHome {
    Local,
    Remote,
}

/// When remote metadata is written (`--metadata-sync`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataSync {
    Reply,
    Fsync,
}

/// `fs-NAME` for a mount point: its path without the leading `/`, each `/` a `-`, other
/// bytes than `[A-Za-z0-9._-]` as `_` (so `/mnt/remem` is `fs-mnt-remem`).
fn default_state_name(mountpoint: &Path) -> String {
    let path = mountpoint.to_string_lossy();
    let name: String = path
        .trim_matches('/')
        .chars()
        .map(|character| match character {
            '/' => '-',
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => character,
            _ => '_',
        })
        .collect();
    if name.is_empty() {
        "root".to_owned()
    } else {
        name.chars().take(200).collect()
    }
}

/// The file system's name: `--name`, else the mount point's path with `/` as `-`.
fn file_system_name(args: &FsArgs, mountpoint: &Path) -> Result<String> {
    match &args.name {
        Some(name) if !name.is_empty() && !name.contains('/') && name != "." && name != ".." => {
            Ok(name.clone())
        }
        Some(name) => bail!("--name {name:?} must be a plain file name"),
        None => Ok(default_state_name(mountpoint)),
    }
}

/// The state directory of this mount: `--state`, else `fs-NAME` beside the cluster file (with
/// etcd, in the `remem up` default directory).
fn state_path(args: &FsArgs, directory: &Path, mountpoint: &Path) -> Result<PathBuf> {
    if let Some(state) = &args.state {
        return Ok(state.clone());
    }
    Ok(directory.join(format!("fs-{}", file_system_name(args, mountpoint)?)))
}

/// Detaches the dead mount a SIGKILLed `remem fs` left at `mountpoint` (every access to it fails
/// with `ENOTCONN`), lazily, saying so. Another file system's dead mount is refused, naming the
/// fix; a live mount or a plain directory is left as it is.
pub fn detach_dead_mount(mountpoint: &Path) -> Result<()> {
    // statfs, not stat: FUSE answers stat of the root from its attribute cache after the
    // daemon is gone, while statfs always asks the daemon.
    use std::os::unix::ffi::OsStrExt;
    let path =
        std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).context("mount point has a NUL byte")?;
    let mut buffer = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid NUL-terminated path and a buffer of the size statfs writes.
    if unsafe { libc::statfs(path.as_ptr(), buffer.as_mut_ptr()) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOTCONN)
    {
        return Ok(());
    }
    // The mount point itself cannot be entered: resolve its parent.
    let absolute = match (mountpoint.parent(), mountpoint.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
            parent.canonicalize().context("resolving the mount point's directory")?.join(name)
        }
        _ => std::path::absolute(mountpoint).context("resolving the mount point")?,
    };
    let found = remem_host::process::mount_at(&absolute);
    match found.as_ref().map(|(kind, source)| (kind.as_str(), source.as_str())) {
        // fuser's own mount says `fuse` and source `remem`; fusermount3's `fuse.remem`.
        Some(("fuse" | "fuse.remem", "remem")) => {
            crate::detach_lazily(&absolute)
                .with_context(|| format!("detaching the dead mount on {}", absolute.display()))?;
            eprintln!(
                "{} was the dead mount of a remem fs that was killed: detached it (lazily)",
                absolute.display()
            );
            Ok(())
        }
        Some((other, _)) => bail!(
            "{} is a dead {other} mount (its daemon is gone): detach it (fusermount3 -u -z, or umount -l) first",
            absolute.display()
        ),
        None => bail!("mount point {}: transport endpoint is not connected", absolute.display()),
    }
}

/// Fails with the reason when this host cannot mount a FUSE file system at `mountpoint`.
pub fn check_fuse_available(mountpoint: &Path) -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse does not exist: load the fuse kernel module (modprobe fuse) or, in a container, pass the device in");
    }
    let meta = std::fs::metadata(mountpoint)
        .with_context(|| format!("mount point {} (create the directory first)", mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    Ok(())
}

/// The client settings of the contents and, with remote metadata, of the metadata area.
fn client_configs(
    args: &FsArgs,
    cluster_encrypts: bool,
    remote: bool,
) -> Result<(ClientConfig, Option<ClientConfig>)> {
    let mut config = args.client.config(args.size, args.queue_depth, cluster_encrypts)?;
    // The slabs outlive the process: a restart reopens them (the state directory or etcd names
    // them), within the nodes' lease grace period. A scratch file system gives them back on exit.
    config.release_on_drop = args.ephemeral;
    if !remote {
        return Ok((config, None));
    }
    if args.metadata_size == 0 || !args.metadata_size.is_multiple_of(4096) {
        bail!("--metadata-size {} is not a positive multiple of 4096 bytes", args.metadata_size);
    }
    let mut meta = config.clone();
    meta.address_space_bytes = args.metadata_size;
    // A client of its own: its own id (a reopened one takes its map's).
    meta.client_id = rand::random();
    Ok((config, Some(meta)))
}

/// Whether the metadata is remote: `--metadata`, else remote exactly with `--etcd`.
fn metadata_is_remote(args: &FsArgs) -> Result<bool> {
    let etcd = args.client.connect.etcd.etcd.is_some();
    match args.metadata {
        Some(MetadataHome::Local) if etcd => {
            bail!("--etcd keeps the metadata in remote memory (another host must find it): drop --metadata local")
        }
        Some(home) => Ok(home == MetadataHome::Remote),
        None => Ok(etcd),
    }
}

/// The state directory (locked), the opened clients, and the cluster file's path if there is one.
fn open_state_and_clients(
    args: &FsArgs,
    mountpoint: &Path,
) -> Result<(StateDir, open::Clients, Option<PathBuf>)> {
    let remote = metadata_is_remote(args)?;
    match args.client.cluster()? {
        Cluster::Etcd { etcd, secret } => {
            let directory = remem_frontend::cluster_file::default_dir();
            if args.state.is_none() {
                remem_frontend::cluster_file::private_directory(&directory)?;
            }
            let state = StateDir::open(&state_path(args, &directory, mountpoint)?)?;
            let (config, meta) = client_configs(args, false, remote)?;
            let name = file_system_name(args, mountpoint)?;
            let source = open::Source::Etcd { etcd: *etcd, name, secret };
            let clients = open::open_clients(args, &state, config, meta, source)?;
            Ok((state, clients, None))
        }
        Cluster::File { path, cluster, secret } => {
            let directory = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let state = StateDir::open(&state_path(args, &directory, mountpoint)?)?;
            let (config, meta) = client_configs(args, cluster.encrypt, remote)?;
            let source = open::Source::File { cluster: &cluster, cluster_path: &path, secret: &secret };
            let clients = open::open_clients(args, &state, config, meta, source)?;
            Ok((state, clients, Some(path)))
        }
    }
}

pub fn run(args: FsArgs) -> Result<()> {
    if args.size == 0 || !args.size.is_multiple_of(4096) {
        bail!("--size {} is not a positive multiple of 4096 bytes", args.size);
    }
    detach_dead_mount(&args.mountpoint)?;
    check_fuse_available(&args.mountpoint)?;
    let mountpoint = args.mountpoint.canonicalize().context("resolving the mount point")?;
    // Bound before the client connects: a busy or bad address fails without touching the nodes.
    let stop = Arc::new(AtomicBool::new(false));
    let metrics = args.metrics.map(|_| Arc::new(FsMetrics::default()));
    if let (Some(address), Some(metrics)) = (args.metrics, &metrics) {
        let metrics = Arc::clone(metrics);
        let bound = remem_frontend::metrics::serve(address, Arc::clone(&stop), move || metrics.render())?;
        eprintln!("metrics at http://{bound}/metrics");
    }
    let (state, clients, cluster_path) = open_state_and_clients(&args, &mountpoint)?;
    let state_path = state.path().to_owned();
    if let Some(value) = args.oom_score_adj {
        // A warning, not an error: lowering the score needs CAP_SYS_RESOURCE, which root in a
        // container or sandbox may lack; the file system still works without it.
        if let Err(error) = remem_host::process::set_oom_score_adj(value) {
            eprintln!("warning: cannot set oom_score_adj to {value} (needs CAP_SYS_RESOURCE): {error}");
        }
    }
    if args.mlock {
        remem_host::process::lock_all_memory()
            .context("mlockall (needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)")?;
    }

    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let open::Clients { data, meta, fence } = clients;
    let node_count = data.client.node_addresses().count();
    let store = ReportingStore::new(
        data,
        metrics.clone(),
        cluster_path.as_deref(),
        &mountpoint.display().to_string(),
    );
    let (metadata, saved_in) = match meta {
        Some(meta) => {
            let area = RemoteArea::new(Box::new(meta))?;
            let area =
                if args.metadata_sync == MetadataSync::Fsync { area.flush_on_sync_only() } else { area };
            (crate::Metadata::Remote(area), "remote memory".to_owned())
        }
        None => (crate::Metadata::Local(&state), state_path.display().to_string()),
    };
    let (filesystem, report) = FileSystem::open_saved(store, Creator { uid, gid, mode: 0o755 }, metadata)
        .with_context(|| format!("opening the file system saved in {saved_in}"))?;
    if let Some(torn) = &report.torn_tail {
        eprintln!(
            "warning: the journal in {saved_in} ended with a torn record at byte {} ({} bytes: {}), left by a \
             crash mid-append; recovered up to the record before it",
            torn.offset, torn.bytes, torn.reason
        );
    }
    if report.found_saved {
        eprintln!("reopened {} files from {saved_in} (--fresh to start empty)", report.files);
    }
    let observer = metrics.map(|metrics| metrics as Arc<dyn crate::FileOpObserver>);
    let options = MountOptions {
        allow_other: args.allow_other,
        source_name: "remem".to_owned(),
        observer,
        threads: usize::from(args.threads),
        writeback: args.writeback,
    };
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let mounted = crate::mount(filesystem, &mountpoint, &options)
        .with_context(|| format!("mounting on {}", mountpoint.display()))?;
    println!("mounted {}", mountpoint.display());
    std::io::stdout().flush()?;
    eprintln!(
        "remem fs on {}: {} of EC({},{}) across {} nodes",
        mountpoint.display(),
        format_bytes(args.size),
        args.client.code.data_splits,
        args.client.code.parity_splits,
        node_count
    );
    let mut fenced = None;
    while !stop.load(Ordering::Relaxed) && !mounted.is_finished() && fenced.is_none() {
        std::thread::sleep(Duration::from_millis(50));
        fenced = fence.reason();
    }
    if let Some(reason) = &fenced {
        eprintln!("fenced: {reason}; unmounting {}", mountpoint.display());
    }
    if !mounted.unmount(Duration::from_secs(5)) {
        eprintln!(
            "files were still open on {}: the mount is detached, and they fail with ENOTCONN from now on",
            mountpoint.display()
        );
    }
    match fenced {
        Some(reason) => bail!("fenced: {reason}: another remem fs owns this file system now"),
        None => Ok(()),
    }
}
