//! `remem run --memory-limit SIZE|PERCENT -- COMMAND`: runs an unmodified program in a fresh
//! memory cgroup (v1 where its hierarchy is mounted, else v2) limited below its footprint, so
//! that what does not fit goes to swap, which should be remem swap (`remem swap on`, or
//! `--swap-size` for the length of the run).
//!
//! The command joins the cgroup between fork and exec, so every page it touches is charged
//! there. Reported on stderr: the cgroup's peak usage (anonymous memory and page cache), the
//! system-wide swap-ins and swap-outs of the run (`/proc/vmstat` deltas: other processes
//! swapping at the same time are counted too), wall time and exit status. `remem run` exits with
//! the command's status (128 + signal when it was killed).
//!
//! Cleanup invariant: the cgroup is removed (its leftover processes SIGKILLed first) and a swap
//! area turned on by `--swap-size` is turned off, on success, on error and on panic, by guards.
//! SIGINT or SIGTERM during the swap set-up is handed to `remem swap on`, which undoes its steps;
//! `remem run` then turns off whatever was turned on and fails. Only a SIGKILL of `remem run`
//! itself leaves them: the next `remem run --swap-size` turns off the swap of runs that are gone
//! (their `run-swap-PID` directories in the default directory) and removes their directories;
//! `remem swap off --runtime-dir DIR` and `rmdir` of the cgroup clean up otherwise.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::code_args::CodeArgs;
use crate::units::{format_bytes, parse_bytes};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The command's memory limit: a size (`512MiB`) or a percentage (`50%`) of its peak, which
    /// a first, unlimited run of the same command measures (the command then runs twice).
    #[arg(long, value_parser = parse_memory_limit)]
    pub memory_limit: MemoryLimit,
    /// Turn on remem swap of this size for the run (`remem swap on`) and off after it. Without
    /// it, swap must already be on (`remem swap on --size SIZE`).
    #[arg(long, value_parser = parse_bytes)]
    pub swap_size: Option<u64>,
    /// Swap priority of the swap area `--swap-size` turns on (higher is used first).
    #[arg(long, default_value_t = 100)]
    pub swap_priority: i32,
    /// Cluster file for `--swap-size` (default: the `remem up` default directory).
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    #[command(flatten)]
    pub code: CodeArgs,
    /// Runtime directory of the swap area `--swap-size` turns on (default: one per run).
    #[arg(long)]
    pub swap_runtime_dir: Option<PathBuf>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// A memory limit as given on the command line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryLimit {
    Bytes(u64),
    /// Of the peak an unlimited run measures, in (0, 100].
    PercentOfPeak(f64),
}

pub fn parse_memory_limit(text: &str) -> Result<MemoryLimit, String> {
    if let Some(number) = text.trim().strip_suffix('%') {
        let percent: f64 = number.trim().parse().map_err(|_| format!("{text:?}: not a percentage"))?;
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(format!("{text:?}: a percentage must be in (0, 100]"));
        }
        return Ok(MemoryLimit::PercentOfPeak(percent));
    }
    let bytes = parse_bytes(text)?;
    if bytes < (1 << 20) {
        return Err(format!("{text:?}: a memory limit below 1 MiB cannot run a program"));
    }
    Ok(MemoryLimit::Bytes(bytes))
}

/// What one run of the command measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub limit_bytes: Option<u64>,
    pub peak_bytes: Option<u64>,
    pub swap_in_pages: u64,
    pub swap_out_pages: u64,
    pub wall: Duration,
    /// The exit code, or 128 + the signal that killed the command.
    pub exit_code: i32,
    pub cgroup: PathBuf,
}

impl RunReport {
    /// One line for stderr; `remem bench apps` and the tests read the `swap-outs N` field.
    pub fn line(&self) -> String {
        format!(
            "remem run: limit {}, peak {} (cgroup usage: anonymous + page cache), swap-ins {} pages, \
             swap-outs {} pages (system-wide), wall {:.3} s, exit status {}, cgroup {} removed",
            self.limit_bytes.map_or("none".to_owned(), format_bytes),
            self.peak_bytes.map_or("unknown".to_owned(), format_bytes),
            self.swap_in_pages,
            self.swap_out_pages,
            self.wall.as_secs_f64(),
            self.exit_code,
            self.cgroup.display()
        )
    }
}

