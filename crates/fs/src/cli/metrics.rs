//! What `remem fs` tells outside about itself: Prometheus metrics with `--metrics ADDRESS`, and
//! the region report beside the cluster file that `remem status` shows (as nbd and kv do).
//!
//! Two places count. The FUSE request thread reports each answered file request to
//! [`FsMetrics`] (a `crate::FileOpObserver`): by kind, with bytes, errors and, for read,
//! write and fsync, a latency histogram. [`ReportingStore`], the page store under the file
//! system, counts the page ops those requests became (reads, writes, errors, decoded reads) and,
//! about once a second from the healer thread, takes the client's region health for the
//! report and the range gauges. Every counter is a relaxed atomic in one `Arc<FsMetrics>`: the
//! request path takes no lock the scrape thread could hold and allocates nothing per op, and a
//! scrape renders from the atomics without touching the file system's lock.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use remem_client::{OpDone, PageError, PageOp, RegionHealth};
use remem_frontend::client_report::ClientReporter;
use remem_frontend::metrics::{Exposition, Histogram, LATENCY_BUCKETS_SECONDS};

use crate::{FileOp, FileOpObserver, HomedClient, PageStore};

/// How often the healer refreshes the region report and the range gauges.
const REGION_PERIOD: Duration = Duration::from_secs(1);

const KINDS: usize = FileOp::ALL.len();

/// A latency histogram over [`LATENCY_BUCKETS_SECONDS`] that one thread records into and
/// another reads, without a lock.
#[derive(Debug, Default)]
struct AtomicHistogram {
    buckets: [AtomicU64; 15],
    count: AtomicU64,
    sum_nanoseconds: AtomicU64,
}

impl AtomicHistogram {
    fn observe(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        if let Some(bucket) = LATENCY_BUCKETS_SECONDS.iter().position(|&bound| seconds <= bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanoseconds = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanoseconds.fetch_add(nanoseconds, Ordering::Relaxed);
    }

    /// A copy to render. Counters read one by one may disagree by the ops of the moment; a
    /// scrape a moment later agrees again.
    fn snapshot(&self) -> Histogram {
        let buckets = std::array::from_fn(|bucket| self.buckets[bucket].load(Ordering::Relaxed));
        let sum_seconds = self.sum_nanoseconds.load(Ordering::Relaxed) as f64 / 1e9;
        Histogram::from_counts(buckets, self.count.load(Ordering::Relaxed), sum_seconds)
    }
}

/// The file system's counters; see the module docs for who writes which.
#[derive(Debug, Default)]
pub struct FsMetrics {
    ops: [AtomicU64; KINDS],
    errors: [AtomicU64; KINDS],
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    read_latency: AtomicHistogram,
    write_latency: AtomicHistogram,
    fsync_latency: AtomicHistogram,
    page_reads: AtomicU64,
    page_writes: AtomicU64,
    /// Each page op from its start in the engine to its completion: the engine and the nodes,
    /// without FUSE (the fault path's split, docs/APPS.md).
    page_read_latency: AtomicHistogram,
    page_write_latency: AtomicHistogram,
    page_read_errors: AtomicU64,
    page_write_errors: AtomicU64,
    decoded_reads: AtomicU64,
    rebuilds_done: AtomicU64,
    ranges: AtomicU64,
    ranges_healthy: AtomicU64,
    ranges_degraded: AtomicU64,
    ranges_rebuilding: AtomicU64,
    ranges_lost: AtomicU64,
}

impl FileOpObserver for FsMetrics {
    fn file_op(&self, op: FileOp, bytes: u64, latency: Duration, failed: bool) {
        self.ops[op.index()].fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors[op.index()].fetch_add(1, Ordering::Relaxed);
        }
        match op {
            FileOp::Read => {
                self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
                self.read_latency.observe(latency);
            }
            FileOp::Write => {
                self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
                self.write_latency.observe(latency);
            }
            FileOp::Fsync => self.fsync_latency.observe(latency),
            _ => {}
        }
    }
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> f64 {
    counter.load(Ordering::Relaxed) as f64
}

impl FsMetrics {
    /// The client's region health and rebuilds, for the range gauges.
    fn set_regions(&self, regions: &[RegionHealth], rebuilds_done: u64) {
        let sum = |field: fn(&RegionHealth) -> u64| regions.iter().map(field).sum::<u64>();
        let store = |counter: &AtomicU64, value: u64| counter.store(value, Ordering::Relaxed);
        store(&self.rebuilds_done, rebuilds_done);
        store(&self.ranges, sum(|region| region.ranges));
        store(&self.ranges_healthy, sum(|region| region.healthy));
        store(&self.ranges_degraded, sum(|region| region.degraded_by_missing_splits.iter().sum()));
        store(&self.ranges_rebuilding, sum(|region| region.rebuilding));
        store(&self.ranges_lost, sum(|region| region.lost));
    }

