//! The three file systems a run measures, each a directory for the workloads, set up for the
//! run and torn down when dropped (also on error and panic): `remem fs` on a fresh local
//! cluster, a tmpfs mount, and a directory on the local disk.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use remem_frontend::transport_arg::Transport;
use remem_local::launcher::{ClusterOptions, LocalCluster, UnixSockets};

const MIB: u64 = 1 << 20;
/// Slabs of the bench's cluster: 4 MiB, as `remem up`'s.
const SLAB_BYTES: u64 = 4 * MIB;
/// How long `remem fs` may take to print `mounted`.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `remem fs` may take to exit after SIGTERM before it is killed.
const UNMOUNT_GRACE: Duration = Duration::from_secs(15);
/// `statfs`'s f_type of a tmpfs.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// What a `remem fs` of the bench is started with.
pub struct RememFsOptions<'a> {
    pub nodes: usize,
    pub size_bytes: u64,
    pub data_splits: usize,
    pub parity_splits: usize,
    pub transport: Transport,
    /// More arguments for `remem fs` (e.g. `--threads 8`).
    pub extra_args: &'a [String],
}

/// `remem fs` mounted on a local cluster of its own; unmounted, then the nodes stopped, when
/// dropped.
pub struct RememFsMount {
    pub mountpoint: PathBuf,
    // Field order is drop order, but `Drop` stops the daemon before the cluster explicitly.
    daemon: Option<Child>,
    cluster: Option<LocalCluster>,
}

impl RememFsMount {
    /// Starts the nodes under `work_dir/cluster` and `remem fs` on `work_dir/remem`, and waits
    /// for its `mounted` line.
    pub fn start(binary: &Path, options: &RememFsOptions<'_>, work_dir: &Path) -> Result<RememFsMount> {
        let (k, r) = (options.data_splits as u64, options.parity_splits as u64);
        let stored = options.size_bytes * (k + r) / k;
        let per_node = stored / options.nodes.max(1) as u64 + 4 * SLAB_BYTES;
        let options_cluster = ClusterOptions {
            lease_grace: None,
            nodes: options.nodes,
            capacity_bytes: per_node.div_ceil(SLAB_BYTES) * SLAB_BYTES,
            slab_size_bytes: SLAB_BYTES,
            nodes_per_domain: 1,
            dir: work_dir.join("cluster"),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: match options.transport {
                Transport::Shm => UnixSockets::All,
                Transport::Tcp => UnixSockets::None,
            },
            encrypt: false,
        };
        let cluster = LocalCluster::start(binary, &options_cluster).context("starting the local cluster")?;
        let mountpoint = work_dir.join("remem");
        std::fs::create_dir_all(&mountpoint)?;
        let log_path = work_dir.join("remem-fs.log");
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let transport = match options.transport {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
        };
        let mut daemon = Command::new(binary)
            .arg("fs")
            .arg(&mountpoint)
            .arg("--cluster")
            .arg(&cluster.cluster_file_path)
            .args(["--size", &options.size_bytes.to_string(), "--transport", transport, "--ephemeral"])
            .args(["-k", &options.data_splits.to_string(), "-r", &options.parity_splits.to_string()])
            .args(options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting remem fs")?;
        let stdout = daemon.stdout.take().context("remem fs's stdout is piped")?;
        let mut mount = RememFsMount { mountpoint, daemon: Some(daemon), cluster: Some(cluster) };
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        match receiver.recv_timeout(MOUNT_TIMEOUT) {
            Ok(line) if line.starts_with("mounted") => Ok(mount),
            Ok(line) => {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                mount.stop();
                bail!("remem fs did not mount (said {line:?}); its log:\n{log}")
            }
            Err(_) => {
                mount.stop();
                bail!("remem fs did not mount within {MOUNT_TIMEOUT:?} (log: {})", log_path.display())
            }
        }
    }

    /// SIGTERM to `remem fs` (it unmounts and exits), SIGKILL and a lazy unmount if it does
    /// not; then the nodes.
    fn stop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            // SAFETY: kill with the PID of our child, not yet reaped.
            unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + UNMOUNT_GRACE;
            loop {
                match daemon.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    _ => {
                        let _ = daemon.kill();
                        let _ = daemon.wait();
                        break;
                    }
                }
            }
            if remem_host::process::mount_at(&self.mountpoint).is_some() {
                let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
            }
        }
        if let Some(mut cluster) = self.cluster.take() {
            cluster.stop(Duration::from_secs(3));
        }
    }
}

impl Drop for RememFsMount {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A tmpfs mounted for the run (needs root); unmounted when dropped.
pub struct TmpfsMount {
    pub mountpoint: PathBuf,
}

impl TmpfsMount {
    pub fn start(work_dir: &Path, size_bytes: u64) -> Result<TmpfsMount> {
        let mountpoint = work_dir.join("tmpfs");
        std::fs::create_dir_all(&mountpoint)?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_bytes}"), "remem-bench-fs"])
            .arg(&mountpoint)
            .stdin(Stdio::null())
            .output()
            .context("running mount -t tmpfs")?;
        if !output.status.success() {
            bail!(
                "mount -t tmpfs failed (root is needed): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(TmpfsMount { mountpoint })
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).stdin(Stdio::null()).status();
    }
}

/// Whether `path` is on a tmpfs (then "local disk" would be memory too).
pub fn is_tmpfs(path: &Path) -> bool {
    let Ok(text) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into a zeroed struct we own; `text` is a NUL-terminated path.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above: both pointers are valid for the call.
    let result = unsafe { libc::statfs(text.as_ptr(), &mut stat) };
    result == 0 && u64::try_from(stat.f_type).ok() == Some(TMPFS_MAGIC)
}
