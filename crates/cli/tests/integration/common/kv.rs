//! What the tests of `remem kv` share: the server under test (a `remem kv` process on its own
//! local cluster, or Debian's memcached to check the harness itself), the stock memcached
//! clients they drive (libmemcached-tools, pymemcache's own integration tests under Debian's
//! pytest), each run under `timeout`, and the reference model of the cache for the fault test.
//!
//! Every process started here is stopped by its PID when its guard drops, also on a panic: the
//! server (`remem::kv_bench::ServerProcess`) before the cluster (`LocalCluster`). External
//! programs run under `timeout -k 5`, so none outlives its test. A missing program fails the
//! test with the Debian package that `scripts/setup.sh` installs; nothing is skipped.

// Several test crates include this module (`#[path = "common/kv.rs"]`), each using part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use remem::kv_bench::{ClientError, ServerProcess, StoreOutcome, TextClient};
use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};

pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// Nodes of every test cluster: room for EC(8,2) with two nodes dead.
pub const NODES: usize = 12;
/// Slabs of 1 MiB (2048 splits of 512 B), as the other suites use.
pub const SLAB_BYTES: u64 = 1 << 20;
/// Slabs each node may lend (memory is taken only as slabs are mapped).
pub const SLABS_PER_NODE: u64 = 96;
/// `remem kv -m` of most tests: bytes of items kept. remem kv maps a region of this size times
/// each scheme's overhead at start (9.5x in all, docs/KV.md), and nodes populate what they map.
pub const MEMORY_LIMIT: &str = "16MiB";

/// A fresh directory for one test.
pub fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-kv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    dir
}

/// The options of a test cluster in `dir` (also to restart or add one of its nodes).
pub fn cluster_options(dir: &Path) -> ClusterOptions {
    ClusterOptions {
        lease_grace: None,
        nodes: NODES,
        capacity_bytes: SLABS_PER_NODE * SLAB_BYTES,
        slab_size_bytes: SLAB_BYTES,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: true,
        monitor_args: None,
        unix_sockets: UnixSockets::None,
        encrypt: false,
    }
}

/// The server a test talks to; the server stops before its cluster (fields drop in order).
pub struct Target {
    pub server: ServerProcess,
    pub cluster: Option<LocalCluster>,
    pub dir: PathBuf,
}

impl Drop for Target {
    /// A passed test leaves no directory behind; a failed one (panicking) keeps its logs.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Target {
    /// `remem kv --scheme SCHEME -m MEMORY_LIMIT ARGS` on a fresh cluster of [`NODES`] nodes.
    pub fn remem_kv(name: &str, scheme: &str, memory_limit: &str, args: &[&str]) -> Target {
        Target::remem_kv_under_umask(name, scheme, memory_limit, args, None)
    }

    /// As [`Target::remem_kv`], with the server started under `umask` (through a shell that sets
    /// it and execs the binary, so the server's PID is the shell's).
    pub fn remem_kv_under_umask(
        name: &str,
        scheme: &str,
        memory_limit: &str,
        args: &[&str],
        umask: Option<u32>,
    ) -> Target {
        require_remem_kv();
        let dir = test_dir(name);
        let options = cluster_options(&dir);
        let cluster = LocalCluster::start(binary(), &options).expect("cluster starts");
        let mut all =
            vec!["--scheme".to_owned(), scheme.to_owned(), "-m".to_owned(), memory_limit.to_owned()];
        all.extend(args.iter().map(|arg| arg.to_string()));
        let program = match umask {
            None => binary().to_owned(),
            Some(umask) => {
                use std::os::unix::fs::PermissionsExt;
                let wrapper = dir.join("remem-under-umask");
                let script = format!("#!/bin/sh\numask {umask:03o}\nexec '{}' \"$@\"\n", binary().display());
                std::fs::write(&wrapper, script).expect("write the umask wrapper");
                std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o700)).expect("chmod");
                wrapper
            }
        };
        let server = ServerProcess::start_remem_kv(
            &program,
            &cluster.cluster_file_path,
            &all,
            &dir.join("kv.log"),
            &format!("remem kv {scheme}"),
        )
        .unwrap_or_else(|error| panic!("{error:#}"));
        eprintln!("{} listening on {} (pid {})", server.name, server.address, server.pid());
        Target { server, cluster: Some(cluster), dir }
    }

    /// Debian's memcached on an ephemeral port (harness checks).
    pub fn memcached(name: &str) -> Target {
        require_program("memcached", "memcached");
        let dir = test_dir(name);
        let server = ServerProcess::start_memcached("memcached", 64, 1 << 20, &dir.join("memcached.log"))
            .unwrap_or_else(|error| panic!("{error:#}"));
        eprintln!("memcached listening on {} (pid {})", server.address, server.pid());
        Target { server, cluster: None, dir }
    }

    pub fn port(&self) -> String {
        self.server.address.port().to_string()
    }

    pub fn client(&self) -> TextClient {
        TextClient::connect(self.server.address, Duration::from_secs(10)).expect("connects to the server")
    }

    /// Panics with the server's log if it exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.server.exited() {
            panic!("{} exited: {status}; log:\n{}", self.server.name, self.server.log());
        }
    }

    pub fn is_remem(&self) -> bool {
        self.cluster.is_some()
    }
}

