//! The NBD front end driven by real user-space NBD clients from Debian (qemu-io and qemu-img
//! from qemu-utils, nbdcopy and nbdinfo from libnbd-bin, fio's nbd engine, e2fsprogs), against
//! `remem nbd` child processes on real `remem node` processes. Nodes are SIGKILLed under load.
//! Every external command runs under `timeout`, and every process started here is stopped
//! when its guard drops.

use crate::common;

use common::{run, run_ok};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remem::launcher::{ClusterOptions, LocalCluster};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn test_dir(name: &str) -> common::ScratchDir {
    common::ScratchDir::new(&format!("nbd-{name}"))
}

/// Ten nodes of 4 MiB slabs (an EC(8,2) range is 8192 pages, 32 MiB), up to 256 MiB each
/// (enough for the 384 MiB copy at 1.25x; memory is taken only as slabs are mapped).
fn start_cluster(dir: &Path) -> LocalCluster {
    let options = ClusterOptions {
        lease_grace: None,
        nodes: 10,
        capacity_bytes: 256 << 20,
        slab_size_bytes: 4 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::All,
        encrypt: false,
    };
    LocalCluster::start(binary(), &options).expect("cluster starts")
}

/// A `remem nbd` child process, stopped on drop.
struct NbdServer {
    child: Child,
    address: String,
    log: PathBuf,
}

impl NbdServer {
    fn start(
        cluster: &LocalCluster,
        dir: &Path,
        size: &str,
        shape: [&str; 3],
        listen: Option<&Path>,
    ) -> NbdServer {
        let mut command = Command::new(binary());
        command
            .args(["nbd", "--cluster"])
            .arg(&cluster.cluster_file_path)
            .args(["--size", size, "--export", "test", "-k", shape[0], "-r", shape[1], "--delta", shape[2]])
            .args(["--request-timeout-ms", "1000"]);
        match listen {
            Some(path) => command.arg("--unix").arg(path),
            None => command.args(["--listen", "127.0.0.1:0"]),
        };
        NbdServer::from_command(command, dir)
    }

    /// Starts `command` (a `remem nbd` command line) and waits for its `listening` line.
    fn from_command(command: Command, dir: &Path) -> NbdServer {
        let log = dir.join("nbd.log");
        let (mut child, line) = common::spawn_with_first_line(command, &log);
        let address = match line.trim().strip_prefix("listening ") {
            Some(address) => address.to_string(),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "remem nbd did not start: {line:?}; log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            }
        };
        NbdServer { child, address, log }
    }

    fn uri(&self) -> String {
        match self.address.strip_prefix("unix:") {
            Some(path) => format!("nbd+unix:///test?socket={path}"),
            None => format!("nbd://{}/test", self.address),
        }
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "remem nbd exited: {status}; log: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        common::terminate(&mut self.child, Duration::from_secs(5));
    }
}
#[test]
fn qemu_io_writes_read_back_through_nbdcopy_and_nbdinfo_ec82() {
    let dir = test_dir("interop");
    let cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "16MiB", ["8", "2", "1"], None);
    let uri = server.uri();

    let info = run_ok(30, "nbdinfo", &["--json", &uri]);
    assert!(info.contains("\"export-size\": 16777216"), "{info}");
    assert!(info.contains("\"block_size_preferred\": 4096"), "{info}");
    assert!(info.contains("\"can_multi_conn\": true"), "{info}");

    // Aligned and unaligned writes, and write-zeroes, from qemu-io.
    run_ok(
        30,
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x5a 0 1M",
            "-c",
            "write -P 0xa5 4097 9000",
            "-c",
            "write -z 520000 10000",
        ],
    );
    // Another qemu-io connection checks the bytes it did not write.
    let checked =
        run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "read -P 0xa5 4097 9000", "-c", "read -P 0 1M 1M"]);
    assert!(!checked.contains("Pattern verification failed"), "{checked}");

    // nbdcopy reads the whole export out; compare with the model.
    let image = dir.join("out.img");
    run_ok(60, "nbdcopy", &[&uri, image.to_str().unwrap()]);
    let mut expected = vec![0u8; 16 << 20];
    expected[..1 << 20].fill(0x5a);
    expected[4097..4097 + 9000].fill(0xa5);
    expected[520000..530000].fill(0);
    let actual = std::fs::read(&image).unwrap();
    assert!(actual == expected, "nbdcopy read back different bytes");
    server.assert_running();
}

