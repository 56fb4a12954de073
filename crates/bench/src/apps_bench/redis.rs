//! redis-server (in the limited cgroup, no persistence) driven by redis-benchmark (outside it).
//!
//! The bench loads `keys` values of ETC-like sizes under redis-benchmark's own key names
//! (`key:` and 12 digits), then times two redis-benchmark runs: `-t get -r keys` (uniform GETs
//! of the loaded data set: the part that faults) and SETs of new keys `bench:N` with 256-byte
//! values (`-r keys`; they never overwrite the data set, so it stays checkable). Throughput is
//! all requests over the time both took at their reported rates; p50 and p99 are the worse of
//! the two runs' (its `--csv` columns). Afterwards every loaded key is read back and must be
//! exactly what was loaded.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::failure::{Failure, KillTimer};
use super::kv_client::{load, verify, Redis as RedisConnection};
use super::workload::{free_port, ValueSizes};
use super::{Driven, Measurement};

pub struct Redis {
    pub keys: u64,
    /// GET requests; the SET run makes a quarter as many.
    pub requests: u64,
    pub clients: usize,
}

impl Redis {
    pub fn describe(&self) -> String {
        format!(
            "redis (redis-benchmark: {} uniform GETs of {} ETC-like values, {} SETs of new keys, {} connections)",
            self.requests,
            self.keys,
            self.requests / 4,
            self.clients * 4
        )
    }

    pub fn run(
        &self,
        limit: Option<&super::Limit>,
        _work_dir: &Path,
        failure: Option<Failure>,
    ) -> Result<Measurement> {
        let port = free_port()?;
        let command: Vec<String> = [
            "redis-server",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        super::run_server(&command, limit, port, self.keys, || self.drive(port, failure))
    }

    fn drive(&self, port: u16, failure: Option<Failure>) -> Result<Driven> {
        load::<RedisConnection>(port, self.keys, ValueSizes::EtcLike, self.clients)?;
        let timer = KillTimer::arm(failure);
        let started = Instant::now();
        let connections = (self.clients * 4).to_string();
        let keys = self.keys.to_string();
        let base = ["-h", "127.0.0.1", "-p", &port.to_string(), "-c", &connections, "-r", &keys, "--csv"];
        let gets = benchmark(&base, &["-n", &self.requests.to_string(), "-t", "get"])?;
        let value = "x".repeat(256);
        let sets = benchmark(
            &base,
            &["-n", &(self.requests / 4).max(1).to_string(), "SET", "bench:__rand_int__", &value],
        )?;
        let seconds = started.elapsed().as_secs_f64();
        let node_killed_after = timer.finish();
        verify::<RedisConnection>(port, self.keys, ValueSizes::EtcLike, &[], self.clients)?;
        let requests = (self.requests + (self.requests / 4).max(1)) as f64;
        let busy_seconds = self.requests as f64 / gets.rps + (self.requests / 4).max(1) as f64 / sets.rps;
        Ok(Driven {
            ops_per_second: requests / busy_seconds,
            seconds,
            p50_us: Some(gets.p50_ms.max(sets.p50_ms) * 1000.0),
            p99_us: Some(gets.p99_ms.max(sets.p99_ms) * 1000.0),
            node_killed_after,
        })
    }
}

/// One test's row of redis-benchmark's `--csv` output.
#[derive(Debug, PartialEq)]
struct BenchmarkRow {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Runs redis-benchmark (at most 15 minutes) and parses its one test row.
fn benchmark(base: &[&str], test: &[&str]) -> Result<BenchmarkRow> {
    let output = Command::new("timeout")
        .args(["-k", "5", "900", "redis-benchmark"])
        .args(base)
        .args(test)
        .stdin(Stdio::null())
        .output()
        .context("running redis-benchmark (package redis-tools)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "redis-benchmark failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_csv(&stdout)
}

/// The first data row of redis-benchmark's CSV (header `"test","rps",...,"p50_latency_ms",...`).
fn parse_csv(text: &str) -> Result<BenchmarkRow> {
    let mut lines = text.lines().filter(|line| line.starts_with('"'));
    let header: Vec<String> = split_csv(lines.next().context("redis-benchmark printed no CSV header")?);
    let column = |name: &str| {
        header
            .iter()
            .position(|field| field == name)
            .with_context(|| format!("no {name} column in {header:?}"))
    };
    let (rps, p50, p99) = (column("rps")?, column("p50_latency_ms")?, column("p99_latency_ms")?);
    let row = split_csv(lines.next().context("redis-benchmark printed no result row")?);
    let number = |index: usize| -> Result<f64> {
        let value: f64 = row.get(index).context("a short CSV row")?.parse().context("a CSV number")?;
        if !value.is_finite() || value < 0.0 {
            bail!("redis-benchmark reported {value}");
        }
        Ok(value)
    };
    let parsed = BenchmarkRow { rps: number(rps)?, p50_ms: number(p50)?, p99_ms: number(p99)? };
    if parsed.rps <= 0.0 {
        bail!("redis-benchmark reported no throughput");
    }
    Ok(parsed)
}

/// Splits a CSV line of quoted fields (the test name may hold commas inside its quotes).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    for character in line.chars() {
        match character {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            other => field.push(other),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_benchmark_csv_rows_parse_and_garbage_does_not() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\
                    \"p99_latency_ms\",\"max_latency_ms\"\n\"GET\",\"31695.72\",\"0.090\",\"0.016\",\"0.055\",\
                    \"0.103\",\"1.167\",\"5.543\"\n";
        assert_eq!(parse_csv(text).unwrap(), BenchmarkRow { rps: 31695.72, p50_ms: 0.055, p99_ms: 1.167 });
        assert!(parse_csv("").is_err());
        assert!(parse_csv("\"test\",\"rps\"\n\"GET\",\"1\"").is_err());
        assert!(parse_csv(&text.replace("31695.72", "NaN")).is_err());
        assert_eq!(split_csv("\"SET a,b\",\"1\""), vec!["SET a,b".to_owned(), "1".to_owned()]);
    }
}
