//! Front ends over the shared-memory transport (`--transport shm`, docs/SHM.md): `remem nbd`
//! driven by qemu-io and `remem kv` by memcached text requests, on nodes with Unix sockets; every
//! byte read back checked, and the nodes' slabs mapped into the front end's process (memfds in
//! its /proc maps). A cluster without Unix sockets is refused with the reason.

use crate::common;

use std::path::Path;
use std::process::Command;

use remem::kv_bench::{ServerProcess, StoreOutcome, TextClient};
use remem::launcher::UnixSockets;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// Slabs of nodes mapped into process `pid` (memfds show as `/memfd:` in its maps).
fn memfd_mappings(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the process's maps");
    maps.lines().filter(|line| line.contains("/memfd:")).count()
}

/// qemu-io on `uri` with each of `commands` as a `-c`.
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw", uri];
    for command in commands {
        args.extend(["-c", command]);
    }
    common::run_ok(30, "qemu-io", &args)
}

#[test]
fn nbd_over_shared_memory_serves_qemu_io_from_mapped_slabs() {
    let cluster = common::start_cluster("front-ends-shm", "nbd", 10, UnixSockets::All);
    let dir = cluster.cluster_file_path.parent().expect("a directory").to_owned();
    let mut command = Command::new(binary());
    command
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "16MiB", "--export", "test", "-k", "8", "-r", "2", "--transport", "shm"])
        .args(["--listen", "127.0.0.1:0"]);
    let log = dir.join("nbd-shm.log");
    let (mut child, line) = common::spawn_with_first_line(command, &log);
    let Some(address) = line.trim().strip_prefix("listening ").map(str::to_owned) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("remem nbd did not start: {line:?}; {}", std::fs::read_to_string(&log).unwrap_or_default());
    };
    let uri = format!("nbd://{address}/test");
    let written = qemu_io(&uri, &["write -P 0x3c 0 2M", "write -P 0xc3 5000 70000"]);
    assert!(written.contains("wrote"), "{written}");
    let read = qemu_io(&uri, &["read -P 0x3c 0 4096", "read -P 0xc3 5000 70000", "read -P 0x3c 75000 1M"]);
    assert!(!read.contains("Pattern verification failed"), "{read}");
    let mapped = memfd_mappings(child.id());
    assert!(mapped >= 10, "an EC(8,2) range's 10 slabs are mapped, not {mapped}");
    // SAFETY: kill with the PID of a child the test spawned and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let _ = child.wait();
}

#[test]
fn kv_over_shared_memory_stores_and_reads_back_every_size_and_without_sockets_is_refused() {
    let cluster = common::start_cluster("front-ends-shm", "kv", 12, UnixSockets::All);
    let dir = cluster.cluster_file_path.parent().expect("a directory").to_owned();
    let args: Vec<String> = ["--transport", "shm", "--scheme", "ec8+2", "-m", "16MiB", "--ephemeral"]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
    let server = ServerProcess::start_remem_kv(
        binary(),
        &cluster.cluster_file_path,
        &args,
        &dir.join("kv-shm.log"),
        "kv shm",
    )
    .unwrap_or_else(|error| panic!("{error:#}"));
    let mut client =
        TextClient::connect(server.address, std::time::Duration::from_secs(10)).expect("connects");
    let sizes = [1usize, 100, 4095, 4096, 4097, 60_000, 300_000];
    for (index, &size) in sizes.iter().enumerate() {
        let value = common::pseudo_random(size, index as u64 + 1);
        assert_eq!(client.set(&format!("k{index}"), &value).expect("set"), StoreOutcome::Stored);
    }
    for (index, &size) in sizes.iter().enumerate() {
        let value = common::pseudo_random(size, index as u64 + 1);
        assert_eq!(client.get(&format!("k{index}")).expect("get"), Some(value), "k{index} of {size} bytes");
    }
    assert!(memfd_mappings(server.pid()) >= 10, "the EC region's slabs are mapped");
    drop(server);

    let plain = common::start_cluster("front-ends-shm", "kv-tcp", 12, UnixSockets::None);
    let refused = ServerProcess::start_remem_kv(
        binary(),
        &plain.cluster_file_path,
        &args,
        &plain.cluster_file_path.parent().expect("a directory").join("kv-refused.log"),
        "kv shm without sockets",
    );
    let error = format!("{:#}", refused.err().expect("refused"));
    assert!(error.contains("no node") && error.contains("Unix socket"), "{error}");
}