/// nbdcopy's many requests in flight on several connections, in and out of an export of twelve
/// ranges: every node holds twelve slabs, page numbers pass 2^16 and byte offsets 2^28. (It was
/// 1 GiB, 32 ranges: more ranges of the same size cross no other boundary, and took 40 s.)
#[test]
fn copy_in_and_out_is_byte_exact_384mib_ec82() {
    const BYTES: usize = 384 << 20;
    let dir = test_dir("copy");
    let cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "384MiB", ["8", "2", "1"], None);
    let uri = server.uri();
    let source = dir.join("source.img");
    let data = common::pseudo_random(BYTES, 42);
    std::fs::write(&source, &data).unwrap();
    let started = Instant::now();
    run_ok(240, "nbdcopy", &[source.to_str().unwrap(), &uri]);
    let copied_in = started.elapsed();
    std::fs::remove_file(&source).unwrap();
    let back = dir.join("back.img");
    run_ok(240, "nbdcopy", &[&uri, back.to_str().unwrap()]);
    eprintln!("384 MiB in {copied_in:?}, out {:?}", started.elapsed() - copied_in);
    let read_back = std::fs::read(&back).unwrap();
    assert!(read_back == data, "384 MiB copied in and out differ");
    server.assert_running();
    let _ = std::fs::remove_dir_all(&dir);
}

/// libnbd's nbdsh (a third client library) writes, trims and zeroes; a trimmed range reads as
/// zeros and the bytes around it survive; a FUA write and a flush are accepted.
#[test]
fn nbdsh_trim_and_write_zeroes_read_as_zeros_ec82() {
    let dir = test_dir("nbdsh");
    let cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "16MiB", ["8", "2", "1"], None);
    let uri = server.uri();
    // libnbd's Python calls take (count, offset) and pwrite (buffer, offset).
    let script = r#"
assert h.can_trim() and h.can_zero() and h.can_flush() and h.can_fua()
h.pwrite(b"\x77" * (64 * 1024), 0)
h.pwrite(b"\x33" * 4096, 1 << 20, nbd.CMD_FLAG_FUA)
h.trim(8 * 1024, 16 * 1024)
h.zero(40000, 6000)
h.flush()
data = h.pread(64 * 1024, 0)
assert data[:6000] == b"\x77" * 6000, "before the zeroed range"
assert data[6000:46000] == bytes(40000), "trimmed or zeroed bytes are zeros"
assert data[46000:] == b"\x77" * (64 * 1024 - 46000), "after the zeroed range"
assert h.pread(4096, 1 << 20) == b"\x33" * 4096
print("nbdsh checks passed")
"#;
    // nbdsh runs `python3 -m nbd`; Debian's python3-libnbd lives in the system Python, which
    // another python3 earlier on PATH (pyenv, a venv) would hide.
    let output = run_ok(60, "env", &["PATH=/usr/bin:/bin", "nbdsh", "-u", &uri, "-c", script]);
    assert!(output.contains("nbdsh checks passed"), "{output}");
    server.assert_running();
}

