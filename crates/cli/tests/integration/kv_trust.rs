//! `remem kv` keeps its word beyond and within tolerance, from outside (real node processes, a
//! real `remem kv`, stopped by PID when the guards drop): a value whose pages are lost is an
//! error or a miss, never other bytes (no zeros written over a chunk page that could not be
//! read); what was acknowledged within the scheme's tolerance is there after replacements,
//! restarts and a kill in the middle of a chunk page's rewrite.

use crate::kv_crash;
use crate::kv_support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use kv_support::{binary, Target};
use remem::kv_bench::{ClientError, ServerProcess, TextClient};
use remem_client::SlabMapFile;

fn value(index: usize, length: usize) -> Vec<u8> {
    (0..length).map(|byte| (byte as u64 * 31 + index as u64 * 7919 % 251 + 1) as u8).collect()
}

/// The cluster node (index in its cluster file) that holds split `split` of range `range` of
/// region `region` (0: the EC region, then the others in creation order) of the kv's slab map.
fn node_of(target: &Target, region: usize, range: usize, split: usize) -> usize {
    let cluster = target.cluster.as_ref().expect("a cluster");
    let state = cluster.cluster_file_path.parent().expect("a directory").join("kv-default");
    let map = SlabMapFile::load(&state.join("slabmap.json")).expect("the kv's slab map");
    let ranges = if region == 0 { &map.ranges } else { &map.more_regions[region - 1].ranges };
    let address = map.nodes[ranges[range][split].0];
    cluster.file.nodes.iter().position(|node| node.address == address).expect("a node of the cluster")
}

/// What a get may answer once a value's only copy is gone: its bytes (not lost after all), a
/// miss, or `SERVER_ERROR`. Anything else is counted.
fn wrong_reads(client: &mut TextClient, keys: &[(String, Vec<u8>)]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (key, expected) in keys {
        match client.get(key) {
            Ok(Some(got)) if got != *expected => wrong.push(format!(
                "{key}: {} bytes, {} of them zero",
                got.len(),
                got.iter().filter(|&&byte| byte == 0).count()
            )),
            Ok(_) => {}
            Err(ClientError::Server(line)) if line.starts_with("SERVER_ERROR") => {}
            Err(error) => panic!("get {key}: {error}"),
        }
    }
    wrong
}

/// Seed 003's small values in one chunk page of a region without redundancy: one deleted, the
/// page's node SIGKILLed, one set that would reuse the freed chunk. The page cannot be read, so
/// it must not be written: before the fix it was filled with zeros around the new value and
/// written whole, and 38 of the other 199 values then read as 100 zero bytes.
#[test]
fn a_chunk_page_that_cannot_be_read_is_never_written_over_with_zeros() {
    let mut target = Target::remem_kv("chunk-zeros", "none", "16MiB", &[]);
    let mut client = target.client();
    let keys: Vec<(String, Vec<u8>)> =
        (0..200).map(|index| (format!("small{index}"), value(index, 100))).collect();
    for (key, bytes) in &keys {
        client.set(key, bytes).expect("set");
    }
    assert!(client.delete("small5").expect("delete"), "small5 was stored");
    let node = node_of(&target, 1, 0, 0);
    target.cluster.as_mut().expect("a cluster").kill(node).expect("SIGKILL the chunk page's node");
    match client.set("newcomer", &value(999, 100)) {
        Ok(_) => {}
        Err(ClientError::Server(line)) if line.starts_with("SERVER_ERROR") => {}
        Err(error) => panic!("set after the kill: {error}"),
    }
    let others: Vec<(String, Vec<u8>)> = keys.into_iter().filter(|(key, _)| key != "small5").collect();
    let wrong = wrong_reads(&mut client, &others);
    assert!(wrong.is_empty(), "{} values read back wrong: {wrong:?}", wrong.len());
    let stats = client.stats().expect("stats");
    assert!(
        stats.get("remem_unreadable_chunk_pages").is_some_and(|count| count != "0"),
        "the set found the chunk page unreadable: {stats:?}"
    );
    target.assert_running();
}