/// Fails unless this binary has `remem kv`.
pub fn require_remem_kv() {
    assert!(
        remem::kv_bench::remem_kv_available(binary()),
        "{} has no `kv` command (remem kv is not built into this binary)",
        binary().display()
    );
}

/// Fails the test, naming the Debian package, unless `program` is on PATH.
pub fn require_program(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    assert!(found, "{program} is missing: scripts/setup.sh installs it (Debian package {package})");
}

/// Runs `program` under `timeout -k 5 SECONDS` with stdin closed.
pub fn run_bounded(seconds: u32, program: &str, args: &[&str], cwd: Option<&Path>) -> Output {
    let mut command = Command::new("timeout");
    command.args(["-k", "5", &seconds.to_string(), program]).args(args).stdin(Stdio::null());
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    command.output().unwrap_or_else(|error| panic!("cannot run {program}: {error} (run scripts/setup.sh)"))
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// libmemcached-tools' memccapable, ASCII protocol only (remem kv speaks the text and meta
/// protocols, not the binary one); panics unless every check passed.
pub fn memccapable_passes(target: &Target) {
    require_program("memccapable", "libmemcached-tools");
    let port = target.port();
    let output = run_bounded(60, "memccapable", &["-h", "127.0.0.1", "-p", &port, "-a", "-t", "5"], None);
    let report = text(&output);
    println!("memccapable against {}:\n{report}", target.server.name);
    let failed: Vec<&str> =
        report.lines().filter(|line| line.contains("[FAIL]") || line.contains("FAIL")).collect();
    assert!(failed.is_empty(), "memccapable failed checks against {}: {failed:#?}", target.server.name);
    assert!(output.status.success(), "memccapable exited {} against {}", output.status, target.server.name);
    assert!(report.contains("All tests passed"), "memccapable did not report all tests passed");
}

/// pymemcache 3.5.2's source distribution, fetched by scripts/setup.sh.
pub fn pymemcache_source() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pymemcache-src/pymemcache-3.5.2");
    assert!(
        dir.join("pymemcache/test/test_integration.py").is_file(),
        "pymemcache's integration tests are missing from {}: scripts/setup.sh fetches them",
        dir.display()
    );
    dir
}

