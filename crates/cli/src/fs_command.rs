//! `remem fs MOUNTPOINT`: a FUSE file system whose file contents live in remem, until SIGTERM,
//! Ctrl-C or an unmount from outside (`fusermount3 -u`, `umount`).
//!
//! Thin: check /dev/fuse and the mount point, connect a client to the cluster, optionally lock
//! memory, mount, print `mounted MOUNTPOINT` as the first stdout line (tests, scripts and
//! `remem swap on` wait for it), and unmount on a signal. The file system lives in crates/fs;
//! the semantics in docs/FS.md.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_client::{Client, ClientConfig};
use remem_fs::{Creator, FileSystem, MountOptions};

use crate::code_args::CodeArgs;
use crate::placement_arg::PlacementArgs;
use crate::units::{format_bytes, parse_bytes};

#[derive(Args, Debug)]
pub struct FsArgs {
    /// An existing empty directory to mount the file system on.
    pub mountpoint: PathBuf,
    /// Cluster file written by `remem up` (default: the `remem up` default directory).
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Remote memory for file contents (a multiple of 4 KiB): the most that written and
    /// fallocated pages of all files together may hold. Mapped on the nodes at start, (k+r)/k
    /// times this of node memory. Files may be far larger when sparse (up to 1 PiB each).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub size: u64,
    #[command(flatten)]
    pub code: CodeArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Pages in flight at once.
    #[arg(long, default_value_t = 32)]
    pub queue_depth: usize,
    /// A split not answered in this time counts as failed.
    #[arg(long, default_value_t = 2000)]
    pub request_timeout_ms: u64,
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

pub fn run(args: FsArgs) -> Result<()> {
    if args.size == 0 || !args.size.is_multiple_of(4096) {
        bail!("--size {} is not a positive multiple of 4096 bytes", args.size);
    }
    check_fuse_available(&args.mountpoint)?;
    let mountpoint = args.mountpoint.canonicalize().context("resolving the mount point")?;
    let shape = args.code.shape()?;
    let (cluster_path, cluster, secret) = crate::launcher::load_cluster(args.cluster.as_deref())?;
    let mut config = ClientConfig::new(shape, args.size);
    config.max_in_flight = args.queue_depth.max(1);
    config.request_timeout = Duration::from_millis(args.request_timeout_ms);
    let client = Client::connect(&cluster.addresses(), &secret, config, args.placement.build(rand::random()))
        .with_context(|| format!("connecting to the cluster of {}", cluster_path.display()))?;
    if let Some(value) = args.oom_score_adj {
        // A warning, not an error: lowering the score needs CAP_SYS_RESOURCE, which root in a
        // container or sandbox may lack; the file system still works without it.
        if let Err(error) = remem_nbd::host::set_oom_score_adj(value) {
            eprintln!("warning: cannot set oom_score_adj to {value} (needs CAP_SYS_RESOURCE): {error}");
        }
    }
    if args.mlock {
        remem_nbd::host::lock_all_memory()
            .context("mlockall (needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)")?;
    }

    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let filesystem = FileSystem::new(client, Creator { uid, gid, mode: 0o755 });
    let options = MountOptions { allow_other: args.allow_other, source_name: "remem".to_owned() };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let mounted = remem_fs::mount(filesystem, &mountpoint, &options)
        .with_context(|| format!("mounting on {}", mountpoint.display()))?;
    println!("mounted {}", mountpoint.display());
    std::io::stdout().flush()?;
    eprintln!(
        "remem fs on {}: {} of EC({},{}) across {} nodes",
        mountpoint.display(),
        format_bytes(args.size),
        args.code.data_splits,
        args.code.parity_splits,
        cluster.nodes.len()
    );
    while !stop.load(Ordering::Relaxed) && !mounted.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !mounted.unmount(Duration::from_secs(5)) {
        eprintln!("files were still open on {}: they fail with ENOTCONN from now on", mountpoint.display());
    }
    Ok(())
}
