//! What the pager did, counted with atomics so the report at exit reads them while the handler
//! runs: faults by kind, evictions, write-backs, and where a fetched fault's time went.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Log2 buckets of nanoseconds: bucket b holds [2^b, 2^(b+1)).
pub struct Histogram([AtomicU64; 40]);

impl Histogram {
    const fn new() -> Histogram {
        Histogram([const { AtomicU64::new(0) }; 40])
    }

    pub fn record(&self, elapsed: Duration) {
        let nanos = elapsed.as_nanos().clamp(1, u64::MAX as u128) as u64;
        self.0[(63 - nanos.leading_zeros() as usize).min(39)].fetch_add(1, Relaxed);
    }

    /// The upper edge of the bucket that holds quantile `q`, in microseconds (0 when empty).
    pub fn quantile_us(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self.0.iter().map(|count| count.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let wanted = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return (1u64 << (bucket + 1)) as f64 / 1000.0;
            }
        }
        0.0
    }
}

pub struct Stats {
    pub zero_faults: AtomicU64,
    /// Pages of zeros installed for a write (a never-written page, or one whose bytes are
    /// gone), each a page of its own; reads map the shared zero page.
    pub zero_copies: AtomicU64,
    pub victim_faults: AtomicU64,
    pub fetch_faults: AtomicU64,
    pub prefetched: AtomicU64,
    pub write_faults: AtomicU64,
    pub lost_pages: AtomicU64,
    pub evictions: AtomicU64,
    /// Evictions made by a move of a sequential run of pages (`Pager::evict_run`).
    pub evicted_in_runs: AtomicU64,
    pub write_backs: AtomicU64,
    pub write_back_errors: AtomicU64,
    pub unevictable: AtomicU64,
    pub peak_resident_pages: AtomicU64,
    pub managed_bytes: AtomicU64,
    /// A fetched fault's fetch from remem and its UFFDIO_COPY.
    pub fetch: Histogram,
    pub copy: Histogram,
    /// A victim's move back.
    pub move_back: Histogram,
}

pub static STATS: Stats = Stats {
    zero_faults: AtomicU64::new(0),
    zero_copies: AtomicU64::new(0),
    victim_faults: AtomicU64::new(0),
    fetch_faults: AtomicU64::new(0),
    prefetched: AtomicU64::new(0),
    write_faults: AtomicU64::new(0),
    lost_pages: AtomicU64::new(0),
    evictions: AtomicU64::new(0),
    evicted_in_runs: AtomicU64::new(0),
    write_backs: AtomicU64::new(0),
    write_back_errors: AtomicU64::new(0),
    unevictable: AtomicU64::new(0),
    peak_resident_pages: AtomicU64::new(0),
    managed_bytes: AtomicU64::new(0),
    fetch: Histogram::new(),
    copy: Histogram::new(),
    move_back: Histogram::new(),
};

impl Stats {
    /// One JSON object (the report `remem run` prints).
    pub fn json(&self) -> String {
        let count = |counter: &AtomicU64| counter.load(Relaxed);
        format!(
            "{{\"zero_faults\":{},\"zero_copies\":{},\"victim_faults\":{},\"fetch_faults\":{},\"prefetched\":{},\"write_faults\":{},\
             \"lost_pages\":{},\"evictions\":{},\"evicted_in_runs\":{},\"write_backs\":{},\"write_back_errors\":{},\"unevictable\":{},\
             \"peak_resident_pages\":{},\"managed_bytes\":{},\"fetch_p50_us\":{},\"fetch_p99_us\":{},\
             \"copy_p50_us\":{},\"copy_p99_us\":{},\"move_back_p50_us\":{}}}",
            count(&self.zero_faults),
            count(&self.zero_copies),
            count(&self.victim_faults),
            count(&self.fetch_faults),
            count(&self.prefetched),
            count(&self.write_faults),
            count(&self.lost_pages),
            count(&self.evictions),
            count(&self.evicted_in_runs),
            count(&self.write_backs),
            count(&self.write_back_errors),
            count(&self.unevictable),
            count(&self.peak_resident_pages),
            count(&self.managed_bytes),
            self.fetch.quantile_us(0.5),
            self.fetch.quantile_us(0.99),
            self.copy.quantile_us(0.5),
            self.copy.quantile_us(0.99),
            self.move_back.quantile_us(0.5),
        )
    }
}
