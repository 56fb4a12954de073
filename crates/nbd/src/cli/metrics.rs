//! `remem nbd --metrics`: what the export's client did, per page op, in Prometheus's text format.
//!
//! Counted where the server hands page ops to its client (`WatchedClient::execute`, in `cli`), so every
//! NBD read, write, trim and zero is seen as the page ops it became. The snapshot is rendered on
//! the server's background work (about once a second) and served from another thread, so the
//! data path takes no lock of the metrics server and allocates nothing per op.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remem_client::{Client, OpDone, PageOp};

use remem_frontend::metrics::{Exposition, Histogram};

/// What a page op was, remembered per batch slot while its batch runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Read,
    Write,
    Other,
}

/// Counters and latency histograms of the export's page ops.
pub struct NbdMetrics {
    reads: Histogram,
    writes: Histogram,
    read_errors: u64,
    write_errors: u64,
    decoded_reads: u64,
    /// The kinds of the running batch's ops, by index; reused, so no allocation per batch.
    kinds: Vec<OpKind>,
    snapshot: Arc<Mutex<String>>,
    rendered: Option<Instant>,
}

impl NbdMetrics {
    /// Metrics whose rendered text lands in `snapshot`.
    pub fn new(snapshot: Arc<Mutex<String>>) -> NbdMetrics {
        NbdMetrics {
            reads: Histogram::default(),
            writes: Histogram::default(),
            read_errors: 0,
            write_errors: 0,
            decoded_reads: 0,
            kinds: Vec::new(),
            snapshot,
            rendered: None,
        }
    }

    /// Remembers the kinds of a batch's ops before it runs.
    pub fn start_batch(&mut self, ops: &[PageOp<'_>]) {
        self.kinds.clear();
        self.kinds.extend(ops.iter().map(|op| match op {
            PageOp::Read { .. } => OpKind::Read,
            PageOp::Write { .. } | PageOp::WriteData { .. } | PageOp::WriteParity { .. } => OpKind::Write,
            _ => OpKind::Other,
        }));
    }

    /// One op of the batch completed; its latency is wall time from its start to now.
    pub fn op_done(&mut self, done: &OpDone) {
        let latency = done.started.elapsed();
        match self.kinds.get(done.index) {
            Some(OpKind::Read) => {
                self.reads.observe(latency);
                self.read_errors += u64::from(done.result.is_err());
                self.decoded_reads += u64::from(done.decoded);
            }
            Some(OpKind::Write) => {
                self.writes.observe(latency);
                self.write_errors += u64::from(done.result.is_err());
            }
            _ => {}
        }
    }

    /// Renders the snapshot, at most once a second.
    pub fn render(&mut self, client: &Client) {
        if self.rendered.is_some_and(|rendered| rendered.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.rendered = Some(Instant::now());
        let mut out = Exposition::default();
        out.counter(
            "remem_nbd_page_reads_total",
            "Page reads the export's client did.",
            self.reads.count() as f64,
        )
        .counter(
            "remem_nbd_page_writes_total",
            "Page writes the export's client did.",
            self.writes.count() as f64,
        )
        .counter("remem_nbd_page_read_errors_total", "Page reads that failed (EIO).", self.read_errors as f64)
        .counter(
            "remem_nbd_page_write_errors_total",
            "Page writes that failed (EIO).",
            self.write_errors as f64,
        )
        .counter(
            "remem_nbd_decoded_reads_total",
            "Page reads that decoded from parity (a data split missing or late).",
            self.decoded_reads as f64,
        )
        .histograms(
            "remem_nbd_page_op_seconds",
            "Latency of one page op, from its start to its completion.",
            "op",
            &[("read", &self.reads), ("write", &self.writes)],
        )
        .counter(
            "remem_nbd_rebuilds_done_total",
            "Slab rebuilds the client completed.",
            client.regeneration_status().done as f64,
        );
        let regions = client.region_health();
        let sum =
            |field: fn(&remem_client::RegionHealth) -> u64| regions.iter().map(field).sum::<u64>() as f64;
        out.gauge("remem_nbd_ranges", "Address ranges of the export.", sum(|region| region.ranges))
            .gauge(
                "remem_nbd_ranges_healthy",
                "Ranges with every split available.",
                sum(|region| region.healthy),
            )
            .gauge(
                "remem_nbd_ranges_degraded",
                "Readable ranges missing splits.",
                sum(|region| region.degraded_by_missing_splits.iter().sum()),
            )
            .gauge(
                "remem_nbd_ranges_rebuilding",
                "Ranges with a split being rebuilt.",
                sum(|region| region.rebuilding),
            )
            .gauge("remem_nbd_ranges_lost", "Ranges missing more splits than r.", sum(|region| region.lost));
        if let Ok(mut shared) = self.snapshot.lock() {
            *shared = out.finish();
        }
    }
}
