//! A local cluster: `remem node` processes on 127.0.0.1, started and stopped by PID.
//!
//! Used by `remem up`, `remem demo`, `remem bench` and the tests. Each node is a real process
//! (the same `remem` binary), so tests can SIGKILL or SIGSTOP it. Nodes get the cluster secret
//! through the `REMEM_SECRET` environment variable, never on the command line, and print their
//! address as the first line of stdout; their logs go to `DIR/node-N.log`.
//!
//! Invariant: a `LocalCluster` stops (SIGTERM, then SIGKILL after a grace period) exactly the
//! processes it started, when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use remem_client::cluster::{ClusterFile, ClusterNode};
use remem_proto::auth::Secret;

// The runtime directory, the cluster file and private files are remem-frontend's (every front
// end needs them); re-exported here, where the tests and benchmarks have always found them.
pub use remem_frontend::cluster_file::{
    check_saved_on_cluster, default_dir, load_cluster, load_cluster_as_it_is, private_directory,
    stale_cluster, write_private_file,
};

/// How to start the nodes of a local cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub nodes: usize,
    pub capacity_bytes: u64,
    pub slab_size_bytes: u64,
    /// Nodes per failure domain; 1 gives every node its own domain.
    pub nodes_per_domain: usize,
    /// Where the cluster file, secret and logs go.
    pub dir: PathBuf,
    /// Start nodes with `--fault-injection` (tests and benchmarks).
    pub fault_injection: bool,
    /// Arguments for the nodes' resource monitor (e.g. `--monitor-period 200ms`); `None` starts
    /// them with `--no-monitor`. Local clusters default to no monitor: all their nodes share one
    /// host, so every monitor would see the same memory and all would evict at once, and tests
    /// must not lose slabs because the machine is busy.
    pub monitor_args: Option<Vec<String>>,
    /// Give node N a Unix socket `DIR/node-N.sock` (recorded in the cluster file) for
    /// same-host shared memory. Nodes not listed get none (for mixed-transport tests).
    pub unix_sockets: UnixSockets,
    /// The nodes' `--lease-grace` (how long a departed client's slabs are kept); `None` leaves
    /// the node's default.
    pub lease_grace: Option<Duration>,
    /// Start nodes with `--encrypt`: every TCP connection to them must be encrypted (clients
    /// need `ClientConfig::encrypt`; Unix sockets stay plaintext).
    pub encrypt: bool,
}

/// Which nodes of a local cluster listen on a Unix socket too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum UnixSockets {
    #[default]
    All,
    None,
    /// Only these node indexes.
    Only(Vec<usize>),
}

impl UnixSockets {
    fn includes(&self, node: usize) -> bool {
        match self {
            UnixSockets::All => true,
            UnixSockets::None => false,
            UnixSockets::Only(nodes) => nodes.contains(&node),
        }
    }
}

/// Whether the nodes of a local cluster serve Prometheus metrics (`remem node --metrics`), and on
/// which port of 127.0.0.1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeMetrics {
    #[default]
    Off,
    /// A free port each, chosen by the kernel (`127.0.0.1:0`), so nothing else on the host can
    /// clash with them.
    AnyPort,
    /// Node number N on port `first + N`, so a scrape configuration stays valid across runs.
    FromPort(u16),
}

pub struct LocalCluster {
    /// An exclusive lock on `DIR/lock` while the cluster runs: a second `remem up` on the same
    /// directory is refused instead of overwriting this one's cluster file and secret.
    _lock: std::fs::File,
    pub file: ClusterFile,
    pub cluster_file_path: PathBuf,
    pub secret: Secret,
    secret_hex: String,
    /// Node `i`'s process, beside `file.nodes[i]` (`None` once it exited or was killed).
    children: Vec<Option<Child>>,
    /// Node `i`'s number in its file names (`node-N.log`, `node-N.sock`): its index when it
    /// started, kept when nodes before it are removed, never given to another node.
    numbers: Vec<usize>,
    next_number: usize,
    /// Which `--metrics` address each node started gets.
    metrics: NodeMetrics,
    /// The cluster's directory, removed when the cluster is dropped (set by
    /// [`LocalCluster::remove_dir_on_drop`]); unless the thread is panicking, so a failed test
    /// keeps its nodes' logs.
    remove_on_drop: Option<PathBuf>,
}

