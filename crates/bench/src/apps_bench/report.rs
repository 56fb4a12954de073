//! The bench's output: a table per application (each run's throughput and p50/p99 latency as
//! ratios to the all-in-memory baseline, swap traffic, verification), and a PNG per
//! application of the throughput ratio against local memory, one line per backend and the
//! failure runs as separate points.

use std::path::Path;

use anyhow::Result;

use super::{AppReport, AppRun, SwapDevice};
use crate::plot::{points_plot, PointSeries};
use remem_local::units::format_bytes;

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".to_owned(), |ratio| format!("{ratio:.2}x"))
}

fn micros(value: Option<f64>) -> String {
    value.map_or("-".to_owned(), |us| format!("{us:.0} us"))
}

fn milliseconds(value: Option<f64>) -> String {
    value.map_or("-".to_owned(), |ms| format!("{ms:.2}"))
}

fn verdict(run: &AppRun) -> String {
    match (run.verified, run.exit_code) {
        (true, _) => "yes".to_owned(),
        (false, 137) => "killed".to_owned(),
        (false, _) => "NO".to_owned(),
    }
}

fn local(run: &AppRun) -> String {
    if run.failure_run {
        format!("{:.0}%+kill", run.local_percent)
    } else {
        format!("{:.0}%", run.local_percent)
    }
}

/// One line per run, for progress on stderr.
pub fn row_line(run: &AppRun) -> String {
    format!(
        "{} {} {:.1} ops/s ({}), p50 {}, p99 {}, {} s, swap-outs {} swap-ins {}, verified {}{}",
        run.backend,
        local(run),
        run.ops_per_second,
        ratio(Some(run.throughput_ratio)),
        micros(run.latency_p50_us),
        micros(run.latency_p99_us),
        format_args!("{:.1}", run.wall_seconds),
        run.swap_out_pages,
        run.swap_in_pages,
        verdict(run),
        run.problem.as_ref().map_or(String::new(), |problem| format!(": {problem}"))
    )
}

pub fn print_table(report: &AppReport) {
    println!("== {}: {}", report.application, report.description);
    println!(
        "baseline (no limit, no swap): peak {}, {:.1} {}, p50 {}, p99 {}, {:.1} s",
        format_bytes(report.baseline_peak_bytes),
        report.baseline_ops_per_second,
        report.throughput_unit,
        micros(report.baseline_latency_p50_us),
        micros(report.baseline_latency_p99_us),
        report.baseline_wall_seconds
    );
    println!(
        "{:<16} {:>9} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8}",
        "swap backend",
        "local",
        "limit",
        "throughput",
        "p50",
        "p99",
        "time s",
        "swap-outs",
        "swap-ins",
        "verified"
    );
    for run in &report.runs {
        println!(
            "{:<16} {:>9} {:>11} {:>10} {:>9} {:>9} {:>9.1} {:>9} {:>10} {:>8} {:>8} {:>8}",
            run.backend,
            local(run),
            format_bytes(run.limit_bytes),
            ratio(Some(run.throughput_ratio)),
            ratio(run.p50_ratio),
            ratio(run.p99_ratio),
            run.wall_seconds,
            run.swap_out_pages,
            run.swap_in_pages,
            verdict(run),
            milliseconds(run.swap_device.as_ref().and_then(|device| device.read_ms_mean)),
            milliseconds(run.swap_device.as_ref().and_then(|device| device.write_ms_mean)),
        );
    }
    for run in report.runs.iter().filter(|run| run.problem.is_some() || run.failure_run) {
        let killed = match (run.failure_run, run.node_killed_after_seconds) {
            (true, Some(after)) => format!("node SIGKILLed {after:.1} s into the timed phase"),
            (true, None) => "the timed phase ended before the node kill was due".to_owned(),
            (false, _) => String::new(),
        };
        println!(
            "  {} {}: {killed}{}{}",
            run.backend,
            local(run),
            if killed.is_empty() || run.problem.is_none() { "" } else { "; " },
            run.problem.as_deref().unwrap_or("")
        );
    }
    println!(
        "throughput, p50, p99: this run's over the baseline's (throughput 1.00x = as fast as all in memory; \
         latency above 1.00x = slower); verified: checks passed and result equal to the baseline's, \
         killed (SIGKILL: the cgroup's OOM killer), or NO; read/write ms: mean time of a request in \
         the swap device (remem: loop -> FUSE -> remem fs -> engine -> nodes; disk: the whole partition)"
    );
    for run in
        report.runs.iter().filter(|run| run.swap_device.as_ref().is_some_and(|device| device.reads > 0))
    {
        let device = run.swap_device.as_ref().expect("filtered");
        println!(
            "  {} {}: {} swap reads ({:.1} KiB each, {:.1} pages swapped in per read), {:.2} s in the device \
             summed over reads; run {:.1} s vs baseline {:.1} s",
            run.backend,
            local(run),
            device.reads,
            device.read_kib as f64 / device.reads as f64,
            run.swap_in_pages as f64 / device.reads as f64,
            device.read_seconds_total,
            run.wall_seconds,
            report.baseline_wall_seconds
        );
        if let Some(line) = fault_path_line(device) {
            println!("    {line}");
        }
    }
    for run in &report.runs {
        if let Some(line) = run.pager.as_ref().and_then(pager_line) {
            println!("  {} {}: {line}", run.backend, local(run));
        }
    }
    println!();
}

