//! `remem run --paging uffd` for real: unmodified programs paged inside their own process by
//! libremem_preload.so, against a local cluster of 10 `remem node` processes whose memory the
//! pager reaches as shared memory, EC(8,2), with a local budget far below what the programs
//! touch, so most of their pages go to remem and come back.
//!
//! - A C probe (tests/programs/paging_probe.c, compiled here with `cc`) checks each semantic a
//!   real program relies on: threads, fork (the child sees every byte), mremap, munmap,
//!   MADV_DONTNEED (zeros after, the rest intact), system calls that read and write paged-out
//!   memory in the kernel (write(2), read(2)), exec, random writes (a write the pager missed
//!   reads back as an older version) and the brk heap's small blocks. Each mode runs first without the
//!   library (the probe's own verdict), then under it; under it the pager must have evicted
//!   and fetched pages, or the mode proved nothing.
//! - Failures: 2 of 10 nodes SIGKILLed while the probe's pages are out: every byte reads back;
//!   3 killed (r + 1): the probe dies of SIGBUS and never sees a wrong or zero page.
//! - python3, sqlite3 and memcached under the library give what they give without it.
//!
//! Needs root (userfaultfd serves kernel faults only with CAP_SYS_PTRACE), cc, python3, sqlite3
//! and memcached, which `scripts/setup.sh` installs; a missing one fails with its name.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use remem::kv_bench::TextClient;
use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

struct Setup {
    cluster: LocalCluster,
    dir: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.cluster.stop(Duration::from_secs(5));
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn setup(name: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!("remem-paging-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let options = ClusterOptions {
        lease_grace: None,
        nodes: 10,
        capacity_bytes: 48 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain: 1,
        dir: dir.join("cluster"),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: UnixSockets::All,
        encrypt: false,
    };
    let cluster = LocalCluster::start(binary(), &options).expect("a local cluster starts");
    Setup { cluster, dir }
}

/// The probe, compiled once per test into its directory.
fn probe(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/paging_probe.c");
    let output = dir.join("paging_probe");
    let compiled = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&output)
        .arg(&source)
        .output()
        .expect("cc runs (Debian package gcc, installed by scripts/setup.sh)");
    assert!(compiled.status.success(), "cc: {}", String::from_utf8_lossy(&compiled.stderr));
    output
}

/// `remem run --paging uffd` of `command` with a budget of `limit` (EC(8,2), shared memory).
fn paged(setup: &Setup, limit: &str, command: &[&str]) -> Command {
    let mut run = Command::new("timeout");
    run.args(["-k", "5", "120"])
        .arg(binary())
        .args(["run", "--paging", "uffd", "--memory-limit", limit, "--remote-size", "96MiB", "--cluster"])
        .arg(&setup.cluster.cluster_file_path)
        .arg("--")
        .args(command);
    run
}

