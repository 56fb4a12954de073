//! Secrets and runtime directories, attacked as another local user would (the tests run as
//! root, as CI does; the other user is `nobody`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};

fn options(dir: PathBuf) -> ClusterOptions {
    ClusterOptions {
        lease_grace: None,
        nodes: 1,
        capacity_bytes: 4 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir,
        fault_injection: false,
        monitor_args: None,
        unix_sockets: UnixSockets::None,
        encrypt: false,
    }
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-security-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn nobody() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let output = Command::new("id").args([flag, "nobody"]).output().expect("id runs");
        String::from_utf8_lossy(&output.stdout).trim().parse().expect("nobody exists")
    };
    (id("-u"), id("-g"))
}

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests act as two users: run them as root (CI does)");
}

/// Runs `cat path` as `nobody`; true if it could read the file.
fn nobody_can_read(path: &Path) -> bool {
    let (uid, gid) = nobody();
    Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string(), "--clear-groups", "cat"])
        .arg(path)
        .output()
        .expect("setpriv runs")
        .status
        .success()
}

#[test]
fn the_cluster_directory_is_private_and_the_secret_is_never_readable_by_others() {
    assert_root();
    let dir = fresh_dir("private");
    let cluster = LocalCluster::start(binary(), &options(dir.clone())).expect("cluster starts");
    let dir_mode = std::fs::metadata(&dir).unwrap().mode() & 0o7777;
    assert_eq!(dir_mode, 0o700, "the cluster directory has mode {dir_mode:o}");
    let secret_mode = std::fs::metadata(dir.join("secret")).unwrap().mode() & 0o7777;
    assert_eq!(secret_mode, 0o600, "the secret has mode {secret_mode:o}");
    assert!(!nobody_can_read(&dir.join("secret")), "another user read the cluster secret");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_another_user_owns_is_refused_and_a_planted_symlink_is_not_followed() {
    assert_root();
    let (uid, gid) = nobody();
    // Another user made the predictable directory first and planted a link named `secret`.
    let dir = fresh_dir("planted");
    std::fs::create_dir_all(&dir).unwrap();
    let victim = fresh_dir("victim-file");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("secret")).unwrap();
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: chown of a path we created, with a valid C string.
    assert_eq!(unsafe { libc::chown(c_dir.as_ptr(), uid, gid) }, 0);
    let refused = LocalCluster::start(binary(), &options(dir.clone()));
    let message = format!("{:#}", refused.err().expect("another user's directory is refused"));
    assert!(message.contains("belongs to user"), "unexpected error: {message}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the link's target was overwritten");
    assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o777, 0o644, "the link's target was chmodded");

    // Our own directory with the same planted link: the link is replaced, never followed.
    // SAFETY: as above, back to root.
    assert_eq!(unsafe { libc::chown(c_dir.as_ptr(), 0, 0) }, 0);
    let cluster = LocalCluster::start(binary(), &options(dir.clone())).expect("our own directory is used");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the link's target was overwritten");
    let secret = std::fs::symlink_metadata(dir.join("secret")).unwrap();
    assert!(secret.file_type().is_file() && secret.mode() & 0o077 == 0, "the secret is a private file");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&victim);
}

#[test]
fn a_node_refuses_a_secret_file_other_users_can_read() {
    let dir = fresh_dir("readable-secret");
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, b"0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = Command::new(binary())
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "4MiB",
            "--slab-size",
            "1MiB",
            "--secret-file",
        ])
        .arg(&secret)
        .env_remove("REMEM_SECRET")
        .output()
        .expect("remem node runs");
    assert!(!output.status.success(), "the node started with a world-readable secret");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("other users can read it"), "unexpected error: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `remem node` process on 127.0.0.1 with a known secret; killed on drop.
struct NodeProcess {
    child: std::process::Child,
    address: std::net::SocketAddr,
}

