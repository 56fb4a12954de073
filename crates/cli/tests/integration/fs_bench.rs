//! `remem bench fs --quick`, so the bench never rots: its table has a row for every workload
//! with a figure for each of remem fs, tmpfs and the local disk and a ratio, and it leaves no
//! mount, process or directory behind. Speed is not asserted (benchmarks measure it). Needs
//! root (the bench mounts a tmpfs), fio, sqlite3 and tar (scripts/setup.sh).

use crate::common;
use crate::kv_support::{run_bounded, text};

use std::path::Path;

/// The workloads of a run, in the table's order.
const WORKLOADS: [&str; 10] = [
    "fio write 1MiB qd1",
    "fio read 1MiB qd1",
    "fio randwrite 4KiB qd1",
    "fio randwrite 4KiB qd32",
    "fio randread 4KiB qd1",
    "fio randread 4KiB qd32",
    "sqlite3 WAL insert 2000 rows",
    "sqlite3 WAL select pass",
    "tar create (source tree)",
    "tar extract (source tree)",
];

/// A positive number from a table cell (`12.5`, `3.21x`), or a panic naming the row.
fn positive(cell: &str, row: &str) -> f64 {
    let value: f64 = cell.trim_end_matches('x').parse().unwrap_or_else(|_| panic!("{cell:?} in {row:?}"));
    assert!(value.is_finite() && value > 0.0, "{cell:?} in {row:?} is not a positive number");
    value
}

#[test]
fn bench_fs_quick_prints_a_figure_for_every_workload_and_target() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "remem bench fs mounts a tmpfs: it needs root (CI runs as root)");
    let dir = common::ScratchDir::new("fs-bench");
    let binary = Path::new(env!("CARGO_BIN_EXE_remem")).to_str().expect("a UTF-8 path");
    let dir_arg = dir.to_str().expect("a UTF-8 path");
    let output = run_bounded(150, binary, &["bench", "fs", "--quick", "--dir", dir_arg], None);
    let said = text(&output);
    assert!(output.status.success(), "remem bench fs --quick failed: {said}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| workload"))
        .map(|line| line.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    let workloads: Vec<&str> = rows.iter().map(|cells| cells[0]).collect();
    assert_eq!(workloads, WORKLOADS, "the table's rows: {stdout}");
    for cells in &rows {
        assert_eq!(cells.len(), 6, "workload, unit, three figures, ratio: {cells:?}");
        assert!(["IOPS", "MB/s", "s"].contains(&cells[1]), "unit of {cells:?}");
        for cell in &cells[2..] {
            positive(cell, cells[0]);
        }
        assert!(cells[5].ends_with('x'), "the ratio of {cells:?}");
    }
    // Nothing is left: no mount under the directory, no run directory in it.
    let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    assert!(!mounts.contains(dir_arg), "a mount is left under {dir_arg}: {mounts}");
    let left: Vec<_> = std::fs::read_dir(&*dir).expect("the scratch directory").collect();
    assert!(left.is_empty(), "the bench left {left:?} in {dir_arg}");
}