/// A counter of the pager's report (`remem run: pager {...}` on stderr).
fn pager_counter(stderr: &str, name: &str) -> u64 {
    let line = stderr.lines().find(|line| line.starts_with("remem run: pager ")).unwrap_or_else(|| {
        panic!("no pager report in:\n{stderr}");
    });
    let field = format!("\"{name}\":");
    let rest = line.split(&field).nth(1).unwrap_or_else(|| panic!("no {name} in {line}"));
    let number: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    number.parse::<f64>().unwrap_or_else(|_| panic!("{name} in {line}")) as u64
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn every_semantic_of_a_program_holds_when_its_pages_live_in_remem() {
    let setup = setup("semantics");
    let probe = probe(&setup.dir);
    let modes =
        ["fill", "threads", "fork", "mremap", "munmap", "dontneed", "syscall", "exec", "random", "heap"];
    for mode in modes {
        let alone = Command::new(&probe).args([mode, "8"]).output().expect("the probe runs");
        assert_eq!(text(&alone).0, "ok\n", "{mode} without the library: {:?}", text(&alone));
        let output =
            paged(&setup, "4MiB", &[probe.to_str().unwrap(), mode, "16"]).output().expect("remem run runs");
        let (stdout, stderr) = text(&output);
        assert!(output.status.success() && stdout == "ok\n", "{mode} under the library: {stdout}\n{stderr}");
        // 16 MiB (32 with the pressure the probe adds) in a 4 MiB budget: pages went out and
        // came back from remem, or the mode checked nothing of the pager.
        assert!(pager_counter(&stderr, "evictions") >= 1024, "{mode}: too few evictions\n{stderr}");
        assert!(pager_counter(&stderr, "write_backs") > 0, "{mode}: nothing written back\n{stderr}");
        if mode != "exec" && mode != "heap" {
            // exec replaces the paged image before it reads anything back.
            assert!(pager_counter(&stderr, "fetch_faults") > 0, "{mode}: nothing fetched back\n{stderr}");
        }
        if mode == "fill" || mode == "random" {
            // Fresh memory written first: a page of zeros of its own per write fault, not the
            // zero page and a copy-on-write fault after it.
            assert!(pager_counter(&stderr, "zero_copies") > 0, "{mode}: no zero copies\n{stderr}");
        }
        if mode == "fill" {
            // Filled in order: the oldest pages leave in runs, one move (one TLB flush) each.
            assert!(pager_counter(&stderr, "evicted_in_runs") > 0, "{mode}: no run evicted\n{stderr}");
        }
        assert_eq!(pager_counter(&stderr, "lost_pages"), 0, "{mode}: {stderr}");
        // Every image's slabs are given back: the last one's by `remem run`, an earlier one's
        // (exec replaced it without a destructor) by the next image's pager before it connects.
        assert_eq!(slabs_held(&setup), 0, "{mode}: slabs left on the nodes");
    }
}

/// Slabs the cluster's nodes hold (mapped, or kept for a client in its lease grace).
fn slabs_held(setup: &Setup) -> u64 {
    let output = Command::new(binary())
        .args(["status", "--json", "--cluster"])
        .arg(&setup.cluster.cluster_file_path)
        .output()
        .expect("remem status runs");
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    let nodes = status["nodes"].as_array().expect("nodes");
    nodes.iter().map(|node| node["slabs_mapped"].as_u64().unwrap_or(0)).sum()
}

/// Starts the probe's `hold` mode (16 MiB filled, then paged out), waits for "filled", kills
/// `kills` nodes, lets the probe verify and returns its output.
fn hold_through_kills(setup: &mut Setup, probe: &Path, kills: &[usize]) -> Output {
    let mut child = paged(setup, "2MiB", &[probe.to_str().unwrap(), "hold", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("remem run starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the probe reports");
    if line != "filled\n" {
        let output = child.wait_with_output().expect("remem run ends");
        panic!("the probe did not fill its memory: {line}{}", String::from_utf8_lossy(&output.stderr));
    }
    for &node in kills {
        setup.cluster.kill(node).expect("node killed");
    }
    child.stdin.take().expect("stdin").write_all(b"go\n").expect("probe told to verify");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("the probe's output");
    let mut output = child.wait_with_output().expect("remem run ends");
    output.stdout = (line + &rest).into_bytes();
    output
}

#[test]
fn within_r_failed_nodes_every_byte_comes_back_and_beyond_r_the_access_gets_sigbus() {
    let mut setup = setup("failures");
    let probe = probe(&setup.dir);
    let output = hold_through_kills(&mut setup, &probe, &[1, 6]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success() && stdout == "filled\nok\n", "2 of 10 nodes killed: {stdout}\n{stderr}");
    assert!(pager_counter(&stderr, "fetch_faults") > 0, "pages came back from remem: {stderr}");
    drop(setup);

    let mut setup = self::setup("beyond");
    let probe = self::probe(&setup.dir);
    let output = hold_through_kills(&mut setup, &probe, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9][..3]);
    let (stdout, stderr) = text(&output);
    assert!(!stdout.contains("WRONG"), "never a wrong or zero page: {stdout}");
    // remem run exits with 128 + the signal that killed the command.
    assert_eq!(output.status.code(), Some(128 + libc::SIGBUS), "SIGBUS beyond r: {stdout}\n{stderr}");
    assert!(stderr.contains("is lost"), "the pager says which page is lost: {stderr}");
}

/// Writes 40 MiB of distinct blocks and reads every one back (as tests/run.rs does).
const PYTHON_HOG: &str = "blocks = [bytes([i % 251]) * 65536 for i in range(640)]\n\
assert all(b == bytes([i % 251]) * 65536 for i, b in enumerate(blocks)), 'wrong bytes'\n\
print('intact')";

/// 60,000 rows in an in-memory database, summed.
const SQL: &str = "CREATE TABLE t(a INTEGER, b TEXT);\n\
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60000)\n\
INSERT INTO t SELECT i, printf('%0200d', i) FROM n;\n\
SELECT count(*), sum(a), sum(length(b)) FROM t;";

#[test]
fn python3_sqlite3_and_memcached_give_under_the_library_what_they_give_without_it() {
    let setup = setup("programs");
    // Debian's interpreter itself, not a wrapper that execs it (each image would map a region).
    let output =
        paged(&setup, "8MiB", &["/usr/bin/python3", "-c", PYTHON_HOG]).output().expect("remem run runs");
    let (stdout, stderr) = text(&output);
    assert!(output.status.success() && stdout == "intact\n", "python3: {stdout}\n{stderr}");
    assert!(pager_counter(&stderr, "fetch_faults") > 0, "python3's pages came back from remem: {stderr}");

    let alone =
        Command::new("sqlite3").arg(":memory:").arg(SQL).output().expect("sqlite3 runs (Debian sqlite3)");
    let output = paged(&setup, "4MiB", &["sqlite3", ":memory:", SQL]).output().expect("remem run runs");
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "sqlite3: {stdout}\n{stderr}");
    assert_eq!(stdout, text(&alone).0, "sqlite3 answers the same: {stderr}");
    assert!(pager_counter(&stderr, "evictions") > 0, "sqlite3 was paged: {stderr}");

    memcached_keeps_every_value(&setup);
}

fn memcached_keeps_every_value(setup: &Setup) {
    let port = remem::ports::unassigned_port().expect("a free port");
    let server = paged(
        setup,
        "8MiB",
        &["memcached", "-u", "root", "-l", "127.0.0.1", "-U", "0", "-m", "64", "-p", &port.to_string()],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("memcached under remem run starts (Debian memcached)");
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut client = (0..200)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            TextClient::connect(address, Duration::from_secs(10)).ok()
        })
        .expect("memcached answers under the library");
    let value = |key: usize| -> Vec<u8> { (0..16384).map(|byte| ((key * 31 + byte) % 251) as u8).collect() };
    for key in 0..1500 {
        client.set(&format!("key{key}"), &value(key)).expect("set");
    }
    for key in 0..1500 {
        let got = client.get(&format!("key{key}")).expect("get");
        assert_eq!(got.as_deref(), Some(&value(key)[..]), "memcached under the library: key{key}");
    }
    drop(client);
    // SIGTERM to memcached ends it; remem run (under `timeout`) reports and exits.
    let children = |pid: u32| -> Vec<u32> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        text.split_whitespace().filter_map(|pid| pid.parse().ok()).collect()
    };
    let run = *children(server.id()).first().expect("timeout runs remem run");
    let memcached = *children(run).first().expect("remem run runs memcached");
    // SAFETY: signals the memcached process this test started (remem run's only child).
    unsafe { libc::kill(memcached as i32, libc::SIGTERM) };
    let output = server.wait_with_output().expect("remem run ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(pager_counter(&stderr, "fetch_faults") > 0, "memcached's pages came back from remem: {stderr}");
}
