//! `--metrics` from outside: a node's and a cache's Prometheus endpoints pass `promtool check
//! metrics` (Debian's prometheus), carry the numbers the commands report elsewhere, and a real
//! Prometheus server scrapes both. Processes are stopped by PID when their guards drop.

use crate::kv_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::KillOnDrop;
use kv_support::Target;

/// A free port on 127.0.0.1 for Prometheus (below the ephemeral range: see `remem::ports`).
/// Our own servers bind port 0 and print what they got (`metrics_port`): a port picked early
/// from the ephemeral range was taken by another test's server in between once.
fn free_port() -> u16 {
    remem::ports::unassigned_port().expect("a free port")
}

/// The port of the `metrics at http://127.0.0.1:PORT/metrics` line a server prints (to `log`,
/// its standard error) once it has bound `--metrics 127.0.0.1:0`.
fn metrics_port(log: &std::path::Path) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match remem::launcher::last_metrics_address(log) {
            Ok(address) => return address.port(),
            Err(error) => assert!(Instant::now() < deadline, "{error:#} ({})", log.display()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A file for a child's standard error.
fn log_file(path: &std::path::Path) -> Stdio {
    Stdio::from(std::fs::File::create(path).expect("create the log"))
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Polls until the endpoint answers (servers bind a moment after they start).
fn scrape(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(body) = http_get(port, "/metrics") {
            return body;
        }
        assert!(Instant::now() < deadline, "no metrics on port {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (scripts/setup.sh installs Debian's prometheus)");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let output = child.wait_with_output().expect("promtool ends");
    assert!(
        output.status.success(),
        "promtool rejects the metrics: {}{}\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn value_of(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .expect("a number")
}

#[test]
fn node_and_cache_metrics_pass_promtool_and_a_prometheus_server_scrapes_them() {
    let dir = kv_support::test_dir("metrics");
    let secret = dir.join("secret");
    std::fs::write(&secret, "00112233445566778899aabbccddeeff").expect("secret");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let node = Command::new(kv_support::binary())
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "16MiB",
            "--slab-size",
            "1MiB",
            "--no-monitor",
        ])
        .args(["--metrics", "127.0.0.1:0", "--secret-file"])
        .arg(&secret)
        .stdout(Stdio::null())
        .stderr(log_file(&dir.join("node.log")))
        .spawn()
        .expect("remem node starts");
    let _node = KillOnDrop(node);
    let node_port = metrics_port(&dir.join("node.log"));
    let text = scrape(node_port);
    promtool_accepts(&text);
    assert_eq!(value_of(&text, "remem_node_capacity_bytes"), 16.0 * 1024.0 * 1024.0);
    assert_eq!(value_of(&text, "remem_node_slabs_mapped"), 0.0);

    let target = Target::remem_kv("metrics", "rep2", "16MiB", &["--metrics", "127.0.0.1:0"]);
    let kv_port = metrics_port(&target.dir.join("kv.log"));
    let mut client = target.client();
    for index in 0..20 {
        client.set(&format!("k{index}"), b"value").expect("set");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(kv_port);
        if text.contains("remem_kv_sets_total 20") {
            break text;
        }
        assert!(Instant::now() < deadline, "the cache's metrics never showed the 20 sets:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    promtool_accepts(&text);
    assert_eq!(value_of(&text, "remem_kv_items"), 20.0);
    assert_eq!(value_of(&text, "remem_kv_scheme_items{scheme=\"rep2\"}"), 20.0);
    assert_eq!(value_of(&text, "remem_kv_nodes_connected"), kv_support::NODES as f64);

    // A real Prometheus scrapes both every second.
    let prometheus_port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: remem\n    static_configs:\n      - targets: ['127.0.0.1:{node_port}', '127.0.0.1:{kv_port}']\n"
        ),
    )
    .expect("config");
    let prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus runs (scripts/setup.sh installs it)");
    let _prometheus = KillOnDrop(prometheus);
    let deadline = Instant::now() + Duration::from_secs(30);
    for query in ["remem_node_capacity_bytes", "remem_kv_items"] {
        loop {
            let answer =
                http_get(prometheus_port, &format!("/api/v1/query?query={query}")).unwrap_or_default();
            if answer.contains("\"result\":[{") {
                break;
            }
            assert!(Instant::now() < deadline, "prometheus never scraped {query}: {answer}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// `remem nbd --metrics`: the page ops an NBD client's copy became, with their latency
/// histograms and the ranges' health, in a form promtool accepts.
#[test]
fn nbd_metrics_count_page_ops_with_latency_histograms() {
    let dir = kv_support::test_dir("nbd-metrics");
    let options = remem::launcher::ClusterOptions {
        lease_grace: None,
        nodes: 10,
        capacity_bytes: 16 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::None,
        encrypt: false,
    };
    let cluster =
        remem::launcher::LocalCluster::start(kv_support::binary(), &options).expect("cluster starts");
    let mut command = Command::new(kv_support::binary());
    command
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "8MiB", "--export", "m", "--listen", "127.0.0.1:0"])
        .args(["--metrics", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file(&dir.join("nbd.log")));
    let mut child = command.spawn().expect("remem nbd starts");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    let _nbd = KillOnDrop(child);
    let port = metrics_port(&dir.join("nbd.log"));
    let address = line.trim().strip_prefix("listening ").expect("listening line").to_owned();
    let image = dir.join("image");
    std::fs::write(&image, vec![0x5a; 4 << 20]).unwrap();
    let uri = format!("nbd://{address}/m");
    for (from, to) in [(image.to_str().unwrap(), uri.as_str()), (uri.as_str(), image.to_str().unwrap())] {
        let status = Command::new("nbdcopy").args([from, to]).status().expect("nbdcopy runs");
        assert!(status.success());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(port);
        if text.contains("remem_nbd_page_writes_total")
            && value_of(&text, "remem_nbd_page_reads_total") >= 1024.0
        {
            break text;
        }
        assert!(Instant::now() < deadline, "the export's metrics never showed the copy:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    promtool_accepts(&text);
    assert!(value_of(&text, "remem_nbd_page_writes_total") >= 1024.0, "{text}");
    assert_eq!(
        value_of(&text, "remem_nbd_page_op_seconds_count{op=\"read\"}"),
        value_of(&text, "remem_nbd_page_reads_total")
    );
    assert_eq!(value_of(&text, "remem_nbd_page_read_errors_total"), 0.0);
    assert_eq!(value_of(&text, "remem_nbd_ranges_healthy"), value_of(&text, "remem_nbd_ranges"));
    assert!(text.contains("remem_nbd_page_op_seconds_bucket{op=\"write\",le=\"+Inf\"}"), "{text}");
}

/// A `remem fs` mount, unmounted and stopped on drop: SIGTERM by PID, then a lazy
/// `fusermount3 -u -z` in case the process could not unmount.
struct FsGuard {
    child: Child,
    mountpoint: std::path::PathBuf,
}

impl Drop for FsGuard {
    fn drop(&mut self) {
        // SAFETY: kill with the PID of a child this test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mountpoint).status();
    }
}

/// `remem fs --metrics`: file requests by kind with bytes, errors and latency histograms, the
/// page ops they became, and the ranges' health, in a form promtool accepts; and `remem status`
/// shows the file system's own region report.
#[test]
fn fs_metrics_count_file_ops_and_status_shows_its_regions() {
    use std::os::unix::fs::OpenOptionsExt;
    assert!(std::path::Path::new("/dev/fuse").exists(), "/dev/fuse is missing: this test needs FUSE");
    let dir = kv_support::test_dir("fs-metrics");
    let options = remem::launcher::ClusterOptions {
        lease_grace: None,
        nodes: 10,
        capacity_bytes: 16 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::None,
        encrypt: false,
    };
    let cluster =
        remem::launcher::LocalCluster::start(kv_support::binary(), &options).expect("cluster starts");
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint).expect("mount point");
    let mut child = Command::new(kv_support::binary())
        .arg("fs")
        .arg(&mountpoint)
        .arg("--cluster")
        .arg(&cluster.cluster_file_path)
        .args(["--size", "8MiB", "-k", "8", "-r", "2", "--fresh"])
        .args(["--metrics", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file(&dir.join("fs.log")))
        .spawn()
        .expect("remem fs starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let fs = FsGuard { child, mountpoint: mountpoint.clone() };
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("first line");
    assert!(line.starts_with("mounted "), "remem fs did not mount: {line:?}");
    let port = metrics_port(&dir.join("fs.log"));

    let data: Vec<u8> =
        (0..1u32 << 20).map(|index| (index.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let file_path = mountpoint.join("data");
    let mut file = std::fs::File::create(&file_path).expect("create");
    file.write_all(&data).expect("write 1 MiB");
    file.sync_all().expect("fsync");
    drop(file);
    // O_DIRECT: the reads reach the file system instead of the kernel's page cache.
    let mut direct =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&file_path).expect("open");
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).expect("layout");
    // SAFETY: the layout has a non-zero size; the buffer is freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buffer.is_null(), "allocation");
    // SAFETY: `buffer` is 1 MiB, valid and zeroed, and owned by this test until dealloc.
    let slice = unsafe { std::slice::from_raw_parts_mut(buffer, 1 << 20) };
    direct.read_exact(slice).expect("O_DIRECT read");
    let equal = slice == &data[..];
    // SAFETY: allocated above with this layout, not used after.
    unsafe { std::alloc::dealloc(buffer, layout) };
    assert!(equal, "the file read back wrong");
    // Closed before the unmount below: a file still open holds the mount (and the report) up.
    drop(direct);
    std::fs::rename(&file_path, mountpoint.join("renamed")).expect("rename");
    assert!(std::fs::metadata(mountpoint.join("missing")).is_err(), "a lookup that fails");

    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = scrape(port);
        // The range gauges come from the healer, about once a second.
        if text.contains("remem_fs_ranges ") && value_of(&text, "remem_fs_ranges") > 0.0 {
            break text;
        }
        assert!(Instant::now() < deadline, "the file system's metrics never showed its ranges:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    promtool_accepts(&text);
    assert_eq!(value_of(&text, "remem_fs_bytes_total{op=\"write\"}"), (1 << 20) as f64, "{text}");
    assert!(value_of(&text, "remem_fs_bytes_total{op=\"read\"}") >= (1 << 20) as f64, "{text}");
    assert!(value_of(&text, "remem_fs_ops_total{op=\"create\"}") >= 1.0, "{text}");
    assert!(value_of(&text, "remem_fs_ops_total{op=\"fsync\"}") >= 1.0, "{text}");
    assert!(value_of(&text, "remem_fs_ops_total{op=\"rename\"}") >= 1.0, "{text}");
    assert!(value_of(&text, "remem_fs_op_errors_total{op=\"lookup\"}") >= 1.0, "{text}");
    assert_eq!(value_of(&text, "remem_fs_op_errors_total{op=\"write\"}"), 0.0);
    assert_eq!(
        value_of(&text, "remem_fs_op_seconds_count{op=\"write\"}"),
        value_of(&text, "remem_fs_ops_total{op=\"write\"}")
    );
    assert!(value_of(&text, "remem_fs_page_writes_total") >= 256.0, "1 MiB is 256 pages: {text}");
    assert!(value_of(&text, "remem_fs_page_reads_total") >= 256.0, "{text}");
    assert_eq!(value_of(&text, "remem_fs_page_read_errors_total"), 0.0);
    assert_eq!(value_of(&text, "remem_fs_ranges_healthy"), value_of(&text, "remem_fs_ranges"));
    assert_eq!(value_of(&text, "remem_fs_ranges_lost"), 0.0);

    // `remem status` shows the file system's client and its region, from its own report.
    let output = Command::new(kv_support::binary())
        .args(["status", "--timeout-ms", "2000", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .output()
        .expect("remem status runs");
    let status = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{status}{}", String::from_utf8_lossy(&output.stderr));
    let mount_name = mountpoint.canonicalize().expect("mount point").display().to_string();
    assert!(status.contains(&format!("  fs {mount_name} (pid {}", fs.child.id())), "{status}");
    assert!(status.contains("    region 0 EC(8,2): 1 ranges, 1 healthy, 0 degraded"), "{status}");
    drop(fs);
    let reports = dir.join("cluster").join("clients");
    let left: Vec<_> =
        std::fs::read_dir(&reports).map(|entries| entries.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "a cleanly stopped file system removes its report: {left:?}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `remem kv --standby --metrics`: before it takes over, the standby serves gauges of its own
/// (attached, synced, changes applied, the primary's silence), promtool-clean; after the primary
/// is SIGKILLed it takes over and the same endpoint serves the cache's metrics.
#[test]
fn a_standby_serves_its_own_metrics_until_it_takes_over_then_the_caches() {
    let flags = ["--replication", "rpc"];
    let mut target = Target::remem_kv("standby-metrics", "auto", "16MiB", &flags);
    let cluster = target.cluster.as_ref().expect("a remem cluster");
    let args: Vec<String> =
        ["--scheme", "auto", "-m", "16MiB", "--replication", "rpc", "--standby", "--metrics", "127.0.0.1:0"]
            .iter()
            .map(|arg| arg.to_string())
            .collect();
    let (mut standby, first_line) = remem::kv_bench::ServerProcess::spawn_remem_kv(
        kv_support::binary(),
        &cluster.cluster_file_path,
        &args,
        &target.dir.join("standby.log"),
        "standby",
    )
    .unwrap_or_else(|error| panic!("{error:#}"));
    let port = metrics_port(&target.dir.join("standby.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(port);
        if text.contains("remem_kv_standby_synced 1") {
            break text;
        }
        assert!(standby.exited().is_none(), "the standby exited: {}", standby.log_full());
        assert!(Instant::now() < deadline, "the standby never showed itself synced:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    promtool_accepts(&text);
    assert_eq!(value_of(&text, "remem_kv_standby_attached"), 1.0);
    assert_eq!(value_of(&text, "remem_kv_standby_attaches_total"), 1.0);
    assert!(!text.contains("remem_kv_items"), "a standby serves no cache metrics:\n{text}");
    let applied_before = value_of(&text, "remem_kv_standby_changes_applied_total");
    let mut client = target.client();
    for index in 0..20 {
        client.set(&format!("k{index}"), b"value").expect("set");
    }
    let applied = value_of(&scrape(port), "remem_kv_standby_changes_applied_total");
    assert!(applied >= applied_before + 20.0, "20 sets applied: {applied_before} then {applied}");
    assert!(value_of(&scrape(port), "remem_kv_standby_primary_silence_seconds") < 2.0);

    crate::kv_crash::sigkill(&mut target.server);
    standby.wait_listening(&first_line, Duration::from_secs(30)).unwrap_or_else(|error| panic!("{error:#}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(port);
        if text.contains("remem_kv_items 20") {
            break text;
        }
        assert!(Instant::now() < deadline, "the new primary's metrics never showed the 20 items:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    promtool_accepts(&text);
    assert!(!text.contains("remem_kv_standby_synced"), "the standby's gauges are gone:\n{text}");
    target.server = standby;
    target.assert_running();
}
