//! `remem swap on` / `remem swap off`: kernel swap on remem without kernel modules, through a
//! file on a `remem fs` mount, a loop device with direct I/O, mkswap and swapon.
//!
//! `on` records every step in `RUNTIME_DIR/state.json` (a private directory) as soon as it is
//! taken, and `off` undoes whatever it finds, from that file and from the system itself: swap
//! areas and loop devices whose backing file lies under the runtime directory's mount point,
//! the `remem fs` daemon (by its PID, checked against its command line), and the mount. So
//! `off` cleans up after a crash of `on`, of the daemon, or of the whole command. SIGINT or
//! SIGTERM during `on` is taken between steps (and while the daemon mounts): `on` then undoes
//! what it set up and fails. Deadlock
//! caveats and how they are avoided: docs/FS.md, SWAP.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use crate::code_args::CodeArgs;
use crate::units::{format_bytes, parse_bytes};
use remem_host::swap::tool_within;

#[derive(Subcommand, Debug)]
pub enum SwapCommand {
    /// Turn on swap on remem: a `remem fs` daemon (mlocked, OOM-exempt, outside memory
    /// cgroups), a swap file on it, a loop device with direct I/O, mkswap, swapon. Needs root.
    On(SwapOnArgs),
    /// Turn it off and leave nothing attached: swapoff, loop devices detached, daemon stopped,
    /// mount removed; also after a crash.
    Off(SwapOffArgs),
}

#[derive(Args, Debug)]
pub struct SwapOnArgs {
    /// Swap size (a multiple of 4 KiB). The nodes hold (k+r)/k times this.
    #[arg(long, value_parser = parse_bytes)]
    pub size: u64,
    /// Swap priority (swapon -p): higher is used first.
    #[arg(long)]
    pub priority: Option<i32>,
    /// Cluster file written by `remem up` (default: the `remem up` default directory).
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    #[command(flatten)]
    pub code: CodeArgs,
    /// How the file system daemon reaches the nodes: tcp, or shm (the slabs of nodes on this
    /// host with a Unix socket, as `remem up` starts them, as shared memory: a 4 KiB page in or
    /// out costs microseconds instead of node round trips; docs/SHM.md).
    #[arg(long, value_enum, default_value = "tcp")]
    pub transport: crate::transport_arg::Transport,
    /// Encrypt the TCP connections to the nodes (nodes started with `--encrypt` require it;
    /// shared memory and Unix sockets are never encrypted).
    #[arg(long)]
    pub encrypt: bool,
    /// Where the state file, the mount point and the daemon's log live.
    #[arg(long, default_value_os_t = default_runtime_dir())]
    pub runtime_dir: PathBuf,
    /// The file system daemon serves Prometheus metrics at http://ADDRESS/metrics (`remem fs
    /// --metrics`): FUSE request and page op latencies, the fault path's split (docs/APPS.md).
    #[arg(long, value_name = "ADDRESS")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Threads of the file system daemon that take requests from the kernel (`remem fs
    /// --threads`): swap-ins and swap-outs that arrive together run as one batch of page ops.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
}

#[derive(Args, Debug)]
pub struct SwapOffArgs {
    /// The runtime directory `remem swap on` used.
    #[arg(long, default_value_os_t = default_runtime_dir())]
    pub runtime_dir: PathBuf,
}

/// What `on` has set up so far.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SwapState {
    daemon_pid: Option<u32>,
    mountpoint: PathBuf,
    swap_file: Option<PathBuf>,
    loop_device: Option<String>,
    size_bytes: u64,
}

pub fn default_runtime_dir() -> PathBuf {
    crate::launcher::default_dir().join("swap")
}

pub fn run(command: SwapCommand, binary: &Path) -> Result<()> {
    match command {
        SwapCommand::On(args) => on(args, binary),
        SwapCommand::Off(args) => off(&args.runtime_dir),
    }
}

fn state_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("state.json")
}

fn save(runtime_dir: &Path, state: &SwapState) -> Result<()> {
    let text = serde_json::to_vec_pretty(state)?;
    crate::launcher::write_private_file(&state_path(runtime_dir), &text)
}

/// Runs a system tool (under `timeout`), failing with its stderr; returns its stdout.
fn tool(program: &str, args: &[&str]) -> Result<String> {
    tool_within(60, program, args)
}

