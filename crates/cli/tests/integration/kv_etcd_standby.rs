//! `remem kv --etcd --standby` (docs/KV.md "Standby on another host"), on one host: a standby
//! whose -m differs from the saved kv's is refused at once; a standby stands by, serving nothing,
//! while the primary lives and holds the name; when the primary is SIGKILLed, its owner lease
//! (2 s) lapses and the standby claims the name, reads the state region back and serves every
//! acknowledged item, publishes its address in etcd and runs its takeover command. Across hosts
//! (network namespaces, a service address moved by the takeover command) is
//! kv_etcd_standby_netns.rs. Every process is stopped by PID.

use crate::common;
use crate::etcd_support::{free_port, wait_for, EtcdNode, EtcdServer};
use crate::kv_support::binary;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remem::kv_bench::{StoreOutcome, TextClient};

/// A `remem kv` child whose stdout goes to a file (a standby prints `listening` only once it
/// serves); SIGKILLed and reaped on drop.
struct Process {
    child: Child,
    stdout: PathBuf,
    log: PathBuf,
}

impl Process {
    fn spawn(args: &[String], log: &Path) -> Process {
        let stdout = log.with_extension("out");
        let child = Command::new(binary())
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("remem starts");
        Process { child, stdout, log: log.to_owned() }
    }

