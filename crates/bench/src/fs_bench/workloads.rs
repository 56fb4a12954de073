//! The workloads, each run in one directory and measured from outside by Debian's programs:
//! fio (4 KiB random and 1 MiB sequential, `O_DIRECT` through libaio, so the file system is
//! measured and not the page cache above it), sqlite3 (a WAL database: inserts in transactions,
//! then a select pass) and tar (an archive of a source tree created on the file system, then
//! extracted there). Each checks what it can: fio its errors, sqlite3 the row count and
//! `integrity_check`, tar the extracted tree against the archive (`tar --compare`, not timed).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use remem_host::swap::tool_within;

/// The longest any one program may run.
const TOOL_SECONDS: u32 = 600;

/// One fio job: pattern, block size, queue depth.
#[derive(Clone, Copy, Debug)]
pub struct FioJob {
    /// fio's `rw`: `randread`, `randwrite`, `read`, `write`.
    pub pattern: &'static str,
    pub block_bytes: u64,
    pub queue_depth: u32,
}

impl FioJob {
    pub const ALL: [FioJob; 6] = [
        FioJob { pattern: "write", block_bytes: 1 << 20, queue_depth: 1 },
        FioJob { pattern: "read", block_bytes: 1 << 20, queue_depth: 1 },
        FioJob { pattern: "randwrite", block_bytes: 4 << 10, queue_depth: 1 },
        FioJob { pattern: "randwrite", block_bytes: 4 << 10, queue_depth: 32 },
        FioJob { pattern: "randread", block_bytes: 4 << 10, queue_depth: 1 },
        FioJob { pattern: "randread", block_bytes: 4 << 10, queue_depth: 32 },
    ];

    /// `fio randread 4KiB qd32`.
    pub fn name(&self) -> String {
        let block = if self.block_bytes >= 1 << 20 {
            format!("{}MiB", self.block_bytes >> 20)
        } else {
            format!("{}KiB", self.block_bytes >> 10)
        };
        format!("fio {} {block} qd{}", self.pattern, self.queue_depth)
    }

    /// Random jobs are reported in IOPS, sequential ones in MB/s.
    pub fn unit(&self) -> &'static str {
        if self.pattern.starts_with("rand") {
            "IOPS"
        } else {
            "MB/s"
        }
    }

    fn reads(&self) -> bool {
        self.pattern.ends_with("read")
    }
}

/// Runs `job` on `DIR/fio.dat` (`file_bytes` long, laid out by fio when missing) for at most
/// `runtime`; returns IOPS or MB/s (see [`FioJob::unit`]).
pub fn fio(dir: &Path, job: FioJob, file_bytes: u64, runtime: Duration) -> Result<f64> {
    let file = dir.join("fio.dat");
    let file = file.to_str().context("a UTF-8 path")?;
    let output = tool_within(
        TOOL_SECONDS,
        "fio",
        &[
            "--output-format=json",
            "--name=bench",
            &format!("--filename={file}"),
            &format!("--size={file_bytes}"),
            &format!("--rw={}", job.pattern),
            &format!("--bs={}", job.block_bytes),
            &format!("--iodepth={}", job.queue_depth),
            "--ioengine=libaio",
            "--direct=1",
            &format!("--runtime={}ms", runtime.as_millis().max(1)),
            "--time_based",
            "--randrepeat=0",
            "--norandommap",
        ],
    )?;
    // fio may print notes before its JSON document.
    let start = output.find('{').context("fio printed no JSON")?;
    let report: serde_json::Value = serde_json::from_str(&output[start..]).context("fio's JSON")?;
    let result = &report["jobs"][0];
    if result["error"].as_i64() != Some(0) {
        bail!("fio {}: error {}", job.name(), result["error"]);
    }
    let side = &result[if job.reads() { "read" } else { "write" }];
    let figure = if job.unit() == "IOPS" {
        side["iops"].as_f64()
    } else {
        side["bw_bytes"].as_f64().map(|bytes| bytes / 1e6)
    };
    match figure {
        Some(figure) if figure > 0.0 => Ok(figure),
        _ => bail!("fio {} reported no progress: {side}", job.name()),
    }
}

/// The seconds of a sqlite3 run: `rows` inserted in transactions of `rows_per_transaction`
/// (WAL mode, the default `synchronous`, so each commit syncs the WAL), and the seconds of a
/// select pass over them (a full scan, index range queries and `integrity_check`).
pub fn sqlite(dir: &Path, rows: u64, rows_per_transaction: u64) -> Result<(f64, f64)> {
    let database = dir.join("bench.sqlite");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", database.display()));
    }
    let database = database.to_str().context("a UTF-8 path")?;
    let mut inserts = String::from(
        "pragma journal_mode=wal;\n\
         create table t(id integer primary key, n integer, body text);\n\
         create index t_n on t(n);\n",
    );
    let mut left = rows;
    while left > 0 {
        let batch = left.min(rows_per_transaction.max(1));
        inserts.push_str("begin;\n");
        for _ in 0..batch {
            inserts
                .push_str("insert into t(n, body) values (abs(random()) % 100000, hex(randomblob(64)));\n");
        }
        inserts.push_str("commit;\n");
        left -= batch;
    }
    let script = dir.join("inserts.sql");
    std::fs::write(&script, inserts)?;
    let started = Instant::now();
    tool_within(TOOL_SECONDS, "sqlite3", &[database, &format!(".read {}", script.display())])?;
    let insert_seconds = started.elapsed().as_secs_f64();
    let selects = "select count(*) from t;\n\
                   select count(*) from t where n between 1000 and 20000;\n\
                   select sum(length(body)) from t where id % 3 = 0;\n\
                   pragma integrity_check;\n";
    let started = Instant::now();
    let output = tool_within(TOOL_SECONDS, "sqlite3", &[database, selects])?;
    let select_seconds = started.elapsed().as_secs_f64();
    let lines: Vec<&str> = output.lines().collect();
    if lines.first() != Some(&rows.to_string().as_str()) || lines.last() != Some(&"ok") {
        bail!("sqlite3 in {} read back {output:?}, not {rows} rows and ok", dir.display());
    }
    Ok((insert_seconds, select_seconds))
}

/// The seconds of `tar -c` of `source` (without `target/` and `.git/`) into an archive in
/// `dir`, and of its extraction into `dir/tree`; the tree is then compared with the archive.
pub fn tar(dir: &Path, source: &Path) -> Result<(f64, f64)> {
    let archive = dir.join("source.tar");
    let archive = archive.to_str().context("a UTF-8 path")?;
    let source = source.to_str().context("a UTF-8 path")?;
    let tree = dir.join("tree");
    if tree.exists() {
        std::fs::remove_dir_all(&tree)?;
    }
    std::fs::create_dir(&tree)?;
    let tree = tree.to_str().context("a UTF-8 path")?;
    let started = Instant::now();
    tool_within(
        TOOL_SECONDS,
        "tar",
        &["-C", source, "--exclude=./target", "--exclude=./.git", "-cf", archive, "."],
    )?;
    let create_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    tool_within(TOOL_SECONDS, "tar", &["-C", tree, "-xf", archive])?;
    let extract_seconds = started.elapsed().as_secs_f64();
    tool_within(TOOL_SECONDS, "tar", &["-C", tree, "--compare", "-f", archive])
        .with_context(|| format!("the tree extracted in {tree} differs from its archive"))?;
    Ok((create_seconds, extract_seconds))
}
