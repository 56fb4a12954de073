//! Request latency, from a request's parse to its reply, by kind: fixed buckets, counted on the
//! server's one thread (no lock, no allocation), rendered as Prometheus histograms.

use std::time::Duration;

use remem_memcache::Request;

/// Upper bounds of the buckets, in microseconds (the last bucket is +Inf).
pub const BOUNDS_MICROS: [u64; 16] =
    [5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000, 1_000_000];

/// What a request is, for its latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// get, gets, gat, gats, mg.
    Get,
    /// set, add, replace, append, prepend, cas, ms, incr, decr, ma.
    Store,
    /// Everything else (delete, touch, stats, ...).
    Other,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Get, Kind::Store, Kind::Other];

    pub fn of(request: &Request) -> Kind {
        match request {
            Request::Get { .. } | Request::MetaGet { .. } => Kind::Get,
            Request::Store { .. }
            | Request::MetaSet { .. }
            | Request::Arithmetic { .. }
            | Request::MetaArithmetic { .. } => Kind::Store,
            _ => Kind::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::Get => "get",
            Kind::Store => "store",
            Kind::Other => "other",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative), the last one above every bound.
    pub counts: [u64; BOUNDS_MICROS.len() + 1],
    pub sum_micros: u64,
}

impl Histogram {
    pub fn record(&mut self, elapsed: Duration) {
        let micros = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = BOUNDS_MICROS.iter().position(|&bound| micros <= bound).unwrap_or(BOUNDS_MICROS.len());
        self.counts[bucket] += 1;
        self.sum_micros = self.sum_micros.saturating_add(micros);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One histogram per [`Kind`].
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    pub by_kind: [Histogram; 3],
}

impl Latencies {
    pub fn record(&mut self, kind: Kind, elapsed: Duration) {
        self.by_kind[kind as usize].record(elapsed);
    }

    /// `remem_kv_request_seconds` in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let name = "remem_kv_request_seconds";
        let _ = writeln!(out, "# HELP {name} Time from a request's parse to its reply, by kind.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for kind in Kind::ALL {
            let histogram = &self.by_kind[kind as usize];
            let label = kind.label();
            let mut cumulative = 0;
            for (bound, count) in BOUNDS_MICROS.iter().zip(&histogram.counts) {
                cumulative += count;
                let le = *bound as f64 / 1e6;
                let _ = writeln!(out, "{name}_bucket{{op=\"{label}\",le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_bucket{{op=\"{label}\",le=\"+Inf\"}} {}", histogram.count());
            let _ = writeln!(out, "{name}_sum{{op=\"{label}\"}} {}", histogram.sum_micros as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{{op=\"{label}\"}} {}", histogram.count());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_in_the_exposition() {
        let mut latencies = Latencies::default();
        latencies.record(Kind::Get, Duration::from_micros(3));
        latencies.record(Kind::Get, Duration::from_micros(150));
        latencies.record(Kind::Get, Duration::from_secs(5));
        let mut text = String::new();
        latencies.render(&mut text);
        assert!(text.contains("remem_kv_request_seconds_bucket{op=\"get\",le=\"0.000005\"} 1\n"), "{text}");
        assert!(text.contains("remem_kv_request_seconds_bucket{op=\"get\",le=\"0.0002\"} 2\n"), "{text}");
        assert!(text.contains("remem_kv_request_seconds_bucket{op=\"get\",le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("remem_kv_request_seconds_count{op=\"store\"} 0\n"), "{text}");
    }
}
