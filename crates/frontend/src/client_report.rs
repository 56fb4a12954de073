//! Front ends (`remem nbd`, `remem kv`, `remem fs`) publish their client's region health beside
//! the cluster file, in `clients/FRONTEND-PID.json`, at most once a second; `remem status` shows
//! them.
//!
//! Nodes know which client owns each slab, not what a client's ranges look like: only the
//! client knows that a range lost a split to a dead node (whose slabs nobody can list any more),
//! is rebuilding, or is lost. So each client says it itself. A report's file is written
//! atomically (temp file, rename) and private (0600), removed when its front end exits cleanly;
//! a report whose process is gone is shown as such (its slabs wait out the nodes' lease grace),
//! and removed by the `remem status` that finds it older than [`DEAD_REPORT_KEPT`]. A process is
//! the report's only while its PID runs with the start time the report names (not a zombie, not
//! a reused PID).
//!
//! Reports are read back as input: a file over 1 MiB or that does not parse is skipped with a
//! note, never trusted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use remem_client::RegionHealth;
use serde::{Deserialize, Serialize};

/// How often a front end rewrites its report.
const PUBLISH_PERIOD: Duration = Duration::from_secs(1);
/// Larger report files are not read.
const MAX_REPORT_BYTES: u64 = 1 << 20;
/// How long after its last update the report of a process that is gone is still shown: well past
/// the nodes' default lease grace (2 minutes), while its slabs may still be waiting.
pub const DEAD_REPORT_KEPT: Duration = Duration::from_secs(600);

/// What one front end's client says of itself.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientReport {
    /// `nbd`, `kv`...
    pub front_end: String,
    /// The export, mount point or listen address.
    pub name: String,
    pub pid: u32,
    /// The process's start time, in clock ticks after boot (/proc/PID/stat): with the PID, which
    /// process wrote the report (0 in reports of older versions: the PID alone then).
    #[serde(default)]
    pub process_start: u64,
    /// The client id that owns its slabs, in hex.
    pub client_id: String,
    /// When it was written, in milliseconds since the Unix epoch.
    pub updated_unix_ms: u64,
    pub regions: Vec<RegionHealth>,
}

/// Writes one front end's report; removes it on drop.
pub struct ClientReporter {
    path: PathBuf,
    front_end: String,
    name: String,
    client_id: u64,
    last: Option<Instant>,
}

impl ClientReporter {
    /// A reporter for the cluster of `cluster_path`. Nothing is written until `publish`.
    pub fn new(cluster_path: &Path, front_end: &str, name: &str, client_id: u64) -> ClientReporter {
        let path = reports_dir(cluster_path).join(format!("{front_end}-{}.json", std::process::id()));
        ClientReporter { path, front_end: front_end.to_owned(), name: name.to_owned(), client_id, last: None }
    }

    /// Writes the report if a second has passed since the last one; `regions` is only called
    /// then. Failures are logged once per failure and otherwise ignored: a report is advice.
    pub fn publish(&mut self, regions: impl FnOnce() -> Vec<RegionHealth>) {
        if self.last.is_some_and(|last| last.elapsed() < PUBLISH_PERIOD) {
            return;
        }
        self.last = Some(Instant::now());
        let report = ClientReport {
            front_end: self.front_end.clone(),
            name: self.name.clone(),
            pid: std::process::id(),
            process_start: process_start(std::process::id()).unwrap_or(0),
            client_id: format!("{:#x}", self.client_id),
            updated_unix_ms: unix_ms(SystemTime::now()),
            regions: regions(),
        };
        if let Err(error) = self.write(&report) {
            tracing::debug!(path = %self.path.display(), %error, "cannot write the client report");
        }
    }

    fn write(&self, report: &ClientReport) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
        let temporary = self.path.with_extension("tmp");
        crate::cluster_file::write_private_file(&temporary, text.as_bytes())
            .map_err(std::io::Error::other)?;
        std::fs::rename(&temporary, &self.path)
    }
}

impl Drop for ClientReporter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The start time of running process `pid` in clock ticks after boot, from /proc/PID/stat; None
/// when there is no such process or it has exited (a zombie, or being reaped).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state (field 3) ... starttime (field 22).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if matches!(fields.first(), Some(&"Z" | &"X" | &"x")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether the process that wrote `report` still runs.
fn writer_alive(report: &ClientReport) -> bool {
    report.pid != 0
        && process_start(report.pid)
            .is_some_and(|start| report.process_start == 0 || start == report.process_start)
}

fn reports_dir(cluster_path: &Path) -> PathBuf {
    cluster_path.parent().unwrap_or(Path::new(".")).join("clients")
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
}

/// A report read back, with whether its process still runs and how old it is.
#[derive(Clone, Debug, Serialize)]
pub struct ClientRow {
    #[serde(flatten)]
    pub report: ClientReport,
    /// The process is alive (it may still be a different one with a reused PID; the age tells).
    pub alive: bool,
    pub age_secs: f64,
}

/// Every report beside the cluster file, sorted by front end and PID. Unreadable ones are
/// skipped; those of gone processes older than [`DEAD_REPORT_KEPT`] are removed (when this user
/// may) and skipped.
pub fn read_reports(cluster_path: &Path) -> Vec<ClientRow> {
    let Ok(entries) = std::fs::read_dir(reports_dir(cluster_path)) else { return Vec::new() };
    let now = unix_ms(SystemTime::now());
    let mut rows: Vec<ClientRow> = entries
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|extension| extension == "json"))
        .filter(|entry| entry.metadata().is_ok_and(|metadata| metadata.len() <= MAX_REPORT_BYTES))
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let report: ClientReport = serde_json::from_str(&text).ok()?;
            let alive = writer_alive(&report);
            let age_secs = now.saturating_sub(report.updated_unix_ms) as f64 / 1000.0;
            if !alive && age_secs > DEAD_REPORT_KEPT.as_secs_f64() {
                let _ = std::fs::remove_file(entry.path());
                return None;
            }
            Some(ClientRow { report, alive, age_secs })
        })
        .collect();
    rows.sort_by(|a, b| (&a.report.front_end, a.report.pid).cmp(&(&b.report.front_end, b.report.pid)));
    rows
}

/// One line per region: `EC(8,2): 4 ranges, 2 healthy, 2 degraded (2 missing 1 split), ...`.
pub fn describe_region(region: &RegionHealth) -> String {
    let degraded: u64 = region.degraded_by_missing_splits.iter().sum();
    let mut text = format!(
        "region {} {}: {} ranges, {} healthy, {} degraded",
        region.index, region.scheme, region.ranges, region.healthy, degraded
    );
    let detail: Vec<String> = region
        .degraded_by_missing_splits
        .iter()
        .enumerate()
        .filter(|(_, &count)| count > 0)
        .map(|(index, count)| {
            format!("{count} missing {} split{}", index + 1, if index == 0 { "" } else { "s" })
        })
        .collect();
    if !detail.is_empty() {
        text.push_str(&format!(" ({})", detail.join(", ")));
    }
    text.push_str(&format!(", {} rebuilding, {} lost", region.rebuilding, region.lost));
    if region.unreadable_pages > 0 {
        text.push_str(&format!(", {} pages unreadable", region.unreadable_pages));
    }
    text
}