/// pymemcache's own integration tests (its `-m integration` set, less TLS, which needs a TLS
/// listener) with Debian's pytest and Debian's pymemcache against the target: `pytest-3`, not
/// `python3 -m pytest`, and `--import-mode=importlib`, so the sdist's copy of the client is not
/// put first on sys.path; the system Python, not one a pyenv or venv puts first on PATH.
/// Panics unless every test passed; returns the summary line.
pub fn pymemcache_integration_passes(target: &Target) -> String {
    require_program("pytest-3", "python3-pytest");
    assert!(
        Path::new("/usr/lib/python3/dist-packages/pymemcache/client/base.py").is_file(),
        "Debian's pymemcache is missing: scripts/setup.sh installs it (python3-pymemcache)"
    );
    let source = pymemcache_source();
    let server = "--server=127.0.0.1".to_owned();
    let port = format!("--port={}", target.port());
    let output = run_bounded(
        120,
        "env",
        &[
            "PATH=/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE=1",
            "pytest-3",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--import-mode=importlib",
            "-q",
            "-rfE",
            "--tb=short",
            "-m",
            "integration",
            "-k",
            "not tls",
            "pymemcache/test/test_integration.py",
            &server,
            &port,
        ],
        Some(&source),
    );
    let report = text(&output);
    println!("pymemcache integration tests against {}:\n{report}", target.server.name);
    let summary = report
        .lines()
        .rev()
        .find(|line| line.contains(" passed") || line.contains(" failed") || line.contains(" error"))
        .unwrap_or("")
        .to_owned();
    assert!(
        output.status.success(),
        "pytest exited {} against {}: {summary}",
        output.status,
        target.server.name
    );
    assert!(summary.contains(" passed"), "no pymemcache test passed: {summary:?}");
    assert!(
        !summary.contains("failed") && !summary.contains("error") && !summary.contains("skipped"),
        "{summary}"
    );
    summary
}

/// memccp copies files of 1 B, 100 KiB and 900 KiB in (key = file name); memccat reads each
/// back; the bytes must match.
pub fn memccp_memccat_round_trip(target: &Target) {
    require_program("memccp", "libmemcached-tools");
    require_program("memccat", "libmemcached-tools");
    let servers = format!("--servers=127.0.0.1:{}", target.port());
    for (index, size) in [1usize, 100 << 10, 900 << 10].into_iter().enumerate() {
        let name = format!("round-trip-{size}.bin");
        let path = target.dir.join(&name);
        let data = remem::kv_bench::value_for(index as u64 + 11, 3, size);
        std::fs::write(&path, &data).expect("write the file");
        let output =
            run_bounded(30, "memccp", &[&servers, "--set", path.to_str().expect("UTF-8 path")], None);
        assert!(output.status.success(), "memccp of {size} B failed: {}", text(&output));
        // memccat adds a newline on stdout; --file writes the value alone.
        let out = target.dir.join(format!("{name}.out"));
        let file = format!("--file={}", out.to_str().expect("UTF-8 path"));
        let output = run_bounded(30, "memccat", &[&servers, &file, &name], None);
        assert!(output.status.success(), "memccat of {size} B failed: {}", text(&output));
        let read = std::fs::read(&out).expect("memccat wrote the file");
        assert_eq!(read.len(), size, "memccat returned {} B of a {size} B file", read.len());
        assert!(read == data, "memccat returned other bytes than memccp stored ({size} B)");
        println!("memccp/memccat {size} B: bytes match");
    }
}

// ---------------------------------------------------------------------------------------------
// The reference model of the cache for the fault test.

/// What a key holds after the operations acknowledged so far. `Unknown` after an operation
/// whose outcome the client cannot know (an error answer): the next read learns it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    Known(Option<(u32, Vec<u8>)>),
    Unknown,
}

/// The model of one client thread's keys (threads own disjoint keys, so each model is exact).
#[derive(Default)]
pub struct CacheModel {
    pub keys: HashMap<String, Expected>,
}

/// Counts of one model run.
#[derive(Clone, Debug, Default)]
pub struct ModelCounts {
    pub ops: u64,
    pub reads_checked: u64,
    /// A value, or an answer, that no acknowledged write explains.
    pub wrong_values: u64,
    /// A key whose last acknowledged write stored it, missing (a miss, `NOT_FOUND`,
    /// `NOT_STORED` of an append).
    pub lost_keys: u64,
    /// `SERVER_ERROR` / `CLIENT_ERROR` / `ERROR` answers.
    pub error_answers: u64,
    /// The first few problems, described.
    pub problems: Vec<String>,
}