/// A paged run's counters: where its faults went and what a fetched fault cost in the pager.
fn pager_line(stats: &serde_json::Value) -> Option<String> {
    let count = |name: &str| stats.get(name).and_then(serde_json::Value::as_u64);
    let micros = |name: &str| stats.get(name).and_then(serde_json::Value::as_f64);
    Some(format!(
        "pager: {} faults fetched from remem (+{} prefetched; fetch p50 <= {} us, p99 <= {} us; copy p50 <= {} us), \
         {} victim faults (moved back), {} zero faults, {} write-protect faults, {} evictions, {} write-backs, \
         {} lost pages",
        count("fetch_faults")?,
        count("prefetched")?,
        micros("fetch_p50_us")?,
        micros("fetch_p99_us")?,
        micros("copy_p50_us")?,
        count("victim_faults")?,
        count("zero_faults")?,
        count("write_faults")?,
        count("evictions")?,
        count("write_backs")?,
        count("lost_pages")?,
    ))
}

/// Throughput ratio against local memory %, one line per backend, failure runs as points.
pub fn plot_throughput(path: &Path, report: &AppReport) -> Result<()> {
    let series = throughput_series(report);
    let x_min = report.runs.iter().map(|run| run.local_percent).fold(100.0, f64::min);
    points_plot(
        path,
        &format!("{}: throughput vs local memory (1.0 = all in memory)", report.application),
        ("local memory (% of the peak)", "throughput ratio"),
        (x_min - 5.0).max(0.0)..105.0,
        1.0,
        &series,
    )
}

/// The plot's series: a joined line per backend, the failure runs as points, and the runs that
/// measured nothing apart.
fn throughput_series(report: &AppReport) -> Vec<PointSeries> {
    let mut series: Vec<PointSeries> = Vec::new();
    for run in &report.runs {
        // A run that was not verified (the OOM killer stopped it) measured nothing: it gets its
        // own unjoined series at 0 whose name says so, and the backend's line skips it.
        let (name, joined) = if !run.verified {
            (format!("{}: stopped, not measured", run.backend), false)
        } else if run.failure_run {
            (format!("{}, a node SIGKILLed", run.backend), false)
        } else {
            (run.backend.clone(), true)
        };
        let point = (run.local_percent, if run.verified { run.throughput_ratio } else { 0.0 });
        match series.iter_mut().find(|line| line.name == name) {
            Some(line) => line.points.push(point),
            None => series.push(PointSeries { name, points: vec![point], joined }),
        }
    }
    for line in &mut series {
        line.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// A run's swap request split below the loop device: the kernel's part (loop worker, FUSE
/// queue, wake-ups) is the device's mean time less the daemon's mean FUSE request time.
fn fault_path_line(device: &SwapDevice) -> Option<String> {
    let path = device.fault_path.as_ref()?;
    let side = |name: &str,
                device_ms: Option<f64>,
                fuse_ms: Option<f64>,
                page_ms: Option<f64>,
                pages: Option<f64>| {
        let (device_ms, fuse_ms) = (device_ms?, fuse_ms?);
        Some(format!(
            "a {name} {device_ms:.3} ms in the device = {:.3} ms kernel (loop, FUSE queue, wake-ups) + \
             {fuse_ms:.3} ms in remem fs ({:.2} pages of {:.3} ms in the engine and nodes)",
            device_ms - fuse_ms,
            pages.unwrap_or(0.0),
            page_ms.unwrap_or(0.0)
        ))
    };
    let parts: Vec<String> = [
        side("read", device.read_ms_mean, path.fuse_read_ms, path.page_read_ms, path.pages_per_fuse_read),
        side(
            "write",
            device.write_ms_mean,
            path.fuse_write_ms,
            path.page_write_ms,
            path.pages_per_fuse_write,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps_bench::AppRun;

    fn run(backend: &str, local_percent: f64, ratio: f64, failure_run: bool, verified: bool) -> AppRun {
        let mut run = AppRun::unmeasured(backend, local_percent, 1 << 20, failure_run);
        (run.throughput_ratio, run.verified, run.exit_code) =
            (ratio, verified, if verified { 0 } else { 137 });
        run
    }

    /// An OOM-killed run is drawn apart, at 0, under a name that says it measured nothing; the
    /// backend's line joins only the runs that measured something.
    #[test]
    fn a_run_that_measured_nothing_is_not_on_its_backends_line() {
        let report = AppReport {
            application: "test".to_owned(),
            description: String::new(),
            throughput_unit: "ops/s".to_owned(),
            baseline_peak_bytes: 1 << 20,
            baseline_wall_seconds: 1.0,
            baseline_ops_per_second: 1.0,
            baseline_latency_p50_us: None,
            baseline_latency_p99_us: None,
            baseline_result: String::new(),
            runs: vec![
                run("remem ec", 100.0, 1.0, false, true),
                run("remem ec", 50.0, 0.0, false, false),
                run("remem ec", 75.0, 0.7, false, true),
                run("remem ec", 50.0, 0.3, true, true),
            ],
        };
        let series = throughput_series(&report);
        let find = |name: &str| series.iter().find(|line| line.name == name).expect(name);
        assert_eq!(find("remem ec").points, vec![(75.0, 0.7), (100.0, 1.0)]);
        assert!(find("remem ec").joined);
        assert_eq!(find("remem ec: stopped, not measured").points, vec![(50.0, 0.0)]);
        assert!(!find("remem ec: stopped, not measured").joined);
        assert_eq!(find("remem ec, a node SIGKILLed").points, vec![(50.0, 0.3)]);
        assert_eq!(series.len(), 3);
    }
}