    /// The exposition text, from the atomics as they are now.
    pub fn render(&self) -> String {
        let ops: Vec<(&str, f64)> =
            FileOp::ALL.iter().map(|op| (op.name(), load(&self.ops[op.index()]))).collect();
        let errors: Vec<(&str, f64)> =
            FileOp::ALL.iter().map(|op| (op.name(), load(&self.errors[op.index()]))).collect();
        let mut out = Exposition::default();
        out.counters("remem_fs_ops_total", "File system requests answered, by kind.", "op", &ops)
            .counters(
                "remem_fs_op_errors_total",
                "File system requests answered with an error.",
                "op",
                &errors,
            )
            .counters(
                "remem_fs_bytes_total",
                "Bytes returned by reads and taken by writes.",
                "op",
                &[("read", load(&self.read_bytes)), ("write", load(&self.write_bytes))],
            )
            .histograms(
                "remem_fs_op_seconds",
                "Latency of a file request, from its arrival at the file system to its answer.",
                "op",
                &[
                    ("read", &self.read_latency.snapshot()),
                    ("write", &self.write_latency.snapshot()),
                    ("fsync", &self.fsync_latency.snapshot()),
                ],
            )
            .histograms(
                "remem_fs_page_op_seconds",
                "Latency of a page op in the client, from its start to its completion (engine and nodes).",
                "op",
                &[
                    ("read", &self.page_read_latency.snapshot()),
                    ("write", &self.page_write_latency.snapshot()),
                ],
            )
            .counter("remem_fs_page_reads_total", "Page reads the client did.", load(&self.page_reads))
            .counter("remem_fs_page_writes_total", "Page writes the client did.", load(&self.page_writes))
            .counter(
                "remem_fs_page_read_errors_total",
                "Page reads that failed.",
                load(&self.page_read_errors),
            )
            .counter(
                "remem_fs_page_write_errors_total",
                "Page writes that failed.",
                load(&self.page_write_errors),
            )
            .counter(
                "remem_fs_decoded_reads_total",
                "Page reads that decoded from parity (a data split missing or late).",
                load(&self.decoded_reads),
            )
            .counter(
                "remem_fs_rebuilds_done_total",
                "Slab rebuilds the client completed.",
                load(&self.rebuilds_done),
            )
            .gauge("remem_fs_ranges", "Address ranges of the file system's client.", load(&self.ranges))
            .gauge(
                "remem_fs_ranges_healthy",
                "Ranges with every split available.",
                load(&self.ranges_healthy),
            )
            .gauge("remem_fs_ranges_degraded", "Readable ranges missing splits.", load(&self.ranges_degraded))
            .gauge(
                "remem_fs_ranges_rebuilding",
                "Ranges with a split being rebuilt.",
                load(&self.ranges_rebuilding),
            )
            .gauge("remem_fs_ranges_lost", "Ranges missing more splits than r.", load(&self.ranges_lost));
        out.finish()
    }
}

/// The file system's page store: the saved-map client, with its page ops counted (when there
/// are metrics) and its region health published for `remem status`.
pub struct ReportingStore {
    inner: HomedClient,
    metrics: Option<Arc<FsMetrics>>,
    /// The region report beside the cluster file (none with etcd: `remem status --etcd` asks
    /// the nodes).
    reporter: Option<ClientReporter>,
    /// Whether each op of the running batch is a read; reused, so no allocation per batch.
    reads: Vec<bool>,
    regions_at: Option<Instant>,
}

impl ReportingStore {
    /// Wraps the file system's client; its report goes beside `cluster_path` (if there is a
    /// cluster file) under `name` (the mount point).
    pub fn new(
        inner: HomedClient,
        metrics: Option<Arc<FsMetrics>>,
        cluster_path: Option<&Path>,
        name: &str,
    ) -> ReportingStore {
        let reporter =
            cluster_path.map(|path| ClientReporter::new(path, "fs", name, inner.client.client_id()));
        ReportingStore { inner, metrics, reporter, reads: Vec::new(), regions_at: None }
    }
}

impl PageStore for ReportingStore {
    fn page_bytes(&self) -> usize {
        self.inner.page_bytes()
    }

