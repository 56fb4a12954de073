//! The report of `remem bench kv` ([`KvBenchReport`], serialized as the `--json` document) and
//! its tables ([`print_table`]).

use serde::Serialize;

use super::client::Transition;
use remem_local::stats::Summary;

#[derive(Debug, Serialize)]
pub struct KvSeries {
    /// `memcached` or `remem <scheme>`.
    pub target: String,
    pub operation: String,
    pub value_bytes: u64,
    pub connections: usize,
    pub latency: Summary,
    pub ops_per_second: f64,
    /// Error answers and misses of keys filled before the series.
    pub errors: u64,
    /// This series' p50 over memcached's for the same operation, size and connections.
    pub p50_ratio_to_memcached: Option<f64>,
    pub p99_ratio_to_memcached: Option<f64>,
    pub ops_ratio_to_memcached: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct TransitionRow {
    pub value_bytes: u64,
    /// rep(2) -> EC(8,2) by reading and rewriting (`transition <key> ec8+2 naive`).
    pub naive: Transition,
    /// eor2 -> EC(8,2) (`transition <key> ec8+2`).
    pub eor: Transition,
    /// 1 - EOR's (read + written) bytes over the naive way's.
    pub bytes_saving: f64,
    /// EOR's time over the naive way's (medians of the rounds).
    pub time_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct RaceRow {
    /// `bypass` or `no-bypass`.
    pub mode: String,
    pub value_bytes: u64,
    /// The SET racing three GETs.
    pub set: Summary,
    /// GETs sent right after a SET of the same key, on other connections.
    pub get_after_set: Summary,
    /// How many of those returned the new value (the others returned the old one).
    pub get_after_set_new_values: u64,
    /// Four GETs of one key at once.
    pub get_after_get: Summary,
}

#[derive(Debug, Serialize)]
pub struct KvBenchReport {
    pub nodes: usize,
    /// How remem kv reached the nodes.
    pub transport: remem_frontend::transport_arg::Transport,
    pub memcached_version: String,
    /// Whether `remem kv` was measured (false only while the binary has no `kv` command).
    pub remem_kv: bool,
    pub series: Vec<KvSeries>,
    pub transitions: Vec<TransitionRow>,
    /// Racing reads with and without the work table's bypassing; ratio = bypass / no-bypass.
    pub races: Vec<RaceRow>,
    pub warnings: Vec<String>,
}

/// `100 B`, `4 KiB`, `1.5 MiB`: sizes as the flags name them.
fn size_text(bytes: u64) -> String {
    for (unit, size) in [("MiB", 1u64 << 20), ("KiB", 1 << 10)] {
        if bytes >= size {
            return if bytes.is_multiple_of(size) {
                format!("{} {unit}", bytes / size)
            } else {
                format!("{:.1} {unit}", bytes as f64 / size as f64)
            };
        }
    }
    format!("{bytes} B")
}

fn ratio_text(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_owned(), |value| format!("{value:.2}"))
}

fn transport_name(transport: remem_frontend::transport_arg::Transport) -> &'static str {
    match transport {
        remem_frontend::transport_arg::Transport::Tcp => "TCP",
        remem_frontend::transport_arg::Transport::Shm => "shared memory",
    }
}

pub fn print_table(report: &KvBenchReport) {
    println!(
        "GET and SET from outside, {} vs remem kv on {} local nodes over {}",
        report.memcached_version,
        report.nodes,
        transport_name(report.transport)
    );
    println!("(ratios: this row over memcached's row of the same operation, size and connections)");
    println!(
        "{:<4} {:>9} {:>5}  {:<14} {:>9} {:>9} {:>11} {:>7} {:>7} {:>7} {:>6}",
        "op", "size", "conns", "target", "p50 us", "p99 us", "ops/s", "p50 x", "p99 x", "ops x", "errors"
    );
    let mut rows: Vec<&KvSeries> = report.series.iter().collect();
    rows.sort_by(|a, b| {
        (&a.operation, a.value_bytes, a.connections).cmp(&(&b.operation, b.value_bytes, b.connections))
    });
    for row in rows {
        println!(
            "{:<4} {:>9} {:>5}  {:<14} {:>9.1} {:>9.1} {:>11.0} {:>7} {:>7} {:>7} {:>6}",
            row.operation,
            size_text(row.value_bytes),
            row.connections,
            row.target,
            row.latency.p50_us,
            row.latency.p99_us,
            row.ops_per_second,
            ratio_text(row.p50_ratio_to_memcached),
            ratio_text(row.p99_ratio_to_memcached),
            ratio_text(row.ops_ratio_to_memcached),
            row.errors
        );
    }
    if !report.transitions.is_empty() {
        println!();
        println!("transition to ec8+2: naive (rep2 object read and rewritten) vs EOR (eor2 object)");
        println!(
            "{:>9}  {:>11} {:>11} {:>9}  {:>11} {:>11} {:>9}  {:>8} {:>7}",
            "size",
            "naive read",
            "naive wrt",
            "naive us",
            "eor read",
            "eor wrt",
            "eor us",
            "saving",
            "time x"
        );
        for row in &report.transitions {
            println!(
                "{:>9}  {:>11} {:>11} {:>9}  {:>11} {:>11} {:>9}  {:>7.0}% {:>7.2}",
                size_text(row.value_bytes),
                row.naive.bytes_read,
                row.naive.bytes_written,
                row.naive.microseconds,
                row.eor.bytes_read,
                row.eor.bytes_written,
                row.eor.microseconds,
                100.0 * row.bytes_saving,
                row.time_ratio
            );
        }
    }
    print_races(report);
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}

/// The racing-reads table: one key read while it is being set, and read by several at once.
fn print_races(report: &KvBenchReport) {
    if report.races.is_empty() {
        return;
    }
    println!();
    println!("racing reads of one key (ec8+2): 1 SET + 3 GETs at once, and 4 GETs at once");
    println!(
        "{:<10} {:>9}  {:>9} {:>9}  {:>12} {:>12} {:>8}  {:>12} {:>12}",
        "mode",
        "size",
        "set p50",
        "set p99",
        "get|set p50",
        "get|set p99",
        "new",
        "get|get p50",
        "get|get p99"
    );
    for row in &report.races {
        println!(
            "{:<10} {:>9}  {:>9.1} {:>9.1}  {:>12.1} {:>12.1} {:>7.0}%  {:>12.1} {:>12.1}",
            row.mode,
            size_text(row.value_bytes),
            row.set.p50_us,
            row.set.p99_us,
            row.get_after_set.p50_us,
            row.get_after_set.p99_us,
            100.0 * row.get_after_set_new_values as f64 / row.get_after_set.count.max(1) as f64,
            row.get_after_get.p50_us,
            row.get_after_get.p99_us
        );
    }
    if let [bypass, no_bypass] = &report.races[..] {
        println!(
            "bypass / no-bypass p50: get after set {:.2}, get after get {:.2}",
            bypass.get_after_set.p50_us / no_bypass.get_after_set.p50_us,
            bypass.get_after_get.p50_us / no_bypass.get_after_get.p50_us
        );
    }
}
