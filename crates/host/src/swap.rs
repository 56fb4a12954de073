//! A remem swap device for the life of a value: `RememSwap` runs `remem swap on` (a `remem fs`
//! daemon, a swap file on it, a loop device, swapon) and `remem swap off` when dropped
//! (`remem run --swap-size`, `remem bench apps`); `tool_within` runs the system tools the swap
//! set-up needs, each under a time limit.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use remem_frontend::code_args::CodeArgs;
use remem_frontend::units::format_bytes;

/// What `RememSwap::on` passes to `remem swap on`.
#[derive(Debug, Clone)]
pub struct RememSwapOptions {
    pub size_bytes: u64,
    pub priority: i32,
    pub cluster: Option<PathBuf>,
    pub code: CodeArgs,
    pub runtime_dir: PathBuf,
    /// Shared memory to the nodes' slabs instead of TCP (`remem swap on --transport shm`).
    pub shared_memory: bool,
    /// Encrypted TCP to the nodes (`remem swap on --encrypt`).
    pub encrypt: bool,
    /// The daemon's metrics address (`remem swap on --metrics`).
    pub metrics: Option<std::net::SocketAddr>,
}

/// A remem swap area turned on for one run and off when dropped, through `remem swap on/off`
/// as subprocesses, whose output goes to stderr so the command's stdout stays its own.
pub struct RememSwap {
    binary: PathBuf,
    runtime_dir: PathBuf,
}

impl RememSwap {
    /// The swap device of an earlier run left in `runtime_dir` (that run is gone): turned off
    /// when this is dropped.
    pub fn adopt(binary: &Path, runtime_dir: PathBuf) -> RememSwap {
        RememSwap { binary: binary.to_owned(), runtime_dir }
    }

    /// Turns it on; errors when `remem swap on` fails (which undoes itself), with its error.
    pub fn on(binary: &Path, options: &RememSwapOptions) -> Result<RememSwap> {
        RememSwap::on_unless_interrupted(binary, options, &std::sync::atomic::AtomicBool::new(false))
    }

    /// [`RememSwap::on`], handing `remem swap on` a SIGINT when `interrupted` is raised meanwhile
    /// (it undoes its steps and fails). A swap turned on anyway is returned, for the caller to
    /// turn off.
    pub fn on_unless_interrupted(
        binary: &Path,
        options: &RememSwapOptions,
        interrupted: &std::sync::atomic::AtomicBool,
    ) -> Result<RememSwap> {
        let args = options;
        let size = options.size_bytes;
        let mut command = Command::new(binary);
        command
            .args(["swap", "on", "--size", &size.to_string(), "--priority", &args.priority.to_string()])
            .args(["-k", &args.code.data_splits.to_string(), "-r", &args.code.parity_splits.to_string()])
            .args(["--delta", &args.code.delta.to_string()])
            .args(["--transport", if args.shared_memory { "shm" } else { "tcp" }])
            .args(args.encrypt.then_some("--encrypt"))
            .arg("--runtime-dir")
            .arg(&options.runtime_dir)
            .args(args.metrics.map(|address| format!("--metrics={address}")));
        if let Some(cluster) = &args.cluster {
            command.arg("--cluster").arg(cluster);
        }
        // Its error becomes this one's (not printed by it and then again by the caller).
        let mut child = command
            .stdin(Stdio::null())
            .stdout(stderr_stdio()?)
            .stderr(Stdio::piped())
            .spawn()
            .context("running remem swap on")?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let said = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        let mut handed_on = false;
        let status = loop {
            if let Some(status) = child.try_wait().context("waiting for remem swap on")? {
                break status;
            }
            if !handed_on && interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: kill with the PID of our child, not yet reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
                handed_on = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let said = said.join().unwrap_or_default();
        let runtime_dir = &options.runtime_dir;
        if status.success() {
            eprint!("{said}");
            return Ok(RememSwap { binary: binary.to_owned(), runtime_dir: runtime_dir.clone() });
        }
        // `remem swap on` undid its steps; what it leaves in the directory goes too (the log it
        // names in its error with it), unless it says something stayed attached.
        let log = runtime_dir.join("fs.log");
        let error = said.lines().rev().find_map(|line| line.strip_prefix("error: "));
        let mut error = error.map_or_else(|| status.to_string(), str::to_owned);
        if remove_runtime_dir(runtime_dir) {
            error = error.replace(&format!(" (its log: {})", log.display()), "");
        }
        bail!("remem swap on --size {}: {error}", format_bytes(size));
    }
}

/// Removes a swap runtime directory whose swap is off (no state file: nothing is mounted under
/// it): its log, the empty mount point, the directory. Whether it is gone.
fn remove_runtime_dir(runtime_dir: &Path) -> bool {
    if runtime_dir.join("state.json").exists() {
        return false;
    }
    let _ = std::fs::remove_file(runtime_dir.join("fs.log"));
    let _ = std::fs::remove_dir(runtime_dir.join("mnt"));
    std::fs::remove_dir(runtime_dir).is_ok()
}

impl Drop for RememSwap {
    fn drop(&mut self) {
        let status = stderr_stdio().and_then(|stdout| {
            Command::new(&self.binary)
                .args(["swap", "off", "--runtime-dir"])
                .arg(&self.runtime_dir)
                .stdin(Stdio::null())
                .stdout(stdout)
                .status()
                .context("running remem swap off")
        });
        match status {
            Ok(status) if status.success() => {
                // Only now is nothing mounted under it: the directory may go.
                remove_runtime_dir(&self.runtime_dir);
            }
            Ok(status) => eprintln!(
                "remem run: remem swap off --runtime-dir {} failed ({status}): run it again",
                self.runtime_dir.display()
            ),
            Err(error) => eprintln!("remem run: {error:#}"),
        }
    }
}

/// Runs a system tool under `timeout` with a limit of `seconds`, failing with its stderr;
/// returns its stdout.
pub fn tool_within(seconds: u32, program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new("timeout")
        .args(["-k", "5", &seconds.to_string(), program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// This process's stderr, for a child's stdout (so `remem swap on`'s lines reach the user).
fn stderr_stdio() -> Result<Stdio> {
    Ok(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned().context("duplicating stderr")?))
}
