//! `remem run` for real: a python3 process that writes and verifies 40 MiB of distinct blocks
//! runs under a 24 MiB memory limit with remem swap on for the run (`--swap-size`), so at least
//! 16 MiB must page out to remem and come back intact; then with a limit of 50% of the peak a
//! first unlimited run measures, exiting with status 3, which `remem run` must pass on. After
//! each run nothing may be left attached: no swap area, loop device, mount, runtime directory or
//! cgroup. Needs root, FUSE, loop devices, a memory cgroup and python3: it fails with the reason
//! when one is missing.
//!
//! Also `remem bench apps --quick`, so the bench never rots: its PageRank must give the
//! baseline's result under every swap backend and leave nothing behind. The two tests hold one
//! lock: the bench needs swap off, and swap counters are system-wide.

#[allow(dead_code)] // the shared helpers this test does not use
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use std::sync::Mutex;

use remem::launcher::UnixSockets;

/// Held by each test: they turn swap on and off, which is system-wide.
static SWAP_LOCK: Mutex<()> = Mutex::new(());

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// Writes 640 distinct 64 KiB blocks (40 MiB), reads every one back, prints `intact`.
const HOG_SCRIPT: &str = "import sys\n\
blocks = [bytes([i % 251]) * 65536 for i in range(640)]\n\
assert all(b == bytes([i % 251]) * 65536 for i, b in enumerate(blocks)), 'wrong bytes'\n\
print('intact')\n\
sys.exit(int(sys.argv[1]))";

fn remem_run(memory_limit: &str, cluster_file: &Path, runtime_dir: &Path, exit_code: i32) -> Output {
    Command::new("timeout")
        .args(["-k", "5", "180"])
        .arg(binary())
        .args(["run", "--memory-limit", memory_limit, "--swap-size", "64MiB", "--cluster"])
        .arg(cluster_file)
        .arg("--swap-runtime-dir")
        .arg(runtime_dir)
        .args(["--", "python3", "-c", HOG_SCRIPT, &exit_code.to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("remem runs")
}

/// The number after `field ` in the last `remem run:` line of `stderr`.
fn report_field<'a>(stderr: &'a str, field: &str) -> &'a str {
    let line = stderr.lines().rev().find(|line| line.starts_with("remem run: limit")).expect("a report line");
    let rest = line.split(&format!("{field} ")).nth(1).unwrap_or_else(|| panic!("no {field} in {line}"));
    rest.split([' ', ',']).next().expect("a value")
}

/// Nothing of the run is attached: no loop device backed under `runtime_dir` (so no swap area
/// on one), no mount under it, the directory itself and the cgroup removed.
fn assert_nothing_attached(runtime_dir: &Path, cgroup: &Path) {
    let prefix = runtime_dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/sys/block").expect("/sys/block").flatten() {
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
        assert!(
            !backing.starts_with(&prefix),
            "loop device {:?} still attached to {backing}",
            entry.file_name()
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&prefix), "still mounted under {prefix}");
    assert!(!runtime_dir.exists(), "runtime directory {prefix} left");
    assert!(!cgroup.exists(), "cgroup {} left", cgroup.display());
    let swaps = std::fs::read_to_string("/proc/swaps").expect("/proc/swaps");
    assert!(!swaps.contains(&prefix), "swap left: {swaps}");
}

fn check_run(output: &Output, runtime_dir: &Path, expected_exit_code: i32) -> u64 {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(expected_exit_code), "remem run: {stdout}{stderr}");
    assert!(stdout.contains("intact"), "the paging process did not verify its data: {stdout}{stderr}");
    assert!(stdout.lines().all(|line| line == "intact"), "stdout is not the command's own: {stdout}");
    let swap_out_pages: u64 = report_field(&stderr, "swap-outs").parse().expect("a page count");
    assert!(swap_out_pages > 0, "nothing went to swap: {stderr}");
    let cgroup = PathBuf::from(report_field(&stderr, "cgroup"));
    assert_nothing_attached(runtime_dir, &cgroup);
    eprintln!("{}", stderr.trim());
    swap_out_pages
}

#[test]
fn run_pages_a_limited_command_to_remem_swap_and_leaves_nothing_attached() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "remem run needs root (CI runs as root)");
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: remem swap needs FUSE");
    let _lock = SWAP_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let started = Instant::now();
    let cluster = common::start_cluster("run", "limit", 10, UnixSockets::None);
    let runtime_dir = std::env::temp_dir().join(format!("remem-run-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime_dir);

    let output = remem_run("24MiB", &cluster.cluster_file_path, &runtime_dir, 0);
    let swap_out_pages = check_run(&output, &runtime_dir, 0);
    // 40 MiB of data in 24 MiB: at least 16 MiB (4096 pages) must have left.
    assert!(swap_out_pages >= 4096, "only {swap_out_pages} pages went to swap");

    let output = remem_run("50%", &cluster.cluster_file_path, &runtime_dir, 3);
    check_run(&output, &runtime_dir, 3);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("[unlimited run, to measure the peak]"), "no measuring run: {stderr}");
    eprintln!("run test took {:?}", started.elapsed());
}

#[test]
fn bench_apps_quick_gives_the_baseline_pagerank_on_remem_and_disk_swap() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "remem bench apps needs root (CI runs as root)");
    let _lock = SWAP_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let started = Instant::now();
    // On the target directory's disk, not /tmp, which may be tmpfs: the baseline is a disk swap file.
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("remem-bench-apps-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work directory");
    let output = Command::new("timeout")
        .args(["-k", "5", "300"])
        .arg(binary())
        .args(["bench", "apps", "--quick", "--dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("remem runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench apps failed: {stdout}{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("remem EC(8,2)") || line.starts_with("local disk file"))
        .collect();
    assert_eq!(rows.len(), 4, "two backends at 100% and 50%: {stdout}");
    assert!(
        rows.iter().filter(|row| row.starts_with("remem")).all(|row| row.ends_with(" same")),
        "a result changed or a run died on remem swap: {stdout}"
    );
    // The disk baseline may be stopped by the cgroup's OOM killer on a loaded machine.
    assert!(rows.iter().all(|row| row.ends_with(" same") || row.ends_with(" killed")), "{stdout}");
    let remem_half =
        rows.iter().find(|row| row.starts_with("remem EC(8,2)") && row.contains(" 50%")).expect("row");
    let swap_outs: u64 =
        remem_half.split_whitespace().nth(7).expect("swap-outs column").parse().expect("a count");
    assert!(swap_outs > 0, "nothing went to remem swap at 50%: {stdout}");
    let left: Vec<_> =
        std::fs::read_dir(&dir).expect("work directory").flatten().map(|entry| entry.path()).collect();
    assert!(left.is_empty(), "bench apps left {left:?}");
    let swaps = std::fs::read_to_string("/proc/swaps").expect("/proc/swaps");
    assert_eq!(swaps.lines().count(), 1, "swap left on: {swaps}");
    let _ = std::fs::remove_dir(&dir);
    eprintln!("{stdout}bench apps test took {:?}", started.elapsed());
}