/// `remem kv` again on `target`'s cluster and state, with `args`.
fn restart_kv(target: &mut Target, args: &[&str], log: &str) {
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let cluster = target.cluster.as_ref().expect("a cluster");
    target.server.stop(Duration::from_secs(10));
    target.server = ServerProcess::start_remem_kv(
        binary(),
        &cluster.cluster_file_path,
        &args,
        &target.dir.join(log),
        "remem kv",
    )
    .unwrap_or_else(|error| panic!("{error:#}"));
}

fn check_all(client: &mut TextClient, keys: &[(String, Vec<u8>)], what: &str) {
    let mut wrong = Vec::new();
    for (key, expected) in keys {
        match client.get(key) {
            Ok(Some(got)) if got == *expected => {}
            Ok(got) => wrong.push(format!("{key}: {:?} bytes", got.map(|got| got.len()))),
            Err(error) => wrong.push(format!("{key}: {error}")),
        }
    }
    assert!(wrong.is_empty(), "{what}: {} of {} values wrong or missing: {wrong:?}", wrong.len(), keys.len());
}

/// Waits (bounded) until `path` was written again after `since`.
fn wait_rewritten(path: &Path, since: SystemTime, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let modified = std::fs::metadata(path).and_then(|meta| meta.modified()).expect("slab map");
        if modified > since {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {} not rewritten in 40 s", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `remem kv --scheme eor` holding `count` values of a page and a chunk tail each: the
/// server, a client and what it stored.
fn eor_values(name: &str, count: usize) -> (Target, TextClient, Vec<(String, Vec<u8>)>) {
    let target = Target::remem_kv(name, "eor", "16MiB", &[]);
    let mut client = target.client();
    let keys: Vec<(String, Vec<u8>)> =
        (0..count).map(|index| (format!("eor{index}"), value(index, 4096 + 64 + index * 37))).collect();
    for (key, bytes) in &keys {
        client.set(key, bytes).expect("set");
    }
    (target, client, keys)
}

/// EOR values of a page and a chunk tail; the node of their main copies replaced by an empty
/// one (one failure: within EOR's tolerance). The running server reads them from the data
/// splits; so must a restarted one, whose client no longer knows that the main copies were lost
/// (the new slab's pages read as never written): before the fix 55 of 100 answered "does not
/// match the checksum of its restored record" and were dropped.
#[test]
fn eor_values_survive_their_main_copy_node_replaced_and_a_restart() {
    let args = ["--scheme", "eor", "-m", "16MiB"];
    let (mut target, mut client, keys) = eor_values("eor-replaced", 100);
    let node = node_of(&target, 1, 0, 0);
    let slab_map = target
        .cluster
        .as_ref()
        .expect("a cluster")
        .cluster_file_path
        .parent()
        .expect("dir")
        .join("kv-default/slabmap.json");
    let before = SystemTime::now();
    std::thread::sleep(Duration::from_millis(20));
    let options = kv_support::cluster_options(&target.dir);
    target.cluster.as_mut().expect("a cluster").restart(binary(), &options, node).expect("replace the node");
    check_all(&mut client, &keys, "main copies' node replaced");
    wait_rewritten(&slab_map, before, "the rebuild of the main copies' slab");
    drop(client);
    restart_kv(&mut target, &args, "kv-restarted.log");
    let mut client = target.client();
    check_all(&mut client, &keys, "after a restart");
    // Verified once, a value is read from its main copy again: the first read wrote it back.
    check_all(&mut client, &keys, "read again after a restart");
    // The first reads wrote the main copies back: a second restart reads them directly.
    restart_kv(&mut target, &args, "kv-restarted-again.log");
    let mut client = target.client();
    check_all(&mut client, &keys, "after a second restart");
    assert_eq!(
        client.stats().expect("stats").get("remem_restored_mismatches").map(String::as_str),
        Some("0")
    );
    target.assert_running();
}

/// EOR values nobody reads while the node of their main copies dies and its range comes back
/// empty elsewhere: each value then has only its k data splits (parity-stale), and after the
/// cluster healed one more failure, of a data node, would lose it. The scrub reads every such
/// value and writes its main copy back; the data node's death then costs nothing. Before the
/// scrub, only a read repaired a main copy, and values not read were lost.
#[test]
fn eor_values_not_read_after_their_main_copies_were_lost_survive_a_data_node_after_healing() {
    let (mut target, mut client, keys) = eor_values("eor-scrub", 60);
    let (main, data) = (node_of(&target, 1, 0, 0), node_of(&target, 0, 0, 0));
    target.cluster.as_mut().expect("a cluster").kill(main).expect("SIGKILL");
    // The main copies come back on another node and the scrub reads the values (bounded wait
    // until its count holds still).
    let deadline = Instant::now() + Duration::from_secs(40);
    let (mut last, mut still_since) = (0, Instant::now());
    loop {
        let reads: u64 = client.stats().expect("stats")["remem_eor_scrub_reads"].parse().expect("a count");
        if reads != last {
            (last, still_since) = (reads, Instant::now());
        }
        let moved = node_of(&target, 1, 0, 0) != main;
        if moved && last > 0 && still_since.elapsed() > Duration::from_secs(3) {
            break;
        }
        assert!(Instant::now() < deadline, "no scrub after the main copies moved: {last} reads");
        std::thread::sleep(Duration::from_millis(200));
    }
    target.cluster.as_mut().expect("a cluster").kill(data).expect("SIGKILL");
    check_all(&mut client, &keys, "a data node down after the main copies were rebuilt");
    target.assert_running();
}

/// What [`eor_writes_with_one_node_down`] leaves: the server (running), its `stats`, the EC
/// range's ten nodes and the node of its main copies when the writes began.
struct EorDown {
    target: Target,
    stats: std::collections::BTreeMap<String, String>,
    range_nodes: Vec<usize>,
    main: usize,
}

/// EOR sets and overwrites while one node (`down` picks it from the EC range's ten nodes and
/// the main copies' node) is down and cannot be replaced yet: the two spare nodes are down too,
/// so the window between a death and its rebuild lasts. Every set must be STORED, every
/// overwrite keep its key, and every value read back twice.
fn eor_writes_with_one_node_down(name: &str, down: impl Fn(&[usize], usize) -> usize) -> EorDown {
    let mut target = Target::remem_kv(name, "eor", "16MiB", &[]);
    let mut client = target.client();
    let mut keys: Vec<(String, Vec<u8>)> =
        (0..20).map(|index| (format!("before{index}"), value(index, 8192 + 100 + index))).collect();
    for (key, bytes) in &keys {
        client.set(key, bytes).expect("set");
    }
    let range_nodes: Vec<usize> = (0..10).map(|split| node_of(&target, 0, 0, split)).collect();
    let main = node_of(&target, 1, 0, 0);
    let down = down(&range_nodes, main);
    let cluster = target.cluster.as_mut().expect("a cluster");
    let spares: Vec<usize> =
        (0..cluster.file.nodes.len()).filter(|node| !range_nodes.contains(node) && *node != main).collect();
    assert_eq!(spares.len(), 2, "12 nodes, 10 in the range, the main copies on one of them");
    for node in spares.iter().chain([&down]) {
        cluster.kill(*node).expect("SIGKILL");
    }
    for index in 0..40 {
        let key = format!("during{index}");
        let bytes = value(100 + index, 4096 + 100 + index * 50);
        client.set(&key, &bytes).unwrap_or_else(|error| panic!("set {key} with node {down} down: {error}"));
        keys.push((key, bytes));
    }
    // Overwrites keep the key: the new value, never an error that drops the old one; the freed
    // pages are taken again by the next round's sets.
    for round in 0..2 {
        for (key, bytes) in keys.iter_mut().take(30) {
            *bytes = value(bytes.len() + round, 5000 + round * 3000);
            client.set(key, bytes).unwrap_or_else(|error| panic!("overwrite {key}: {error}"));
        }
    }
    check_all(&mut client, &keys, &format!("node {down} down"));
    check_all(&mut client, &keys, "read again");
    let stats = client.stats().expect("stats");
    target.assert_running();
    EorDown { target, stats, range_nodes, main }
}

/// EOR writes while one data node of the range is down: a data-only write needs every data
/// split, so each page is written whole instead (k of k+m splits). Before the fix each answered
/// `SERVER_ERROR ... 7 splits stored, 8 needed` and the key's previous value was dropped.
#[test]
fn eor_writes_succeed_with_a_data_node_down_before_its_rebuild() {
    let EorDown { stats, .. } = eor_writes_with_one_node_down("eor-down", |range, _| range[0]);
    let whole = stats.get("remem_eor_whole_page_writes");
    assert!(whole.is_some_and(|count| count != "0"), "the pages were written whole: {stats:?}");
}

/// EOR writes while the node of the range's main copies is down: one failure, within EOR's
/// tolerance. The data splits are written, the main copy's write fails, and the set is STORED
/// all the same; reads go to the data splits until a main copy is written again. Before the fix
/// each set answered `SERVER_ERROR` and an overwrite dropped the key's previous value. The main
/// copies' range is rebuilt (empty: it has no redundancy) on a node that holds none of the
/// range's data splits, or not at all; before that fix it could land on a data node, where one
/// more failure would take a page's main copy and a data split together.
#[test]
fn eor_writes_succeed_with_the_main_copy_node_down_before_its_rebuild() {
    let EorDown { target, stats, range_nodes, main } =
        eor_writes_with_one_node_down("eor-main-down", |_, main| main);
    // A rebuild that came before the writes left nothing to miss (the slab map saved after it
    // names the new node, bounded wait); one that did not, missed.
    let missed = stats.get("remem_eor_main_copy_misses").is_some_and(|count| count != "0");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = node_of(&target, 1, 0, 0);
    while !missed && now == main && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now = node_of(&target, 1, 0, 0);
    }
    assert!(missed || now != main, "no main copy write missed, and the main copies did not move: {stats:?}");
    assert!(
        !range_nodes[..8].contains(&now),
        "main copies rebuilt on node {now}, a data node of {range_nodes:?}"
    );
}

/// Small EC values under four writers while `remem kv` is SIGKILLed at a random moment, eight
/// times: a kill in the middle of an in-place rewrite of a chunk page used to leave fewer than k
/// splits of either version ("7 valid splits of the 8 needed", no node down) and lose every
/// value acknowledged earlier in the page, about one kill in ten. Rewrites of EC chunk pages now
/// go through a journal page first, and a restart completes the ones cut short: every
/// acknowledged value is there after every restart.
#[test]
fn a_kill_during_a_chunk_page_rewrite_loses_no_acknowledged_value() {
    const WRITERS: u64 = 4;
    const KEYS_PER_WRITER: u64 = 150;
    let args = ["--scheme", "ec", "-m", "16MiB"];
    let mut target = Target::remem_kv("torn", "ec", "16MiB", &[]);
    // Key -> acknowledged generation; the write in flight at the kill may be either.
    let mut known: HashMap<String, u64> = HashMap::new();
    let mut in_flight: Vec<(String, u64)> = Vec::new();
    let mut recovered_rounds = 0;
    for round in 0..8u64 {
        let address = target.server.address;
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                std::thread::spawn(move || {
                    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects");
                    let mut acknowledged = Vec::new();
                    for generation in 0.. {
                        let index = writer * KEYS_PER_WRITER + (generation * 7 + round) % KEYS_PER_WRITER;
                        let key = format!("t{index}");
                        let stamp = round * 1_000_000 + generation;
                        match client.set(&key, &small_value(index, stamp)) {
                            Ok(_) => acknowledged.push((key, stamp)),
                            Err(ClientError::Io(_)) => return (acknowledged, Some((key, stamp))),
                            Err(error) => panic!("set {key}: {error}"),
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300 + (round * 7919) % 700));
        kv_crash::sigkill(&mut target.server);
        for writer in writers {
            let (acknowledged, cut) = writer.join().expect("a writer");
            known.extend(acknowledged);
            in_flight.extend(cut);
        }
        restart_kv(&mut target, &args, &format!("kv-torn-{round}.log"));
        if target.server.log().contains("chunk page rewrites cut short") {
            recovered_rounds += 1;
        }
        let mut client = target.client();
        let mut wrong = Vec::new();
        for (key, stamp) in &known {
            let index: u64 = key[1..].parse().expect("a key of ours");
            let got = client.get(key).unwrap_or_else(|error| panic!("round {round}: get {key}: {error}"));
            let cut = in_flight.iter().find(|(cut_key, _)| cut_key == key).map(|(_, stamp)| *stamp);
            let fits = |stamp: u64| got.as_deref() == Some(&small_value(index, stamp)[..]);
            if !fits(*stamp) && !cut.is_some_and(fits) {
                wrong.push(format!("{key}: {:?} bytes", got.map(|got| got.len())));
            }
        }
        assert!(
            wrong.is_empty(),
            "round {round}: {} acknowledged values wrong or lost: {wrong:?}",
            wrong.len()
        );
        // What was in flight is settled by rewriting it.
        for (key, stamp) in in_flight.drain(..) {
            let index: u64 = key[1..].parse().expect("a key of ours");
            client.set(&key, &small_value(index, stamp)).expect("settle");
            known.insert(key, stamp);
        }
        eprintln!("round {round}: {} keys verified", known.len());
    }
    eprintln!("{recovered_rounds} of 8 restarts completed rewrites cut short");
    target.assert_running();
}

fn small_value(index: u64, stamp: u64) -> Vec<u8> {
    let length = [17, 60, 100, 300, 700][(stamp % 5) as usize];
    (0..length).map(|byte| (byte as u64 * 13 + index * 31 + stamp * 7) as u8 | 1).collect()
}

/// A `remem kv` whose `--metrics` port is taken fails before it prints `listening` (a supervisor
/// waiting for that line must not take a start that then fails for a running server).
#[test]
fn a_kv_start_on_a_busy_metrics_port_never_says_listening() {
    let target = Target::remem_kv("busy-metrics", "rep2", "16MiB", &[]);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to occupy");
    let port = busy.local_addr().unwrap().to_string();
    let cluster = target.cluster.as_ref().expect("a cluster");
    let output = std::process::Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(binary())
        .args(["kv", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args([
            "--name",
            "second",
            "--listen",
            "127.0.0.1:0",
            "-m",
            "16MiB",
            "--ephemeral",
            "--metrics",
            &port,
        ])
        .output()
        .expect("remem kv runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "started on a busy metrics port: {stdout}");
    assert!(!stdout.contains("listening"), "said listening before it could fail: {stdout}");
    drop(busy);
}

/// A cache state saved on a cluster that is gone (a new `remem up` in the same directory: new
/// nodes, new secret) is named as such, with `--fresh` in the message, instead of failing on
/// unreachable nodes; `--fresh` then starts empty.
#[test]
fn a_state_saved_on_another_cluster_is_refused_naming_fresh() {
    let mut target = Target::remem_kv("other-cluster", "rep2", "16MiB", &[]);
    target.client().set("kept", b"value").expect("set");
    target.server.stop(Duration::from_secs(10));
    let mut old = target.cluster.take().expect("a cluster");
    old.stop(Duration::from_secs(5));
    drop(old);
    let options = kv_support::cluster_options(&target.dir);
    let cluster = remem::launcher::LocalCluster::start(binary(), &options).expect("a new cluster");
    assert!(cluster.cluster_file_path.parent().unwrap().join("kv-default/slabmap.json").exists());
    let run = |extra: &[&str]| {
        std::process::Command::new("timeout")
            .args(["-k", "5", "30"])
            .arg(binary())
            .args(["kv", "--cluster"])
            .arg(&cluster.cluster_file_path)
            .args(["--scheme", "rep2", "-m", "16MiB", "--listen", "127.0.0.1:0"])
            .args(extra)
            .output()
            .expect("remem kv runs")
    };
    let refused = run(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("saved on another cluster") && stderr.contains("--fresh"), "{stderr}");
    target.cluster = Some(cluster);
    restart_kv(&mut target, &["--scheme", "rep2", "-m", "16MiB", "--fresh"], "kv-fresh.log");
    assert_eq!(target.client().get("kept").expect("get"), None, "--fresh starts empty");
}
