//! Floors of `remem bench pages` over TCP: for every scheme, the raw fan-out its page ops make,
//! measured on the same client, transport and queue depth as the scheme's series, in alternating
//! rounds.
//!
//! A floor must be a floor. A probe (`PageOp::Probe`) sends a read's one-split requests to the
//! nodes that a read of a page of the same range asks, in split order, and completes at the
//! reply that the read completes at; it does none of the read's own work (no checksum, no copy
//! into the page, no version check, no decoding) and always reads slot 0, warm in the node's
//! cache. So a read should never beat its floor: one that does by more than noise means the
//! measurement is wrong, and the bench prints a WARNING naming both.
//!
//! Series and floor run interleaved, A B A B, in rounds of a few hundred ops over the same pages,
//! so the drift of these shared 2-core machines (another process compiling, a node thread moved
//! to the other vCPU) hits both sides alike.
//!
//! Writes have no exact floor: a probe only reads, so a write's payload cannot travel in the
//! requests. Beside each write series runs a proxy instead, labelled as one everywhere: k+r
//! one-split reads of page/k bytes to the range's k+r nodes, done at the last reply (same nodes,
//! same messages, same payload bytes, but the payload travels in the replies).

use std::time::Duration;

use anyhow::{Context, Result};
use remem_client::{Client, PageOp, Shape};
use serde::Serialize;

use crate::bench::{result, run_chunk, Operation, SeriesResult};
use remem_local::stats::Samples;

/// A series whose p50 is below this fraction of its floor's p50 beats the floor by more than
/// the run-to-run noise of these machines (a few percent at p50 over thousands of ops).
pub const NOISE_RATIO: f64 = 0.95;

/// The raw fan-out of one op: `asked` one-split reads to the first `asked` nodes of the page's
/// range, done at the `need`-th reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FanOut {
    pub asked: usize,
    pub need: usize,
    pub split_bytes: usize,
    /// True for a read's floor; false for a write's proxy (payload in the replies, not the
    /// requests), which is not a strict floor.
    pub exact: bool,
}

impl FanOut {
    /// What a read of `shape` sends on a healthy cluster: k + delta splits (data splits first),
    /// done at the k-th valid one.
    pub fn read(shape: Shape, page_bytes: usize) -> FanOut {
        let k = shape.data_splits;
        FanOut {
            asked: k + shape.extra_reads.min(shape.parity_splits),
            need: k,
            split_bytes: page_bytes / k,
            exact: true,
        }
    }

    /// The closest the probe API comes to a write of `shape`: k + r splits, done at the last.
    pub fn write_proxy(shape: Shape, page_bytes: usize) -> FanOut {
        FanOut {
            asked: shape.total_splits(),
            need: shape.total_splits(),
            split_bytes: page_bytes / shape.data_splits,
            exact: false,
        }
    }

    /// "9x512B->8": nine one-split reads of 512 bytes, done at the eighth reply.
    pub fn label(&self) -> String {
        format!("{}x{}B->{}", self.asked, self.split_bytes, self.need)
    }
}

/// One prepared probe per distinct node list among a client's ranges, so that the floor op of a
/// page goes to exactly the nodes the page's own op goes to.
pub struct RangeProbes {
    pub fan_out: FanOut,
    probe_of_range: Vec<usize>,
    pages_per_range: u64,
}

impl RangeProbes {
    /// Maps one probe slab on each node of every distinct node list (at most as many slabs as
    /// the ranges hold already).
    pub fn prepare(client: &mut Client, fan_out: FanOut) -> Result<RangeProbes> {
        let mut prepared: Vec<(Vec<usize>, usize)> = Vec::new();
        let mut probe_of_range = Vec::with_capacity(client.ranges().len());
        for range in 0..client.ranges().len() {
            let nodes = client.range_nodes(range)[..fan_out.asked].to_vec();
            let probe = match prepared.iter().find(|(known, _)| *known == nodes) {
                Some(&(_, probe)) => probe,
                None => {
                    let probe =
                        client.prepare_probe(&nodes, fan_out.split_bytes, fan_out.need).with_context(
                            || format!("preparing the {} probe of range {range}", fan_out.label()),
                        )?;
                    prepared.push((nodes, probe));
                    probe
                }
            };
            probe_of_range.push(probe);
        }
        Ok(RangeProbes { fan_out, probe_of_range, pages_per_range: client.pages_per_range() })
    }

    fn probe_of_page(&self, page: u64) -> usize {
        self.probe_of_range[(page / self.pages_per_range) as usize]
    }
}

