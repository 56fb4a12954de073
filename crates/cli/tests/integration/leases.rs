//! Slab leases, with real node processes and real `remem nbd` servers killed with SIGKILL:
//! a dead client's slabs come back after the grace period (on the previous code they leaked
//! forever and every later start failed for want of free slabs), a restarted client re-attaches
//! to its slabs within the grace period, a failed start releases what it mapped at once, a
//! second process claiming the same slab map is refused while the first lives, and a stopped
//! one loses its lease as a dead one does.

use crate::common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::run_ok;
use remem::launcher::{ClusterOptions, LocalCluster};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn test_dir(name: &str) -> common::ScratchDir {
    common::ScratchDir::new(&format!("leases-{name}"))
}

/// Ten nodes with room for 8 slabs of 1 MiB each (and their metadata, not a ninth), so an
/// EC(8,2) export of 64 MiB (8 ranges of 8 MiB) fills the cluster.
fn start_cluster(dir: &Path, lease_grace: Option<Duration>) -> LocalCluster {
    let options = ClusterOptions {
        lease_grace,
        nodes: 10,
        capacity_bytes: 8 * (1 << 20) + 8 * 16 * 1024,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::None,
        encrypt: false,
    };
    LocalCluster::start(binary(), &options).expect("cluster starts")
}

fn nbd_command(cluster: &LocalCluster, export: &str, size: &str) -> Command {
    let mut command = Command::new(binary());
    command.args(["nbd", "--cluster"]).arg(&cluster.cluster_file_path).args([
        "--size",
        size,
        "--export",
        export,
        "--listen",
        "127.0.0.1:0",
    ]);
    command
}

/// A running `remem nbd`, killed on drop.
struct Nbd {
    child: Child,
    uri: String,
}

impl Nbd {
    fn start(cluster: &LocalCluster, dir: &Path, export: &str, size: &str) -> Nbd {
        Nbd::try_start(cluster, dir, export, size).unwrap_or_else(|why| panic!("{why}"))
    }

    /// Starts it, or says why it did not start (it has exited then).
    fn try_start(cluster: &LocalCluster, dir: &Path, export: &str, size: &str) -> Result<Nbd, String> {
        let log = dir.join(format!("nbd-{export}.log"));
        let (mut child, line) = common::spawn_with_first_line(nbd_command(cluster, export, size), &log);
        let Some(address) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "remem nbd did not start: {line:?}; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        };
        let uri = format!("nbd://{address}/{export}");
        Ok(Nbd { child, uri })
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
        let result = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(result, 0, "signal {signal} to remem nbd");
    }

    fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL remem nbd");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Nbd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `remem status --json` of the cluster.
fn status(cluster: &LocalCluster) -> serde_json::Value {
    let cluster_file = cluster.cluster_file_path.to_str().unwrap();
    let text = common::remem_status(30, &["--json", "--cluster", cluster_file]);
    serde_json::from_str(&text).expect("status --json is JSON")
}

/// Per node: (slabs mapped, clients live, clients in grace, slabs in grace).
fn slab_counts(cluster: &LocalCluster) -> Vec<(u64, u64, u64, u64)> {
    let status = status(cluster);
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|node| {
            assert_eq!(node["up"], true, "every node is up: {node}");
            let number = |key: &str| node[key].as_u64().unwrap_or_else(|| panic!("{key} in {node}"));
            (number("slabs_mapped"), number("clients"), number("clients_in_grace"), number("slabs_in_grace"))
        })
        .collect()
}
fn copy(from: &str, to: &str) {
    run_ok(60, "nbdcopy", &[from, to]);
}

