//! The server processes: [`ServerProcess`] (memcached on an ephemeral port, `remem kv`),
//! stopped by PID on drop, and the bench's `remem kv` on a local cluster of its own.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::KvBenchArgs;
use remem_local::launcher::{ClusterOptions, LocalCluster};

/// A memcached-protocol server process this program started: memcached or `remem kv`. Stopped
/// (SIGTERM, then SIGKILL after 5 s) by its PID when dropped, also when a test panics.
pub struct ServerProcess {
    child: Child,
    pub address: SocketAddr,
    pub name: String,
    pub log_path: PathBuf,
}

impl ServerProcess {
    /// Starts Debian's memcached on 127.0.0.1 with `memory_mib` of item memory and
    /// `max_item_bytes` as its largest item. memcached cannot pick its own port (`-p 0` turns
    /// TCP off), so a free port is chosen here and the process is accepted only once that
    /// port's listening socket is one of its own file descriptors; on a lost race, another.
    pub fn start_memcached(
        program: &str,
        memory_mib: u64,
        max_item_bytes: u64,
        log_path: &Path,
    ) -> Result<ServerProcess> {
        ServerProcess::start_memcached_with_threads(program, (memory_mib, max_item_bytes), None, log_path)
    }

    /// [`ServerProcess::start_memcached`] with `-t threads` (memcached's default, 4, without).
    pub fn start_memcached_with_threads(
        program: &str,
        (memory_mib, max_item_bytes): (u64, u64),
        threads: Option<usize>,
        log_path: &Path,
    ) -> Result<ServerProcess> {
        let mut last_error = None;
        for _ in 0..5 {
            let port = remem_local::ports::unassigned_port()?;
            let log = std::fs::File::create(log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut command = Command::new(program);
            command.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"]).args([
                "-m",
                &memory_mib.to_string(),
                "-I",
                &max_item_bytes.to_string(),
                "-c",
                "4096",
            ]);
            if let Some(threads) = threads {
                command.args(["-t", &threads.to_string()]);
            }
            // SAFETY: geteuid has no preconditions and cannot fail.
            if unsafe { libc::geteuid() } == 0 {
                // memcached refuses to run as root unless told which user to be.
                command.args(["-u", "root"]);
            }
            let child = command
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone()?))
                .stderr(Stdio::from(log))
                .spawn()
                .with_context(|| {
                    format!("starting {program} (scripts/setup.sh installs Debian's memcached)")
                })?;
            let mut server = ServerProcess {
                child,
                address: SocketAddr::from(([127, 0, 0, 1], port)),
                name: "memcached".to_owned(),
                log_path: log_path.to_owned(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(status) = server.exited() {
                    last_error = Some(anyhow::anyhow!("memcached exited: {status}; log: {}", server.log()));
                    break;
                }
                if listening_socket_of(server.pid(), port) {
                    return Ok(server);
                }
                if Instant::now() > deadline {
                    bail!("memcached did not listen on port {port} within 10 s; log: {}", server.log());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("memcached did not start")))
    }

    /// Starts `binary kv --cluster FILE --listen 127.0.0.1:0 ARGS` and waits (up to 30 s) for
    /// its first stdout line, `listening ADDRESS`. Its stderr goes to `log_path`.
    pub fn start_remem_kv(
        binary: &Path,
        cluster_file: &Path,
        args: &[String],
        log_path: &Path,
        name: &str,
    ) -> Result<ServerProcess> {
        let (mut server, first_line) =
            ServerProcess::spawn_remem_kv(binary, cluster_file, args, log_path, name)?;
        server.wait_listening(&first_line, Duration::from_secs(30))?;
        Ok(server)
    }

    /// Starts `remem kv` without waiting for it to listen (a standby listens only once it took
    /// over): the receiver gets its first stdout line.
    pub fn spawn_remem_kv(
        binary: &Path,
        cluster_file: &Path,
        args: &[String],
        log_path: &Path,
        name: &str,
    ) -> Result<(ServerProcess, mpsc::Receiver<String>)> {
        let log =
            std::fs::File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut child = Command::new(binary)
            .arg("kv")
            .arg("--cluster")
            .arg(cluster_file)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {} kv", binary.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let server = ServerProcess {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            name: name.to_owned(),
            log_path: log_path.to_owned(),
        };
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = sender.send(line);
            // Keep draining so the server never blocks on a full pipe.
            let mut sink = Vec::new();
            while matches!(reader.read_until(b'\n', &mut sink), Ok(n) if n > 0) {
                sink.clear();
            }
        });
        Ok((server, receiver))
    }

    /// Waits up to `timeout` for the `listening ADDRESS` line and takes its address.
    pub fn wait_listening(&mut self, first_line: &mpsc::Receiver<String>, timeout: Duration) -> Result<()> {
        let line = first_line.recv_timeout(timeout).unwrap_or_default();
        let Some(address) = line.trim().strip_prefix("listening ") else {
            // The guard stops the process.
            bail!("remem kv ({}) did not start: first line {line:?}; log: {}", self.name, self.log());
        };
        self.address =
            address.parse().with_context(|| format!("remem kv printed a bad address {address:?}"))?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process's stderr so far (its last 8 KiB).
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let start = text.len().saturating_sub(8 << 10);
        let start = (start..text.len()).find(|&index| text.is_char_boundary(index)).unwrap_or(text.len());
        text[start..].to_owned()
    }

    /// The process's whole stderr so far, up to its last whole line.
    pub fn log_full(&self) -> String {
        let mut log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        // Only whole lines: the process writes a line in several writes (stderr is unbuffered),
        // and a reader that saw "standby synced: " without its numbers took it for the line.
        log.truncate(log.rfind('\n').map_or(0, |end| end + 1));
        log
    }

    /// Resident memory of the process (from /proc), in bytes.
    pub fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// SIGTERM, then SIGKILL if it still runs after `grace`; reaps it.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: kill with the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port` (from /proc/net/tcp
