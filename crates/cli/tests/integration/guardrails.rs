//! What an operator types wrong, answered clearly (issue 14's list): zero and malformed numbers
//! refused by the argument parsers instead of panicking later, sizes with fractions and SI
//! suffixes, a demo larger than the host refused, a second `remem up` on a busy directory
//! refused, a node that fails to start named with its reason, nodes that die with a killed
//! `remem up`, each cause of an error printed once, and node logs without colour codes.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn remem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_remem"))
}

fn run(args: &[&str]) -> (bool, String) {
    let output = remem().args(args).stdin(Stdio::null()).output().expect("remem runs");
    let text =
        String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    (output.status.success(), text)
}

fn dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-guardrails-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn zero_and_malformed_numbers_are_refused_with_a_message_not_a_panic() {
    let cases: &[(&[&str], &str)] = &[
        (&["demo", "-k", "0"], "k must be between 1 and 16"),
        (&["demo", "-k", "40"], "k must be between 1 and 16"),
        // One definition of the shape limits, checked before anything connects (issue 29: nbd
        // said "data_splits must be in 1..=16" after connecting, kv "k + r at most 32").
        (&["nbd", "-k", "32"], "k must be between 1 and 16"),
        (&["nbd", "-r", "40"], "r must be between 0 and 4"),
        (&["kv", "-r", "40"], "r must be between 0 and 4"),
        (&["kv", "-k", "17"], "k must be between 1 and 16"),
        (&["fs", "-k", "20", "/nonexistent"], "k must be between 1 and 16"),
        (&["bench", "codec", "-r", "5"], "r must be between 0 and 4"),
        (&["demo", "--slab-size", "0"], "must be more than 0 bytes"),
        (&["demo", "--slab-size", "100"], "must be a multiple of 4 KiB"),
        (&["demo", "--queue-depth", "0"], "must be at least 1"),
        (&["demo", "--size", "1.5"], "not a whole number of bytes"),
        (&["demo", "--size", "12XB"], "unknown size suffix"),
        (&["up", "--nodes", "0"], "must be at least 1"),
        (&["up", "--capacity", "0"], "must be more than 0 bytes"),
        (&["bench", "pages", "--ops", "0"], "must be at least 1"),
        (&["node", "--max-connections", "0"], "must be at least 1"),
        (&["kv", "--max-connections", "0"], "must be positive"),
        (&["kv", "-m", "100"], "at least 1 MiB"),
    ];
    for (args, expected) in cases {
        let (success, text) = run(args);
        assert!(!success, "remem {args:?} was accepted");
        assert!(!text.contains("panicked"), "remem {args:?} panicked: {text}");
        assert!(text.contains(expected), "remem {args:?}: expected {expected:?} in {text}");
    }
}

#[test]
fn a_demo_larger_than_the_host_is_refused_unless_forced() {
    let (success, text) = run(&["demo", "--size", "10TiB"]);
    assert!(!success);
    assert!(text.contains("of node memory") && text.contains("--force"), "{text}");
}

