//! The `remem` commands as a user runs them: demo, bench, up, and their errors.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn remem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_remem"))
}

#[test]
fn demo_writes_and_verifies_every_page() {
    let dir = std::env::temp_dir().join(format!("remem-test-demo-{}", std::process::id()));
    let output =
        remem().args(["demo", "--size", "16MiB", "--slab-size", "1MiB", "--dir"]).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("every one of 4096 pages read back and verified: 0 mismatches"), "{stdout}");
    assert!(stdout.contains("node memory:"), "{stdout}");
    assert!(stdout.contains("cluster stopped"), "{stdout}");
    assert!(dir.exists(), "a directory the user named stays");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without --dir the demo's cluster lives in a fresh temporary directory, secret included: a
/// run that succeeds removes it (before, every run left one behind).
#[test]
fn demo_without_dir_leaves_no_directory_behind() {
    let tmp = std::env::temp_dir().join(format!("remem-test-demo-tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let output =
        remem().env("TMPDIR", &tmp).args(["demo", "--size", "4MiB", "--slab-size", "1MiB"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("removed"), "{stdout}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert!(left.is_empty(), "the demo left {left:?}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bench_pages_reports_every_scheme_floor_and_ratio() {
    let dir = std::env::temp_dir().join(format!("remem-test-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("cdf.png");
    let output = remem()
        .args(["bench", "pages", "--size", "8MiB", "--slab-size", "1MiB", "--ops", "300", "--json", "--plot"])
        .arg(&plot)
        .output()
        .unwrap();
    assert!(output.status.success(), "bench failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("bench --json prints JSON");
    let series = report["series"].as_array().unwrap();
    let schemes = ["ec(8,2) d=1", "ec(8,2) d=0", "rep(2)", "none"];
    for scheme in schemes {
        // Each scheme's series, its read floor and its write proxy, at both queue depths.
        let floor = format!("floor: {scheme}");
        let proxy = format!("proxy: {scheme}");
        for (name, operation) in [(scheme, "write"), (scheme, "read"), (&floor, "read"), (&proxy, "write")] {
            for queue_depth in [1, 32] {
                let found = series.iter().find(|s| {
                    s["name"] == name && s["operation"] == operation && s["queue_depth"] == queue_depth
                });
                let found =
                    found.unwrap_or_else(|| panic!("missing series {name} {operation} qd{queue_depth}"));
                assert_eq!(found["latency"]["count"], if queue_depth == 1 { 300 } else { 1200 }, "{found}");
                assert!(found["latency"]["p50_us"].as_f64().unwrap() > 0.0);
                assert!(found["ops_per_second"].as_f64().unwrap() > 0.0);
            }
        }
    }
    // Every series is compared with its floor in exactly the fan-out its ops make.
    let floors = report["floors"].as_array().unwrap();
    assert_eq!(floors.len(), schemes.len() * 2 * 2);
    let fan_out = |scheme: &str, operation: &str| {
        let comparison = floors
            .iter()
            .find(|c| c["scheme"] == scheme && c["operation"] == operation && c["queue_depth"] == 1)
            .unwrap_or_else(|| panic!("no floor for {scheme} {operation}"));
        let f = &comparison["fan_out"];
        (
            f["asked"].as_u64().unwrap(),
            f["need"].as_u64().unwrap(),
            f["split_bytes"].as_u64().unwrap(),
            f["exact"] == true,
        )
    };
    assert_eq!(fan_out("ec(8,2) d=1", "read"), (9, 8, 512, true));
    assert_eq!(fan_out("ec(8,2) d=0", "read"), (8, 8, 512, true));
    assert_eq!(fan_out("rep(2)", "read"), (1, 1, 4096, true));
    assert_eq!(fan_out("none", "read"), (1, 1, 4096, true));
    assert_eq!(fan_out("ec(8,2) d=1", "write"), (10, 10, 512, false));
    assert_eq!(fan_out("rep(2)", "write"), (2, 2, 4096, false));
    for comparison in floors {
        let ratio = comparison["p50_ratio"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{comparison}");
        assert_eq!(comparison["beats_floor"] == true, ratio < 0.95, "{comparison}");
    }
    // A warning for each series that beats its floor (timing on a shared machine decides how many).
    let beaten = floors.iter().filter(|c| c["beats_floor"] == true).count();
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), beaten);
    assert!(warnings.iter().all(|w| w.as_str().unwrap().starts_with("WARNING: ")));
    for ratio in report["ratios"].as_array().unwrap() {
        let value = ratio["value"].as_f64().unwrap();
        assert!(value.is_finite() && value > 0.0, "{ratio}");
    }
    // EC(8,2) ranges of 1 MiB slabs filled completely: 1.25 times each slab's memfd (5 bytes of
    // metadata per 512-byte split, plus the shared-memory header page) over its split bytes.
    let layout = remem_proto::shm::ShmLayout::new(1 << 20, 512).unwrap();
    let expected = 1.25 * layout.total_bytes as f64 / (1u64 << 20) as f64;
    let memory = report["ec_memory_ratio"].as_f64().unwrap();
    assert!((memory - expected).abs() < 1e-6, "memory ratio {memory}, expected {expected}");
    let png = std::fs::read(&plot).expect("plot written");
    assert_eq!(&png[1..4], b"PNG");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `remem up` driven through its standard input, its stdout lines read as they come.
struct UpSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl UpSession {
    fn start(dir: &Path, extra: &[&str]) -> UpSession {
        use std::io::BufRead;
        let mut child = remem()
            .args(["up", "--nodes", "3", "--capacity", "8MiB", "--slab-size", "1MiB", "--dir"])
            .arg(dir)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        let mut session = UpSession { child, stdin, lines };
        session.wait_for("press Ctrl-C");
        session
    }

    /// The next stdout line that contains `what` (lines before it are dropped).
    fn wait_for(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line with {what:?} within 30 s"),
            }
        }
    }

    fn send(&mut self, command: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{command}").unwrap();
    }

    fn signal(&mut self, signal: i32) -> std::process::ExitStatus {
        // SAFETY: signalling the child we spawned and have not reaped; its nodes die with it.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        self.child.wait().unwrap()
    }
}

fn is_running(pid: u32) -> bool {
    remem_local::process::is_remem(pid, "node")
}

/// `remem up`'s commands on standard input: `help` lists them, `stop N` kills a node (it exits),
/// `remove N` stops one and takes it out of the cluster file; with `--metrics` every node serves
/// metrics on the address it prints and the cluster file records.
#[test]
fn up_answers_help_stop_and_remove_on_its_standard_input_and_serves_node_metrics() {
    let dir = std::env::temp_dir().join(format!("remem-test-up-help-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut up = UpSession::start(&dir, &["--metrics"]);
    let cluster_path = dir.join("cluster.json");
    let cluster = remem_client::cluster::ClusterFile::load(&cluster_path).unwrap();
    for node in &cluster.nodes {
        let address = node.metrics.expect("every node has a metrics address");
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        std::io::Write::write_all(&mut stream, b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stream, &mut text).unwrap();
        assert!(text.contains("remem_node_capacity_bytes"), "{text}");
    }
    up.send("help");
    assert!(up.wait_for("stop N").contains("SIGKILL"));
    assert!(up.wait_for("remove N").contains("cluster file"));
    let pid = cluster.nodes[1].pid.unwrap();
    up.send("stop 1");
    up.wait_for("node 1: stopped");
    assert!(!is_running(pid), "node 1 still runs");
    up.send("remove 0");
    up.wait_for("node 0: ");
    let after = remem_client::cluster::ClusterFile::load(&cluster_path).unwrap();
    assert_eq!(after.nodes, cluster.nodes[1..], "node 0 is out of the cluster file, the others moved up");
    assert!(!is_running(cluster.nodes[0].pid.unwrap()), "node 0 still runs");
    // The removed node's number is not given again: the added node gets files of its own.
    up.send("add");
    let added = up.wait_for("node 2: ");
    assert!(added.contains("metrics http://127.0.0.1:"), "{added}");
    assert!(up.signal(libc::SIGTERM).success());
    assert!(dir.join("node-3.log").exists(), "the added node logs to a file of its own");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `remem up` that was SIGKILLed cannot remove its cluster file, and its nodes die with it:
/// a front end pointed at the file says the cluster is gone (instead of trying its dead nodes),
/// and the next `remem up` in the directory replaces the file.
#[test]
fn a_sigkilled_ups_cluster_file_is_refused_by_readers_and_replaced_by_the_next_up() {
    let dir = std::env::temp_dir().join(format!("remem-test-up-killed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster_path = dir.join("cluster.json");
    let mut up = UpSession::start(&dir, &[]);
    let cluster = remem_client::cluster::ClusterFile::load(&cluster_path).unwrap();
    up.signal(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.nodes.iter().any(|node| is_running(node.pid.unwrap())) {
        assert!(Instant::now() < deadline, "the nodes outlived their remem up");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cluster_path.exists(), "a SIGKILLed remem up leaves its cluster file");
    // `remem status` shows the nodes down (its exit status says every one is), and says why.
    let output = remem().args(["status", "--cluster"]).arg(&cluster_path).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("left by a cluster that is gone") && stderr.contains("remem up"), "{stderr}");
    // A front end refuses it at once.
    let output = Command::new("timeout")
        .args(["-k", "5", "30", env!("CARGO_BIN_EXE_remem"), "nbd", "--size", "1MiB", "--cluster"])
        .arg(&cluster_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("left by a cluster that is gone") && !stderr.contains("WARN"), "{stderr}");
    let mut again = UpSession::start(&dir, &[]);
    let replaced = remem_client::cluster::ClusterFile::load(&cluster_path).unwrap();
    assert!(replaced.nodes.iter().all(|node| is_running(node.pid.unwrap())));
    let output = remem().args(["status", "--cluster"]).arg(&cluster_path).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(again.signal(libc::SIGTERM).success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits up to 30 s for `remem up` to write its cluster file; returns it.
fn wait_for_cluster_file(path: &std::path::Path) -> remem_client::cluster::ClusterFile {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    remem_client::cluster::ClusterFile::load(path).unwrap()
}

/// Waits up to 15 s for `remem up` to stop after `signal`; SIGKILLs it and panics if it does not.
fn wait_stopped(child: &mut std::process::Child, signal: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("remem up did not stop on {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn up_starts_a_cluster_idles_with_stdin_closed_and_stops_it_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("remem-test-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Standard input closed, as under a service manager or in a script's background job.
    let mut child = remem()
        .args(["up", "--nodes", "3", "--capacity", "8MiB", "--slab-size", "1MiB", "--dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let cluster_file = dir.join("cluster.json");
    let cluster = wait_for_cluster_file(&cluster_file);
    assert_eq!(cluster.nodes.len(), 3);
    // Watching three idle nodes takes next to no CPU (it once spun on the closed input).
    let before = remem::stats::cpu_seconds(child.id()).expect("remem up's CPU time");
    std::thread::sleep(Duration::from_secs(2));
    let used = remem::stats::cpu_seconds(child.id()).expect("remem up's CPU time") - before;
    if used >= 0.5 {
        // SAFETY: signalling the child we spawned; its nodes die with it.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = child.wait();
        panic!("remem up used {used:.2} CPU seconds in 2 s with nothing to do");
    }
    // SAFETY: signalling the child we spawned.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = wait_stopped(&mut child, "SIGTERM");
    assert!(status.success());
    for node in &cluster.nodes {
        let pid = node.pid.unwrap() as libc::pid_t;
        // SAFETY: signal 0 only checks whether the process exists.
        assert!(unsafe { libc::kill(pid, 0) } != 0, "node {pid} outlived remem up");
    }
    assert!(!cluster_file.exists(), "cluster file removed on stop");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C at a terminal sends SIGINT to the whole foreground process group: `remem up` stops its
/// nodes in order and reports none of them as failed (its nodes are in a group of their own).
/// `--cluster` takes the cluster's directory as well as its file.
#[test]
fn ctrl_c_to_the_terminals_group_stops_up_without_calling_its_nodes_failed() {
    let dir = std::env::temp_dir().join(format!("remem-test-up-ctrl-c-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = dir.with_extension("log");
    let mut command = remem();
    command
        .args(["up", "--nodes", "3", "--capacity", "8MiB", "--slab-size", "1MiB", "--dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // A group of its own, as a shell's job: the test's own group gets no signal.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    // Killed if the test fails: `remem up`'s nodes follow it (PR_SET_PDEATHSIG).
    let mut up = crate::common::KillOnDrop(command.spawn().unwrap());
    let child = &mut up.0;
    let cluster_file = dir.join("cluster.json");
    let cluster = wait_for_cluster_file(&cluster_file);
    let status = remem().args(["status", "--cluster"]).arg(&dir).output().unwrap();
    let text =
        String::from_utf8_lossy(&status.stdout).into_owned() + &String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "`remem status --cluster DIR` fails: {text}");
    assert!(text.contains("3 of 3 nodes up"), "three nodes up in:\n{text}");
    // SAFETY: signalling the process group of the child we spawned (its PID is the group's id).
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGINT) };
    let status = wait_stopped(child, "SIGINT");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "remem up failed: {text}");
    assert!(text.contains("stopping 3 nodes"), "{text}");
    assert!(!text.contains("warning"), "a node of a stopping cluster was reported: {text}");
    for node in &cluster.nodes {
        let pid = node.pid.unwrap() as libc::pid_t;
        // SAFETY: signal 0 only checks whether the process exists.
        assert!(unsafe { libc::kill(pid, 0) } != 0, "node {pid} outlived remem up");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&log);
}

#[test]
fn bad_arguments_get_clear_errors() {
    let output = remem().args(["node", "--capacity", "lots"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a size"));

    let output =
        remem().args(["node", "--listen", "127.0.0.1:0"]).env_remove("REMEM_SECRET").output().unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("secret"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output = remem().args(["demo", "--nodes", "5"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("fewer than k+r"));
    let _ = Path::new(".");
}

#[test]
fn bench_codec_compares_with_debian_isal() {
    // Needs remem-isal-baseline beside remem: `cargo nextest run --workspace` builds it.
    let output = remem().args(["bench", "codec", "--iterations", "200", "--json"]).output().unwrap();
    assert!(output.status.success(), "bench codec failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let rows = report["rows"].as_array().unwrap();
    assert!(rows.iter().any(|row| row["codec"].as_str().unwrap().contains("Debian")));
    for ratio in report["ratios"].as_array().unwrap() {
        let value = ratio["remem_over_isal"].as_f64().unwrap();
        assert!(value.is_finite() && value > 0.0, "{ratio}");
    }
}

#[test]
fn bench_regen_rebuilds_a_slab_and_verifies_every_page() {
    let output = remem().args(["bench", "regen", "--slab-size", "1MiB", "--json"]).output().unwrap();
    assert!(output.status.success(), "bench regen failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["read_mismatches"], 0);
    assert_eq!(report["pages_verified_after"], 2048);
    assert!(report["mib_per_second"].as_f64().unwrap() > 0.0);
    // The floor was read twice, and the speed ratio is the floor's time over the rebuild's.
    assert_eq!(report["floor_runs"].as_array().unwrap().len(), 2);
    let (floor, seconds) = (report["floor_seconds"].as_f64().unwrap(), report["seconds"].as_f64().unwrap());
    assert!(floor > 0.0 && (report["rebuild_over_floor"].as_f64().unwrap() - floor / seconds).abs() < 1e-9);
    // Reads and writes were served, and timed, before the rebuild and during it.
    for phase in ["before", "during"] {
        for kind in ["reads", "writes"] {
            let summary = &report[phase][kind];
            assert!(summary["count"].as_u64().unwrap() > 0, "{phase} {kind}: {summary}");
            assert!(summary["p99_us"].as_f64().unwrap() >= summary["p50_us"].as_f64().unwrap());
        }
    }
}

#[test]
fn bench_straggler_reports_healthy_and_slowed_p99_per_scheme() {
    let output = remem()
        .args([
            "bench",
            "pages",
            "--size",
            "8MiB",
            "--slab-size",
            "1MiB",
            "--ops",
            "200",
            "--straggler",
            "2000",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "bench --straggler failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let (delay, rows) = (&report["straggler"][0], report["straggler"][1].as_array().unwrap());
    assert_eq!(delay, 2000);
    let names: Vec<&str> = rows.iter().map(|row| row["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ec(8,2) d=1", "ec(8,2) d=0", "rep(2)"]);
    for row in rows {
        assert!(row["healthy"]["p99_us"].as_f64().unwrap() > 0.0);
        assert!(row["straggler"]["p99_us"].as_f64().unwrap() > 0.0);
        // The slow node holds split 0 of range 0, so at least the reads of range 0 ask it.
        let asking = row["reads_asking_slow_node"].as_f64().unwrap();
        assert!(asking > 0.0 && asking <= 1.0, "{row}");
    }
}

/// A front end pointed at a cluster whose nodes are all gone (a cluster file without PIDs, so
/// only connecting finds out) says so in one line: no WARN per node before it (there were
/// thirteen lines), each node named once, their shared reason once.
#[test]
fn a_front_end_on_a_cluster_with_every_node_gone_prints_one_error_line() {
    let dir = std::env::temp_dir().join(format!("remem-test-dead-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("secret");
    remem::launcher::write_private_file(&secret_file, "00".repeat(32).as_bytes()).unwrap();
    // Ports that were free a moment ago: nothing listens there now.
    let listeners: Vec<_> = (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let nodes = listeners
        .iter()
        .map(|listener| remem_client::cluster::ClusterNode {
            address: listener.local_addr().unwrap(),
            failure_domain: "rack".to_owned(),
            pid: None,
            unix_socket: None,
            metrics: None,
        })
        .collect();
    drop(listeners);
    let cluster_path = dir.join("cluster.json");
    remem_client::cluster::ClusterFile { secret_file, nodes, encrypt: false }.save(&cluster_path).unwrap();
    let cluster = cluster_path.to_str().unwrap();
    let shape = ["-k", "2", "-r", "1", "--cluster", cluster];
    for command in
        [&["nbd", "--size", "1MiB"][..], &["kv", "-m", "1MiB", "--listen", "127.0.0.1:0", "--fresh"]]
    {
        let output = Command::new("timeout")
            .args(["-k", "5", "30", env!("CARGO_BIN_EXE_remem")])
            .args(command)
            .args(shape)
            .env("REMEM_LOG", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{command:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{command:?}: one line: {stderr}");
        assert!(stderr.starts_with("error: connecting to the cluster of"), "{stderr}");
        assert!(stderr.contains("only 0 of the cluster's 3 nodes answered"), "{stderr}");
        assert!(stderr.contains("(all: Connection refused"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README and docs/*.md, each with its path.
fn documents() -> Vec<(std::path::PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths = vec![root.join("README.md")];
    let docs = std::fs::read_dir(root.join("docs")).unwrap().map(|entry| entry.unwrap().path());
    paths.extend(docs.filter(|path| path.extension().is_some_and(|extension| extension == "md")));
    paths.into_iter().map(|path| (path.clone(), std::fs::read_to_string(&path).unwrap())).collect()
}

/// The code of a Markdown text: inline `spans` (also across the lines of a paragraph), and
/// the lines of fenced and indented blocks without their shell comments.
fn code_of(markdown: &str) -> Vec<String> {
    let mut code = Vec::new();
    let mut paragraph = String::new();
    let spans_of = |paragraph: &mut String, code: &mut Vec<String>| {
        code.extend(paragraph.split('`').skip(1).step_by(2).map(str::to_owned));
        paragraph.clear();
    };
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced || line.starts_with("    ") || line.starts_with('\t') {
            spans_of(&mut paragraph, &mut code);
            let command =
                if line.trim_start().starts_with('#') { "" } else { line.split(" #").next().unwrap_or("") };
            code.push(command.to_owned());
        } else if line.trim().is_empty() {
            spans_of(&mut paragraph, &mut code);
        } else {
            paragraph.push_str(line);
            paragraph.push(' ');
        }
    }
    spans_of(&mut paragraph, &mut code);
    code
}

/// The words after each `remem` that starts a command in a piece of code (at its start, or
/// after a shell operator or `sudo`), as far as they can name subcommands: `remem swap on
/// --size 8GiB` gives `swap on`, `remem fs /mnt` gives `fs`.
fn remem_invocations(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    let mut before_all = String::new();
    while let Some(at) = rest.find("remem ") {
        before_all.push_str(&rest[..at]);
        let after = &rest[at + "remem ".len()..];
        rest = after;
        let before = before_all.trim_end();
        let starts_a_command = before.is_empty()
            || ["|", "&&", ";", "$(", "<(", "(", "&", "sudo", "$"]
                .iter()
                .any(|operator| before.ends_with(operator));
        before_all.push_str("remem ");
        if !starts_a_command {
            continue;
        }
        let is_word = |word: &&str| {
            word.starts_with(|character: char| character.is_ascii_lowercase())
                && word.chars().all(|character| {
                    character.is_ascii_lowercase() || character.is_ascii_digit() || character == '-'
                })
        };
        let words: Vec<String> =
            after.split_whitespace().take_while(is_word).take(3).map(str::to_owned).collect();
        if !words.is_empty() {
            found.push(words);
        }
    }
    found
}

/// The subcommands `remem WORDS --help` lists (none for a leaf), or why it failed.
fn subcommands_of(
    words: &[String],
    cache: &mut std::collections::HashMap<Vec<String>, Result<Vec<String>, String>>,
) -> Result<Vec<String>, String> {
    cache
        .entry(words.to_vec())
        .or_insert_with(|| {
            let output = remem().args(words).arg("--help").output().unwrap();
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            if !output.status.success() {
                return Err(String::from_utf8_lossy(&output.stderr).into_owned());
            }
            let listed = text.lines().skip_while(|line| *line != "Commands:").skip(1);
            let names =
                listed.take_while(|line| !line.is_empty()).filter_map(|line| line.split_whitespace().next());
            Ok(names.filter(|name| *name != "help").map(str::to_owned).collect())
        })
        .clone()
}

/// Every `remem ...` command the README and docs/*.md show runs (`remem WORDS --help`): a
/// renamed or removed command cannot linger in the documentation.
#[test]
fn every_command_the_docs_name_exists() {
    let mut cache = std::collections::HashMap::new();
    let mut problems = Vec::new();
    let mut checked = std::collections::BTreeSet::new();
    for (path, text) in documents() {
        for code in code_of(&text) {
            for words in remem_invocations(&code) {
                let mut command: Vec<String> = Vec::new();
                for word in &words {
                    match subcommands_of(&command, &mut cache) {
                        Ok(subcommands) if subcommands.is_empty() => break,
                        Ok(subcommands) if subcommands.contains(word) => command.push(word.clone()),
                        // A hidden helper (`remem memory-hog`): not listed, but it answers.
                        Ok(_)
                            if subcommands_of(
                                &[command.clone(), vec![word.clone()]].concat(),
                                &mut cache,
                            )
                            .is_ok() =>
                        {
                            command.push(word.clone())
                        }
                        Ok(subcommands) => {
                            problems.push(format!(
                                "{}: `remem {}`: no {word:?} among {subcommands:?}",
                                path.display(),
                                words.join(" ")
                            ));
                            break;
                        }
                        Err(error) => {
                            problems.push(format!(
                                "{}: `remem {}`: {error}",
                                path.display(),
                                command.join(" ")
                            ));
                            break;
                        }
                    }
                }
                checked.insert(command);
            }
        }
    }
    assert!(problems.is_empty(), "documented commands that do not exist:\n{}", problems.join("\n"));
    assert!(checked.len() > 20, "only {} commands found in the docs: {checked:?}", checked.len());
}

/// Every `remem_*` metric (or memcached `stats` name) the README and docs/*.md name is written
/// by the source: as a string, or as a prefix the source formats (`remem_kv_{name}`) and a
/// string the rest is (`"degraded_reads_total"`). `remem_kv_backup_*` names a family.
#[test]
fn every_metric_the_docs_name_exists_in_the_source() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| format!("remem_{}", entry.unwrap().file_name().to_string_lossy().replace('-', "_")))
        .collect();
    let mut source = String::new();
    let mut directories = vec![root.join("crates")];
    while let Some(directory) = directories.pop() {
        for path in std::fs::read_dir(&directory).unwrap().map(|entry| entry.unwrap().path()) {
            let under_tests = path.components().any(|part| part.as_os_str() == "tests");
            if path.is_dir() && !under_tests && !path.ends_with("target") {
                directories.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") && !under_tests {
                source.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let written = |name: &str| {
        let (name, family) = match name.strip_suffix('*') {
            Some(prefix) => (prefix, true),
            None => (name, false),
        };
        let quoted = |text: &str| {
            if family {
                source.contains(&format!("\"{text}"))
            } else {
                source.contains(&format!("\"{text}\""))
            }
        };
        quoted(name)
            || (0..name.len())
                .filter(|&at| name.as_bytes()[at] == b'_')
                .any(|at| source.contains(&format!("{}{{", &name[..=at])) && quoted(&name[at + 1..]))
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, text) in documents() {
        for code in code_of(&text) {
            let mut rest = code.as_str();
            while let Some(at) = rest.find("remem_") {
                let boundary =
                    rest[..at].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '*'))
                    .unwrap_or(tail.len());
                let name = &tail[..end];
                rest = &tail[end..];
                if !boundary || rest.starts_with("::") || crates.iter().any(|crate_name| crate_name == name) {
                    continue;
                }
                checked += 1;
                if !written(name) {
                    problems.push(format!("{}: {name}", path.display()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "documented metrics the source does not write:\n{}", problems.join("\n"));
    assert!(checked > 20, "only {checked} metric names found in the docs");
}
