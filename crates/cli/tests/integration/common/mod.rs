//! What the integration tests share: a local cluster of real node processes, and a reference
//! model of remote memory that writes pages with a pattern per (page, generation) and checks
//! every byte read back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};
use remem::pattern;
use remem_client::{Client, PageOp};

/// 1 MiB slabs hold 2048 splits of 512 B: one EC(8,2) range is 2048 pages.
pub const SLAB_BYTES: u64 = 1 << 20;

/// Starts `nodes` node processes with fault injection on, 16 slabs of [`SLAB_BYTES`] each, one
/// failure domain per node, in a fresh directory named after `suite` and `name`.
pub fn start_cluster(suite: &str, name: &str, nodes: usize, unix_sockets: UnixSockets) -> LocalCluster {
    let options = cluster_options(suite, name, nodes, unix_sockets);
    let _ = std::fs::remove_dir_all(&options.dir);
    let mut cluster =
        LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_remem")), &options).expect("cluster starts");
    cluster.remove_dir_on_drop();
    cluster
}

/// The options [`start_cluster`] uses, also for adding a node to its cluster.
pub fn cluster_options(suite: &str, name: &str, nodes: usize, unix_sockets: UnixSockets) -> ClusterOptions {
    ClusterOptions {
        lease_grace: None,
        nodes,
        capacity_bytes: 16 * SLAB_BYTES,
        slab_size_bytes: SLAB_BYTES,
        nodes_per_domain: 1,
        dir: std::env::temp_dir().join(format!("remem-{suite}-{name}-{}", std::process::id())),
        fault_injection: true,
        monitor_args: None,
        unix_sockets,
        encrypt: false,
    }
}

/// A child process killed (by PID, SIGKILL) and reaped on drop, however the test ends.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh directory for one test, `remem-NAME-PID` under the system's temporary directory,
/// removed when dropped unless the test is failing (panicking), so a failed test keeps its
/// logs. Declare it before what writes into it: locals drop in reverse order.
pub struct ScratchDir(PathBuf);

#[allow(dead_code)] // not every test crate that includes this module makes one
impl ScratchDir {
    pub fn new(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("remem-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test directory");
        ScratchDir(dir)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Pattern seed of the pages the model writes.
pub const PATTERN_SEED: u64 = 0x5eed_da7a;

/// The reference model of remote memory: the generation last written to each page.
#[derive(Default)]
pub struct Model {
    pub generations: HashMap<u64, u64>,
    pub verified: u64,
    pub mismatches: u64,
}

impl Model {
    pub fn write(&mut self, client: &mut Client, pages: &[u64]) {
        let next: Vec<u64> =
            pages.iter().map(|page| self.generations.get(page).copied().unwrap_or(0) + 1).collect();
        let buffers: Vec<Vec<u8>> = pages
            .iter()
            .zip(&next)
            .map(|(&page, &generation)| {
                let mut buffer = vec![0; 4096];
                pattern::fill(&mut buffer, page, generation, PATTERN_SEED);
                buffer
            })
            .collect();
        let mut ops: Vec<PageOp<'_>> =
            pages.iter().zip(&buffers).map(|(&page, data)| PageOp::Write { page, data }).collect();
        let mut errors = Vec::new();
        client.execute(&mut ops, |done| {
            if let Err(error) = done.result {
                errors.push(error.to_string());
            }
        });
        assert!(errors.is_empty(), "writes failed: {:?}", &errors[..errors.len().min(3)]);
        for (&page, generation) in pages.iter().zip(next) {
            self.generations.insert(page, generation);
        }
    }

    /// Reads `pages`, checks each against the model; returns how many were decoded.
    pub fn read(&mut self, client: &mut Client, pages: &[u64]) -> usize {
        let mut buffers = vec![vec![0u8; 4096]; pages.len()];
        let mut errors = Vec::new();
        let mut decoded = 0;
        {
            let mut ops: Vec<PageOp<'_>> =
                pages.iter().zip(buffers.iter_mut()).map(|(&page, buf)| PageOp::Read { page, buf }).collect();
            client.execute(&mut ops, |done| {
                decoded += done.decoded as usize;
                if let Err(error) = done.result {
                    errors.push(error.to_string());
                }
            });
        }
        assert!(errors.is_empty(), "reads failed: {:?}", &errors[..errors.len().min(3)]);
        let mut scratch = vec![0; 4096];
        for (page, buffer) in pages.iter().zip(&buffers) {
            self.verified += 1;
            let ok = match self.generations.get(page) {
                Some(&generation) => pattern::check(buffer, *page, generation, PATTERN_SEED, &mut scratch),
                None => buffer.iter().all(|&byte| byte == 0),
            };
            if !ok {
                self.mismatches += 1;
            }
        }
        assert_eq!(self.mismatches, 0, "a page read back wrong");
        decoded
    }
}

/// One round of load for the scale tests: 64 random pages written, 128 read and checked
/// against the model.
#[allow(dead_code)] // the scale tests only
pub fn load_round(client: &mut Client, model: &mut Model, rng: &mut impl rand::Rng, pages: u64) {
    let mut writes: Vec<u64> = (0..64).map(|_| rng.gen_range(0..pages)).collect();
    writes.sort_unstable();
    writes.dedup();
    model.write(client, &writes);
    let reads: Vec<u64> = (0..128).map(|_| rng.gen_range(0..pages)).collect();
    model.read(client, &reads);
}

/// Runs a program under `timeout` (killed 5 s after it), returning its output.
#[allow(dead_code)] // not every test crate that includes this module runs programs
pub fn run(seconds: u32, program: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("timeout")
        .args(["-k", "5", &seconds.to_string(), program])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {program}: {error} (run scripts/setup.sh)"))
}

/// Runs a program and panics unless it succeeds; returns its stdout.
#[allow(dead_code)]
pub fn run_ok(seconds: u32, program: &str, args: &[&str]) -> String {
    let output = run(seconds, program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `remem status ARGS`' standard output; its exit status says the cluster's health (0 all up, 3
/// some nodes down, 4 all down), any other is a failure.
#[allow(dead_code)]
pub fn remem_status(seconds: u32, args: &[&str]) -> String {
    let program = env!("CARGO_BIN_EXE_remem");
    let mut all = vec!["status"];
    all.extend_from_slice(args);
    let output = run(seconds, program, &all);
    assert!(
        matches!(output.status.code(), Some(0 | 3 | 4)),
        "remem {all:?} failed: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Starts `command` with its stdout piped and its stderr in `log`; returns the child and its first
/// stdout line (empty if none came within 30 s: the caller reports the log).
#[allow(dead_code)]
pub fn spawn_with_first_line(
    mut command: std::process::Command,
    log: &Path,
) -> (std::process::Child, String) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).expect("log file")))
        .spawn()
        .expect("remem starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    let line = receiver.recv_timeout(std::time::Duration::from_secs(30)).unwrap_or_default();
    (child, line)
}

/// `bytes` of xorshift noise from `seed`: data no codec or page pattern could fake.
#[allow(dead_code)]
/// SIGTERM to a child we spawned, then waits up to `grace` for it to exit, then SIGKILL; reaped
/// either way.
pub fn terminate(child: &mut std::process::Child, grace: std::time::Duration) {
    // SAFETY: kill with the PID of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn pseudo_random(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut data = vec![0u8; bytes];
    for chunk in data.chunks_exact_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    data
}