/// A front end larger than its cluster says the node memory it needs and the nodes have free
/// (as the demo does for the host), not "placement needs 3 nodes with a free slab, only 0 have
/// one", and before it maps a slab.
#[test]
fn a_front_end_larger_than_its_cluster_names_the_node_memory_needed_and_free() {
    let dir = dir("too-large");
    let _up = start_up(&dir, "3");
    let cluster = dir.join("cluster.json");
    let cluster = cluster.to_str().expect("utf-8");
    let shape = ["-k", "2", "-r", "1", "--cluster", cluster];
    for command in [&["nbd", "--size", "10TiB"][..], &["kv", "-m", "10TiB", "--listen", "127.0.0.1:0"]] {
        let (success, text) = run(&[command, &shape[..]].concat());
        assert!(!success, "{command:?}: {text}");
        // nbd maps its whole size; kv maps as items arrive and checks its limit at its costliest
        // starting scheme (EOR: main copies plus an EC page, 10 + 15 TiB).
        let needs = if command[0] == "nbd" {
            "10.00 TiB at EC(2,1) needs 15."
        } else {
            "-m 10.00 TiB of items at eor needs up to 25."
        };
        assert!(text.contains(needs) && text.contains("TiB of node memory"), "{text}");
        assert!(text.contains("the 3 nodes that answered have 192.00 MiB free"), "{text}");
        // Refused before anything is mapped: the nodes' free slabs are too few in all, so
        // placement is never asked (mapping and releasing slab after slab took 44 s at 10 TiB).
        assert!(!text.contains("placement"), "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running `remem up`, killed (SIGKILL) and reaped on drop.
struct Up {
    child: std::process::Child,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_up(dir: &Path, nodes: &str) -> Up {
    let child = remem()
        .args(["up", "--nodes", nodes, "--capacity", "64MiB", "--slab-size", "1MiB", "--dir"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("remem up starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.join("cluster.json").exists() {
        assert!(Instant::now() < deadline, "remem up wrote no cluster file");
        std::thread::sleep(Duration::from_millis(50));
    }
    Up { child }
}

fn node_pids(dir: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(dir.join("cluster.json")).expect("cluster file");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|node| node["pid"].as_i64().expect("pid") as i32)
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0): look at its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn a_second_up_on_a_busy_directory_is_refused_and_a_killed_up_takes_its_nodes_along() {
    let dir = dir("up");
    let mut first = start_up(&dir, "3");
    let before = std::fs::read(dir.join("cluster.json")).expect("cluster file");
    let (success, text) = run(&["up", "--nodes", "2", "--dir", dir.to_str().expect("utf-8")]);
    assert!(!success && text.contains("another remem up"), "{text}");
    assert_eq!(
        std::fs::read(dir.join("cluster.json")).expect("cluster file"),
        before,
        "the first cluster file was overwritten"
    );
    // Node logs are plain text.
    let mut log = String::new();
    std::fs::File::open(dir.join("node-0.log")).expect("log").read_to_string(&mut log).expect("read");
    assert!(!log.contains('\u{1b}'), "ANSI codes in a node log: {log:?}");

    let pids = node_pids(&dir);
    first.child.kill().expect("SIGKILL remem up");
    first.child.wait().expect("reaped");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| alive(pid)) {
        assert!(Instant::now() < deadline, "nodes {pids:?} outlived their remem up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_that_cannot_start_is_named_with_its_reason() {
    let dir = dir("bad-node");
    let (success, text) =
        run(&["up", "--nodes", "1", "--slab-size", "3000", "--dir", dir.to_str().expect("utf-8")]);
    assert!(!success);
    assert!(text.contains("node 0") && text.contains("power of two"), "{text}");
}

#[test]
fn each_cause_of_an_error_is_printed_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = dir("causes");
    std::fs::create_dir_all(&dir).expect("dir");
    let secret = dir.join("secret");
    std::fs::write(&secret, "00112233445566778899aabbccddeeff").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // A cluster file naming a node nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let cluster = serde_json::json!({
        "secret_file": secret,
        "nodes": [{ "address": address.to_string(), "failure_domain": "a" }],
    });
    std::fs::write(dir.join("cluster.json"), cluster.to_string()).expect("cluster file");
    let (success, text) = run(&[
        "nbd",
        "--size",
        "1MiB",
        "-k",
        "1",
        "-r",
        "0",
        "--delta",
        "0",
        "--cluster",
        dir.join("cluster.json").to_str().expect("utf-8"),
    ]);
    assert!(!success);
    let error_line = text.lines().find(|line| line.starts_with("error: ")).expect("an error line");
    assert_eq!(
        error_line.matches("Connection refused").count(),
        1,
        "a cause printed more than once: {error_line}"
    );
}

#[test]
fn up_with_restart_dead_brings_a_killed_node_back_on_its_address() {
    let dir = dir("restart-dead");
    let child = remem()
        .args(["up", "--nodes", "2", "--capacity", "64MiB", "--slab-size", "1MiB", "--restart-dead", "--dir"])
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("remem up starts");
    let _up = Up { child };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.join("cluster.json").exists() {
        assert!(Instant::now() < deadline, "remem up wrote no cluster file");
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = node_pids(&dir)[0];
    // SAFETY: kill with the PID of a node process this test's remem up started.
    unsafe { libc::kill(first, libc::SIGKILL) };
    loop {
        let now = node_pids(&dir)[0];
        if now != first && alive(now) {
            break;
        }
        assert!(Instant::now() < deadline, "node 0 was not restarted");
        std::thread::sleep(Duration::from_millis(50));
    }
}