/// and the process's file descriptors).
fn listening_socket_of(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else { return false };
    let wanted = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 9 && fields[1] == wanted && fields[3] == "0A")
                .then(|| format!("socket:[{}]", fields[9]))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    descriptors.flatten().any(|entry| {
        std::fs::read_link(entry.path())
            .is_ok_and(|target| inodes.iter().any(|inode| target.as_os_str() == inode.as_str()))
    })
}

/// Whether `binary` has the `kv` subcommand (`remem kv --help` succeeds).
pub fn remem_kv_available(binary: &Path) -> bool {
    Command::new(binary)
        .args(["kv", "--help"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The version memcached reports (`memcached -V`).
pub(super) fn memcached_version(program: &str) -> String {
    Command::new(program)
        .arg("-V")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// A `remem kv` process on a fresh cluster of its own. Every `remem kv` maps regions of its
/// memory limit times each scheme's overhead when it starts (9.5x in all, docs/KV.md) and nodes
/// populate what they map, so processes do not share a cluster: each one's memory is given back
/// before the next starts. The server stops before its cluster (fields drop in order).
pub(super) struct RememKvOnCluster {
    pub(super) server: ServerProcess,
    _cluster: LocalCluster,
}

impl RememKvOnCluster {
    /// `remem kv -m (values_bytes x 1.25 + 16 MiB) -I item_limit EXTRA`.
    pub(super) fn start(
        binary: &Path,
        args: &KvBenchArgs,
        dir: &Path,
        name: &str,
        values_bytes: u64,
        item_limit: u64,
        extra: &[&str],
    ) -> Result<RememKvOnCluster> {
        let memory_limit = (values_bytes * 5 / 4 + (16 << 20)).next_multiple_of(1 << 20);
        let slab_bytes: u64 = if args.quick { 1 << 20 } else { 4 << 20 };
        // 9.5x the limit across the nodes, with room for rounding up to whole ranges.
        let per_node = memory_limit * 10 / args.nodes.max(1) as u64;
        let capacity_bytes = (per_node * 2).next_multiple_of(slab_bytes) + 16 * slab_bytes;
        let label = name.replace(' ', "-");
        let options = ClusterOptions {
            lease_grace: None,
            nodes: args.nodes,
            capacity_bytes,
            slab_size_bytes: slab_bytes,
            nodes_per_domain: 1,
            dir: dir.join(format!("cluster-{label}")),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: remem_local::launcher::UnixSockets::All,
            encrypt: false,
        };
        let cluster = LocalCluster::start(binary, &options)?;
        let transport = match args.transport {
            remem_frontend::transport_arg::Transport::Tcp => "tcp",
            remem_frontend::transport_arg::Transport::Shm => "shm",
        };
        let mut kv_args = vec![
            "-m".to_owned(),
            memory_limit.to_string(),
            "-I".to_owned(),
            item_limit.to_string(),
            "--transport".to_owned(),
            transport.to_owned(),
        ];
        kv_args.extend(extra.iter().map(|word| word.to_string()));
        kv_args.extend(args.kv_arg.iter().cloned());
        let server = ServerProcess::start_remem_kv(
            binary,
            &cluster.cluster_file_path,
            &kv_args,
            &dir.join(format!("kv-{label}.log")),
            name,
        )?;
        Ok(RememKvOnCluster { server, _cluster: cluster })
    }
}
