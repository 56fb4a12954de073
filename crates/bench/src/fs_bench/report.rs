//! The report of `remem bench fs`: one row per workload, a figure per target, and the ratio of
//! remem fs to the local disk.

use std::path::PathBuf;

use serde::Serialize;

use remem_frontend::transport_arg::Transport;

/// The targets, in the order of each row's figures.
pub const TARGETS: [&str; 3] = ["remem fs", "tmpfs", "local disk"];

#[derive(Serialize, Debug)]
pub struct FsBenchReport {
    pub transport: Transport,
    pub data_splits: usize,
    pub parity_splits: usize,
    pub fs_args: Vec<String>,
    pub fio_size_bytes: u64,
    pub fio_seconds: f64,
    pub sqlite_rows: u64,
    pub sqlite_rows_per_transaction: u64,
    pub tar_rounds: usize,
    pub tar_source: PathBuf,
    pub rows: Vec<FsRow>,
    pub warnings: Vec<String>,
}

#[derive(Serialize, Debug)]
pub struct FsRow {
    pub workload: String,
    /// `IOPS` or `MB/s` (more is better) or `s` (less is better).
    pub unit: &'static str,
    /// remem fs, tmpfs, local disk (as [`TARGETS`]).
    pub figures: [f64; 3],
    /// remem fs / local disk.
    pub ratio_to_disk: f64,
}

impl FsRow {
    pub fn new(workload: String, unit: &'static str, figures: [f64; 3]) -> FsRow {
        let ratio_to_disk = if figures[2] > 0.0 { figures[0] / figures[2] } else { f64::NAN };
        FsRow { workload, unit, figures, ratio_to_disk }
    }
}

fn figure(value: f64, unit: &str) -> String {
    match unit {
        "s" => format!("{value:.3}"),
        _ if value >= 100.0 => format!("{value:.0}"),
        _ => format!("{value:.1}"),
    }
}

/// The table: workload, unit, each target's figure, remem fs / local disk.
pub fn print_table(report: &FsBenchReport) {
    let transport = match report.transport {
        Transport::Shm => "shared memory",
        Transport::Tcp => "TCP",
    };
    println!(
        "remem bench fs: remem fs EC({},{}) over {transport}{} beside tmpfs and a local disk directory",
        report.data_splits,
        report.parity_splits,
        if report.fs_args.is_empty() {
            String::new()
        } else {
            format!(" (remem fs {})", report.fs_args.join(" "))
        },
    );
    println!(
        "fio: O_DIRECT libaio on a {} MiB file, {} s a job; sqlite3: {} rows, {} a transaction; \
         tar: {}, median of {}",
        report.fio_size_bytes >> 20,
        report.fio_seconds,
        report.sqlite_rows,
        report.sqlite_rows_per_transaction,
        report.tar_source.display(),
        report.tar_rounds
    );
    println!();
    println!(
        "| {:<32} | {:<4} | {:>10} | {:>10} | {:>10} | {:>17} |",
        "workload", "unit", TARGETS[0], TARGETS[1], TARGETS[2], "remem fs / disk"
    );
    println!("|{:-<34}|{:-<6}|{:->12}|{:->12}|{:->12}|{:->19}|", "", "", "", "", "", "");
    for row in &report.rows {
        let [remem, tmpfs, disk] = row.figures;
        println!(
            "| {:<32} | {:<4} | {:>10} | {:>10} | {:>10} | {:>16.2}x |",
            row.workload,
            row.unit,
            figure(remem, row.unit),
            figure(tmpfs, row.unit),
            figure(disk, row.unit),
            row.ratio_to_disk
        );
    }
    println!();
    println!("IOPS and MB/s: more is better (a ratio over 1 beats the disk); s: less is better.");
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}