/// Measures `scheme`'s `operation` over `order` interleaved with its floor (or proxy) `probes`,
/// and returns the scheme's series, the floor's series and the comparison of the two.
pub fn measure_beside_floor(
    client: &mut Client,
    scheme: &str,
    order: &[u64],
    queue_depth: usize,
    operation: Operation,
    page_bytes: usize,
    probes: &RangeProbes,
) -> Result<(SeriesResult, SeriesResult, FloorComparison)> {
    let floor = floor_name(scheme, &probes.fan_out);
    eprintln!(
        "{scheme}: {} qd{queue_depth} x{}, interleaved with '{floor}' ({}) ...",
        operation.name(),
        order.len(),
        probes.fan_out.label()
    );
    let measured = run_interleaved(client, order, queue_depth, operation, page_bytes, probes)?;
    let (samples, elapsed) = measured.series;
    let scheme_result = result(scheme, operation.name(), queue_depth, samples, elapsed);
    let (samples, elapsed) = measured.floor;
    let mut floor_result = result(&floor, operation.name(), queue_depth, samples, elapsed);
    floor_result.fan_out = Some(probes.fan_out);
    let comparison = FloorComparison::new(&scheme_result, &floor_result, probes.fan_out);
    Ok((scheme_result, floor_result, comparison))
}

/// Both sides of one interleaved measurement; each elapsed time counts only its own rounds.
pub struct Interleaved {
    pub series: (Samples, Duration),
    pub floor: (Samples, Duration),
}

/// Ops per round: small at queue depth 1, so that a round lasts tens of milliseconds and drift
/// slower than that hits both sides; a full chunk at higher depths, where every round drains the
/// pipeline once (on both sides alike).
fn round_ops(queue_depth: usize) -> usize {
    if queue_depth == 1 {
        256
    } else {
        crate::bench::CHUNK_OPS
    }
}

/// Runs `order` as `operation`s at `queue_depth`, and the same pages' floor probes, alternating
/// one round of each (series first). Every error is fatal.
pub fn run_interleaved(
    client: &mut Client,
    order: &[u64],
    queue_depth: usize,
    operation: Operation,
    page_bytes: usize,
    probes: &RangeProbes,
) -> Result<Interleaved> {
    client.set_max_in_flight(queue_depth);
    let round = round_ops(queue_depth);
    let mut buffers = vec![vec![0u8; page_bytes]; round.min(order.len())];
    for (index, buffer) in buffers.iter_mut().enumerate() {
        remem_local::pattern::fill(buffer, index as u64, 0, 42);
    }
    let mut series = (Samples::with_capacity(order.len()), Duration::ZERO);
    let mut floor = (Samples::with_capacity(order.len()), Duration::ZERO);
    for pages in order.chunks(round) {
        series.1 += run_chunk(client, pages, operation, &mut buffers, &mut series.0)?;
        let mut ops: Vec<PageOp<'_>> =
            pages.iter().map(|&page| PageOp::Probe { probe: probes.probe_of_page(page) }).collect();
        floor.1 += execute_probes(client, &mut ops, &mut floor.0)?;
    }
    Ok(Interleaved { series, floor })
}