fn on(args: SwapOnArgs, binary: &Path) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("remem swap needs root (losetup, mkswap, swapon)");
    }
    if args.size < (1 << 20) || !args.size.is_multiple_of(4096) {
        bail!("--size {} must be a multiple of 4 KiB and at least 1 MiB", args.size);
    }
    // A Ctrl-C or SIGTERM from now on is a request to give up: taken between steps, so every
    // step taken is in the state file for the undo.
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, std::sync::Arc::clone(&interrupted))?;
    }
    let runtime_dir = &args.runtime_dir;
    crate::launcher::private_directory(runtime_dir)?;
    if state_path(runtime_dir).exists() {
        bail!(
            "swap on remem is already on (or left over) in {}: run `remem swap off` first",
            runtime_dir.display()
        );
    }
    let mountpoint = runtime_dir.join("mnt");
    std::fs::create_dir_all(&mountpoint)?;
    crate::fs_command::check_fuse_available(&mountpoint)?;
    let mut state =
        SwapState { mountpoint: mountpoint.clone(), size_bytes: args.size, ..SwapState::default() };
    save(runtime_dir, &state)?;
    if let Err(error) = set_up(&args, binary, &mut state, &interrupted) {
        // One error, once: what failed, and that nothing stays attached (or what does).
        return Err(match undo(runtime_dir) {
            Ok(_) => error.context("swap on failed, and is undone: nothing of remem swap is attached"),
            Err(undo_error) => error.context(format!(
                "swap on failed, and undoing it failed too ({undo_error:#}): run `remem swap off \
                 --runtime-dir {}`",
                runtime_dir.display()
            )),
        });
    }
    println!(
        "swap on: {} on {} ({}, priority {})",
        format_bytes(args.size),
        state.loop_device.as_deref().unwrap_or("?"),
        state.swap_file.as_deref().map(Path::display).map(|path| path.to_string()).unwrap_or_default(),
        args.priority.map_or("default".to_owned(), |priority| priority.to_string())
    );
    Ok(())
}

/// Fails when `interrupted` was raised (SIGINT or SIGTERM): the caller undoes what was set up.
fn check_interrupt(interrupted: &std::sync::atomic::AtomicBool) -> Result<()> {
    if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
        bail!("interrupted");
    }
    Ok(())
}

fn set_up(
    args: &SwapOnArgs,
    binary: &Path,
    state: &mut SwapState,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<()> {
    let runtime_dir = &args.runtime_dir;
    // The file system holds the swap file and a little metadata slack.
    let fs_size = args.size + (1 << 20);
    let log = std::fs::File::create(runtime_dir.join("fs.log"))?;
    let mut command = Command::new(binary);
    command.arg("fs").arg(&state.mountpoint);
    if let Some(cluster) = &args.cluster {
        command.arg("--cluster").arg(cluster);
    }
    command
        .args(["--size", &fs_size.to_string(), "--mlock", "--oom-score-adj", "-1000"])
        .args(["-k", &args.code.data_splits.to_string(), "-r", &args.code.parity_splits.to_string()])
        .args(["--delta", &args.code.delta.to_string()])
        .args([
            "--transport",
            if args.transport == crate::transport_arg::Transport::Shm { "shm" } else { "tcp" },
        ])
        .args(args.encrypt.then_some("--encrypt"))
        .args(args.metrics.map(|address| format!("--metrics={address}")))
        .args(["--threads", &args.threads.to_string()])
        // Swap contents die with the swap device: every `on` starts an empty file system, with
        // its metadata journal in the runtime directory (not beside a shared cluster file).
        .arg("--state")
        .arg(runtime_dir.join("fs-state"))
        .arg("--ephemeral")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    // Its own process group: a Ctrl-C meant for this command must not stop the daemon.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("starting the remem fs daemon")?;
    state.daemon_pid = Some(child.id());
    save(runtime_dir, state)?;
    leave_memory_cgroups(child.id());
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        check_interrupt(interrupted)?;
        match receiver.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => break line,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(_) => break String::new(),
        }
    };
    if !line.starts_with("mounted ") {
        let log_path = runtime_dir.join("fs.log");
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        bail!("{} (its log: {})", daemon_failure(&log), log_path.display());
    }
    // The daemon is not waited for: it outlives this command, and `off` stops it by PID.
    std::mem::forget(child);
    check_interrupt(interrupted)?;

    let swap_file = state.mountpoint.join("swapfile");
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&swap_file)
        .with_context(|| format!("creating {}", swap_file.display()))?;
    state.swap_file = Some(swap_file.clone());
    save(runtime_dir, state)?;
    std::fs::set_permissions(&swap_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    // Every page allocated now: swap-out never allocates in the file system.
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    if unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, args.size as i64) } != 0 {
        return Err(std::io::Error::last_os_error()).context("fallocate of the swap file");
    }
    drop(file);
    check_interrupt(interrupted)?;
    let swap_file_arg = swap_file.to_str().context("runtime directory is not UTF-8")?;
    let device = tool("losetup", &["--direct-io=on", "--find", "--show", swap_file_arg])?;
    state.loop_device = Some(device.clone());
    save(runtime_dir, state)?;
    let name = device.trim_start_matches("/dev/");
    let dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap_or_default();
    if dio.trim() != "1" {
        bail!("{device} did not take direct I/O: swap through the page cache of a FUSE file can deadlock");
    }
    check_interrupt(interrupted)?;
    tool("mkswap", &[&device])?;
    check_interrupt(interrupted)?;
    let priority = args.priority.map(|priority| priority.to_string());
    let mut swapon_args = vec![device.as_str()];
    if let Some(priority) = &priority {
        swapon_args.extend(["-p", priority.as_str()]);
    }
    tool("swapon", &swapon_args)?;
    // An interrupt during swapon still undoes it: the caller asked for nothing to be left.
    check_interrupt(interrupted)?;
    Ok(())
}

