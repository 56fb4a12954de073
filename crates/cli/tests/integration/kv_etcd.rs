//! `remem kv --etcd` (docs/KV.md "Host loss"): against a real etcd (Debian's etcd-server) and
//! `remem node --etcd` processes registered in it, a kv that is SIGKILLed and whose state
//! directory is deleted comes back in another state directory with every acknowledged item,
//! byte for byte (its records were in its own remote memory); a second kv on the same name is
//! refused while the first lives, naming it; and with the state region's copies beyond r lost
//! the kv refuses to start rather than serve anything. Every process started here is stopped by
//! PID; every external command runs under `timeout`.

use crate::common;
use crate::etcd_support;
use crate::kv_crash;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use etcd_support::{wait_for, write_secret, EtcdNode, EtcdServer};
use remem::kv_bench::{ClientError, StoreOutcome, TextClient};

/// Nodes: EC(4,2) needs 6 distinct ones; one more so placement has a choice.
const NODES: usize = 7;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// etcd, its secret and the nodes registered in it (checked with etcdctl).
fn start_cluster(dir: &Path) -> (EtcdServer, PathBuf, Vec<EtcdNode>) {
    etcd_support::start_registered(dir, NODES, ("16MiB", "1MiB"))
}

/// A `remem kv --etcd` process, stopped by PID on drop.
struct Kv {
    child: Child,
    address: SocketAddr,
    log: PathBuf,
}

fn kv_command(etcd: &EtcdServer, secret: &Path, state: &Path) -> Command {
    let mut command = Command::new(binary());
    command
        .args(["kv", "--etcd", &etcd.url, "--secret-file"])
        .arg(secret)
        .args(["--export", "cache", "-m", "16MiB", "--backup-size", "4MiB", "-k", "4", "-r", "2"])
        .args(["--prefix-scheme", "ec:=ec", "--request-timeout-ms", "1000", "--listen", "127.0.0.1:0"])
        .arg("--state")
        .arg(state);
    command
}

impl Kv {
    /// Starts a kv with its state directory `state`; Err(its log) if it did not start.
    fn start(etcd: &EtcdServer, secret: &Path, state: &Path, log: &Path) -> Result<Kv, String> {
        Kv::start_with(kv_command(etcd, secret, state), log)
    }

    fn start_with(command: Command, log: &Path) -> Result<Kv, String> {
        let (mut child, line) = common::spawn_with_first_line(command, log);
        match line.trim().strip_prefix("listening ").and_then(|address| address.parse().ok()) {
            Some(address) => Ok(Kv { child, address, log: log.to_owned() }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(std::fs::read_to_string(log).unwrap_or_default())
            }
        }
    }

