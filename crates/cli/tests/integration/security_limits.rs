//! Bounded resources under hostile peers (issue 17, items 4 and 5): a node's connection buffers
//! and partial frames, NBD connections that never finish the handshake, and the log volume of
//! floods. Each test starts its own processes and stops them by PID on drop.

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-limits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A child process killed (by its PID) on drop, with the first stdout line parsed.
struct Process {
    child: Child,
    first_line: String,
}

impl Process {
    fn start(command: &mut Command, log: &Path) -> Process {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
            .spawn()
            .expect("process starts");
        let mut first_line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
        assert!(first_line.starts_with("listening "), "no listening line; log: {}", read(log));
        Process { child, first_line: first_line.trim()["listening ".len()..].to_owned() }
    }

    fn address(&self) -> SocketAddr {
        self.first_line.parse().unwrap()
    }

    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn start_node(log: &Path, max_connections: &str) -> Process {
    Process::start(
        Command::new(binary())
            .args(["node", "--listen", "127.0.0.1:0", "--capacity", "256MiB", "--slab-size", "1MiB"])
            .args(["--no-monitor", "--max-connections", max_connections])
            .env("REMEM_SECRET", SECRET),
        log,
    )
}

fn authenticated(address: SocketAddr, client_id: u64) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let secret = remem_proto::auth::Secret::from_bytes(SECRET.as_bytes().to_vec()).unwrap();
    remem_proto::blocking::handshake(&mut stream, &secret, client_id).expect("authenticates");
    stream
}

/// True once the peer has closed `stream` (end of stream or reset).
fn closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn partial_frames_of_400_authenticated_connections_stay_bounded_and_are_closed() {
    let dir = fresh_dir("partial");
    let node = start_node(&dir.join("node.log"), "1000");
    let baseline = node.rss_bytes();
    // A 1 MiB WriteSplit announced, then nothing: today each one pinned a 1 MiB buffer for ever.
    let header = remem_proto::FrameHeader {
        kind: remem_proto::Kind::WriteSplit,
        body_len: remem_proto::MAX_BODY_BYTES,
        request_id: 1,
    }
    .encode();
    let started = Instant::now();
    let mut parked: Vec<TcpStream> = (0..400)
        .map(|id| {
            let mut stream = authenticated(node.address(), id + 1);
            stream.write_all(&header).unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let grown = node.rss_bytes().saturating_sub(baseline);
    assert!(grown < 160 << 20, "400 parked frames grew the node by {} MiB", grown >> 20);
    // Every connection is closed within the partial-frame deadline (plus the 1 s clock).
    let limit = remem_node::PARTIAL_FRAME_TIMEOUT + Duration::from_secs(4);
    while started.elapsed() < limit && !parked.iter_mut().all(closed) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let open = parked.iter_mut().map(closed).filter(|is_closed| !is_closed).count();
    assert_eq!(open, 0, "{open} connections still hold a partial frame after {:?}", started.elapsed());
    // The node still serves.
    drop(authenticated(node.address(), 9999));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flood_of_failed_handshakes_writes_a_bounded_node_log() {
    let dir = fresh_dir("node-log");
    let log = dir.join("node.log");
    let node = start_node(&log, "64");
    let before = read(&log).len();
    for _ in 0..1500 {
        let mut stream = TcpStream::connect(node.address()).unwrap();
        let _ = stream.write_all(b"GET / HTTP/1.0\r\n\r\n");
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = stream.read(&mut [0u8; 256]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let written = read(&log).len() - before;
    // Ten lines per 10 s and one summary, about 200 bytes each; today ~400 bytes per connection.
    assert!(written < 16 * 1024, "1500 bad connections wrote {written} bytes of node log");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three nodes and a `remem nbd` export of 4 MiB on EC(2,1).
struct Export {
    _cluster: LocalCluster,
    server: Process,
    log: PathBuf,
}

fn start_export(dir: &Path, extra: &[&str]) -> Export {
    let options = ClusterOptions {
        lease_grace: None,
        nodes: 3,
        capacity_bytes: 64 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: UnixSockets::None,
        encrypt: false,
    };
    let cluster = LocalCluster::start(binary(), &options).expect("cluster starts");
    let log = dir.join("nbd.log");
    let server = Process::start(
        Command::new(binary())
            .args(["nbd", "--cluster"])
            .arg(&cluster.cluster_file_path)
            .args(["--size", "4MiB", "--export", "test", "-k", "2", "-r", "1", "--delta", "0"])
            .args(extra),
        &log,
    );
    Export { _cluster: cluster, server, log }
}

fn nbdinfo(uri: &str) -> std::process::Output {
    Command::new("timeout").args(["20", "nbdinfo", "--size", uri]).output().expect("nbdinfo runs")
}

#[test]
fn twenty_idle_nbd_connections_do_not_lock_out_a_client() {
    let dir = fresh_dir("nbd-idle");
    let export = start_export(&dir, &["--listen", "127.0.0.1:0"]);
    let address = export.server.first_line.clone();
    // Twenty connections that never answer the greeting: today the 16 slots were theirs for the
    // 30 s handshake timeout per read, and every new client was closed at accept.
    let idle: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&address).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let output = nbdinfo(&format!("nbd://{address}/test"));
    assert!(
        output.status.success(),
        "a client was locked out by idle connections: {}; log: {}",
        String::from_utf8_lossy(&output.stderr),
        read(&export.log)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "4194304");
    assert!(started.elapsed() < Duration::from_secs(5), "served only after {:?}", started.elapsed());
    drop(idle);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fixed-newstyle handshake with NBD_OPT_EXPORT_NAME, as the simplest client does it.
fn nbd_connect(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).unwrap();
    stream.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
    let mut option = Vec::new();
    option.extend_from_slice(&0x4948_4156_454f_5054u64.to_be_bytes());
    option.extend_from_slice(&1u32.to_be_bytes());
    option.extend_from_slice(&4u32.to_be_bytes());
    option.extend_from_slice(b"test");
    stream.write_all(&option).unwrap();
    let mut export_info = [0u8; 10];
    stream.read_exact(&mut export_info).unwrap();
    stream
}

#[test]
fn a_flood_of_failing_nbd_requests_writes_a_bounded_log() {
    let dir = fresh_dir("nbd-log");
    let export = start_export(&dir, &["--listen", "127.0.0.1:0"]);
    let mut stream = nbd_connect(&export.server.first_line);
    let before = read(&export.log).len();
    // 3000 reads past the end of the export, one at a time: each fails with EINVAL.
    for handle in 0..3000u64 {
        let mut request = Vec::with_capacity(28);
        request.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        request.extend_from_slice(&0u16.to_be_bytes());
        request.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
        request.extend_from_slice(&handle.to_be_bytes());
        request.extend_from_slice(&(64u64 << 20).to_be_bytes());
        request.extend_from_slice(&4096u32.to_be_bytes());
        stream.write_all(&request).unwrap();
        let mut reply = [0u8; 16];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 22, "EINVAL");
    }
    let written = read(&export.log).len() - before;
    assert!(written < 16 * 1024, "3000 failed requests wrote {written} bytes of log");
    let _ = std::fs::remove_dir_all(&dir);
}
