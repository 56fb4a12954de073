//! Request latency, from a request's parse to its reply, by kind: the fixed buckets of every
//! remem histogram (`remem_frontend::metrics`, 10 us to 1 s), counted on the server's one thread
//! (no lock, no allocation), rendered as Prometheus histograms by the one exposition writer.

use std::time::Duration;

use remem_memcache::Request;

use remem_frontend::metrics::{Exposition, Histogram};

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

/// One histogram per [`Kind`].
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    pub by_kind: [Histogram; 3],
}

impl Latencies {
    pub fn record(&mut self, kind: Kind, elapsed: Duration) {
        self.by_kind[kind as usize].observe(elapsed);
    }

    /// `remem_kv_request_seconds`, one series per kind.
    pub fn render(&self, out: &mut Exposition) {
        let series: Vec<(&str, &Histogram)> =
            Kind::ALL.iter().map(|&kind| (kind.label(), &self.by_kind[kind as usize])).collect();
        out.histograms(
            "remem_kv_request_seconds",
            "Time from a request's parse to its reply, by kind.",
            "op",
            &series,
        );
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
        let mut out = Exposition::default();
        latencies.render(&mut out);
        let text = out.finish();
        assert!(text.contains("remem_kv_request_seconds_bucket{op=\"get\",le=\"0.00001\"} 1\n"), "{text}");
        assert!(text.contains("remem_kv_request_seconds_bucket{op=\"get\",le=\"0.00025\"} 2\n"), "{text}");
        assert!(text.contains("remem_kv_request_seconds_bucket{op=\"get\",le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("remem_kv_request_seconds_count{op=\"store\"} 0\n"), "{text}");
    }
}