/// [`stale_cluster`] of the cluster file at `path`, if there is one that loads.
fn left_by_a_cluster_that_is_gone(path: &Path) -> Option<String> {
    let file = ClusterFile::load(path).ok()?;
    stale_cluster(path, &file)
}

/// MemAvailable of /proc/meminfo, in bytes.
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Per-node capacity `remem up` lends when it is not told.
pub const UP_DEFAULT_CAPACITY_BYTES: u64 = 2 << 30;

/// The capacity of each of `nodes` nodes that `remem up` starts without a resource monitor:
/// `requested`, checked against the host (their sum at most its memory and 80% of what it has
/// available, unless `force`), or when not given the default shrunk to fit that budget, so
/// that `remem up` works as it is on a small machine.
///
/// Errors: the sum does not fit (the message gives the numbers and names --force), or not even
/// one slab per node fits.
pub fn up_capacity_bytes(
    nodes: usize,
    requested: Option<u64>,
    slab_size_bytes: u64,
    force: bool,
) -> Result<u64> {
    let host = crate::host_memory::HostMemory::read();
    let Some(capacity_bytes) = requested else {
        let Some(host) = host.filter(|_| !force) else { return Ok(UP_DEFAULT_CAPACITY_BYTES) };
        let fitting = host.default_capacity_bytes(nodes, slab_size_bytes, UP_DEFAULT_CAPACITY_BYTES);
        return fitting.with_context(|| {
            format!(
                "{nodes} nodes of at least one {} slab each do not fit in 80% of the {} this host \
                 has available: start fewer --nodes or smaller --slab-size, or pass --force to \
                 start anyway",
                crate::units::format_bytes(slab_size_bytes),
                crate::units::format_bytes(host.available_bytes)
            )
        });
    };
    if let (Some(host), false) = (host, force) {
        let total_bytes = capacity_bytes.saturating_mul(nodes as u64);
        let what = format!(
            "--nodes {nodes} x --capacity {} = {}",
            crate::units::format_bytes(capacity_bytes),
            crate::units::format_bytes(total_bytes)
        );
        host.check(&what, total_bytes, false).map_err(anyhow::Error::msg)?;
    }
    Ok(capacity_bytes)
}

/// Takes an exclusive lock on `dir/lock`, held as long as the returned file is open.
fn lock_directory(dir: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("another remem up (or demo) is using {}: stop it first, or pass another --dir", dir.display());
    }
    Ok(file)
}

fn remove_stale_slab_maps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|extension| extension == "slabmap") {
            if let Err(error) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), %error, "cannot remove a stale slab map");
            }
        }
    }
}

/// The last error or warning line of a node's log, for the message when it fails to start.
fn last_error_of(log_path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(log_path) else { return String::new() };
    text.lines()
        .rev()
        .find(|line| line.contains("error") || line.contains("ERROR") || line.contains("WARN"))
        .map(|line| format!(" ({})", line.trim()))
        .unwrap_or_default()
}

