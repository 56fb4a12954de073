//! The pager's settings, from the environment `remem run --paging uffd` gives the command (a
//! preloaded library has no command line). Every variable is checked; a bad one is an error
//! that names it.

use std::path::PathBuf;
use std::time::Duration;

pub const CLUSTER: &str = "REMEM_PAGING_CLUSTER";
pub const LIMIT: &str = "REMEM_PAGING_LIMIT";
pub const REMOTE: &str = "REMEM_PAGING_REMOTE";
pub const DATA_SPLITS: &str = "REMEM_PAGING_K";
pub const PARITY_SPLITS: &str = "REMEM_PAGING_R";
pub const TRANSPORT: &str = "REMEM_PAGING_TRANSPORT";
pub const SPIN_US: &str = "REMEM_PAGING_SPIN_US";
pub const MIN_BYTES: &str = "REMEM_PAGING_MIN_BYTES";
pub const PROTECTED_PERCENT: &str = "REMEM_PAGING_PROTECTED_PERCENT";
pub const STATS: &str = "REMEM_PAGING_STATS";
pub const PARENT: &str = "REMEM_PAGING_PARENT";
pub const MAP: &str = "REMEM_PAGING_MAP";
pub const ENCRYPT: &str = "REMEM_PAGING_ENCRYPT";

/// How long the handler polls for the next fault before it blocks, by default (microseconds).
pub const DEFAULT_SPIN_US: u64 = 50;
/// The smallest mapping the pager manages, by default: see `maps.rs` for why.
pub const DEFAULT_MIN_BYTES: u64 = 1 << 20;
/// The protected segment's share of the resident pages (`pages` module): pages used again after
/// they became victims stay about that much longer. Faults at 50% of the peak, against 0 (one
/// FIFO): PageRank -21%, redis -23%, memcached ETC -38% per request, sqlite the same (docs/PAGING.md).
pub const DEFAULT_PROTECTED_PERCENT: u64 = 75;

#[derive(Clone, Debug)]
pub struct Config {
    pub cluster: PathBuf,
    /// Local memory the managed pages may use (resident and victims), bytes.
    pub limit_bytes: u64,
    /// Size of the process's remem region: how much may be paged out, bytes.
    pub remote_bytes: u64,
    pub data_splits: usize,
    pub parity_splits: usize,
    pub shared_memory: bool,
    /// Encrypted TCP to the nodes (`remem run --encrypt`; nodes with `--encrypt` require it).
    pub encrypt: bool,
    /// How long the handler polls for the next fault before it blocks.
    pub spin: Duration,
    pub min_bytes: u64,
    /// Percent of the resident pages the protected segment holds at most (0 to 90).
    pub protected_percent: u64,
    pub stats: Option<PathBuf>,
    /// Where the slab map is saved for `remem run` to release the slabs after the program.
    pub map: Option<PathBuf>,
}

fn number(name: &str, default: Option<u64>) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(text) => text.trim().parse().map_err(|_| format!("{name}={text:?} is not a number")),
        Err(_) => default.ok_or_else(|| format!("{name} is not set")),
    }
}

impl Config {
    /// The environment that gives this configuration to the library (what `from_env` reads),
    /// for the process that starts the program; `stats` and `map` are set there.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut variables = vec![
            (CLUSTER, self.cluster.display().to_string()),
            (LIMIT, self.limit_bytes.to_string()),
            (REMOTE, self.remote_bytes.to_string()),
            (DATA_SPLITS, self.data_splits.to_string()),
            (PARITY_SPLITS, self.parity_splits.to_string()),
            (TRANSPORT, if self.shared_memory { "shm" } else { "tcp" }.to_owned()),
            (ENCRYPT, u8::from(self.encrypt).to_string()),
            (SPIN_US, self.spin.as_micros().to_string()),
            (MIN_BYTES, self.min_bytes.to_string()),
            (PROTECTED_PERCENT, self.protected_percent.to_string()),
        ];
        variables.extend(self.stats.as_ref().map(|path| (STATS, path.display().to_string())));
        variables.extend(self.map.as_ref().map(|path| (MAP, path.display().to_string())));
        variables
    }

    /// `None` when this process is not to be paged: no configuration, or a child process of
    /// the command (only the command `remem run` started is paged; its children run as usual).
    pub fn from_env() -> Result<Option<Config>, String> {
        let Ok(cluster) = std::env::var(CLUSTER) else { return Ok(None) };
        if let Ok(parent) = std::env::var(PARENT) {
            // SAFETY: getppid has no preconditions.
            if parent.trim().parse::<i32>().ok() != Some(unsafe { libc::getppid() }) {
                return Ok(None);
            }
        }
        let limit_bytes = number(LIMIT, None)?;
        if limit_bytes < 64 * 4096 {
            return Err(format!("{LIMIT}={limit_bytes}: at least 64 pages (256 KiB)"));
        }
        let remote_bytes = number(REMOTE, None)?;
        let data_splits = number(DATA_SPLITS, Some(8))? as usize;
        let parity_splits = number(PARITY_SPLITS, Some(2))? as usize;
        let shared_memory = match std::env::var(TRANSPORT).as_deref() {
            Ok("shm") | Err(_) => true,
            Ok("tcp") => false,
            Ok(other) => return Err(format!("{TRANSPORT}={other:?}: tcp or shm")),
        };
        Ok(Some(Config {
            cluster: PathBuf::from(cluster),
            limit_bytes,
            remote_bytes,
            data_splits,
            parity_splits,
            shared_memory,
            encrypt: number(ENCRYPT, Some(0))? != 0,
            spin: Duration::from_micros(number(SPIN_US, Some(DEFAULT_SPIN_US))?.min(10_000)),
            min_bytes: number(MIN_BYTES, Some(DEFAULT_MIN_BYTES))?,
            protected_percent: number(PROTECTED_PERCENT, Some(DEFAULT_PROTECTED_PERCENT))?.min(90),
            stats: std::env::var_os(STATS).map(PathBuf::from),
            map: std::env::var_os(MAP).map(PathBuf::from),
        }))
    }
}
