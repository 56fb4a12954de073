//! remem with etcd as its metadata home (docs/ETCD.md), against a real etcd (Debian's
//! etcd-server) started here on free ports: nodes register and leave, `remem nbd --etcd` finds
//! them there and keeps its slab map there, a restarted export from another directory finds
//! every byte, a second process on the same export is fenced, and the data path serves on while
//! etcd is paused or killed, taking a node added once etcd is back. Every process started here
//! is stopped by PID; every external command runs under `timeout`.

use crate::common;
use crate::etcd_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{run, run_ok};
use etcd_support::{wait_for, EtcdNode, EtcdServer};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn test_dir(name: &str) -> common::ScratchDir {
    common::ScratchDir::new(&format!("etcd-{name}"))
}

/// etcd, its secret and `count` nodes registered in it (checked with etcdctl).
fn start_cluster(dir: &Path, count: usize) -> (EtcdServer, PathBuf, Vec<EtcdNode>) {
    etcd_support::start_registered(dir, count, ("16MiB", "1MiB"))
}

/// A `remem nbd --etcd` child process, stopped on drop.
struct NbdServer {
    child: Child,
    address: String,
    log: PathBuf,
}

impl NbdServer {
    /// Starts the export `test` (8 MiB, EC(4,2)) with its working directory and runtime
    /// directory in `home`, so nothing local carries over between two homes.
    fn start(etcd: &EtcdServer, secret: &Path, home: &Path) -> NbdServer {
        NbdServer::start_with(nbd_command(etcd, secret, home), home)
    }

    fn start_with(command: Command, home: &Path) -> NbdServer {
        std::fs::create_dir_all(home).expect("home");
        let log = home.join("nbd.log");
        let (mut child, line) = common::spawn_with_first_line(command, &log);
        let Some(address) = line.trim().strip_prefix("listening ").map(str::to_owned) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "remem nbd did not start: {line:?}; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        NbdServer { child, address, log }
    }

    fn uri(&self) -> String {
        format!("nbd://{}/test", self.address)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("remem nbd exited: {status}; log: {}", self.log_text());
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        common::terminate(&mut self.child, Duration::from_secs(5));
    }
}

fn nbd_command(etcd: &EtcdServer, secret: &Path, home: &Path) -> Command {
    let mut command = Command::new(binary());
    command
        .args(["nbd", "--etcd", &etcd.url, "--secret-file"])
        .arg(secret)
        .args(["--size", "8MiB", "--export", "test", "-k", "4", "-r", "2", "--delta", "0"])
        .args(["--request-timeout-ms", "1000", "--listen", "127.0.0.1:0"])
        // Leases of 3 s, not 10: what waits for one here waits less.
        .args(["--etcd-lease-seconds", "3"])
        .current_dir(home)
        .env("XDG_RUNTIME_DIR", home);
    command
}