/// Why the `remem fs` daemon did not mount, from its log: its own one-line error (the last
/// `error: ` line, without the prefix), not the log's other lines.
fn daemon_failure(log: &str) -> String {
    match log.lines().rev().find_map(|line| line.strip_prefix("error: ")) {
        Some(error) => format!("remem fs did not mount: {error}"),
        None => "remem fs did not mount within 60 s, and said no error".to_owned(),
    }
}

/// Moves `pid` to the root memory cgroup (v1, and v2 where mounted): the daemon must not be
/// limited with the processes whose pages it serves. Best effort: a warning if it fails.
fn leave_memory_cgroups(pid: u32) {
    for procs in [
        "/sys/fs/cgroup/memory/cgroup.procs",
        "/sys/fs/cgroup/unified/cgroup.procs",
        "/sys/fs/cgroup/cgroup.procs",
    ] {
        if Path::new(procs).exists() {
            if let Err(error) = std::fs::write(procs, pid.to_string()) {
                tracing::debug!(procs, %error, "cannot move the daemon to the root cgroup");
            }
        }
    }
}

/// Loop devices whose backing file lies under `mountpoint`: (device, backing file).
fn loop_devices_under(mountpoint: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return found };
    let prefix = mountpoint.to_string_lossy().into_owned();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else { continue };
        let backing = backing.trim().to_owned();
        if backing.starts_with(&format!("{prefix}/")) {
            found.push((format!("/dev/{name}"), backing));
        }
    }
    found
}

fn is_swap_area(device: &str) -> bool {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split_whitespace().next() == Some(device))
}

fn off(runtime_dir: &Path) -> Result<()> {
    for step in undo(runtime_dir)? {
        println!("{step}");
    }
    println!("swap off: nothing of remem swap is attached");
    Ok(())
}

/// Undoes whatever of remem swap is set up under `runtime_dir` (its state file, and what the
/// system shows under its mount point) and returns the steps taken, one line each.
///
/// Errors: a step failed (all are tried; the message lists every failure).
fn undo(runtime_dir: &Path) -> Result<Vec<String>> {
    let state: SwapState = match std::fs::read(state_path(runtime_dir)) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
        Err(_) => SwapState::default(),
    };
    let mountpoint = runtime_dir.join("mnt");
    let (mut steps, mut problems) = (Vec::new(), Vec::new());
    for (device, backing) in loop_devices_under(&mountpoint) {
        if is_swap_area(&device) {
            match tool("swapoff", &[&device]) {
                Ok(_) => steps.push(format!("swapoff {device}")),
                Err(error) => problems.push(format!("{error:#}")),
            }
        }
        match tool("losetup", &["-d", &device]) {
            Ok(_) => steps.push(format!("detached {device} ({backing})")),
            Err(error) => problems.push(format!("{error:#}")),
        }
    }
    if let Some(pid) = state.daemon_pid.filter(|&pid| remem_host::process::is_remem(pid, "fs")) {
        stop_daemon(pid);
        steps.push(format!("stopped remem fs (pid {pid})"));
    }
    if remem_host::process::mount_at(&mountpoint).is_some() {
        let path = mountpoint.to_str().context("runtime directory is not UTF-8")?;
        match tool("umount", &["-l", path]) {
            Ok(_) => steps.push(format!("unmounted {path}")),
            Err(error) => problems.push(format!("{error:#}")),
        }
    }
    if !problems.is_empty() {
        bail!("swap off left something behind: {}", problems.join("; "));
    }
    let _ = std::fs::remove_file(state_path(runtime_dir));
    // The file system's metadata journal: swap contents never outlive the swap device.
    let _ = std::fs::remove_dir_all(runtime_dir.join("fs-state"));
    Ok(steps)
}

/// SIGTERM (the daemon unmounts), then SIGKILL after 10 s.
fn stop_daemon(pid: u32) {
    // SAFETY: kill with a PID just checked to be a remem fs daemon; no memory is passed.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && remem_host::process::is_remem(pid, "fs") {
        std::thread::sleep(Duration::from_millis(50));
    }
    if remem_host::process::is_remem(pid, "fs") {
        // SAFETY: as above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}
