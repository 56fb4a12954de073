//! A command paged inside its own process (`remem run --paging uffd`): started with
//! libremem_preload.so preloaded and the pager's settings in its environment (remem-paging's
//! `config`), waited for, and reported: wall time, peak resident set, exit status and the
//! pager's counters.
//!
//! Only the command itself is paged: the library checks that its parent is this process, so
//! the command's own children (a shell's commands, a server's workers) run as usual.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use remem_frontend::units::format_bytes;

/// The preload library's file name, looked for beside the `remem` binary.
pub const LIBRARY: &str = "libremem_preload.so";

/// The pager's settings (`stats` and `map` are chosen here).
pub use remem_paging::config::Config as PagedOptions;
/// The pager's defaults, for the commands that start it.
pub use remem_paging::config::{DEFAULT_MIN_BYTES, DEFAULT_PROTECTED_PERCENT, DEFAULT_SPIN_US};

#[derive(Debug)]
pub struct PagedReport {
    pub wall: Duration,
    pub peak_rss_bytes: u64,
    pub exit_code: i32,
    /// The pager's counters as it wrote them at exit (JSON), when it did.
    pub stats: Option<String>,
    pub limit_bytes: u64,
}

impl PagedReport {
    pub fn line(&self) -> String {
        format!(
            "remem run: paging uffd, limit {}, peak RSS {} (with the nodes' shared memory the process maps), \
             wall {:.3} s, exit status {}",
            format_bytes(self.limit_bytes),
            format_bytes(self.peak_rss_bytes),
            self.wall.as_secs_f64(),
            self.exit_code
        )
    }
}

/// The library beside `binary`, or an error that says how to build it.
pub fn library_beside(binary: &Path) -> Result<PathBuf> {
    let library = binary.parent().unwrap_or(Path::new(".")).join(LIBRARY);
    if !library.is_file() {
        bail!(
            "{} is missing: --paging uffd preloads it into the command (build it with `cargo build \
             --release -p remem-preload`; it is installed beside the remem binary)",
            library.display()
        );
    }
    Ok(library)
}

/// The environment that starts a command paged by the library: the library preloaded, glibc's
/// thread-stack cache off, the pager's settings, and this process as the one parent whose child
/// is paged. Errors when the library is missing or this process is not root.
pub fn paged_environment(binary: &Path, options: &PagedOptions) -> Result<Vec<(String, String)>> {
    let library = library_beside(binary)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "--paging uffd needs root: faults the kernel takes for the program (a read(2) into a paged-out \
             buffer) are served only with CAP_SYS_PTRACE"
        );
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.is_empty() => format!("{} {existing}", library.display()),
        _ => library.display().to_string(),
    };
    // glibc keeps the stacks of exited threads for the next ones; the pager's own threads (its
    // client's) must never be given one the pager manages (it would write into a page it may
    // have paged out, and wait on itself), so the command runs without that cache.
    let tunables = match std::env::var("GLIBC_TUNABLES") {
        Ok(existing) if !existing.is_empty() => format!("{existing}:glibc.pthread.stack_cache_size=0"),
        _ => "glibc.pthread.stack_cache_size=0".to_owned(),
    };
    let mut environment = vec![("LD_PRELOAD".to_owned(), preload), ("GLIBC_TUNABLES".to_owned(), tunables)];
    environment.extend(options.to_env().into_iter().map(|(name, value)| (name.to_owned(), value)));
    environment.push((remem_paging::config::PARENT.to_owned(), std::process::id().to_string()));
    Ok(environment)
}

/// Runs `command` paged by the library and waits for it.
pub fn run_paged(binary: &Path, command: &[String], options: &PagedOptions) -> Result<PagedReport> {
    let stats = std::env::temp_dir().join(format!("remem-paging-{}.json", std::process::id()));
    let map = std::env::temp_dir().join(format!("remem-paging-{}.map", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    let _ = std::fs::remove_file(&map);
    let environment = paged_environment(
        binary,
        &PagedOptions { stats: Some(stats.clone()), map: Some(map.clone()), ..options.clone() },
    )?;
    let (program, arguments) = command.split_first().context("no command given")?;
    let started = Instant::now();
    let mut command = Command::new(program);
    // SAFETY: the closure runs between fork and exec and calls only signal, which is
    // async-signal-safe: the command gets SIGINT as usual although `remem run` ignores it.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    };
    let mut child = command
        .args(arguments)
        .envs(environment)
        .stdin(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let (exit_code, peak_rss_bytes) = wait_with_usage(child.id() as i32)?;
    let _ = child.try_wait();
    let wall = started.elapsed();
    let report = PagedReport {
        wall,
        peak_rss_bytes,
        exit_code,
        stats: std::fs::read_to_string(&stats).ok().map(|text| text.trim().to_owned()),
        limit_bytes: options.limit_bytes,
    };
    let _ = std::fs::remove_file(&stats);
    release_slabs(&map, &options.cluster, options.encrypt);
    Ok(report)
}

/// Gives the slabs of the command's pager back to the nodes (the map it saved), also when the
/// command was killed; without this the nodes keep them for their lease grace period.
pub fn release_slabs(map: &Path, cluster: &Path, encrypt: bool) {
    let Ok(saved) = remem_client::SlabMapFile::load(map) else { return };
    let _ = std::fs::remove_file(map);
    let released = remem_frontend::cluster_file::load_cluster(Some(cluster)).and_then(|(_, _, secret)| {
        let mut config = remem_client::ClientConfig::new(
            remem_client::Shape {
                data_splits: saved.data_splits,
                parity_splits: saved.parity_splits,
                extra_reads: saved.extra_reads,
            },
            saved.address_space_bytes,
        );
        config.encrypt = encrypt;
        remem_client::Client::release_saved(&saved, &secret, config).map_err(anyhow::Error::from)
    });
    if let Err(error) = released {
        eprintln!("remem run: the pager's slabs are not released ({error:#}): the nodes free them after their lease grace period");
    }
}

/// Waits for the child and returns its exit code (128 + signal when killed) and peak RSS.
fn wait_with_usage(pid: i32) -> Result<(i32, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child, with valid pointers to status and usage.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if waited == pid {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error).context("waiting for the command");
        }
    }
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
    Ok((code, usage.ru_maxrss as u64 * 1024))
}