/// ext4 made by mke2fs from a directory, copied into the export, read back out, checked by
/// e2fsck and read by debugfs; then changed by debugfs, copied in and out again and checked
/// again; qemu-img compares the image with the export directly.
#[test]
fn ext4_made_used_and_checked_through_the_export() {
    let dir = test_dir("ext4");
    let cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "64MiB", ["8", "2", "1"], None);
    let uri = server.uri();
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let blob = common::pseudo_random(3 << 20, 7);
    std::fs::write(tree.join("blob.bin"), &blob).unwrap();
    std::fs::write(tree.join("sub/hello.txt"), b"hello from remem\n").unwrap();
    let image = dir.join("fs.img");
    let image_path = image.to_str().unwrap();
    run_ok(60, "mke2fs", &["-q", "-F", "-t", "ext4", "-d", tree.to_str().unwrap(), image_path, "64M"]);

    run_ok(60, "nbdcopy", &[image_path, &uri]);
    run_ok(60, "qemu-img", &["compare", "-f", "raw", "-F", "raw", image_path, &uri]);
    let back = dir.join("back.img");
    let back_path = back.to_str().unwrap();
    run_ok(60, "nbdcopy", &[&uri, back_path]);
    run_ok(60, "e2fsck", &["-fn", back_path]);
    let blob_out = dir.join("blob.out");
    run_ok(60, "debugfs", &["-R", &format!("dump /blob.bin {}", blob_out.display()), back_path]);
    assert!(std::fs::read(&blob_out).unwrap() == blob, "file read back through ext4 differs");

    // Use the file system: add a file, copy the image in again, and check it once more.
    let note = dir.join("note.txt");
    std::fs::write(&note, b"written after the first round trip\n").unwrap();
    run_ok(60, "debugfs", &["-w", "-R", &format!("write {} /sub/note.txt", note.display()), back_path]);
    run_ok(60, "nbdcopy", &[back_path, &uri]);
    let again = dir.join("again.img");
    run_ok(60, "nbdcopy", &[&uri, again.to_str().unwrap()]);
    run_ok(60, "e2fsck", &["-fn", again.to_str().unwrap()]);
    let listed = run_ok(60, "debugfs", &["-R", "cat /sub/note.txt", again.to_str().unwrap()]);
    assert!(listed.contains("written after the first round trip"), "{listed}");
    let hello = run_ok(60, "debugfs", &["-R", "cat /sub/hello.txt", again.to_str().unwrap()]);
    assert!(hello.contains("hello from remem"), "{hello}");
    server.assert_running();
    let _ = std::fs::remove_dir_all(&dir);
}

/// fio writes with crc32c verification while two of the ten nodes are SIGKILLed (r = 2), then
/// verifies every block; a second fio run re-verifies everything on a fresh connection.
#[test]
fn fio_verify_survives_two_killed_nodes_k8_r2() {
    let dir = test_dir("fio-kill");
    let mut cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "96MiB", ["8", "2", "1"], None);
    let uri = format!("--uri={}", server.uri());
    let common = [
        "--name=verify",
        "--ioengine=nbd",
        uri.as_str(),
        "--rw=randwrite",
        "--bs=4k",
        "--size=96M",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        // No verify state file in the working directory (crates/cli) to leave behind.
        "--verify_state_save=0",
        "--randseed=5",
    ];
    let mut fio = Command::new("timeout")
        .args(["-k", "5", "90", "fio"])
        .args(common)
        .arg("--do_verify=1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio starts (run scripts/setup.sh)");
    let mut killed_while_running = 0;
    for node in [3, 7] {
        std::thread::sleep(Duration::from_millis(700));
        if fio.try_wait().unwrap().is_none() {
            killed_while_running += 1;
        }
        cluster.kill(node).unwrap();
    }
    let mut stdout = String::new();
    fio.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let mut stderr = String::new();
    fio.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = fio.wait().unwrap();
    assert!(status.success(), "fio failed: {status}\n{stdout}\n{stderr}");
    assert!(!stdout.contains("verify: bad"), "{stdout}");
    assert!(killed_while_running >= 1, "fio finished before any node was killed: make the job longer");

    // Everything again, read-only, on a new connection with both nodes gone.
    let reverify = run_ok(90, "fio", &[&common[..], &["--verify_only=1"]].concat());
    assert!(!reverify.contains("verify: bad"), "{reverify}");
    server.assert_running();
}

/// Beyond r: with three of ten nodes gone, every page of EC(8,2) has lost three splits. Reads
/// fail with EIO (never wrong data), writes fail, and the server keeps serving.
#[test]
fn three_killed_nodes_give_eio_not_wrong_data_k8_r2() {
    let dir = test_dir("beyond-r");
    let mut cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "16MiB", ["8", "2", "1"], None);
    let uri = server.uri();
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x33 0 2M"]);
    for node in [0, 4, 8] {
        cluster.kill(node).unwrap();
    }
    let read = run(30, "qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x33 0 64k"]);
    let text = String::from_utf8_lossy(&read.stdout).to_string() + &String::from_utf8_lossy(&read.stderr);
    assert!(text.contains("Input/output error"), "{text}");
    assert!(!text.contains("Pattern verification failed"), "wrong data returned: {text}");
    let write = run(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x44 0 4k"]);
    let text = String::from_utf8_lossy(&write.stdout).to_string() + &String::from_utf8_lossy(&write.stderr);
    assert!(text.contains("Input/output error"), "{text}");
    // Never-written pages still read as zeros (no remote I/O), and the server still answers.
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "read -P 0 8M 64k"]);
    server.assert_running();
}

