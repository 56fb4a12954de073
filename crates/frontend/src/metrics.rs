//! `--metrics ADDRESS`: Prometheus text exposition (format 0.0.4) on a small HTTP endpoint, for
//! `remem node`, `remem nbd`, `remem fs` and `remem kv`. One thread accepts scrapes one at a
//! time; each request is read with a deadline and a size bound (it is input from the network)
//! and answered with whatever the command's renderer produces at that moment. Written by hand: the format is a few lines of
//! text and one GET, and a metrics crate would bring a registry the commands do not need.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

/// Longest request read (headers included).
const MAX_REQUEST_BYTES: usize = 8 << 10;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `render()` at `http://ADDRESS/metrics` on a thread until `stop` is set. Returns the
/// address bound (port 0 picks one).
pub fn serve(
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    render: impl Fn() -> String + Send + 'static,
) -> Result<SocketAddr> {
    let listener =
        TcpListener::bind(address).with_context(|| format!("binding the metrics address {address}"))?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(error) = answer(stream, &render) {
                        tracing::debug!(%error, "metrics request failed");
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(error) => {
                    tracing::warn!(%error, "metrics accept failed");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    })?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, render: &impl Fn() -> String) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut request = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = stream.read(&mut buffer)?;
        if read == 0 || request.len() + read > MAX_REQUEST_BYTES {
            return Ok(());
        }
        request.extend_from_slice(&buffer[..read]);
    }
    let line = request.split(|&byte| byte == b'\r').next().unwrap_or_default();
    let (status, body, content_type) =
        if line.starts_with(b"GET /metrics ") || line.starts_with(b"GET /metrics?") {
            ("200 OK", render(), "text/plain; version=0.0.4; charset=utf-8")
        } else {
            ("404 Not Found", "only GET /metrics is served\n".to_string(), "text/plain; charset=utf-8")
        };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}

/// Upper bounds of the latency buckets, in seconds: 10 us to 1 s.
pub const LATENCY_BUCKETS_SECONDS: [f64; 15] =
    [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0];

/// A latency histogram over [`LATENCY_BUCKETS_SECONDS`]: fixed size, `observe` allocates nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); those above the last bound only in `count`.
    buckets: [u64; 15],
    count: u64,
    sum_seconds: f64,
}

impl Histogram {
    pub fn observe(&mut self, latency: std::time::Duration) {
        let seconds = latency.as_secs_f64();
        if let Some(bucket) = LATENCY_BUCKETS_SECONDS.iter().position(|&bound| seconds <= bound) {
            self.buckets[bucket] += 1;
        }
        self.count += 1;
        self.sum_seconds += seconds;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// A histogram from counts kept elsewhere (e.g. in atomics): `buckets` per bucket, not
    /// cumulative, as [`Histogram::observe`] keeps them.
    pub fn from_counts(buckets: [u64; 15], count: u64, sum_seconds: f64) -> Histogram {
        Histogram { buckets, count, sum_seconds }
    }
}

/// Builds the exposition text: `# HELP`, `# TYPE` and one sample per metric.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.metric(name, help, "gauge", value)
    }

    pub fn counter(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.metric(name, help, "counter", value)
    }

    /// One metric of type `kind` (`gauge`, `counter`) with one sample.
    pub fn metric(&mut self, name: &str, help: &str, kind: &str, value: f64) -> &mut Self {
        use std::fmt::Write as _;
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        self
    }

    /// One counter metric with a sample per value of `label` (e.g. `op="read"`).
    pub fn counters(&mut self, name: &str, help: &str, label: &str, series: &[(&str, f64)]) -> &mut Self {
        self.labeled(name, help, "counter", label, series)
    }

    /// One metric of type `kind` with a sample per value of `label` (e.g. `scheme="ec"`).
    pub fn labeled(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        label: &str,
        series: &[(&str, f64)],
    ) -> &mut Self {
        use std::fmt::Write as _;
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (value, count) in series {
            let _ = writeln!(self.text, "{name}{{{label}=\"{value}\"}} {count}");
        }
        self
    }

    /// One histogram metric with a series per value of `label` (e.g. `op="read"`).
    pub fn histograms(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        series: &[(&str, &Histogram)],
    ) -> &mut Self {
        use std::fmt::Write as _;
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (value, histogram) in series {
            let mut cumulative = 0;
            for (bound, count) in LATENCY_BUCKETS_SECONDS.iter().zip(histogram.buckets) {
                cumulative += count;
                let _ =
                    writeln!(self.text, "{name}_bucket{{{label}=\"{value}\",le=\"{bound}\"}} {cumulative}");
            }
            let _ =
                writeln!(self.text, "{name}_bucket{{{label}=\"{value}\",le=\"+Inf\"}} {}", histogram.count);
            let _ = writeln!(self.text, "{name}_sum{{{label}=\"{value}\"}} {}", histogram.sum_seconds);
            let _ = writeln!(self.text, "{name}_count{{{label}=\"{value}\"}} {}", histogram.count);
        }
        self
    }

    pub fn finish(self) -> String {
        self.text
    }
}
