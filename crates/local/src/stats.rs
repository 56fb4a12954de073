//! Latency samples and their percentiles.

use serde::Serialize;

/// Latencies of one series, in nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub nanos: Vec<u64>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
}

impl Samples {
    pub fn with_capacity(capacity: usize) -> Samples {
        Samples { nanos: Vec::with_capacity(capacity) }
    }

    pub fn push(&mut self, duration: std::time::Duration) {
        self.nanos.push(duration.as_nanos() as u64);
    }

    /// Sorts in place and summarizes.
    pub fn summarize(&mut self) -> Summary {
        self.nanos.sort_unstable();
        let count = self.nanos.len();
        if count == 0 {
            return Summary::default();
        }
        let at = |quantile: f64| {
            let index = ((count as f64 * quantile).ceil() as usize).clamp(1, count) - 1;
            self.nanos[index] as f64 / 1000.0
        };
        Summary {
            count,
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            mean_us: self.nanos.iter().sum::<u64>() as f64 / count as f64 / 1000.0,
        }
    }
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    use anyhow::Context;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").context("a /proc stat line")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |index: usize| -> anyhow::Result<f64> {
        Ok(fields.get(index).context("a short /proc stat line")?.parse::<f64>()?)
    };
    // utime and stime are fields 14 and 15 of the line, 12th and 13th after the command name.
    let ticks = field(11)? + field(12)?;
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / per_second)
}

/// CPU seconds the whole machine has spent busy so far (every CPU's user, nice, system, irq,
/// softirq and steal time from the first line of /proc/stat), and the number of CPUs.
pub fn machine_busy_seconds() -> anyhow::Result<(f64, usize)> {
    use anyhow::Context;
    let stat = std::fs::read_to_string("/proc/stat")?;
    let total = stat.lines().next().context("an empty /proc/stat")?;
    let ticks: Vec<f64> = total
        .strip_prefix("cpu ")
        .context("/proc/stat does not start with the cpu line")?
        .split_whitespace()
        .map(|field| field.parse::<f64>())
        .collect::<Result<_, _>>()?;
    // user nice system idle iowait irq softirq steal ...: everything but idle and iowait.
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&index| ticks.get(index)).sum();
    let cpus = stat.lines().filter(|line| line.starts_with("cpu") && !line.starts_with("cpu ")).count();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((busy / per_second, cpus.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_one_to_thousand() {
        let mut samples = Samples { nanos: (1..=1000).rev().map(|us| us * 1000).collect() };
        let summary = samples.summarize();
        assert_eq!(summary.p50_us, 500.0);
        assert_eq!(summary.p99_us, 990.0);
        assert_eq!(summary.p999_us, 999.0);
    }
}