#[test]
fn a_sigkilled_clients_slabs_wait_out_the_grace_period_then_are_freed() {
    let dir = test_dir("expiry");
    let cluster = start_cluster(&dir, Some(Duration::from_secs(4)));
    let data = common::pseudo_random(4 << 20, 11);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();

    // A client takes 6 of each node's 8 slabs, writes, and dies.
    let first = Nbd::start(&cluster, &dir, "first", "48MiB");
    copy(source.to_str().unwrap(), &first.uri);
    assert!(
        slab_counts(&cluster).iter().all(|&counts| counts == (6, 1, 0, 0)),
        "{:?}",
        slab_counts(&cluster)
    );
    first.sigkill();
    let counts = slab_counts(&cluster);
    assert!(counts.iter().all(|&counts| counts == (6, 0, 1, 6)), "slabs kept in grace: {counts:?}");

    // A start that needs 4 ranges maps 2, finds the nodes full and gives up: it releases those 2
    // before it exits (no grace period for slabs of a start that failed).
    let failed = nbd_command(&cluster, "second", "32MiB").output().expect("remem nbd runs");
    assert!(!failed.status.success(), "the cluster has room for 2 ranges only");
    let counts = slab_counts(&cluster);
    assert!(counts.iter().all(|&counts| counts.0 == 6), "a failed start leaked slabs: {counts:?}");

    // Within the grace period the dead client re-attaches and finds its bytes.
    let back = dir.join("back.img");
    let reopened = Nbd::start(&cluster, &dir, "first", "48MiB");
    copy(&reopened.uri, back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "the re-attached export lost bytes");
    let counts = slab_counts(&cluster);
    assert!(counts.iter().all(|&counts| counts == (6, 1, 0, 0)), "re-attached: {counts:?}");
    reopened.sigkill();

    // Past the grace period its slabs are freed, and a client that needs the whole cluster starts.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let counts = slab_counts(&cluster);
        if counts.iter().all(|&counts| counts == (0, 0, 0, 0)) {
            break;
        }
        assert!(Instant::now() < deadline, "slabs not freed 20 s after the client died: {counts:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    let whole = Nbd::start(&cluster, &dir, "whole", "64MiB");
    copy(source.to_str().unwrap(), &whole.uri);
    drop(whole);
    let log = std::fs::read_to_string(dir.join("cluster/node-0.log")).unwrap_or_default();
    assert!(log.contains("client lease expired"), "the node logs the expiry: {log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_process_claiming_a_live_clients_slab_map_is_refused() {
    let dir = test_dir("fence");
    let cluster = start_cluster(&dir, None);
    let data = common::pseudo_random(2 << 20, 12);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();
    let first = Nbd::start(&cluster, &dir, "shared", "16MiB");
    copy(source.to_str().unwrap(), &first.uri);

    let started = Instant::now();
    let second = nbd_command(&cluster, "shared", "16MiB").output().expect("remem nbd runs");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "two processes own one slab map: {stderr}");
    assert!(stderr.contains("held by another live process"), "says why: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "refused promptly");

    // The first one never noticed: it serves every byte.
    let back = dir.join("back.img");
    copy(&first.uri, back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "the holder lost bytes");

    // Once it is dead, the same command takes over and finds the bytes.
    first.sigkill();
    let second = Nbd::start(&cluster, &dir, "shared", "16MiB");
    copy(&second.uri, back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "the successor lost bytes");
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Defect (issue 31): a SIGSTOPped `remem nbd` kept its leases for ever, since its kernel answers
/// TCP keepalive, so no other process could take its export over until it was killed. Now the
/// nodes close a claimed connection that sent no heartbeat for the lease timeout (10 s).
#[test]
fn a_stopped_servers_lease_lapses_and_another_process_takes_its_export_over() {
    let dir = test_dir("stopped");
    let cluster = start_cluster(&dir, None);
    let data = common::pseudo_random(2 << 20, 13);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();
    let first = Nbd::start(&cluster, &dir, "stopped", "16MiB");
    copy(source.to_str().unwrap(), &first.uri);
    first.signal(libc::SIGSTOP);

    // Each refused attempt waits out its own 3 s fence retry; the lease lapses 10 s after the
    // stop, far within this bound (on the previous code it never did).
    let deadline = Instant::now() + Duration::from_secs(60);
    let second = loop {
        match Nbd::try_start(&cluster, &dir, "stopped", "16MiB") {
            Ok(second) => break second,
            Err(why) => {
                assert!(why.contains("held by another live process"), "refused for the lease only: {why}");
                assert!(Instant::now() < deadline, "the stopped server still holds its export: {why}");
            }
        }
    };
    let back = dir.join("back.img");
    copy(&second.uri, back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "the successor lost bytes");

    // The first one, continued, is fenced off: it cannot write over its successor's bytes.
    first.signal(libc::SIGCONT);
    let other = dir.join("other.img");
    std::fs::write(&other, common::pseudo_random(1 << 20, 14)).unwrap();
    let overwrite = common::run(60, "nbdcopy", &[other.to_str().unwrap(), &first.uri]);
    assert!(!overwrite.status.success(), "the fenced server acknowledged a write");
    copy(&second.uri, back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "the fenced server's write landed");
    drop((first, second));
    let _ = std::fs::remove_dir_all(&dir);
}
