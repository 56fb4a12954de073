//! The swap backends an application pages to: remem EC(8,2) and remem rep(2) (k=1, r=1), each
//! on a fresh local 10-node cluster over TCP through `remem swap on`, remem EC(8,2) over shared
//! memory (`--transport shm`: the same-host case), and a swap file on the local disk (the seed's
//! "SSD backup"). One is on at a time; guards turn it off, also on error.
//!
//! Two more page inside the application's own process (`remem run --paging uffd`, crates/paging):
//! remem EC(8,2) over shared memory and over TCP on the same fresh cluster, no swap on. There
//! the pager keeps the application's managed memory within the limit and the cgroup only
//! measures: the kernel never swaps.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use remem_frontend::code_args::CodeArgs;
use remem_host::swap::{RememSwap, RememSwapOptions};
use remem_local::launcher::{ClusterOptions, LocalCluster, UnixSockets};

use super::fault_path::DaemonStat;

const MIB: u64 = 1 << 20;
pub const SLAB_BYTES: u64 = 4 * MIB;
const NODES: usize = 10;
/// The node a failure run SIGKILLs.
const VICTIM_NODE: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    RememEc,
    RememEcShm,
    RememRep,
    DiskFile,
    /// Paging inside the process over shared memory / TCP.
    UffdShm,
    UffdTcp,
}

impl Backend {
    pub const ALL: [Backend; 6] = [
        Backend::RememEc,
        Backend::RememEcShm,
        Backend::RememRep,
        Backend::DiskFile,
        Backend::UffdShm,
        Backend::UffdTcp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::RememEc => "remem EC(8,2)",
            Backend::RememEcShm => "remem EC(8,2) shm",
            Backend::RememRep => "remem rep(2)",
            Backend::DiskFile => "local disk file",
            Backend::UffdShm => "uffd EC(8,2) shm",
            Backend::UffdTcp => "uffd EC(8,2)",
        }
    }

    pub fn parse(text: &str) -> Result<Backend, String> {
        match text.trim() {
            "ec" => Ok(Backend::RememEc),
            "ec-shm" => Ok(Backend::RememEcShm),
            "rep" => Ok(Backend::RememRep),
            "disk" => Ok(Backend::DiskFile),
            "uffd-shm" => Ok(Backend::UffdShm),
            "uffd" => Ok(Backend::UffdTcp),
            other => Err(format!("{other:?}: a backend is ec, ec-shm, rep, disk, uffd-shm or uffd")),
        }
    }

    pub fn is_remem(self) -> bool {
        self != Backend::DiskFile
    }

    fn code(self) -> Option<CodeArgs> {
        match self {
            Backend::RememEc | Backend::RememEcShm | Backend::UffdShm | Backend::UffdTcp => {
                Some(CodeArgs { data_splits: 8, parity_splits: 2, delta: 1 })
            }
            // Both replicas are read only when the first is slow or gone: no extra reads.
            Backend::RememRep => Some(CodeArgs { data_splits: 1, parity_splits: 1, delta: 0 }),
            Backend::DiskFile => None,
        }
    }

    /// Pages inside the application's process: no swap, the pager keeps the limit.
    pub fn pages_in_process(self) -> bool {
        matches!(self, Backend::UffdShm | Backend::UffdTcp)
    }

    fn shared_memory(self) -> bool {
        matches!(self, Backend::RememEcShm | Backend::UffdShm)
    }
}

/// How one run's memory is limited: by its cgroup (the kernel swaps to the backend that is on),
/// or by the pager the application is started with (the cgroup only measures).
pub struct Limit {
    pub bytes: u64,
    pub pager: Option<PagerRun>,
}

impl Limit {
    /// The cgroup's limit: none when the pager keeps it.
    pub fn cgroup_bytes(&self) -> Option<u64> {
        self.pager.is_none().then_some(self.bytes)
    }

    pub fn environment(&self) -> &[(String, String)] {
        self.pager.as_ref().map_or(&[], |pager| &pager.environment)
    }
}

/// The pager of one run: the environment that starts the application paged, and where the
/// pager leaves its counters and its slab map at exit.
pub struct PagerRun {
    environment: Vec<(String, String)>,
    stats: PathBuf,
    map: PathBuf,
    cluster: PathBuf,
}

impl PagerRun {
    /// After the run: the pager's counters (its JSON line), and its slabs given back.
    pub fn finish(&self) -> Option<String> {
        let stats = std::fs::read_to_string(&self.stats).ok().map(|text| text.trim().to_owned());
        let _ = std::fs::remove_file(&self.stats);
        remem_host::paging::release_slabs(&self.map, &self.cluster, false);
        stats
    }
}