    /// The address of its `listening ADDRESS` line, waiting at most `limit`.
    fn listening(&self, limit: Duration) -> Option<SocketAddr> {
        let address = || {
            let text = std::fs::read_to_string(&self.stdout).unwrap_or_default();
            text.lines().next()?.strip_prefix("listening ")?.parse().ok()
        };
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(address) = address() {
                return Some(address);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        address()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `remem kv --etcd` with a 2 s owner lease, in state directory `state` (scratch paths, no
/// spaces).
fn kv_args(etcd: &EtcdServer, secret: &Path, state: &Path, memory: &str, listen: &str) -> Vec<String> {
    let line = format!(
        "kv --etcd {} --export cache -m {memory} -k 4 -r 2 --backup-size 4MiB --etcd-lease-seconds 2 \
         --listen {listen} --secret-file {} --state {}",
        etcd.url,
        secret.display(),
        state.display()
    );
    line.split_whitespace().map(str::to_owned).collect()
}

/// The value of write `index` of `key` (sizes from one chunk class to several pages).
fn value_of(key: &str, index: usize) -> Vec<u8> {
    const SIZES: [usize; 5] = [100, 1500, 3000, 5000, 20_000];
    common::pseudo_random(SIZES[index % SIZES.len()], (index as u64) << 8 | key.len() as u64)
}

/// etcd, its secret, seven registered nodes and a primary (`a`) serving, in a scratch
/// directory.
struct Cluster {
    dir: common::ScratchDir,
    etcd: EtcdServer,
    secret: PathBuf,
    _nodes: Vec<EtcdNode>,
    primary: Process,
    address: SocketAddr,
}

fn cluster(name: &str) -> Cluster {
    let dir = common::ScratchDir::new(name);
    let (etcd, secret, nodes) = crate::etcd_support::start_registered(&dir, 7, ("16MiB", "1MiB"));
    let primary =
        Process::spawn(&kv_args(&etcd, &secret, &dir.join("a"), "16MiB", "127.0.0.1:0"), &dir.join("a.log"));
    let address =
        primary.listening(Duration::from_secs(40)).unwrap_or_else(|| panic!("{}", primary.log_text()));
    Cluster { dir, etcd, secret, _nodes: nodes, primary, address }
}

#[test]
fn kv_etcd_standby_waits_while_the_primary_lives_and_takes_over_when_its_lease_lapses() {
    let Cluster { dir, etcd, secret, _nodes, primary, address: primary_address } = cluster("kv-etcd-standby");
    let mut client = TextClient::connect(primary_address, Duration::from_secs(10)).expect("connects");
    let mut model: HashMap<String, Option<Vec<u8>>> = HashMap::new();
    for index in 0..150 {
        let key = format!("k{}", index % 100);
        let value = value_of(&key, index);
        assert_eq!(client.set(&key, &value).expect("set"), StoreOutcome::Stored);
        model.insert(key, Some(value));
    }
    for index in (0..100).step_by(9) {
        let key = format!("k{index}");
        assert!(client.delete(&key).expect("delete"));
        model.insert(key, None);
    }

    // Another -m than the saved kv's: refused at once, naming both.
    let wrong = Process::spawn(
        &[kv_args(&etcd, &secret, &dir.join("w"), "32MiB", "127.0.0.1:0"), vec!["--standby".to_owned()]]
            .concat(),
        &dir.join("wrong.log"),
    );
    let mut wrong = wrong;
    assert!(wait_for(Duration::from_secs(15), || matches!(wrong.child.try_wait(), Ok(Some(_)))), "refused");
    assert!(
        wrong.log_text().contains("standby refused") && wrong.log_text().contains("16.00 MiB"),
        "{}",
        wrong.log_text()
    );

    // The standby stands by while the primary lives (several leases), serving nothing.
    let listen = format!("127.0.0.1:{}", free_port());
    let marker = dir.join("took-over");
    let command = format!("echo \"$REMEM_KV_NAME $REMEM_KV_ADDRESS\" > {}", marker.display());
    let mut standby_args = kv_args(&etcd, &secret, &dir.join("b"), "16MiB", &listen);
    standby_args.extend(["--standby".to_owned(), "--takeover-command".to_owned(), command]);
    let mut standby = Process::spawn(&standby_args, &dir.join("b.log"));
    assert_eq!(
        standby.listening(Duration::from_secs(6)),
        None,
        "serves while the primary lives: {}",
        standby.log_text()
    );
    assert!(matches!(standby.child.try_wait(), Ok(None)), "the standby waits: {}", standby.log_text());
    let said = standby.log_text();
    assert!(said.contains("standing by") && said.contains(&format!("pid {}", primary.child.id())), "{said}");
    assert_eq!(client.set("late", b"still the primary").expect("set"), StoreOutcome::Stored);
    model.insert("late".to_owned(), Some(b"still the primary".to_vec()));
    let endpoint = etcd.etcdctl(&["get", "--print-value-only", "/remem/clients/cache/endpoint"]);
    assert!(String::from_utf8_lossy(&endpoint.stdout).contains(&primary_address.to_string()), "{endpoint:?}");
    drop(client);

    let killed = Instant::now();
    drop(primary); // SIGKILL
    let address =
        standby.listening(Duration::from_secs(30)).unwrap_or_else(|| panic!("{}", standby.log_text()));
    eprintln!("standby serves {} ms after the SIGKILL\n{}", killed.elapsed().as_millis(), standby.log_text());
    assert_eq!(address.to_string(), listen);
    assert!(killed.elapsed() < Duration::from_secs(5), "failover within 5 s");
    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects to the standby");
    for (key, expected) in &model {
        assert_eq!(&client.get(key).expect("get"), expected, "{key} as acknowledged");
    }
    let published = wait_for(Duration::from_secs(5), || {
        let endpoint = etcd.etcdctl(&["get", "--print-value-only", "/remem/clients/cache/endpoint"]);
        String::from_utf8_lossy(&endpoint.stdout).contains(&listen)
    });
    assert!(published, "the new server's endpoint is in etcd");
    let ran = wait_for(Duration::from_secs(5), || {
        std::fs::read_to_string(&marker).is_ok_and(|text| text.trim() == format!("cache {listen}"))
    });
    assert!(ran, "the takeover command ran: {}", standby.log_text());
    assert!(matches!(standby.child.try_wait(), Ok(None)));
}

/// Two standbys of one primary: when it dies exactly one takes over with every item, and the
/// other stands by again, now for the new primary, until that one dies too.
#[test]
fn kv_etcd_two_standbys_one_takes_over_and_the_other_stands_by_for_it() {
    let Cluster { dir, etcd, secret, _nodes, primary, address } = cluster("kv-etcd-two-standbys");
    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects");
    for index in 0..40 {
        let key = format!("k{index}");
        assert_eq!(client.set(&key, &value_of(&key, index)).expect("set"), StoreOutcome::Stored);
    }
    drop(client);
    let standby = |name: &str| {
        let mut args = kv_args(&etcd, &secret, &dir.join(name), "16MiB", "127.0.0.1:0");
        args.push("--standby".to_owned());
        Process::spawn(&args, &dir.join(format!("{name}.log")))
    };
    let mut standbys = [standby("b"), standby("c")];
    let standing = wait_for(Duration::from_secs(20), || {
        standbys.iter().all(|one| one.log_text().contains("standing by"))
    });
    assert!(standing, "both stand by");
    drop(primary); // SIGKILL
    let winner = wait_for(Duration::from_secs(15), || {
        standbys.iter().any(|one| one.listening(Duration::ZERO).is_some())
    });
    assert!(winner, "one takes over");
    std::thread::sleep(Duration::from_secs(3)); // more than a lease: the other must not serve too
    let serving: Vec<usize> =
        (0..2).filter(|&index| standbys[index].listening(Duration::ZERO).is_some()).collect();
    assert_eq!(serving.len(), 1, "exactly one standby serves");
    let (won, other) = (serving[0], 1 - serving[0]);
    let new_primary = standbys[won].child.id();
    assert!(
        standbys[other].log_text().contains(&format!("held by pid {new_primary}")),
        "{}",
        standbys[other].log_text()
    );
    let address = standbys[won].listening(Duration::ZERO).expect("serving");
    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects to the winner");
    for index in 0..40 {
        let key = format!("k{index}");
        assert_eq!(client.get(&key).expect("get"), Some(value_of(&key, index)), "{key}");
    }
    drop(client);
    let _ = standbys[won].child.kill();
    let _ = standbys[won].child.wait();
    let last = standbys[other]
        .listening(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("{}", standbys[other].log_text()));
    let mut client = TextClient::connect(last, Duration::from_secs(10)).expect("connects to the last");
    assert_eq!(client.get("k7").expect("get"), Some(value_of("k7", 7)));
}

/// `--etcd-lease-seconds` below etcd's floor, or without `--etcd`, is refused before anything
/// starts.
#[test]
fn kv_etcd_lease_seconds_out_of_range_or_without_etcd_is_refused() {
    let run = |args: &[&str]| {
        let output = Command::new(binary()).arg("kv").args(args).stdin(Stdio::null()).output().expect("runs");
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let etcd = ["--etcd", "http://127.0.0.1:1", "--export", "cache"];
    let (ok, stderr) = run(&[&etcd[..], &["--etcd-lease-seconds", "1"]].concat());
    assert!(!ok && stderr.contains("--etcd-lease-seconds") && stderr.contains("2..=3600"), "{stderr}");
    let (ok, stderr) = run(&["--etcd-lease-seconds", "5", "--ephemeral"]);
    assert!(!ok && stderr.contains("--etcd <URLS>"), "{stderr}");
}
