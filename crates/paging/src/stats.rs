//! What the pager did, counted with atomics so the report at exit reads them while the handler
//! runs: faults by kind, evictions, write-backs, and where a fetched fault's time went.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Log2 buckets of nanoseconds: bucket b holds [2^b, 2^(b+1)); and the sum, for the mean
/// (the buckets are too coarse to split a fault's 10-20 us by them alone).
pub struct Histogram {
    buckets: [AtomicU64; 40],
    sum_nanos: AtomicU64,
}

impl Histogram {
    const fn new() -> Histogram {
        Histogram { buckets: [const { AtomicU64::new(0) }; 40], sum_nanos: AtomicU64::new(0) }
    }

    pub fn record(&self, elapsed: Duration) {
        let nanos = elapsed.as_nanos().clamp(1, u64::MAX as u128) as u64;
        self.buckets[(63 - nanos.leading_zeros() as usize).min(39)].fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|count| count.load(Relaxed)).sum()
    }

    /// The mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        (self.sum_nanos.load(Relaxed) as f64 / count as f64 / 100.0).round() / 10.0
    }

    /// The upper edge of the bucket that holds quantile `q`, in microseconds (0 when empty).
    pub fn quantile_us(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self.buckets.iter().map(|count| count.load(Relaxed)).collect();
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
    /// A victim's copy back.
    pub move_back: Histogram,
    /// The evictions after a batch of faults was served (`Pager::enforce_budget`, when it
    /// evicted): the next fault waits for them.
    pub evict: Histogram,
    /// Dropping a batch of victims (`Pager::drop_victims`: the write-back of the dirty ones),
    /// and giving back a batch of staging pages (`Pager::discard_now`).
    pub drop: Histogram,
    pub discard: Histogram,
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
    evict: Histogram::new(),
    drop: Histogram::new(),
    discard: Histogram::new(),
};

impl Stats {
    /// One JSON object (the report `remem run` prints).
    pub fn json(&self) -> String {
        let count = |counter: &AtomicU64| counter.load(Relaxed);
        format!(
            "{{\"zero_faults\":{},\"zero_copies\":{},\"victim_faults\":{},\"fetch_faults\":{},\"prefetched\":{},\"write_faults\":{},\
             \"lost_pages\":{},\"evictions\":{},\"evicted_in_runs\":{},\"write_backs\":{},\"write_back_errors\":{},\"unevictable\":{},\
             \"peak_resident_pages\":{},\"managed_bytes\":{},\"fetch_p50_us\":{},\"fetch_p99_us\":{},\
             \"copy_p50_us\":{},\"copy_p99_us\":{},\"move_back_p50_us\":{},\
             \"fetch_mean_us\":{},\"copy_mean_us\":{},\"move_back_mean_us\":{},\"evict_calls\":{},\"evict_mean_us\":{},\"evict_p50_us\":{},\"evict_p99_us\":{},\
             \"drop_calls\":{},\"drop_mean_us\":{},\"drop_p50_us\":{},\"discard_calls\":{},\"discard_mean_us\":{},\"discard_p50_us\":{}}}",
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
            self.fetch.mean_us(),
            self.copy.mean_us(),
            self.move_back.mean_us(),
            self.evict.count(),
            self.evict.mean_us(),
            self.evict.quantile_us(0.5),
            self.evict.quantile_us(0.99),
            self.drop.count(),
            self.drop.mean_us(),
            self.drop.quantile_us(0.5),
            self.discard.count(),
            self.discard.mean_us(),
            self.discard.quantile_us(0.5),
        )
    }
}