/// Garbage, bad flags, oversized options, bad request magic, an oversized write: each ends its
/// own connection (or gets an error) and the server keeps serving others.
#[test]
fn hostile_clients_do_not_disturb_the_server() {
    let dir = test_dir("hostile");
    let cluster = start_cluster(&dir);
    let mut server = NbdServer::start(&cluster, &dir, "8MiB", ["1", "1", "0"], None);
    let address = server.address.clone();
    let attempt = |bytes: &[u8]| {
        let mut stream = TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        // The server must answer or close, not hang: read_to_end returns within the timeout.
        let result = stream.read_to_end(&mut sink);
        assert!(result.is_ok() || sink.len() >= 18, "server hung: {result:?}");
    };
    attempt(b"");
    attempt(&[0xff; 4096]);
    attempt(&0xdead_beefu32.to_be_bytes());
    let mut huge_option = 1u32.to_be_bytes().to_vec();
    huge_option.extend_from_slice(b"IHAVEOPT");
    huge_option.extend_from_slice(&7u32.to_be_bytes());
    huge_option.extend_from_slice(&u32::MAX.to_be_bytes());
    attempt(&huge_option);
    // A valid EXPORT_NAME, then a request with a bad magic, then one with an absurd write.
    let mut session = 3u32.to_be_bytes().to_vec();
    session.extend_from_slice(b"IHAVEOPT");
    session.extend_from_slice(&1u32.to_be_bytes());
    session.extend_from_slice(&4u32.to_be_bytes());
    session.extend_from_slice(b"test");
    let mut bad_magic = session.clone();
    bad_magic.extend_from_slice(&[0x11; 28]);
    attempt(&bad_magic);
    let mut huge_write = session.clone();
    huge_write.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    huge_write.extend_from_slice(&[0, 0, 0, 1]);
    huge_write.extend_from_slice(&[0; 16]);
    huge_write.extend_from_slice(&u32::MAX.to_be_bytes());
    attempt(&huge_write);
    // Out-of-range and unknown requests from a real client get errors, not a disconnect.
    let uri = server.uri();
    let out_of_range = run(30, "qemu-io", &["-f", "raw", &uri, "-c", "read 8M 4k"]);
    assert!(!String::from_utf8_lossy(&out_of_range.stdout).contains("read 4096/4096"));
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 7 0 4k", "-c", "read -P 7 0 4k"]);
    server.assert_running();
}

#[test]
fn unix_socket_export_rep2_serves_qemu_io_and_nbdcopy() {
    let dir = test_dir("unix");
    let cluster = start_cluster(&dir);
    let socket = dir.join("nbd.sock");
    let mut server = NbdServer::start(&cluster, &dir, "8MiB", ["1", "1", "0"], Some(&socket));
    let uri = server.uri();
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x77 12345 100000", "-c", "discard 0 4096"]);
    let image = dir.join("out.img");
    run_ok(30, "nbdcopy", &[&uri, image.to_str().unwrap()]);
    let data = std::fs::read(&image).unwrap();
    assert!(data[12345..112345].iter().all(|&byte| byte == 0x77));
    assert!(data[112345..].iter().all(|&byte| byte == 0));
    server.assert_running();
}

/// `remem nbd` of export `test`, 4 MiB on TCP, with `extra`, run to its end (bounded by
/// `timeout`): for starts that must fail.
fn nbd_that_should_fail(cluster: &LocalCluster, extra: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(binary())
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "4MiB", "--export", "test", "--listen", "127.0.0.1:0"])
        .args(extra)
        .output()
        .expect("remem nbd runs")
}