#[test]
fn nodes_register_leave_cleanly_and_bad_records_are_skipped() {
    let dir = test_dir("register");
    let (etcd, secret, mut nodes) = start_cluster(&dir, 3);
    let key = format!("/remem/nodes/{}", nodes[1].address);
    let value = etcd.etcdctl(&["get", "--print-value-only", &key]);
    let record: serde_json::Value = serde_json::from_slice(&value.stdout).expect("a JSON node record");
    assert_eq!(record["capacity_bytes"], 16 << 20);
    assert_eq!(record["slab_size_bytes"], 1 << 20);
    assert_eq!(record["failure_domain"], "domain-1");
    assert_eq!(record["address"], nodes[1].address.as_str());

    // Hostile records beside the real ones: garbage, and a record speaking for another key.
    assert!(etcd.etcdctl(&["put", "/remem/nodes/10.9.9.9:1", "not json"]).status.success());
    let stolen = String::from_utf8_lossy(&value.stdout).into_owned();
    assert!(etcd.etcdctl(&["put", "/remem/nodes/127.0.0.1:9", stolen.trim()]).status.success());
    let status = common::remem_status(20, &["--etcd", &etcd.url, "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let mut listed: Vec<String> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["address"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected: Vec<String> = nodes.iter().map(|node| node.address.clone()).collect();
    expected.sort();
    assert_eq!(listed, expected, "status lists exactly the valid records");
    assert_eq!(status["capacity_bytes"], 3 * (16 << 20));

    // A clean stop revokes the lease: the key goes at once, not after the TTL.
    let stopped = Instant::now();
    let gone = format!("/remem/nodes/{}", nodes[0].address);
    let status = nodes[0].stop();
    assert!(status.is_some_and(|status| status.success()), "unclean stop: {status:?}");
    let log = std::fs::read_to_string(&nodes[0].log).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        wait_for(Duration::from_secs(5), || !etcd.keys("/remem/nodes/").contains(&gone)),
        "{gone} stayed"
    );
    assert!(stopped.elapsed() < Duration::from_secs(8));

    // A SIGKILLed node keeps its record until its lease lapses: `status` with the secret asks
    // every registered node and shows it DOWN at once; from the records alone it is still up.
    nodes[2].child.kill().expect("SIGKILL node 2");
    let _ = nodes[2].child.wait();
    let killed = nodes[2].address.clone();
    assert!(
        etcd.keys("/remem/nodes/").contains(&format!("/remem/nodes/{killed}")),
        "the record outlives the node"
    );
    let secret_file = secret.to_str().unwrap();
    let args = ["--etcd", &etcd.url, "--secret-file", secret_file, "--json", "--timeout-ms", "2000"];
    let live: serde_json::Value = serde_json::from_str(&common::remem_status(20, &args)).unwrap();
    let row = |status: &serde_json::Value, address: &str| {
        status["nodes"].as_array().unwrap().iter().find(|node| node["address"] == address).cloned()
    };
    assert_eq!(live["nodes_up"], 1, "{live:#}");
    let down = row(&live, &killed).expect("the killed node is listed");
    assert_eq!(down["up"], false, "{down:#}");
    assert!(down["error"].as_str().is_some_and(|error| !error.is_empty()), "{down:#}");
    let alive = row(&live, &nodes[1].address).expect("node 1 is listed");
    assert_eq!((alive["up"].clone(), alive["capacity_bytes"].clone()), (true.into(), (16u64 << 20).into()));
    let records = common::remem_status(20, &["--etcd", &etcd.url, "--json"]);
    let records: serde_json::Value = serde_json::from_str(&records).unwrap();
    assert_eq!(row(&records, &killed).expect("still registered")["up"], true);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restarted_nbd_elsewhere_finds_every_byte_after_sigkill_and_fresh_starts_empty_ec42() {
    let dir = test_dir("reattach");
    let (etcd, secret, _nodes) = start_cluster(&dir, 6);
    let data = common::pseudo_random(8 << 20, 11);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();
    {
        let mut first = NbdServer::start(&etcd, &secret, &dir.join("host-a"));
        run_ok(60, "nbdcopy", &[source.to_str().unwrap(), &first.uri()]);
        assert_eq!(
            etcd.keys("/remem/clients/test/"),
            ["/remem/clients/test/owner", "/remem/clients/test/slabmap"]
        );
        first.child.kill().expect("SIGKILL remem nbd");
        first.child.wait().expect("reaped");
    }
    // Another "host": nothing local in common. It waits out the dead owner's lease (3 s).
    let second = NbdServer::start(&etcd, &secret, &dir.join("host-b"));
    assert!(second.log_text().contains("reopened the export saved in etcd"), "{}", second.log_text());
    let back = dir.join("back.img");
    run_ok(60, "nbdcopy", &[&second.uri(), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "the export reopened from etcd lost or changed bytes");

    // A clean stop revokes the owner lease: a third process starts at once, and --fresh drops
    // the saved map (its slabs unmapped) and serves zeros.
    let log = second.log.clone();
    drop(second);
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!log.contains("panicked") && !log.contains("error"), "unclean stop: {log}");
    let started = Instant::now();
    let home = dir.join("host-c");
    let mut command = nbd_command(&etcd, &secret, &home);
    command.arg("--fresh");
    let third = NbdServer::start_with(command, &home);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "waited for a lease a clean stop should have revoked"
    );
    run_ok(60, "nbdcopy", &[&third.uri(), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap().iter().all(|&byte| byte == 0), "--fresh kept old bytes");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn second_nbd_on_the_same_export_is_fenced_and_a_rewritten_map_stops_the_first() {
    let dir = test_dir("fence");
    let (etcd, secret, mut nodes) = start_cluster(&dir, 7);
    let mut first = NbdServer::start(&etcd, &secret, &dir.join("host-a"));
    run_ok(30, "qemu-io", &["-f", "raw", &first.uri(), "-c", "write -P 0x5a 0 1M"]);

    // A second process claiming the same export waits one lease, then gives up, naming the key.
    let home = dir.join("host-b");
    std::fs::create_dir_all(&home).unwrap();
    let mut command = Command::new("timeout");
    command.args(["-k", "5", "40"]).arg(binary());
    command.args(nbd_command(&etcd, &secret, &home).get_args());
    command.current_dir(&home);
    let claimed = Instant::now();
    let second = command.output().expect("remem nbd runs");
    let stderr = String::from_utf8_lossy(&second.stderr);
    eprintln!("the second process gave up after {:?}:\n{stderr}", claimed.elapsed());
    assert!(!second.status.success(), "the second process served: {stderr}");
    assert!(
        stderr.contains("/remem/clients/test/owner") && stderr.contains("held by another live process"),
        "{stderr}"
    );
    first.assert_running();
    run_ok(30, "qemu-io", &["-f", "raw", &first.uri(), "-c", "read -P 0x5a 0 1M"]);

    // Someone else writes the slab map: the first process's next save (after the rebuild a
    // killed node causes) fails its compare-and-swap, and it stops without writing.
    assert!(etcd
        .etcdctl(&["put", "/remem/clients/test/slabmap", "{\"written\":\"elsewhere\"}"])
        .status
        .success());
    nodes[0].child.kill().expect("SIGKILL a node");
    let _ = run(30, "qemu-io", &["-f", "raw", &first.uri(), "-c", "write -P 0x5b 0 4M"]);
    let exited = wait_for(Duration::from_secs(40), || matches!(first.child.try_wait(), Ok(Some(_))));
    assert!(exited, "the fenced process kept serving; log: {}", first.log_text());
    let status = first.child.wait().unwrap();
    assert!(!status.success(), "a fenced process must exit with an error");
    assert!(first.log_text().contains("fenced"), "{}", first.log_text());
    let map = etcd.etcdctl(&["get", "--print-value-only", "/remem/clients/test/slabmap"]);
    assert_eq!(
        String::from_utf8_lossy(&map.stdout).trim(),
        "{\"written\":\"elsewhere\"}",
        "the fenced process wrote"
    );
    eprintln!("fenced process's log:\n{}", first.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nbd_serves_while_etcd_is_down_and_takes_a_node_added_after_it_returns() {
    let dir = test_dir("outage");
    let (mut etcd, secret, mut nodes) = start_cluster(&dir, 6);
    let mut server = NbdServer::start(&etcd, &secret, &dir.join("host-a"));
    let uri = server.uri();
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x11 0 1M"]);

    // Paused: requests to etcd hang; the data path does not notice.
    etcd.signal(libc::SIGSTOP);
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x12 1M 1M", "-c", "read -P 0x11 0 1M"]);
    std::thread::sleep(Duration::from_secs(3));
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x12 1M 1M"]);
    etcd.signal(libc::SIGCONT);

    // Killed for longer than a lease: reads and writes go on all along. A node started meanwhile
    // serves, unregistered, and says so once.
    etcd.kill();
    nodes.push(EtcdNode::start(binary(), &dir, &etcd.url, &secret, 6));
    let outage = Instant::now();
    let mut round = 0u8;
    while outage.elapsed() < Duration::from_secs(6) {
        let pattern = format!("0x{:02x}", 0x20 + round);
        let write = format!("write -P {pattern} 2M 512k");
        let read = format!("read -P {pattern} 2M 512k");
        run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", &write, "-c", &read, "-c", "read -P 0x11 0 1M"]);
        round += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    server.assert_running();
    assert!(round >= 3, "only {round} rounds of I/O in 6 s without etcd");

    let node_log = std::fs::read_to_string(&nodes[6].log).unwrap_or_default();
    assert_eq!(node_log.matches("cannot register in etcd").count(), 1, "{node_log}");

    // Back: that node registers, and the running export takes it.
    etcd.restart();
    let joined = format!("node {} joined", nodes[6].address);
    assert!(
        wait_for(Duration::from_secs(20), || server.log_text().contains(&joined)),
        "{}",
        server.log_text()
    );
    server.assert_running();
    assert!(!server.log_text().contains("fenced"), "{}", server.log_text());
    let last = format!("read -P 0x{:02x} 2M 512k", 0x20 + round - 1);
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", &last, "-c", "read -P 0x12 1M 1M"]);
    eprintln!("log of the export that rode out the outage:\n{}", server.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}