    fn page_count(&self) -> u64 {
        self.inner.page_count()
    }

    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        let Some(metrics) = &self.metrics else { return self.inner.execute(ops, on_done) };
        self.reads.clear();
        self.reads.extend(ops.iter().map(|op| matches!(op, PageOp::Read { .. })));
        let reads = &self.reads;
        self.inner.client.execute(ops, |done| {
            let read = reads.get(done.index).copied().unwrap_or(false);
            let latency = done.started.elapsed();
            let errors = u64::from(done.result.is_err());
            if read {
                metrics.page_read_latency.observe(latency);
                add(&metrics.page_reads, 1);
                add(&metrics.page_read_errors, errors);
                add(&metrics.decoded_reads, u64::from(done.decoded));
            } else {
                metrics.page_write_latency.observe(latency);
                add(&metrics.page_writes, 1);
                add(&metrics.page_write_errors, errors);
            }
            on_done(done);
        });
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.inner.discard_page(page)
    }

    fn background(&mut self) {
        self.inner.background();
        if self.regions_at.is_some_and(|at| at.elapsed() < REGION_PERIOD) {
            return;
        }
        self.regions_at = Some(Instant::now());
        let client = &self.inner.client;
        let regions = client.region_health();
        if let Some(metrics) = &self.metrics {
            metrics.set_regions(&regions, client.regeneration_status().done);
        }
        if let Some(reporter) = &mut self.reporter {
            reporter.publish(|| regions);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_ops_are_counted_by_kind_with_bytes_and_latency() {
        let metrics = FsMetrics::default();
        metrics.file_op(FileOp::Write, 4096, Duration::from_micros(30), false);
        metrics.file_op(FileOp::Write, 0, Duration::from_millis(2), true);
        metrics.file_op(FileOp::Read, 100, Duration::from_secs(3), false);
        metrics.file_op(FileOp::Lookup, 0, Duration::from_micros(1), true);
        let text = metrics.render();
        for line in [
            "remem_fs_ops_total{op=\"write\"} 2",
            "remem_fs_op_errors_total{op=\"write\"} 1",
            "remem_fs_op_errors_total{op=\"lookup\"} 1",
            "remem_fs_bytes_total{op=\"write\"} 4096",
            "remem_fs_bytes_total{op=\"read\"} 100",
            "remem_fs_op_seconds_bucket{op=\"write\",le=\"0.00005\"} 1",
            "remem_fs_op_seconds_bucket{op=\"write\",le=\"0.0025\"} 2",
            // Three seconds is above the last bound: only in +Inf and the count.
            "remem_fs_op_seconds_bucket{op=\"read\",le=\"1\"} 0",
            "remem_fs_op_seconds_bucket{op=\"read\",le=\"+Inf\"} 1",
            "remem_fs_op_seconds_sum{op=\"read\"} 3",
            "remem_fs_op_seconds_count{op=\"fsync\"} 0",
        ] {
            assert!(text.lines().any(|candidate| candidate == line), "no {line:?} in\n{text}");
        }
    }
}