/// A start that fails (here: the `--metrics` port is taken) fails before it maps or saves
/// anything and never prints `listening`: the same command then starts an export that serves.
/// Before, the slab map was saved first, and a later start "reopened" slabs freed after the
/// lease grace and answered every request with EIO.
#[test]
fn a_start_that_fails_on_a_busy_metrics_port_leaves_no_slab_map() {
    let dir = test_dir("busy-metrics");
    let cluster = start_cluster(&dir);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to occupy");
    let port = busy.local_addr().unwrap().to_string();
    let failed = nbd_that_should_fail(&cluster, &["--metrics", &port]);
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert!(!failed.status.success(), "started on a busy metrics port: {stdout}");
    assert!(!stdout.contains("listening"), "said listening before it could fail: {stdout}");
    let map = cluster.cluster_file_path.parent().unwrap().join("nbd-test.slabmap");
    assert!(!map.exists(), "a failed start saved {}", map.display());
    drop(busy);
    let server = NbdServer::start(&cluster, &dir, "4MiB", ["8", "2", "1"], None);
    let data = common::pseudo_random(4 << 20, 5);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();
    run_ok(60, "nbdcopy", &[source.to_str().unwrap(), &server.uri()]);
    let back = dir.join("back.img");
    run_ok(60, "nbdcopy", &[&server.uri(), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data);
}

/// `--fresh` never takes an export a live server serves: it is refused (the nodes name the
/// owner), the first server serves on, and its bytes are there after it restarts. Before, the
/// second server replaced the state file and served an empty export under the same name.
#[test]
fn fresh_refuses_an_export_a_live_server_serves() {
    let dir = test_dir("fresh-live");
    let cluster = start_cluster(&dir);
    let data = common::pseudo_random(4 << 20, 11);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();
    let mut first = NbdServer::start(&cluster, &dir, "4MiB", ["8", "2", "1"], None);
    run_ok(60, "nbdcopy", &[source.to_str().unwrap(), &first.uri()]);
    let second = nbd_that_should_fail(&cluster, &["--fresh"]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "--fresh took a live export: {stderr}");
    assert!(stderr.contains("served by a running process"), "{stderr}");
    first.assert_running();
    let back = dir.join("back.img");
    run_ok(60, "nbdcopy", &[&first.uri(), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "the live export changed");
    drop(first);
    let again = NbdServer::start(&cluster, &dir, "4MiB", ["8", "2", "1"], None);
    run_ok(60, "nbdcopy", &[&again.uri(), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "the export's bytes after a restart");
}

/// The export outlives its server: SIGKILLed and started again with the same arguments,
/// `remem nbd` reopens its saved slab map and serves the bytes written before; `--fresh` starts
/// an empty export; a different size is refused with a message naming `--fresh`.
#[test]
fn export_survives_a_sigkilled_server_and_fresh_starts_empty_ec82() {
    let dir = test_dir("restart");
    let cluster = start_cluster(&dir);
    let data = common::pseudo_random(8 << 20, 7);
    let source = dir.join("source.img");
    std::fs::write(&source, &data).unwrap();
    {
        let mut server = NbdServer::start(&cluster, &dir, "8MiB", ["8", "2", "1"], None);
        run_ok(60, "nbdcopy", &[source.to_str().unwrap(), &server.uri()]);
        server.child.kill().expect("SIGKILL remem nbd");
        server.child.wait().expect("reaped");
    }
    let back = dir.join("back.img");
    {
        let server = NbdServer::start(&cluster, &dir, "8MiB", ["8", "2", "1"], None);
        run_ok(60, "nbdcopy", &[&server.uri(), back.to_str().unwrap()]);
        assert!(std::fs::read(&back).unwrap() == data, "the reopened export lost or changed bytes");
    }
    let wrong_size = Command::new(binary())
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "16MiB", "--export", "test", "--listen", "127.0.0.1:0"])
        .output()
        .expect("remem nbd runs");
    assert!(!wrong_size.status.success());
    assert!(String::from_utf8_lossy(&wrong_size.stderr).contains("--fresh"));
    let mut command = Command::new(binary());
    command.args(["nbd", "--cluster"]).arg(&cluster.cluster_file_path);
    command.args(["--size", "8MiB", "--export", "test", "--fresh", "--listen", "127.0.0.1:0"]);
    let fresh = NbdServer::from_command(command, &dir);
    run_ok(60, "nbdcopy", &[&fresh.uri(), back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap().iter().all(|&byte| byte == 0), "--fresh kept old bytes");
    let _ = std::fs::remove_dir_all(&dir);
}