impl NodeProcess {
    fn start(secret: &str, extra: &[&str]) -> NodeProcess {
        use std::io::BufRead;
        let mut child = Command::new(binary())
            .args([
                "node",
                "--listen",
                "127.0.0.1:0",
                "--capacity",
                "4MiB",
                "--slab-size",
                "1MiB",
                "--no-monitor",
            ])
            .args(extra)
            .env("REMEM_SECRET", secret)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("remem node starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let address = line.trim().strip_prefix("listening ").expect("listening line").parse().unwrap();
        NodeProcess { child, address }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn authenticate(address: std::net::SocketAddr) -> Result<u64, String> {
    let mut stream = std::net::TcpStream::connect(address).map_err(|error| error.to_string())?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let secret = remem_proto::auth::Secret::from_bytes(SECRET.as_bytes().to_vec()).unwrap();
    remem_proto::blocking::handshake(&mut stream, &secret, 42).map_err(|error| error.to_string())
}

#[test]
fn connections_that_never_authenticate_cannot_lock_out_a_client() {
    // Eight authenticated connections at most; a hundred connections that send one byte of a
    // Hello and then nothing would have taken every slot.
    let node = NodeProcess::start(SECRET, &["--max-connections", "8"]);
    let mut squatters = Vec::new();
    for _ in 0..100 {
        let mut stream = std::net::TcpStream::connect(node.address).expect("connect");
        std::io::Write::write_all(&mut stream, &[0x52]).unwrap();
        squatters.push(stream);
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    for attempt in 0..3 {
        assert!(
            authenticate(node.address).is_ok(),
            "attempt {attempt}: a client with the secret was locked out"
        );
    }
}

#[test]
fn the_handshake_has_one_deadline_not_a_timeout_per_byte() {
    use std::io::{Read, Write};
    let node = NodeProcess::start(SECRET, &[]);
    let mut stream = std::net::TcpStream::connect(node.address).expect("connect");
    stream.set_read_timeout(Some(std::time::Duration::from_millis(900))).unwrap();
    // A byte of a Hello every 0.9 s: a per-read timeout of 10 s would never fire.
    let started = std::time::Instant::now();
    let hello = [0x52u8, 0x4d, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let mut closed = false;
    for byte in hello.iter().cycle().take(20) {
        if stream.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 64];
        match stream.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => {}
            Err(error)
                if error.kind() == std::io::ErrorKind::WouldBlock
                    || error.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    let elapsed = started.elapsed();
    assert!(closed, "a peer dripping bytes kept its pre-authentication slot for {elapsed:?}");
    assert!(elapsed >= remem_node::HANDSHAKE_TIMEOUT, "closed before the deadline: {elapsed:?}");
}

/// `remem nbd --unix socket --export EXPORT EXTRA` on `cluster`: the guard and its first stdout
/// line; its stderr goes to `SOCKET.EXPORT.log` beside the socket.
fn spawn_unix_export(
    cluster: &LocalCluster,
    socket: &Path,
    export: &str,
    extra: &[&str],
) -> (NodeGuard, String) {
    use std::io::BufRead;
    let mut child = Command::new(binary())
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "1MiB", "--export", export, "-k", "1", "-r", "0", "--delta", "0", "--unix"])
        .arg(socket)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(socket.with_extension(format!("{export}.log"))).expect("log file"))
        .spawn()
        .expect("remem nbd starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (NodeGuard(child), line)
}

/// A SIGKILLed `remem nbd --unix PATH` leaves its socket file: the next start on the same path
/// removes it and serves (before: "Address already in use"). A socket a live server accepts on
/// is never taken: a second server on it is refused, naming why.
#[test]
fn a_killed_nbd_servers_unix_socket_is_replaced_and_a_live_ones_is_not() {
    let dir = fresh_dir("unix-stale");
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = LocalCluster::start(binary(), &options(dir.join("cluster"))).expect("cluster starts");
    let socket = dir.join("nbd.sock");
    let (mut first, line) = spawn_unix_export(&cluster, &socket, "first", &[]);
    assert!(line.starts_with("listening unix:"), "{line:?}");
    first.0.kill().expect("SIGKILL");
    first.0.wait().expect("reaped");
    assert!(socket.exists(), "the killed server left its socket");
    let (second, line) = spawn_unix_export(&cluster, &socket, "first", &[]);
    assert!(line.starts_with("listening unix:"), "the next start serves on the same path: {line:?}");
    let (mut third, line) = spawn_unix_export(&cluster, &socket, "other", &[]);
    assert!(line.is_empty(), "a second server took a live socket: {line:?}");
    let status = third.0.wait().expect("the refused server exits");
    let stderr = std::fs::read_to_string(socket.with_extension("other.log")).unwrap();
    assert!(!status.success() && stderr.contains("socket of a running server"), "{status}: {stderr}");
    drop(second);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `remem nbd --unix socket` on a one-node cluster in `dir`; killed on drop.
fn start_unix_export(dir: &Path, socket: &Path, extra: &[&str]) -> (LocalCluster, NodeGuard) {
    let cluster = LocalCluster::start(binary(), &options(dir.join("cluster"))).expect("cluster starts");
    let (guard, line) = spawn_unix_export(&cluster, socket, "test", extra);
    assert!(line.starts_with("listening unix:"), "unexpected first line {line:?}");
    (cluster, guard)
}

/// Kills its child (by PID) on drop.
struct NodeGuard(std::process::Child);

impl Drop for NodeGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `nbdinfo --size` on the Unix socket as `nobody`.
fn nobody_nbdinfo(socket: &Path) -> std::process::Output {
    let (uid, gid) = nobody();
    Command::new("timeout")
        .args(["20", "setpriv", "--reuid", &uid.to_string(), "--regid", &gid.to_string(), "--clear-groups"])
        .args(["nbdinfo", "--size", &format!("nbd+unix:///test?socket={}", socket.display())])
        .output()
        .expect("setpriv runs")
}

#[test]
fn an_nbd_unix_socket_is_for_its_owner_only_unless_widened() {
    assert_root();
    // A directory every user may enter: only the socket's own mode stands in the way.
    let dir = fresh_dir("nbd-unix");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.join("nbd.sock");
    let (cluster, server) = start_unix_export(&dir, &socket, &[]);
    let mode = std::fs::metadata(&socket).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket has mode {mode:o}");
    let refused = nobody_nbdinfo(&socket);
    assert!(!refused.status.success(), "another user used the export");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("Permission denied"), "unexpected error: {message}");
    drop((server, cluster));

    // The control: a socket widened on purpose lets the other user in, so the refusal above
    // came from the mode.
    let _ = std::fs::remove_file(&socket);
    let (cluster, server) = start_unix_export(&dir, &socket, &["--unix-mode", "666"]);
    let served = nobody_nbdinfo(&socket);
    assert!(served.status.success(), "widened socket: {}", String::from_utf8_lossy(&served.stderr));
    assert_eq!(String::from_utf8_lossy(&served.stdout).trim(), "1048576");
    drop((server, cluster));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Inodes of the TCP sockets in LISTEN state on this host (/proc/net/tcp and tcp6), with their
/// local port.
fn tcp_listeners() -> Vec<(u64, u16)> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is ADDRESS:PORT in hex; state 0A is LISTEN; field 9 the inode.
            if fields.len() > 9 && fields[3] == "0A" {
                let port = fields[1].rsplit(':').next().and_then(|port| u16::from_str_radix(port, 16).ok());
                if let (Some(port), Ok(inode)) = (port, fields[9].parse()) {
                    found.push((inode, port));
                }
            }
        }
    }
    found
}

/// Inodes of the sockets process `pid` holds open.
fn socket_inodes(pid: u32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's descriptors")
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|target| {
            let text = target.to_string_lossy().into_owned();
            text.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// `remem nbd` with no listener flag serves an owner-only Unix socket beside the cluster file,
/// named in its `listening` line, and listens on no TCP port (before: TCP 127.0.0.1:10809, open
/// to every local user): `nobody` cannot connect, though the directory lets it in.
#[test]
fn nbd_by_default_listens_on_an_owner_only_unix_socket_and_no_tcp_port() {
    assert_root();
    let dir = fresh_dir("nbd-default");
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = LocalCluster::start(binary(), &options(dir.join("cluster"))).expect("cluster starts");
    // Every user may enter the directories: only the socket's own mode stands in the way.
    for open in [&dir, &dir.join("cluster")] {
        std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (server, line) = spawn_export(&cluster, "test", &[]);
    let socket = dir.join("cluster").join("nbd-test.sock");
    assert_eq!(line.trim_end(), format!("listening unix:{}", socket.display()), "the default listener");
    let mode = std::fs::metadata(&socket).expect("the default socket exists").mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket has mode {mode:o}");
    let sockets = socket_inodes(server.0.id());
    let listening: Vec<(u64, u16)> =
        tcp_listeners().into_iter().filter(|(inode, _)| sockets.contains(inode)).collect();
    assert!(listening.is_empty(), "remem nbd listens on TCP ports {listening:?}");
    let refused = nobody_nbdinfo(&socket);
    assert!(!refused.status.success(), "another user used the export");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("Permission denied"), "unexpected error: {message}");
    // SAFETY: kill with the PID of our child, not yet reaped.
    unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGTERM) };
    let mut server = server;
    let status = server.0.wait().expect("remem nbd stops on SIGTERM");
    assert!(status.success(), "remem nbd stopped with {status}");
    assert!(!socket.exists(), "a stopped server removes its socket");

    // TCP only when asked for, with one loud warning when without TLS.
    let (server, line) = spawn_export(&cluster, "tcp", &["--listen", "127.0.0.1:0"]);
    assert!(line.starts_with("listening 127.0.0.1:"), "{line:?}");
    drop(server);
    let log = std::fs::read_to_string(dir.join("cluster").join("nbd-tcp.log")).unwrap();
    assert_eq!(log.matches("without TLS: any local user").count(), 1, "{log}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `remem nbd --export EXPORT EXTRA` on `cluster` with no listener of its own choosing: the
/// guard and its first stdout line; its stderr goes to `nbd-EXPORT.log` beside the cluster file.
fn spawn_export(cluster: &LocalCluster, export: &str, extra: &[&str]) -> (NodeGuard, String) {
    let log = cluster.cluster_file_path.with_file_name(format!("nbd-{export}.log"));
    use std::io::BufRead;
    let mut child = Command::new(binary())
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "1MiB", "--export", export, "-k", "1", "-r", "0", "--delta", "0"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("remem nbd starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (NodeGuard(child), line)
}