fn execute_probes(client: &mut Client, ops: &mut [PageOp<'_>], samples: &mut Samples) -> Result<Duration> {
    let mut first_error = None;
    let started = std::time::Instant::now();
    client.execute(ops, |done| {
        samples.push(done.latency);
        if let Err(error) = done.result {
            first_error.get_or_insert(error);
        }
    });
    let elapsed = started.elapsed();
    match first_error {
        Some(error) => Err(error).context("probe failed"),
        None => Ok(elapsed),
    }
}

/// The name of a scheme's floor series: "floor: rep(2)" beside reads, "proxy: rep(2)" beside
/// writes, so that nothing calls the write proxy a floor.
pub fn floor_name(scheme: &str, fan_out: &FanOut) -> String {
    format!("{}: {scheme}", if fan_out.exact { "floor" } else { "proxy" })
}

/// One scheme series beside its floor (or, for writes, its proxy), same run, same rounds.
#[derive(Debug, Serialize)]
pub struct FloorComparison {
    pub scheme: String,
    pub operation: String,
    pub queue_depth: usize,
    /// Name of the floor series in `series`.
    pub floor: String,
    pub fan_out: FanOut,
    pub series_p50_us: f64,
    pub series_p99_us: f64,
    pub floor_p50_us: f64,
    pub floor_p99_us: f64,
    /// Series over floor: at or above 1 when the floor is honest.
    pub p50_ratio: f64,
    pub p99_ratio: f64,
    /// p50_ratio < NOISE_RATIO.
    pub beats_floor: bool,
}

impl FloorComparison {
    pub fn new(scheme: &SeriesResult, floor: &SeriesResult, fan_out: FanOut) -> FloorComparison {
        let p50_ratio = scheme.latency.p50_us / floor.latency.p50_us;
        FloorComparison {
            scheme: scheme.name.clone(),
            operation: scheme.operation.clone(),
            queue_depth: scheme.queue_depth,
            floor: floor.name.clone(),
            fan_out,
            series_p50_us: scheme.latency.p50_us,
            series_p99_us: scheme.latency.p99_us,
            floor_p50_us: floor.latency.p50_us,
            floor_p99_us: floor.latency.p99_us,
            p50_ratio,
            p99_ratio: scheme.latency.p99_us / floor.latency.p99_us,
            beats_floor: p50_ratio < NOISE_RATIO,
        }
    }

    /// The WARNING line when the series beats its floor by more than noise.
    pub fn warning(&self) -> Option<String> {
        if !self.beats_floor {
            return None;
        }
        let kind = if self.fan_out.exact { "floor" } else { "proxy (not a strict floor)" };
        Some(format!(
            "WARNING: {} {} qd{} p50 {:.1} us beats its {kind} '{}' ({}) p50 {:.1} us: ratio {:.2} < {NOISE_RATIO}",
            self.scheme,
            self.operation,
            self.queue_depth,
            self.series_p50_us,
            self.floor,
            self.fan_out.label(),
            self.floor_p50_us,
            self.p50_ratio,
        ))
    }
}

/// The table of series against floors, then the warnings.
pub fn print_comparisons(comparisons: &[FloorComparison]) {
    println!("each series beside its floor, interleaved in rounds on the same client (series / floor):");
    println!(
        "{:<24} {:>3} {:>15} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6}",
        "series", "qd", "fan-out", "p50 us", "floor", "p99 us", "floor", "p50 x", "p99 x"
    );
    for c in comparisons {
        println!(
            "{:<24} {:>3} {:>15} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.2} {:>6.2}",
            format!("{} {}", c.scheme, c.operation),
            c.queue_depth,
            format!("{}{}", c.fan_out.label(), if c.fan_out.exact { "" } else { "*" }),
            c.series_p50_us,
            c.floor_p50_us,
            c.series_p99_us,
            c.floor_p99_us,
            c.p50_ratio,
            c.p99_ratio,
        );
    }
    println!(
        "(* writes: no exact floor, probes only read; the proxy sends as many one-split reads as the\n   write sends splits, done at the last, the payload in the replies instead of the requests)"
    );
    let warnings: Vec<String> = comparisons.iter().filter_map(FloorComparison::warning).collect();
    if warnings.is_empty() {
        println!("no series beats its floor by more than noise (every p50 ratio >= {NOISE_RATIO})");
    }
    for warning in warnings {
        println!("{warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_local::stats::Summary;

    const EC82_DELTA1: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
    const REP2: Shape = Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 };

    #[test]
    fn floors_fan_out_like_the_reads_and_writes_they_stand_for() {
        let read = FanOut::read(EC82_DELTA1, 4096);
        assert_eq!((read.asked, read.need, read.split_bytes, read.exact), (9, 8, 512, true));
        let read = FanOut::read(Shape { extra_reads: 5, ..EC82_DELTA1 }, 4096);
        assert_eq!((read.asked, read.need), (10, 8), "delta is capped at r, as the client caps it");
        let read = FanOut::read(REP2, 4096);
        assert_eq!((read.asked, read.need, read.split_bytes), (1, 1, 4096));
        let write = FanOut::write_proxy(EC82_DELTA1, 4096);
        assert_eq!((write.asked, write.need, write.split_bytes, write.exact), (10, 10, 512, false));
        assert_eq!(write.label(), "10x512B->10");
    }

    fn series(name: &str, p50_us: f64) -> SeriesResult {
        SeriesResult {
            name: name.to_string(),
            operation: "read".to_string(),
            queue_depth: 1,
            latency: Summary { count: 100, p50_us, p99_us: 2.0 * p50_us, p999_us: 0.0, mean_us: 0.0 },
            ops_per_second: 1.0,
            fan_out: None,
            sorted_nanos: Vec::new(),
        }
    }

    #[test]
    fn a_read_below_its_floor_by_more_than_noise_is_named_in_a_warning() {
        let fan_out = FanOut::read(REP2, 4096);
        let honest = FloorComparison::new(&series("rep(2)", 60.0), &series("floor: rep(2)", 62.0), fan_out);
        assert!(!honest.beats_floor, "within noise");
        assert_eq!(honest.warning(), None);
        let beaten = FloorComparison::new(&series("rep(2)", 46.0), &series("floor: rep(2)", 76.0), fan_out);
        assert!(beaten.beats_floor);
        let warning = beaten.warning().expect("a warning");
        assert!(warning.starts_with("WARNING: rep(2) read qd1"), "{warning}");
        assert!(warning.contains("'floor: rep(2)'") && warning.contains("0.61"), "{warning}");
    }
}
