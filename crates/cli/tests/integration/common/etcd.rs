//! A real etcd (Debian's etcd-server) for the tests: one member on 127.0.0.1 with free ports
//! and a data directory of its own, that a test can kill, pause and start again on the same
//! ports and data; killed by PID when dropped. And `remem node --etcd` processes. Included with
//! `#[path]` beside `mod common;`, as common/kv.rs is.

#![allow(dead_code)] // each test crate that includes `common` uses a part of it

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1, for a server told its port before it binds (below the
/// ephemeral range: see `remem::ports`).
pub fn free_port() -> u16 {
    remem::ports::unassigned_port().expect("a free port")
}

pub struct EtcdServer {
    child: Option<Child>,
    pub url: String,
    peer_url: String,
    data_dir: PathBuf,
    log: PathBuf,
}

impl EtcdServer {
    /// Starts etcd in `dir` and waits until it answers (at most 20 s).
    pub fn start(dir: &Path) -> EtcdServer {
        let mut server = EtcdServer {
            child: None,
            url: format!("http://127.0.0.1:{}", free_port()),
            peer_url: format!("http://127.0.0.1:{}", free_port()),
            data_dir: dir.join("etcd-data"),
            log: dir.join("etcd.log"),
        };
        server.restart();
        server
    }

    /// Starts it again (after [`EtcdServer::kill`]) on the same ports and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("etcd log");
        let child = Command::new("etcd")
            .args(["--name", "test", "--data-dir"])
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &self.url, "--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &self.peer_url, "--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &format!("test={}", self.peer_url)])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("etcd starts (run scripts/setup.sh)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.etcdctl(&["endpoint", "health"]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("etcd did not come up: {}", std::fs::read_to_string(&self.log).unwrap_or_default());
    }

    /// SIGKILL, reaped.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`pause`) or SIGCONT (`resume`).
    pub fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("etcd running");
        // SAFETY: kill with the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    }

    /// Runs etcdctl against this server (bounded by `timeout`).
    pub fn etcdctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("timeout")
            .args(["-k", "2", "10", "etcdctl", "--endpoints", &self.url, "--command-timeout=3s"])
            .args(args)
            .env("ETCDCTL_API", "3")
            .stdin(Stdio::null())
            .output()
            .expect("etcdctl runs")
    }

    /// The keys under `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let output = self.etcdctl(&["get", "--prefix", "--keys-only", prefix]);
        assert!(output.status.success(), "etcdctl get: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGCONT);
        }
        self.kill();
    }
}

/// etcd, its secret and `count` nodes of (capacity, slab size) registered in it (checked with
/// etcdctl), all in `dir`.
pub fn start_registered(
    dir: &Path,
    count: usize,
    sizes: (&str, &str),
) -> (EtcdServer, PathBuf, Vec<EtcdNode>) {
    let binary = Path::new(env!("CARGO_BIN_EXE_remem"));
    let etcd = EtcdServer::start(dir);
    let secret = write_secret(dir);
    let nodes: Vec<EtcdNode> = (0..count)
        .map(|index| EtcdNode::start_sized(binary, dir, &etcd.url, &secret, index, sizes))
        .collect();
    let registered = wait_for(Duration::from_secs(15), || etcd.keys("/remem/nodes/").len() == count);
    assert!(registered, "nodes did not register: {:?}", etcd.keys("/remem/nodes/"));
    (etcd, secret, nodes)
}

/// A cluster secret file (mode 0600) in `dir`.
pub fn write_secret(dir: &Path) -> PathBuf {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("secret");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .expect("secret file");
    file.write_all(b"0123456789abcdef0123456789abcdef0123456789abcdef").expect("secret written");
    path
}

/// A `remem node --etcd` process, SIGKILLed on drop.
pub struct EtcdNode {
    pub child: Child,
    pub address: String,
    pub log: PathBuf,
}

impl EtcdNode {
    /// Starts node `index` (its own failure domain), 1 MiB slabs, 16 MiB, registering in `etcd`.
    pub fn start(binary: &Path, dir: &Path, etcd_url: &str, secret: &Path, index: usize) -> EtcdNode {
        EtcdNode::start_sized(binary, dir, etcd_url, secret, index, ("16MiB", "1MiB"))
    }

    /// [`EtcdNode::start`] with another (capacity, slab size).
    pub fn start_sized(
        binary: &Path,
        dir: &Path,
        etcd_url: &str,
        secret: &Path,
        index: usize,
        (capacity, slab_size): (&str, &str),
    ) -> EtcdNode {
        let log = dir.join(format!("node-{index}.log"));
        let mut command = Command::new(binary);
        command
            .args([
                "node",
                "--listen",
                "127.0.0.1:0",
                "--capacity",
                capacity,
                "--slab-size",
                slab_size,
                "--no-monitor",
            ])
            .args(["--failure-domain", &format!("domain-{index}"), "--node-id", &(index + 1).to_string()])
            .arg("--secret-file")
            .arg(secret)
            .args(["--etcd", etcd_url]);
        let (mut child, line) = crate::common::spawn_with_first_line(command, &log);
        let Some(address) = line.trim().strip_prefix("listening ").map(str::to_owned) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "node {index} did not start: {line:?}; {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        EtcdNode { child, address, log }
    }

    /// SIGTERM, and wait (at most 10 s) for an exit; its status, None if it had to be killed.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: kill with the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for EtcdNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `condition` every 100 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    condition()
}
