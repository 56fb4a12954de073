//! The graph analytics job: PageRank in pure python3 (lists of Python objects, as a graph script
//! holds them) on a generated Barabasi-Albert graph (each new node links to `m` earlier nodes
//! picked in proportion to their degree: a power law). A batch job: its throughput is runs per
//! second (1 / wall time), it has no per-operation latency, and its result (edge count, rank
//! sum, top 5 nodes) is deterministic for the seed, so every run must print the baseline's.

use std::path::Path;
use std::process::Stdio;

use anyhow::Result;

use super::failure::{Failure, KillTimer};
use super::Measurement;
use remem_host::cgroup::LimitedChild;

/// `iterations` power iterations with damping 0.85 and dangling mass spread evenly.
const PAGERANK_SCRIPT: &str = r#"import random, sys
n, m, iterations, seed = map(int, sys.argv[1:5])
rng = random.Random(seed)
sources, targets, ends = [], [], list(range(m))
for v in range(m, n):
    for _ in range(m):
        u = ends[rng.randrange(len(ends))]
        sources.append(v)
        targets.append(u)
        ends.append(u)
    ends.extend([v] * m)
del ends
out_degree = [0] * n
for s in sources:
    out_degree[s] += 1
rank = [1.0 / n] * n
for _ in range(iterations):
    incoming = [0.0] * n
    dangling = sum(rank[i] for i in range(n) if out_degree[i] == 0)
    for s, t in zip(sources, targets):
        incoming[t] += rank[s] / out_degree[s]
    base = 0.15 / n + 0.85 * dangling / n
    rank = [base + 0.85 * x for x in incoming]
top = sorted(range(n), key=rank.__getitem__, reverse=True)[:5]
print("edges %d rank_sum %.12f top %s" % (len(sources), sum(rank), top))
"#;

pub struct PageRank {
    pub graph_nodes: usize,
    pub edges_per_node: usize,
    pub iterations: usize,
}

impl PageRank {
    pub fn describe(&self) -> String {
        format!(
            "pagerank (python3, {} nodes, {} edges per node, {} iterations)",
            self.graph_nodes, self.edges_per_node, self.iterations
        )
    }

    pub fn run(
        &self,
        limit: Option<&super::Limit>,
        work_dir: &Path,
        failure: Option<Failure>,
    ) -> Result<Measurement> {
        let script = work_dir.join("pagerank.py");
        std::fs::write(&script, PAGERANK_SCRIPT)?;
        let command: Vec<String> = vec![
            python3(),
            script.to_string_lossy().into_owned(),
            self.graph_nodes.to_string(),
            self.edges_per_node.to_string(),
            self.iterations.to_string(),
            "42".to_owned(),
        ];
        run_batch_job(&command, limit, work_dir, failure)
    }
}

/// The python3 interpreter itself, not a wrapper that execs it (a pyenv shim is a shell script
/// that runs `pyenv exec`): every run measures the interpreter alone, and a paged run pages
/// it, not a chain of images each with its own pager. `python3` from PATH when it cannot say.
pub fn python3() -> String {
    static RESOLVED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RESOLVED
        .get_or_init(|| {
            std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .ok()
                .filter(|output| output.status.success())
                .and_then(|output| String::from_utf8(output.stdout).ok())
                .map(|path| path.trim().to_owned())
                .filter(|path| Path::new(path).is_file())
                .unwrap_or_else(|| "python3".to_owned())
        })
        .clone()
}

/// Runs a batch job whose stdout is its result: throughput 1 / wall time, no latencies (a job
/// that prints `latency p50_us X p99_us Y ops_per_second Z` on a line of its own reports them,
/// and that line is not part of the result).
pub fn run_batch_job(
    command: &[String],
    limit: Option<&super::Limit>,
    work_dir: &Path,
    failure: Option<Failure>,
) -> Result<Measurement> {
    let output_path = work_dir.join("job.out");
    let output_file = std::fs::File::create(&output_path)?;
    let job = LimitedChild::spawn_with_env(
        command,
        limit.and_then(super::Limit::cgroup_bytes),
        Stdio::from(output_file),
        limit.map_or(&[], super::Limit::environment),
    )?;
    let timer = KillTimer::arm(failure);
    let report = job.wait()?;
    let node_killed_after = timer.finish();
    let output = std::fs::read_to_string(&output_path).unwrap_or_default();
    let _ = std::fs::remove_file(&output_path);
    let wall_seconds = report.wall.as_secs_f64().max(1e-9);
    let mut measurement = Measurement {
        ops_per_second: 1.0 / wall_seconds,
        phase_seconds: wall_seconds,
        latency_p50_us: None,
        latency_p99_us: None,
        result: String::new(),
        check: if report.exit_code == 0 {
            Ok(())
        } else {
            Err(format!("the job exited with status {}", report.exit_code))
        },
        node_killed_after,
        process: report,
    };
    for line in output.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["latency", "p50_us", p50, "p99_us", p99, "ops_per_second", rate] => {
                measurement.latency_p50_us = p50.parse().ok().filter(|us: &f64| us.is_finite());
                measurement.latency_p99_us = p99.parse().ok().filter(|us: &f64| us.is_finite());
                if let Ok(rate) = rate.parse::<f64>() {
                    if rate.is_finite() && rate > 0.0 {
                        measurement.ops_per_second = rate;
                    }
                }
            }
            _ => {
                measurement.result.push_str(line.trim());
                measurement.result.push('\n');
            }
        }
    }
    measurement.result = measurement.result.trim().to_owned();
    Ok(measurement)
}
