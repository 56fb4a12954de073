//! Memory cgroups for one command: `LimitedChild` starts a command in a fresh memory cgroup
//! (limited or not), measures its peak and the system's swap traffic while it runs, and removes
//! the cgroup (its processes killed first) when it ends, however it ends (`remem run`, `remem
//! bench apps`).

use std::ffi::CString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use remem_frontend::units::format_bytes;

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
        LimitedChild::spawn_with_env(command, limit_bytes, stdout, &[])
    }

    /// `spawn` with `environment` added to the command's (the pager's variables, when the
    /// command pages inside its own process and the cgroup only measures it).
    pub fn spawn_with_env(
        command: &[String],
        limit_bytes: Option<u64>,
        stdout: Stdio,
        environment: &[(String, String)],
    ) -> Result<LimitedChild> {
        assert!(!command.is_empty(), "callers pass a command");
        let cgroup = MemoryCgroup::create(limit_bytes)?;
        let procs = CString::new(cgroup.dir.join("cgroup.procs").into_os_string().into_encoded_bytes())
            .context("cgroup path has a NUL byte")?;
        let swap_in_before = vmstat("pswpin");
        let swap_out_before = vmstat("pswpout");
        let started = Instant::now();
        let mut child_command = Command::new(&command[0]);
        child_command
            .args(&command[1..])
            .stdout(stdout)
            .envs(environment.iter().map(|(name, value)| (name, value)));
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

/// A counter of `/proc/vmstat` (0 when absent).
pub fn vmstat(field: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == field).then(|| value.trim().parse().ok()).flatten()
        })
        .unwrap_or(0)
}