/// A backend's swap area, on until dropped (the swap first, then the cluster).
pub struct SwapOn {
    // Field order is drop order: swap off before the nodes stop.
    remem_swap: Option<RememSwap>,
    cluster: Option<LocalCluster>,
    _disk: Option<DiskSwap>,
    /// Where the remem swap daemon serves its metrics (the fault path's split).
    metrics: Option<SocketAddr>,
    /// Paging inside the process: the remem binary (the library is beside it) and the backend.
    pager: Option<(PathBuf, Backend, u64)>,
}

impl SwapOn {
    /// Turns on `swap_bytes` of swap on `backend`, its files under `work_dir`.
    pub fn start(binary: &Path, backend: Backend, swap_bytes: u64, work_dir: &Path) -> Result<SwapOn> {
        let Some(code) = backend.code() else {
            let disk = DiskSwap::on(&work_dir.join("disk-swapfile"), swap_bytes)?;
            return Ok(SwapOn {
                remem_swap: None,
                cluster: None,
                _disk: Some(disk),
                metrics: None,
                pager: None,
            });
        };
        // Each node holds its share of (k+r)/k times the swap, with room for the share of a
        // node killed by a failure run (its slabs' replacements land on the other nodes).
        let stored = swap_bytes * (code.data_splits + code.parity_splits) as u64 / code.data_splits as u64;
        let capacity_bytes = (stored / (NODES as u64 - 2) + 8 * SLAB_BYTES).div_ceil(SLAB_BYTES) * SLAB_BYTES;
        let options = ClusterOptions {
            lease_grace: None,
            nodes: NODES,
            capacity_bytes,
            slab_size_bytes: SLAB_BYTES,
            nodes_per_domain: 1,
            dir: work_dir.join("cluster"),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: if backend.shared_memory() { UnixSockets::All } else { UnixSockets::None },
            encrypt: false,
        };
        let cluster = LocalCluster::start(binary, &options).context("starting the local cluster")?;
        if backend.pages_in_process() {
            return Ok(SwapOn {
                remem_swap: None,
                cluster: Some(cluster),
                _disk: None,
                metrics: None,
                pager: Some((binary.to_owned(), backend, swap_bytes)),
            });
        }
        // A port free a moment ago; if another process takes it first, the split is left out.
        let metrics = std::net::TcpListener::bind("127.0.0.1:0").and_then(|probe| probe.local_addr()).ok();
        let swap_options = RememSwapOptions {
            size_bytes: swap_bytes,
            priority: 100,
            cluster: Some(cluster.cluster_file_path.clone()),
            code,
            runtime_dir: work_dir.join("remem-swap"),
            shared_memory: backend.shared_memory(),
            encrypt: false,
            metrics,
        };
        let remem_swap = RememSwap::on(binary, &swap_options)?;
        Ok(SwapOn { remem_swap: Some(remem_swap), cluster: Some(cluster), _disk: None, metrics, pager: None })
    }

    /// The limit of one run at `bytes` of local memory on this backend. Errors when the pager
    /// cannot be set up (its library missing, not root).
    pub fn limit(&self, bytes: u64, work_dir: &Path) -> Result<Limit> {
        let (Some((binary, backend, remote_bytes)), Some(cluster)) = (&self.pager, &self.cluster) else {
            return Ok(Limit { bytes, pager: None });
        };
        let stats = work_dir.join("pager-stats.json");
        let map = work_dir.join("pager.map");
        let _ = std::fs::remove_file(&stats);
        let _ = std::fs::remove_file(&map);
        let code = backend.code().context("a paging backend has a code")?;
        let options = remem_host::paging::PagedOptions {
            cluster: cluster.cluster_file_path.clone(),
            limit_bytes: bytes,
            remote_bytes: *remote_bytes,
            data_splits: code.data_splits,
            parity_splits: code.parity_splits,
            shared_memory: backend.shared_memory(),
            encrypt: false,
            spin: Duration::from_micros(remem_host::paging::DEFAULT_SPIN_US),
            min_bytes: remem_host::paging::DEFAULT_MIN_BYTES,
            protected_percent: remem_host::paging::DEFAULT_PROTECTED_PERCENT,
            stats: Some(stats.clone()),
            map: Some(map.clone()),
        };
        let environment = remem_host::paging::paged_environment(binary, &options)?;
        Ok(Limit {
            bytes,
            pager: Some(PagerRun { environment, stats, map, cluster: cluster.cluster_file_path.clone() }),
        })
    }

