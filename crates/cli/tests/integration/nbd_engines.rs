//! `remem nbd --engines 2` (docs/NBD.md "Engines"): the export's pages dealt across two
//! engines in 128 KiB chunks, on real `remem node` processes over shared memory. qemu-io
//! writes patterns that straddle chunk boundaries from two connections at once, a memory node
//! is SIGKILLed, every byte is read back; the export is stopped and reopened from the two
//! engines' saved maps, and a restart with another engine count is refused with the reason.

use crate::common;

use std::path::Path;
use std::process::{Child, Command};

use remem::launcher::UnixSockets;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// qemu-io on `uri` with each of `commands` as a `-c`.
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw", uri];
    for command in commands {
        args.extend(["-c", command]);
    }
    common::run_ok(60, "qemu-io", &args)
}

/// A `remem nbd` child and its NBD URI; SIGTERMed and reaped on drop.
struct Export {
    child: Child,
    uri: String,
}

impl Drop for Export {
    fn drop(&mut self) {
        // SAFETY: kill with the PID of a child the test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn nbd_command(cluster: &Path, state: &Path, engines: &str) -> Command {
    let mut command = Command::new(binary());
    command
        .args(["nbd", "--cluster"])
        .arg(cluster)
        .args(["--size", "16MiB", "--export", "test", "-k", "8", "-r", "2", "--transport", "shm"])
        .args(["--engines", engines, "--listen", "127.0.0.1:0", "--state"])
        .arg(state);
    command
}

fn start(cluster: &Path, state: &Path, engines: &str, log: &Path) -> Export {
    let (mut child, line) = common::spawn_with_first_line(nbd_command(cluster, state, engines), log);
    let Some(address) = line.trim().strip_prefix("listening ").map(str::to_owned) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("remem nbd did not start: {line:?}; {}", std::fs::read_to_string(log).unwrap_or_default());
    };
    Export { child, uri: format!("nbd://{address}/test") }
}

/// Patterns from two connections: each qemu-io covers chunk boundaries (every 128 KiB) with
/// unaligned ends, so requests are cut across both engines and read-modify-write on both.
const FIRST: [&str; 2] = ["write -P 0x5a 0 4M", "write -P 0xa7 131000 9000"];
const SECOND: [&str; 2] = ["write -P 0x3c 8M 4M", "write -P 0xc3 9306000 300000"];
const CHECKS: [&str; 7] = [
    "read -P 0x5a 0 131000",
    "read -P 0xa7 131000 9000",
    "read -P 0x5a 140000 4054304",
    "read -P 0x3c 8M 917392",
    "read -P 0xc3 9306000 300000",
    "read -P 0x3c 9606000 2976912",
    "read -P 0 4M 4M",
];

fn check_all(uri: &str) {
    let read = qemu_io(uri, &CHECKS);
    assert!(!read.contains("Pattern verification failed"), "{read}");
    assert_eq!(read.matches("read ").count(), CHECKS.len(), "{read}");
}

#[test]
fn two_engines_serve_two_connections_survive_a_killed_node_and_reopen_their_maps() {
    let mut cluster = common::start_cluster("nbd-engines", "two", 10, UnixSockets::All);
    let dir = cluster.cluster_file_path.parent().expect("a directory").to_owned();
    let state = dir.join("test.slabmap");
    let export = start(&cluster.cluster_file_path, &state, "2", &dir.join("nbd-1.log"));
    for engine in 0..2 {
        let map = dir.join(format!("test.slabmap.engine-{engine}-of-2"));
        assert!(map.exists(), "engine {engine} saved its map at {}", map.display());
    }
    assert!(!state.exists(), "no single-engine map beside the engines'");

    let uri = export.uri.clone();
    std::thread::scope(|scope| {
        let second = scope.spawn(|| qemu_io(&uri, &SECOND));
        let first = qemu_io(&uri, &FIRST);
        assert!(first.contains("wrote"), "{first}");
        let second = second.join().expect("the second connection");
        assert!(second.contains("wrote"), "{second}");
    });
    check_all(&export.uri);

    cluster.kill(3).expect("SIGKILL node 3");
    check_all(&export.uri);
    drop(export);

    let reopened = start(&cluster.cluster_file_path, &state, "2", &dir.join("nbd-2.log"));
    check_all(&reopened.uri);
    drop(reopened);

    let args: Vec<String> = nbd_command(&cluster.cluster_file_path, &state, "1")
        .get_args()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = common::run(60, binary().to_str().expect("a UTF-8 path"), &args);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a single engine must not open a two-engine export: {stderr}");
    assert!(stderr.contains("another --engines count"), "{stderr}");
}