impl ModelCounts {
    pub fn problem(&mut self, text: String) {
        if self.problems.len() < 12 {
            self.problems.push(text);
        }
    }

    pub fn add(&mut self, other: &ModelCounts) {
        self.ops += other.ops;
        self.reads_checked += other.reads_checked;
        self.wrong_values += other.wrong_values;
        self.lost_keys += other.lost_keys;
        self.error_answers += other.error_answers;
        for problem in &other.problems {
            self.problem(problem.clone());
        }
    }
}

/// A value for a message: its length and flags.
pub fn describe(value: &Option<(u32, Vec<u8>)>) -> String {
    match value {
        Some((flags, bytes)) => format!("{} B flags {flags}", bytes.len()),
        None => "nothing".to_owned(),
    }
}

impl CacheModel {
    pub fn expected(&self, key: &str) -> Expected {
        self.keys.get(key).cloned().unwrap_or(Expected::Known(None))
    }

    /// Checks a read of `key` (flags and bytes, or a miss) against the model, and learns it
    /// when the model did not know.
    pub fn check_read(&mut self, key: &str, read: &Option<(u32, Vec<u8>)>, counts: &mut ModelCounts) {
        counts.reads_checked += 1;
        match self.expected(key) {
            Expected::Unknown => {
                self.keys.insert(key.to_owned(), Expected::Known(read.clone()));
            }
            Expected::Known(expected) if expected == *read => {}
            Expected::Known(expected) => {
                if read.is_none() {
                    counts.lost_keys += 1;
                } else {
                    counts.wrong_values += 1;
                }
                counts.problem(format!("{key}: read {}, expected {}", describe(read), describe(&expected)));
                // Go on from what the server holds, so one fault is counted once.
                self.keys.insert(key.to_owned(), Expected::Known(read.clone()));
            }
        }
    }
}

/// Reads `key` with `get` (flags and value, or a miss).
pub fn read_key(client: &mut TextClient, key: &str) -> Result<Option<(u32, Vec<u8>)>, ClientError> {
    let mut items = client.retrieve("get", &[key])?;
    match items.len() {
        0 => Ok(None),
        1 => {
            let item = items.pop().expect("one item");
            Ok(Some((item.flags, item.value)))
        }
        count => Err(ClientError::Protocol(format!("{count} values for one key"))),
    }
}

/// A client that sets and reads back its own keys in a loop and times every operation.
pub struct GoodClient {
    pub ops: AtomicU64,
    pub failures: std::sync::Mutex<Vec<String>>,
    pub slowest_us: AtomicU64,
}

impl GoodClient {
    pub fn run(&self, address: std::net::SocketAddr, stop: &AtomicBool) {
        let mut client = match TextClient::connect(address, Duration::from_secs(10)) {
            Ok(client) => client,
            Err(error) => return self.failures.lock().unwrap().push(format!("connect: {error}")),
        };
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("good-{}", round % 50);
            let value = remem::kv_bench::value_for(round, round, 100 + (round as usize * 977) % 20_000);
            let started = Instant::now();
            let result = client.set(&key, &value).and_then(|answer| {
                if answer != StoreOutcome::Stored {
                    return Err(ClientError::Protocol(format!("set answered {answer:?}")));
                }
                match client.get(&key)? {
                    Some(read) if read == value => Ok(()),
                    Some(read) => {
                        Err(ClientError::Protocol(format!("read {} B, not the value set", read.len())))
                    }
                    None => Err(ClientError::Protocol("a miss right after STORED".to_owned())),
                }
            });
            self.slowest_us.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            if let Err(error) = result {
                self.failures.lock().unwrap().push(format!("{key}: {error}"));
                return;
            }
            self.ops.fetch_add(1, Ordering::Relaxed);
            round += 1;
        }
    }

    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }
}

/// Waits up to 10 s for the good client to complete `more` operations beyond `from`.
pub fn good_client_progresses(good: &GoodClient, from: u64, more: u64, during: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while good.ops() < from + more && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let failures = good.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "the good client failed {during}: {failures:?}");
    assert!(good.ops() >= from + more, "the good client made no progress {during}");
}