    fn client(&self) -> TextClient {
        TextClient::connect(self.address, Duration::from_secs(10)).expect("connects to the kv")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Kv {
    fn drop(&mut self) {
        common::terminate(&mut self.child, Duration::from_secs(5));
    }
}

/// Sets, overwrites and deletes keys of every size and scheme (rep2 and EOR by size, EC chunk
/// pages by prefix, whose rewrites go through the journal); the model of what was
/// acknowledged: Some(value) stored, None deleted.
fn write_items(client: &mut TextClient, count: usize) -> HashMap<String, Option<Vec<u8>>> {
    const SIZES: [usize; 6] = [100, 1500, 3000, 5000, 20_000, 70_000];
    let mut model = HashMap::new();
    for index in 0..count {
        let (key, size) = match index % 4 {
            0 => (format!("ec:{index}"), 200 + index % 300),
            _ => (format!("k{index}"), SIZES[index % SIZES.len()]),
        };
        let value = common::pseudo_random(size.next_multiple_of(8), index as u64 + 1);
        assert_eq!(client.set(&key, &value).expect("set"), StoreOutcome::Stored, "set {key}");
        model.insert(key, Some(value));
    }
    let keys: Vec<String> = model.keys().cloned().collect();
    for (position, key) in keys.iter().enumerate() {
        if position % 7 == 0 {
            assert!(client.delete(key).expect("delete"), "delete {key}");
            model.insert(key.clone(), None);
        } else if position % 5 == 0 {
            let value = common::pseudo_random(4096 + 8 * position, 1_000_000 + position as u64);
            assert_eq!(client.set(key, &value).expect("set"), StoreOutcome::Stored, "overwrite {key}");
            model.insert(key.clone(), Some(value));
        }
    }
    model
}

/// (served as acknowledged, lost, wrong): a deleted key that comes back is wrong, so is a
/// value of other bytes; an acknowledged one missing or refused is lost.
fn verify(client: &mut TextClient, model: &HashMap<String, Option<Vec<u8>>>) -> (usize, usize, usize) {
    let (mut good, mut lost, mut wrong) = (0, 0, 0);
    for (key, expected) in model {
        match (client.get(key), expected) {
            (Ok(read), expected) if read == *expected => good += 1,
            (Ok(None), _) | (Err(ClientError::Server(_)), Some(_)) => {
                eprintln!("lost: {key}");
                lost += 1;
            }
            (Ok(Some(read)), _) => {
                eprintln!("wrong: {key}: {} bytes", read.len());
                wrong += 1;
            }
            (Err(error), _) => panic!("get {key}: {error:?}"),
        }
    }
    (good, lost, wrong)
}

#[test]
fn kv_etcd_serves_every_acknowledged_item_after_sigkill_with_its_state_directory_deleted() {
    let dir = common::ScratchDir::new("kv-etcd-host-loss");
    let (etcd, secret, _nodes) = start_cluster(&dir);
    let state_a = dir.join("host-a-state");
    let mut first =
        Kv::start(&etcd, &secret, &state_a, &dir.join("kv-a.log")).unwrap_or_else(|log| panic!("{log}"));
    let mut client = first.client();
    let model = write_items(&mut client, 240);
    let stats = client.stats().expect("stats");
    let written: u64 = stats["remem_state_pages_written"].parse().expect("a count");
    let copy_outs: u64 = stats["remem_state_copy_outs"].parse().expect("a count");
    eprintln!("{copy_outs} copy-outs wrote {written} state pages for 240 sets and the updates after");
    assert!(copy_outs > 0 && written >= copy_outs, "{stats:?}");
    drop(client);
    let keys = etcd.keys("/remem/clients/cache/");
    assert!(keys.iter().any(|key| key.ends_with("/slabmap")), "the map is in etcd: {keys:?}");
    first.sigkill();
    std::fs::remove_dir_all(&state_a).expect("the first host's state is gone");

    // Another state directory, nothing carried over: it waits for the dead one's lease.
    let started = Instant::now();
    let state_b = dir.join("host-b-state");
    let second =
        Kv::start(&etcd, &secret, &state_b, &dir.join("kv-b.log")).unwrap_or_else(|log| panic!("{log}"));
    let log = second.log_text();
    eprintln!("restarted in {:.1} s; log:\n{log}", started.elapsed().as_secs_f64());
    assert!(log.contains("items restored") && log.contains("read the state region"), "{log}");
    let (good, lost, wrong) = verify(&mut second.client(), &model);
    eprintln!("{good} items as acknowledged, {lost} lost, {wrong} wrong");
    assert_eq!((lost, wrong), (0, 0), "every acknowledged item, byte for byte");
    assert_eq!(good, model.len());

    // It serves on: new writes, then a clean stop and a third start sees them too.
    let mut client = second.client();
    let more = common::pseudo_random(3000, 77);
    assert_eq!(client.set("after", &more).expect("set"), StoreOutcome::Stored);
    drop(client);
    drop(second);
    let third =
        Kv::start(&etcd, &secret, &state_a, &dir.join("kv-c.log")).unwrap_or_else(|log| panic!("{log}"));
    let mut client = third.client();
    assert_eq!(client.get("after").expect("get"), Some(more));
    assert_eq!(verify(&mut client, &model).1 + verify(&mut client, &model).2, 0);
}

#[test]
fn kv_etcd_second_process_on_the_same_name_is_refused_naming_the_holder() {
    let dir = common::ScratchDir::new("kv-etcd-second");
    let (etcd, secret, _nodes) = start_cluster(&dir);
    let first = Kv::start(&etcd, &secret, &dir.join("a"), &dir.join("kv-a.log"))
        .unwrap_or_else(|log| panic!("{log}"));
    let started = Instant::now();
    let refused = Kv::start(&etcd, &secret, &dir.join("b"), &dir.join("kv-b.log"));
    let log = match refused {
        Ok(_) => panic!("a second kv on the same name started"),
        Err(log) => log,
    };
    eprintln!("refused after {:.1} s:\n{log}", started.elapsed().as_secs_f64());
    assert!(log.contains("held") && log.contains(&first.child.id().to_string()), "{log}");
    // The first serves on.
    let mut client = first.client();
    assert_eq!(client.set("still", b"here").expect("set"), StoreOutcome::Stored);
    assert_eq!(client.get("still").expect("get").as_deref(), Some(&b"here"[..]));
    // A clean stop frees the name at once (its lease revoked); --fresh then starts empty.
    drop(client);
    drop(first);
    let mut command = kv_command(&etcd, &secret, &dir.join("b"));
    command.arg("--fresh");
    let fresh = Kv::start_with(command, &dir.join("kv-fresh.log")).unwrap_or_else(|log| panic!("{log}"));
    assert_eq!(fresh.client().get("still").expect("get"), None, "--fresh starts empty");
    // A node that registers now is handed to the running kv's client.
    let late = EtcdNode::start(binary(), &dir, &etcd.url, &secret, NODES);
    let joined = wait_for(Duration::from_secs(15), || {
        fresh.log_text().contains(&format!("node {} joined", late.address))
    });
    assert!(joined, "{}", fresh.log_text());
}

/// The nodes that hold the first range of the state region (the last region of the map).
fn state_region_nodes(etcd: &EtcdServer) -> Vec<String> {
    let output = etcd.etcdctl(&["get", "--print-value-only", "/remem/clients/cache/slabmap"]);
    let map: serde_json::Value = serde_json::from_slice(&output.stdout).expect("a JSON slab map");
    let nodes = map["nodes"].as_array().expect("nodes");
    let state = map["more_regions"].as_array().and_then(|regions| regions.last()).expect("a state region");
    assert_eq!(state["data_splits"], 1, "the state region is replicated");
    let first_range = state["ranges"][0].as_array().expect("its first range is mapped");
    first_range
        .iter()
        .map(|split| {
            nodes[split[0].as_u64().expect("a node index") as usize].as_str().expect("an address").to_owned()
        })
        .collect()
}

#[test]
fn kv_etcd_refuses_to_start_when_the_state_region_lost_more_than_r_nodes() {
    let dir = common::ScratchDir::new("kv-etcd-beyond-r");
    let (etcd, secret, mut nodes) = start_cluster(&dir);
    let mut first = Kv::start(&etcd, &secret, &dir.join("a"), &dir.join("kv-a.log"))
        .unwrap_or_else(|log| panic!("{log}"));
    let _model = write_items(&mut first.client(), 60);
    first.sigkill();
    let holders = state_region_nodes(&etcd);
    assert_eq!(holders.len(), 3, "rep(r+1) at r = 2: {holders:?}");
    for node in nodes.iter_mut().filter(|node| holders.contains(&node.address)) {
        let _ = node.child.kill();
        let _ = node.child.wait();
    }
    let refused = Kv::start(&etcd, &secret, &dir.join("b"), &dir.join("kv-b.log"));
    let log = match refused {
        Ok(kv) => panic!("started with its state region's nodes gone: {}", kv.log_text()),
        Err(log) => log,
    };
    eprintln!("{log}");
    assert!(log.contains("is lost with nodes") && log.contains("refusing to start"), "{log}");
}

#[test]
fn kv_etcd_keeps_every_acknowledged_write_across_sigkills_under_load_in_new_state_directories() {
    let dir = common::ScratchDir::new("kv-etcd-load");
    let (etcd, secret, _nodes) = start_cluster(&dir);
    let mut server = Kv::start(&etcd, &secret, &dir.join("state-0"), &dir.join("kv-0.log"))
        .unwrap_or_else(|log| panic!("{log}"));
    let mut known = HashMap::new();
    let mut generation = 1;
    for round in 0..2u64 {
        let address = server.address;
        let seed = 0x2545_f491_4f6c_dd1d ^ (round + 1);
        let before = known.clone();
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&progress);
        let writer = std::thread::spawn(move || {
            kv_crash::write_until_killed_counting(address, before, seed, generation, counter)
        });
        // Killed mid-run, at a different moment each round.
        kv_crash::wait_for_writes(&progress, 40);
        std::thread::sleep(Duration::from_millis(300 + seed % 700));
        server.sigkill();
        let (after, in_flight, acknowledged) = writer.join().expect("the writer");
        known = after;
        generation += 1_000_000;
        eprintln!(
            "round {round}: {acknowledged} writes acknowledged before SIGKILL; in flight {in_flight:?}"
        );
        std::fs::remove_dir_all(dir.join(format!("state-{round}"))).expect("the state directory is gone");
        let state = dir.join(format!("state-{}", round + 1));
        server = Kv::start(&etcd, &secret, &state, &dir.join(format!("kv-{}.log", round + 1)))
            .unwrap_or_else(|log| panic!("{log}"));
        assert!(server.log_text().contains("items restored"), "{}", server.log_text());
        let (present, missing, _) = kv_crash::verify(&mut server.client(), &known, in_flight, true);
        eprintln!("round {round}: {present} keys present, {missing} absent, as acknowledged");
        kv_crash::settle(&mut server.client(), &mut known, in_flight);
    }
}

#[test]
fn kv_etcd_whose_map_another_process_rewrote_is_fenced_and_stops() {
    let dir = common::ScratchDir::new("kv-etcd-fence");
    let (etcd, secret, _nodes) = start_cluster(&dir);
    let mut first = Kv::start(&etcd, &secret, &dir.join("a"), &dir.join("kv-a.log"))
        .unwrap_or_else(|log| panic!("{log}"));
    let mut client = first.client();
    assert_eq!(client.set("before", b"fence").expect("set"), StoreOutcome::Stored);
    assert!(etcd
        .etcdctl(&["put", "/remem/clients/cache/slabmap", "{\"written\":\"elsewhere\"}"])
        .status
        .success());
    // Values enough to need new ranges: mapping one saves the map, whose compare-and-swap fails.
    let large = common::pseudo_random(200_000, 5);
    for index in 0..40 {
        if client.set(&format!("large{index}"), &large).is_err() {
            break;
        }
    }
    let exited = wait_for(Duration::from_secs(30), || matches!(first.child.try_wait(), Ok(Some(_))));
    assert!(exited, "the fenced kv kept serving; log: {}", first.log_text());
    let status = first.child.wait().expect("status");
    assert!(!status.success(), "a fenced kv exits with an error");
    assert!(first.log_text().contains("fenced"), "{}", first.log_text());
    let map = etcd.etcdctl(&["get", "--print-value-only", "/remem/clients/cache/slabmap"]);
    assert_eq!(
        String::from_utf8_lossy(&map.stdout).trim(),
        "{\"written\":\"elsewhere\"}",
        "the fenced kv wrote"
    );
    eprintln!("{}", first.log_text());
}

/// Across "hosts" (network namespaces, as netns_etcd.rs): etcd on its own host, six node hosts
/// of two nodes registering there over the bridge, the kv on client host A; A's kv is
/// SIGKILLed, its state directory deleted, and `remem kv --etcd` on client host B (another
/// address, another state directory) serves every acknowledged item to a client on B.
#[test]
fn kv_etcd_restarted_on_another_host_serves_every_acknowledged_item() {
    use crate::netns_support as netns;
    const NODE_HOSTS: usize = 6;
    const CLIENT_A: usize = NODE_HOSTS;
    const CLIENT_B: usize = NODE_HOSTS + 1;
    const ETCD_HOST: usize = NODE_HOSTS + 2;
    netns::require_namespaces();
    let net = netns::Net::new(NODE_HOSTS + 3, &[]);
    let dir = common::ScratchDir::new("kv-etcd-netns");
    let secret = write_secret(&dir);
    let url = netns::start_etcd(&net, ETCD_HOST, &dir);
    netns::start_etcd_nodes(
        &net,
        (ETCD_HOST, &url),
        NODE_HOSTS,
        &[7100, 7101],
        ("8MiB", "1MiB"),
        &secret,
        &[],
        &dir,
    );

    let start_kv = |host: usize, name: &str| {
        let listen = SocketAddr::from((net.address(host), 11211));
        let mut args: Vec<String> =
            ["kv", "--etcd", &url, "--export", "cache", "-m", "16MiB", "-k", "4", "-r", "2"]
                .map(str::to_owned)
                .to_vec();
        args.extend(
            ["--backup-size", "4MiB", "--prefix-scheme", "ec:=ec", "--request-timeout-ms", "1000"]
                .map(str::to_owned),
        );
        args.extend(["--listen".to_owned(), listen.to_string(), "--secret-file".to_owned()]);
        args.push(secret.to_string_lossy().into_owned());
        args.extend(["--state".to_owned(), dir.join(name).to_string_lossy().into_owned()]);
        let log = dir.join(format!("{name}.log"));
        let (pid, stdout) = net.spawn(host, binary(), &args, &log);
        let line = netns::first_line(stdout, Duration::from_secs(40));
        assert_eq!(
            line.trim(),
            format!("listening {listen}"),
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        (pid, listen, log)
    };
    let (pid_a, listen_a, _) = start_kv(CLIENT_A, "host-a");
    let model = net.run_in(CLIENT_A, || {
        let mut client = TextClient::connect(listen_a, Duration::from_secs(10)).expect("connects on host A");
        write_items(&mut client, 160)
    });
    net.signal(pid_a, libc::SIGKILL); // and reaped
    std::fs::remove_dir_all(dir.join("host-a")).expect("host A's state is gone");

    let started = Instant::now();
    let (_, listen_b, log_b) = start_kv(CLIENT_B, "host-b");
    let log = std::fs::read_to_string(&log_b).unwrap_or_default();
    eprintln!("host B serves {:.1} s after the kill:\n{log}", started.elapsed().as_secs_f64());
    assert!(log.contains("items restored"), "{log}");
    let (good, lost, wrong) = net.run_in(CLIENT_B, || {
        let mut client = TextClient::connect(listen_b, Duration::from_secs(10)).expect("connects on host B");
        verify(&mut client, &model)
    });
    eprintln!("host B: {good} items as acknowledged, {lost} lost, {wrong} wrong");
    assert_eq!((good, lost, wrong), (model.len(), 0, 0));
}