    /// The block device counters of the swap area that is on (the loop device of remem swap,
    /// the disk under the swap file), if /proc/swaps and sysfs tell them.
    pub fn device_stat(&self) -> Option<DeviceStat> {
        let swaps = std::fs::read_to_string("/proc/swaps").ok()?;
        let area = swaps.lines().nth(1)?.split_whitespace().next()?;
        let stat_path = match area.strip_prefix("/dev/") {
            Some(device) => PathBuf::from(format!("/sys/block/{device}/stat")),
            None => {
                let device = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(area).ok()?);
                PathBuf::from(format!("/sys/dev/block/{}:{}/stat", libc::major(device), libc::minor(device)))
            }
        };
        DeviceStat::parse(&std::fs::read_to_string(stat_path).ok()?)
    }

    /// The remem swap daemon's own counters (remem backends only).
    pub fn daemon_stat(&self) -> Option<DaemonStat> {
        DaemonStat::scrape(self.metrics?)
    }

    /// The PID of the memory node a failure run kills (remem backends only).
    pub fn victim_pid(&self) -> Option<u32> {
        self.cluster.as_ref()?.pid(VICTIM_NODE)
    }
}

impl Drop for SwapOn {
    fn drop(&mut self) {
        drop(self.remem_swap.take());
        if let Some(mut cluster) = self.cluster.take() {
            cluster.stop(Duration::from_secs(5));
        }
    }
}

/// A block device's I/O counters (`/sys/block/DEV/stat`): requests completed and the
/// milliseconds they spent from submission to completion, summed over requests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceStat {
    pub reads: u64,
    pub read_sectors: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
}

impl DeviceStat {
    /// Parses the stat file's fields 1-8; None when they are not numbers.
    pub fn parse(text: &str) -> Option<DeviceStat> {
        let fields: Vec<u64> =
            text.split_whitespace().take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
        let &[reads, _, read_sectors, read_ms, writes, _, write_sectors, write_ms] = fields.as_slice() else {
            return None;
        };
        Some(DeviceStat { reads, read_sectors, read_ms, writes, write_sectors, write_ms })
    }

    /// What happened between `earlier` and `self` (counters only grow; a reset reads as 0).
    pub fn since(&self, earlier: &DeviceStat) -> DeviceStat {
        DeviceStat {
            reads: self.reads.saturating_sub(earlier.reads),
            read_sectors: self.read_sectors.saturating_sub(earlier.read_sectors),
            read_ms: self.read_ms.saturating_sub(earlier.read_ms),
            writes: self.writes.saturating_sub(earlier.writes),
            write_sectors: self.write_sectors.saturating_sub(earlier.write_sectors),
            write_ms: self.write_ms.saturating_sub(earlier.write_ms),
        }
    }
}

/// A swap file on the local disk; swapoff and removed on drop.
struct DiskSwap {
    path: PathBuf,
    on: bool,
}

impl DiskSwap {
    fn on(path: &Path, size_bytes: u64) -> Result<DiskSwap> {
        let mut swap = DiskSwap { path: path.to_owned(), on: false };
        let path_text = path.to_str().context("work directory is not UTF-8")?;
        tool("fallocate", &["-l", &size_bytes.to_string(), path_text])?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        tool("mkswap", &[path_text])?;
        tool("swapon", &[path_text]).context(
            "the local-disk baseline needs --dir on a disk file system that takes swap files (ext4, xfs; \
             not tmpfs or overlayfs)",
        )?;
        swap.on = true;
        Ok(swap)
    }
}

impl Drop for DiskSwap {
    fn drop(&mut self) {
        if self.on {
            if let Err(error) = tool("swapoff", &[&self.path.to_string_lossy()]) {
                eprintln!("bench apps: {error:#}: run swapoff {} yourself", self.path.display());
                return;
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes a directory tree on drop, unless something is still mounted under it.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let prefix = self.0.to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mounts
            .lines()
            .any(|line| line.split_whitespace().nth(4).is_some_and(|point| point.starts_with(&prefix)))
        {
            eprintln!("bench apps: something is still mounted under {prefix}; left in place");
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a system tool (under `timeout`, 120 s: a swap file is large), failing with its stderr.
fn tool(program: &str, args: &[&str]) -> Result<()> {
    remem_host::swap::tool_within(120, program, args).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_stat_parses_sysfs_lines_and_refuses_garbage() {
        let stat =
            DeviceStat::parse("  1200 3 9600 450 800 0 6400 900 0 1000 1350 0 0 0 0\n").expect("a stat line");
        assert_eq!(
            stat,
            DeviceStat {
                reads: 1200,
                read_sectors: 9600,
                read_ms: 450,
                writes: 800,
                write_sectors: 6400,
                write_ms: 900
            }
        );
        let later = DeviceStat { reads: 1300, read_ms: 500, ..stat };
        assert_eq!(later.since(&stat).reads, 100);
        assert_eq!(stat.since(&later).reads, 0);
        assert!(DeviceStat::parse("1 2 3").is_none());
        assert!(DeviceStat::parse("a b c d e f g h").is_none());
        assert_eq!(Backend::parse("rep"), Ok(Backend::RememRep));
        assert_eq!(Backend::parse("uffd-shm"), Ok(Backend::UffdShm));
        assert!(Backend::UffdTcp.pages_in_process() && !Backend::RememEcShm.pages_in_process());
        assert!(Backend::parse("nbd").is_err());
    }
}