fn random_secret_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl LocalCluster {
    /// Starts `options.nodes` node processes of `binary` and waits until each listens.
    pub fn start(binary: &Path, options: &ClusterOptions) -> Result<LocalCluster> {
        LocalCluster::start_with_metrics(binary, options, NodeMetrics::Off)
    }

    /// [`LocalCluster::start`], with every node (and every node added or restarted later)
    /// serving metrics as `metrics` says; each node's address is in the cluster file.
    pub fn start_with_metrics(
        binary: &Path,
        options: &ClusterOptions,
        metrics: NodeMetrics,
    ) -> Result<LocalCluster> {
        private_directory(&options.dir)?;
        let lock = lock_directory(&options.dir)?;
        // This process holds the directory's lock: a cluster file in it is left by a cluster that
        // is gone (a `remem up` that was SIGKILLed could not remove it). It is replaced below.
        if let Some(stale) = left_by_a_cluster_that_is_gone(&options.dir.join("cluster.json")) {
            eprintln!("{stale}: replacing it");
        }
        // A new cluster has a new secret: slab maps saved against an earlier one name slabs it
        // cannot reach (`remem nbd --state` files beside the cluster file).
        remove_stale_slab_maps(&options.dir);
        let secret_file = options.dir.join("secret");
        let secret_hex = random_secret_hex();
        write_private_file(&secret_file, secret_hex.as_bytes())?;
        let secret = Secret::from_bytes(secret_hex.clone().into_bytes())
            .map_err(|error| anyhow::anyhow!("{error}"))?;

        let mut cluster = LocalCluster {
            _lock: lock,
            file: ClusterFile {
                secret_file: secret_file.clone(),
                nodes: Vec::new(),
                encrypt: options.encrypt,
            },
            cluster_file_path: options.dir.join("cluster.json"),
            secret,
            secret_hex,
            children: Vec::new(),
            numbers: Vec::new(),
            next_number: 0,
            metrics,
            remove_on_drop: None,
        };
        // Every node is launched before any is waited for: they start side by side (about 25 ms
        // each, one after another, was 5 s for 200 nodes). A failure drops the cluster, which
        // stops every node launched.
        let mut launched = Vec::with_capacity(options.nodes);
        for index in 0..options.nodes {
            cluster.children.push(None);
            cluster.numbers.push(cluster.next_number);
            cluster.next_number += 1;
            launched.push(cluster.launch_node(binary, options, index, None)?);
        }
        for (index, launch) in launched.into_iter().enumerate() {
            let node = cluster.await_node(index, launch)?;
            cluster.file.nodes.push(node);
        }
        cluster.file.save(&cluster.cluster_file_path)?;
        Ok(cluster)
    }

    /// Starts node `index`'s process, as `previous` was (same address, failure domain and
    /// metrics address) or as a new node (a free port), and returns its entry for the cluster
    /// file. Its process is in `children[index]` from the moment it runs, so a failed start
    /// still stops it.
    fn spawn_node(
        &mut self,
        binary: &Path,
        options: &ClusterOptions,
        index: usize,
        previous: Option<&ClusterNode>,
    ) -> Result<ClusterNode> {
        let launch = self.launch_node(binary, options, index, previous)?;
        self.await_node(index, launch)
    }

    /// The first half of [`LocalCluster::spawn_node`]: the process runs (in `children[index]`),
    /// not yet listening.
    fn launch_node(
        &mut self,
        binary: &Path,
        options: &ClusterOptions,
        index: usize,
        previous: Option<&ClusterNode>,
    ) -> Result<Launch> {
        let number = self.numbers[index];
        let domain = previous.map_or_else(
            || format!("domain-{}", number / options.nodes_per_domain.max(1)),
            |node| node.failure_domain.clone(),
        );
        let metrics = self.metrics_address(number, previous)?;
        let log_path = options.dir.join(format!("node-{number}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let unix_socket =
            options.unix_sockets.includes(number).then(|| options.dir.join(format!("node-{number}.sock")));
        if let Some(path) = &unix_socket {
            // A socket file left by an earlier process of this node would stop the bind.
            let _ = std::fs::remove_file(path);
        }
        let listen = previous.map_or_else(|| "127.0.0.1:0".to_owned(), |node| node.address.to_string());
        let mut command = Command::new(binary);
        // A group of its own: a terminal's Ctrl-C (SIGINT to the foreground group) reaches only
        // the launcher, which stops its nodes in order, rather than killing every node at once
        // under a launcher that would report each as a failure (or restart it).
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches only the child's own
        // state; run between fork and exec it makes the node get SIGTERM when the thread that
        // started it dies, so a killed `remem up` or `demo` leaves no node behind.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .arg("node")
            .arg("--listen")
            .arg(&listen)
            .arg("--capacity")
            .arg(options.capacity_bytes.to_string())
            .arg("--slab-size")
            .arg(options.slab_size_bytes.to_string())
            .arg("--failure-domain")
            .arg(&domain)
            .args(options.fault_injection.then_some("--fault-injection"))
            .args(options.encrypt.then_some("--encrypt"))
            .args(match &options.monitor_args {
                Some(args) => args.clone(),
                None => vec!["--no-monitor".to_owned()],
            })
            .args(unix_socket.iter().flat_map(|path| [std::ffi::OsStr::new("--unix"), path.as_os_str()]))
            .args(metrics.map(|address| format!("--metrics={address}")))
            .args(
                options
                    .lease_grace
                    .iter()
                    .flat_map(|grace| ["--lease-grace".to_owned(), format!("{}ms", grace.as_millis())]),
            )
            .env("REMEM_SECRET", &self.secret_hex)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {} node", binary.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let pid = child.id();
        self.children[index] = Some(child);
        Ok(Launch { stdout, pid, log_path, domain, metrics, unix_socket })
    }

    /// The second half of [`LocalCluster::spawn_node`]: waits for the node's `listening` line.
    fn await_node(&self, index: usize, launch: Launch) -> Result<ClusterNode> {
        let Launch { stdout, pid, log_path, domain, metrics, unix_socket } = launch;
        let did_not_start = || {
            format!(
                "node {index} (pid {pid}) did not start{}; see {}",
                last_error_of(&log_path),
                log_path.display()
            )
        };
        let address = read_listen_line(stdout, Duration::from_secs(20)).with_context(did_not_start)?;
        // The node prints its metrics address on stderr (its log) before it prints `listening`.
        let metrics = match metrics {
            Some(_) => Some(last_metrics_address(&log_path).with_context(did_not_start)?),
            None => None,
        };
        Ok(ClusterNode { address, failure_domain: domain, pid: Some(pid), unix_socket, metrics })
    }

    /// The `--metrics` address of node number `number`: the one it had before a restart, else
    /// as `self.metrics` says.
    fn metrics_address(&self, number: usize, previous: Option<&ClusterNode>) -> Result<Option<SocketAddr>> {
        if let Some(address) = previous.and_then(|node| node.metrics) {
            return Ok(Some(address));
        }
        let port = match self.metrics {
            NodeMetrics::Off => return Ok(None),
            NodeMetrics::AnyPort => 0,
            NodeMetrics::FromPort(first) => {
                let port = usize::from(first) + number;
                u16::try_from(port).ok().filter(|&port| port != 0).with_context(|| {
                    format!("node {number} would serve metrics on port {first} + {number}, past 65535")
                })?
            }
        };
        Ok(Some(SocketAddr::from(([127, 0, 0, 1], port))))
    }

    /// Starts one more node, numbered after every node started so far, without saving the
    /// cluster file. Returns its index.
    fn add_unsaved(&mut self, binary: &Path, options: &ClusterOptions) -> Result<usize> {
        let index = self.children.len();
        self.children.push(None);
        self.numbers.push(self.next_number);
        self.next_number += 1;
        match self.spawn_node(binary, options, index, None) {
            Ok(node) => {
                self.file.nodes.push(node);
                Ok(index)
            }
            Err(error) => {
                // Nothing of the node stays: its process (if any) is stopped, its slot freed.
                if let Some(child) = self.children.pop().flatten() {
                    stop_children(vec![child], Duration::ZERO);
                }
                self.numbers.pop();
                Err(error)
            }
        }
    }

    /// Starts one more node and adds it to the cluster file: clients that watch the file (as
    /// `remem nbd` does) start using it without a restart. Returns its index.
    pub fn add_node(&mut self, binary: &Path, options: &ClusterOptions) -> Result<usize> {
        let index = self.add_unsaved(binary, options)?;
        self.file.save(&self.cluster_file_path)?;
        Ok(index)
    }

    /// Stops node `index` (SIGTERM, SIGKILL after `grace`) and takes it out of the cluster file:
    /// the nodes after it move up one index. Clients that watch the file see it gone, and
    /// rebuild its slabs elsewhere as for a failed node. Returns its entry.
    ///
    /// Errors: no node `index`, or it is the last one (a cluster file lists at least one node).
    pub fn remove(&mut self, index: usize, grace: Duration) -> Result<ClusterNode> {
        let count = self.file.nodes.len();
        if index >= count {
            bail!("no node {index}: the nodes are 0 to {}", count.saturating_sub(1));
        }
        if count == 1 {
            bail!("node {index} is the last node: stop the cluster instead (Ctrl-C)");
        }
        if let Some(child) = self.children.remove(index) {
            stop_children(vec![child], grace);
        }
        self.numbers.remove(index);
        let node = self.file.nodes.remove(index);
        self.file.save(&self.cluster_file_path)?;
        Ok(node)
    }

    /// Restarts node `index` (SIGKILL if it still runs) on the same address, empty: clients
    /// probe it and readmit it.
    pub fn restart(&mut self, binary: &Path, options: &ClusterOptions, index: usize) -> Result<()> {
        let Some(old) = self.file.nodes.get(index).cloned() else { bail!("no node {index}") };
        self.kill(index)?;
        let node = self.spawn_node(binary, options, index, Some(&old))?;
        self.file.nodes[index] = node;
        Ok(self.file.save(&self.cluster_file_path)?)
    }

    pub fn addresses(&self) -> Vec<remem_client::NodeAddress> {
        self.file.addresses()
    }

    pub fn pid(&self, node: usize) -> Option<u32> {
        self.children.get(node)?.as_ref().map(|child| child.id())
    }

    /// Sends `signal` to node `node` (a process this cluster started).
    pub fn signal(&mut self, node: usize, signal: i32) -> Result<()> {
        let Some(pid) = self.pid(node) else { bail!("node {node} is not running") };
        // SAFETY: kill with a PID we spawned and still own (not yet reaped).
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILLs node `node` and reaps it.
    pub fn kill(&mut self, node: usize) -> Result<()> {
        if let Some(mut child) = self.children.get_mut(node).and_then(Option::take) {
            child.kill().context("killing node")?;
            child.wait().context("reaping node")?;
        }
        Ok(())
    }

    /// Nodes that exited since the last call, each reported once (a restarted node is a new
    /// process, reported again if it dies).
    pub fn newly_exited(&mut self) -> Vec<(usize, String)> {
        let mut exits = Vec::new();
        for (index, child) in self.children.iter_mut().enumerate() {
            if let Some(process) = child {
                if let Ok(Some(status)) = process.try_wait() {
                    exits.push((index, format!("node {index} (pid {}) exited: {status}", process.id())));
                    *child = None;
                }
            }
        }
        exits
    }

    /// Checks that every node still runs; names the first one that exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (index, child) in self.children.iter_mut().enumerate() {
            if let Some(child) = child {
                if let Some(status) = child.try_wait()? {
                    bail!("node {index} (pid {}) exited: {status}", child.id());
                }
            }
        }
        Ok(())
    }

    /// Removes the cluster's directory (node logs, secret, cluster file) when the cluster is
    /// dropped: for the scratch clusters of tests and benches, once they succeeded.
    pub fn remove_dir_on_drop(&mut self) {
        self.remove_on_drop = self.cluster_file_path.parent().map(Path::to_path_buf);
    }

    /// SIGTERM to every node, SIGKILL to those still alive after `grace`, then reap.
    pub fn stop(&mut self, grace: Duration) {
        stop_children(self.children.iter_mut().filter_map(Option::take).collect(), grace);
        let _ = std::fs::remove_file(&self.cluster_file_path);
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
        if let Some(dir) = self.remove_on_drop.take() {
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// A node process launched and not yet listening (`LocalCluster::launch_node`).
struct Launch {
    stdout: std::process::ChildStdout,
    pid: u32,
    log_path: PathBuf,
    domain: String,
    metrics: Option<SocketAddr>,
    unix_socket: Option<PathBuf>,
}

/// SIGTERM to every process of `children` (processes this cluster started and has not reaped),
/// SIGKILL to those still alive after `grace`, then reaps them.
fn stop_children(children: Vec<Child>, grace: Duration) {
    for child in &children {
        // SAFETY: kill with a PID we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    for mut child in children {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

/// The address in the last `metrics at http://ADDRESS/metrics` line of a log (every remem
/// server prints one once it has bound `--metrics`, port 0 included).
pub fn last_metrics_address(log_path: &Path) -> Result<SocketAddr> {
    let text =
        std::fs::read_to_string(log_path).with_context(|| format!("reading {}", log_path.display()))?;
    let line = text
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix("metrics at http://"))
        .context("the node printed no metrics address")?;
    let address = line.trim_end_matches("/metrics");
    address.parse().with_context(|| format!("bad metrics address {address:?}"))
}

/// Reads the node's first stdout line, `listening ADDRESS`, within `timeout`.
fn read_listen_line(stdout: std::process::ChildStdout, timeout: Duration) -> Result<SocketAddr> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let result = reader.read_line(&mut line).map(|_| line);
        let _ = sender.send(result);
        // Keep draining so the node never blocks on a full pipe.
        let mut sink = String::new();
        while matches!(reader.read_line(&mut sink), Ok(n) if n > 0) {
            sink.clear();
        }
    });
    let line = receiver
        .recv_timeout(timeout)
        .context("timed out waiting for the node's address")?
        .context("reading the node's stdout")?;
    let address = line
        .trim()
        .strip_prefix("listening ")
        .with_context(|| format!("unexpected first line from node: {line:?}"))?;
    address.parse().with_context(|| format!("bad node address {address:?}"))
}