/// Runs the command as `args` say and returns its exit code (after cleanup).
pub fn run(args: RunArgs, binary: &Path) -> Result<i32> {
    // Until the command runs, an interrupt means: undo the set-up and stop.
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handlers = Vec::new();
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        handlers.push(signal_hook::flag::register(signal, std::sync::Arc::clone(&interrupted))?);
    }
    let _swap = match args.swap_size {
        Some(size) => {
            clean_runs_that_are_gone(binary);
            let runtime_dir = args.swap_runtime_dir.clone().unwrap_or_else(|| {
                crate::launcher::default_dir().join(format!("run-swap-{}", std::process::id()))
            });
            let options = RememSwapOptions {
                size_bytes: size,
                priority: args.swap_priority,
                cluster: args.cluster.clone(),
                code: args.code.clone(),
                runtime_dir,
                shared_memory: false,
                metrics: None,
            };
            let swap = RememSwap::on_unless_interrupted(binary, &options, &interrupted)?;
            if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                drop(swap);
                bail!("interrupted while turning swap on: what was set up is undone");
            }
            Some(swap)
        }
        None => {
            if swap_total_bytes() == 0 {
                bail!(
                    "no swap is on, so nothing would page out of the limit: run `remem swap on \
                     --size SIZE` first, or pass --swap-size"
                );
            }
            None
        }
    };
    // The set-up is done: signals act as before it (SIGTERM ends this process).
    for handler in handlers {
        signal_hook::low_level::unregister(handler);
    }
    // SAFETY: setting a signal disposition to its default has no preconditions (signal-hook's
    // handler, whose actions are all gone, would otherwise swallow SIGTERM).
    unsafe { libc::signal(libc::SIGTERM, libc::SIG_DFL) };
    // SIGINT reaches the command from the terminal; this process outlives it to clean up.
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    let previous_sigint = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let result = run_limited(&args);
    // SAFETY: restores the disposition read above.
    unsafe { libc::signal(libc::SIGINT, previous_sigint) };
    result
}

fn run_limited(args: &RunArgs) -> Result<i32> {
    let limit_bytes = match args.memory_limit {
        MemoryLimit::Bytes(bytes) => bytes,
        MemoryLimit::PercentOfPeak(percent) => {
            let report = run_once(&args.command, None, Stdio::inherit())?;
            eprintln!("{} [unlimited run, to measure the peak]", report.line());
            if report.exit_code != 0 {
                // Its peak is still the program's footprint; the limited run's status is returned.
                eprintln!("remem run: note: the unlimited run exited with status {}", report.exit_code);
            }
            let peak = report.peak_bytes.context("the cgroup reports no peak usage (memory.peak missing)")?;
            let limit = (peak as f64 * percent / 100.0) as u64;
            limit.div_ceil(4096).max(256) * 4096
        }
    };
    let report = run_once(&args.command, Some(limit_bytes), Stdio::inherit())?;
    eprintln!("{}", report.line());
    Ok(report.exit_code)
}

/// Runs `command` once in a fresh memory cgroup, limited to `limit_bytes` if given, with its
/// stdout to `stdout`. Errors when the cgroup cannot be made or removed or the command not run.
pub fn run_once(command: &[String], limit_bytes: Option<u64>, stdout: Stdio) -> Result<RunReport> {
    LimitedChild::spawn(command, limit_bytes, stdout)?.wait()
}

/// A command started in a fresh memory cgroup and not yet waited for: `run_once` is spawn and
/// wait; `remem bench apps` starts servers this way and drives them from outside the cgroup.
/// Dropped without `wait`/`stop`, the command is SIGKILLed and the cgroup removed.
pub struct LimitedChild {
    child: std::process::Child,
    cgroup: MemoryCgroup,
    limit_bytes: Option<u64>,
    started: Instant,
    swap_in_before: u64,
    swap_out_before: u64,
}

