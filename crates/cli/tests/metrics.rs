//! `--metrics` from outside: a node's and a cache's Prometheus endpoints pass `promtool check
//! metrics` (Debian's prometheus), carry the numbers the commands report elsewhere, and a real
//! Prometheus server scrapes both. Processes are stopped by PID when their guards drop.

#[path = "common/kv.rs"]
mod kv_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kv_support::Target;

/// A free port on 127.0.0.1 (bound and released: good enough for one test's servers).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("address").port()
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

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn node_and_cache_metrics_pass_promtool_and_a_prometheus_server_scrapes_them() {
    let node_port = free_port();
    let kv_port = free_port();
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
        .args(["--metrics", &format!("127.0.0.1:{node_port}"), "--secret-file"])
        .arg(&secret)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("remem node starts");
    let _node = Guard(node);
    let text = scrape(node_port);
    promtool_accepts(&text);
    assert_eq!(value_of(&text, "remem_node_capacity_bytes"), 16.0 * 1024.0 * 1024.0);
    assert_eq!(value_of(&text, "remem_node_slabs_mapped"), 0.0);

    let target =
        Target::remem_kv("metrics", "rep2", "16MiB", &["--metrics", &format!("127.0.0.1:{kv_port}")]);
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
    let _prometheus = Guard(prometheus);
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
    };
    let cluster =
        remem::launcher::LocalCluster::start(kv_support::binary(), &options).expect("cluster starts");
    let port = free_port();
    let mut command = Command::new(kv_support::binary());
    command
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "8MiB", "--export", "m", "--listen", "127.0.0.1:0"])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = command.spawn().expect("remem nbd starts");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    let _nbd = Guard(child);
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