impl LimitedChild {
    /// Starts `command` in the cgroup (it joins between fork and exec, so every page it touches
    /// is charged there). Errors when the cgroup cannot be made or the command not started.
    pub fn spawn(command: &[String], limit_bytes: Option<u64>, stdout: Stdio) -> Result<LimitedChild> {
        assert!(!command.is_empty(), "callers pass a command");
        let cgroup = MemoryCgroup::create(limit_bytes)?;
        let procs = CString::new(cgroup.dir.join("cgroup.procs").into_os_string().into_encoded_bytes())
            .context("cgroup path has a NUL byte")?;
        let swap_in_before = vmstat("pswpin");
        let swap_out_before = vmstat("pswpout");
        let started = Instant::now();
        let mut child_command = Command::new(&command[0]);
        child_command.args(&command[1..]).stdout(stdout);
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (signal, getpid, open, write, close) on memory prepared before the fork.
        unsafe {
            child_command.pre_exec(move || {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                let mut digits = [0u8; 20];
                let mut position = digits.len();
                let mut pid = libc::getpid() as u64;
                loop {
                    position -= 1;
                    digits[position] = b'0' + (pid % 10) as u8;
                    pid /= 10;
                    if pid == 0 {
                        break;
                    }
                }
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let length = digits.len() - position;
                let written = libc::write(fd, digits[position..].as_ptr().cast(), length);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written != length as isize {
                    return Err(error);
                }
                Ok(())
            });
        }
        let child = child_command
            .spawn()
            .with_context(|| format!("running {:?} in cgroup {}", command[0], cgroup.dir.display()))?;
        Ok(LimitedChild { child, cgroup, limit_bytes, started, swap_in_before, swap_out_before })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit code (128 + signal) if the command has exited.
    pub fn try_wait(&mut self) -> Result<Option<i32>> {
        Ok(self.child.try_wait().context("waiting for the command")?.map(exit_code))
    }

    /// Waits for the command to exit, then reports and removes the cgroup.
    pub fn wait(mut self) -> Result<RunReport> {
        let status = self.child.wait().context("waiting for the command")?;
        self.finish(exit_code(status))
    }

    /// SIGTERM, then SIGKILL after `grace`; then reports and removes the cgroup (a server's end).
    pub fn stop(mut self, grace: Duration) -> Result<RunReport> {
        // SAFETY: kill with the PID of our child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        let status = loop {
            if let Some(status) = self.child.try_wait().context("waiting for the command")? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break self.child.wait().context("waiting for the command")?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.finish(exit_code(status))
    }

    fn finish(self, exit_code: i32) -> Result<RunReport> {
        let report = RunReport {
            limit_bytes: self.limit_bytes,
            peak_bytes: self.cgroup.peak_bytes(),
            swap_in_pages: vmstat("pswpin").saturating_sub(self.swap_in_before),
            swap_out_pages: vmstat("pswpout").saturating_sub(self.swap_out_before),
            wall: self.started.elapsed(),
            exit_code,
            cgroup: self.cgroup.dir.clone(),
        };
        let LimitedChild { mut child, cgroup, .. } = self;
        // Reaped already; kill of an exited child is a no-op error.
        let _ = child.kill();
        cgroup.remove()?;
        Ok(report)
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// A fresh memory cgroup, removed (its processes killed first) by `remove` or on drop.
struct MemoryCgroup {
    dir: PathBuf,
    version: u8,
    removed: bool,
}

impl MemoryCgroup {
    fn create(limit_bytes: Option<u64>) -> Result<MemoryCgroup> {
        static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let sequence = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("remem-run-{}-{sequence}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, version, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), 1, "memory.limit_in_bytes")
        } else {
            let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .into_iter()
                .map(Path::new)
                .find(|root| {
                    std::fs::read_to_string(root.join("cgroup.controllers"))
                        .unwrap_or_default()
                        .split_whitespace()
                        .any(|controller| controller == "memory")
                })
                .context("no memory cgroup: neither a v1 hierarchy nor v2 with the memory controller")?;
            std::fs::write(root.join("cgroup.subtree_control"), "+memory")
                .with_context(|| format!("enabling the memory controller under {}", root.display()))?;
            (root.join(&name), 2, "memory.max")
        };
        std::fs::create_dir(&dir)
            .with_context(|| format!("creating cgroup {} (remem run needs root)", dir.display()))?;
        let cgroup = MemoryCgroup { dir, version, removed: false };
        if let Some(limit) = limit_bytes {
            std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
                .with_context(|| format!("setting {limit_file} of {}", cgroup.dir.display()))?;
        }
        Ok(cgroup)
    }

    fn peak_bytes(&self) -> Option<u64> {
        let file = if self.version == 1 { "memory.max_usage_in_bytes" } else { "memory.peak" };
        std::fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Kills what is left in the cgroup (children the command left behind), then removes it.
    fn remove(mut self) -> Result<()> {
        self.removed = true;
        remove_cgroup(&self.dir)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        if !self.removed {
            if let Err(error) = remove_cgroup(&self.dir) {
                eprintln!("remem run: {error:#}");
            }
        }
    }
}

fn remove_cgroup(dir: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace().filter_map(|pid| pid.parse::<libc::pid_t>().ok()) {
            // SAFETY: kill with a PID the cgroup lists; only processes of this run are in it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) if Instant::now() >= deadline => {
                return Err(error).with_context(|| format!("removing cgroup {}", dir.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

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
    /// Turns it on; errors when `remem swap on` fails (which undoes itself).
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
        let guard = RememSwap { binary: binary.to_owned(), runtime_dir: options.runtime_dir.clone() };
        let mut command = Command::new(binary);
        command
            .args(["swap", "on", "--size", &size.to_string(), "--priority", &args.priority.to_string()])
            .args(["-k", &args.code.data_splits.to_string(), "-r", &args.code.parity_splits.to_string()])
            .args(["--delta", &args.code.delta.to_string()])
            .args(["--transport", if args.shared_memory { "shm" } else { "tcp" }])
            .arg("--runtime-dir")
            .arg(&guard.runtime_dir)
            .args(args.metrics.map(|address| format!("--metrics={address}")));
        if let Some(cluster) = &args.cluster {
            command.arg("--cluster").arg(cluster);
        }
        let mut child =
            command.stdin(Stdio::null()).stdout(stderr_stdio()?).spawn().context("running remem swap on")?;
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
        if !status.success() {
            bail!("remem swap on --size {} failed ({status})", format_bytes(size));
        }
        Ok(guard)
    }
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
                let _ = std::fs::remove_file(self.runtime_dir.join("fs.log"));
                let _ = std::fs::remove_dir(self.runtime_dir.join("mnt"));
                let _ = std::fs::remove_dir(&self.runtime_dir);
            }
            Ok(status) => eprintln!(
                "remem run: remem swap off --runtime-dir {} failed ({status}): run it again",
                self.runtime_dir.display()
            ),
            Err(error) => eprintln!("remem run: {error:#}"),
        }
    }
}

/// Turns off the swap of earlier `remem run --swap-size` runs that are gone (SIGKILLed or
/// crashed: their `run-swap-PID` directory is left in the default directory, and no `remem run`
/// has that PID), and removes their directories, saying so.
fn clean_runs_that_are_gone(binary: &Path) {
    let Ok(entries) = std::fs::read_dir(crate::launcher::default_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-swap-").and_then(|pid| pid.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || is_remem_run(pid) {
            continue;
        }
        eprintln!(
            "remem run: {} is left by a run that is gone (pid {pid}): turning its swap off",
            entry.path().display()
        );
        drop(RememSwap { binary: binary.to_owned(), runtime_dir: entry.path() });
    }
}

/// Whether `pid` is a running `remem run` (not a recycled PID).
fn is_remem_run(pid: u32) -> bool {
    let Ok(command_line) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let words: Vec<&[u8]> = command_line.split(|&byte| byte == 0).collect();
    words.len() > 1 && words[0].ends_with(b"remem") && words[1] == b"run"
}

fn stderr_stdio() -> Result<Stdio> {
    Ok(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned().context("duplicating stderr")?))
}

/// Total swap space on, from `/proc/swaps` (KiB column), in bytes.
fn swap_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024
}

/// A counter of `/proc/vmstat` (0 when absent).
fn vmstat(field: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == field).then(|| value.trim().parse().ok()).flatten()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_is_a_size_or_a_percentage_of_the_peak() {
        assert_eq!(parse_memory_limit("24MiB"), Ok(MemoryLimit::Bytes(24 << 20)));
        assert_eq!(parse_memory_limit("50%"), Ok(MemoryLimit::PercentOfPeak(50.0)));
        assert_eq!(parse_memory_limit("75.5 %"), Ok(MemoryLimit::PercentOfPeak(75.5)));
        assert!(parse_memory_limit("0%").is_err());
        assert!(parse_memory_limit("150%").is_err());
        assert!(parse_memory_limit("4KiB").is_err());
        assert!(parse_memory_limit("lots").is_err());
    }
}
