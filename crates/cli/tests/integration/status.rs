//! `remem status` against real node processes: every node's row, a killed node shown DOWN with
//! the reason, the others with their memory and slabs, as a table and as JSON.

use crate::common;

use std::process::Command;

use common::SLAB_BYTES;
use remem::launcher::UnixSockets;
use remem_client::{Client, ClientConfig, Shape};

#[test]
fn status_shows_every_node_and_a_killed_one_as_down() {
    let mut cluster = common::start_cluster("status", "down", 6, UnixSockets::None);
    // A client maps slabs so the nodes have something to report.
    let shape = Shape { data_splits: 2, parity_splits: 1, extra_reads: 0 };
    let mut config = ClientConfig::new(shape, 4 * SLAB_BYTES);
    config.release_on_drop = false;
    let client = Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(remem_placement::LeastLoaded::new(
            <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1),
        )),
    )
    .expect("client connects");
    drop(client);
    cluster.kill(4).expect("kill node 4");

    let output = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["status", "--json", "--timeout-ms", "1000", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .output()
        .expect("remem status runs");
    assert_eq!(output.status.code(), Some(3), "degraded: {}", String::from_utf8_lossy(&output.stderr));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(status["nodes_up"], 5);
    let nodes = status["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 6);
    assert_eq!(nodes[4]["up"], false);
    assert!(nodes[4]["error"].as_str().is_some_and(|error| error.contains("refused")), "{}", nodes[4]);
    let mapped: u64 = nodes.iter().map(|node| node["slabs_mapped"].as_u64().unwrap_or(0)).sum();
    assert!(mapped >= 3, "the client's slabs are reported: {mapped}");
    for node in nodes.iter().filter(|node| node["up"] == true) {
        assert_eq!(node["capacity_bytes"].as_u64(), Some(16 * SLAB_BYTES));
        assert_eq!(
            node["used_bytes"].as_u64().unwrap() + node["free_bytes"].as_u64().unwrap(),
            16 * SLAB_BYTES
        );
    }

    let table = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["status", "--timeout-ms", "1000", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .output()
        .expect("remem status runs");
    let text = String::from_utf8_lossy(&table.stdout);
    println!("{text}");
    assert!(text.contains("5 of 6 nodes up") && text.contains("DOWN"), "{text}");
    assert_eq!(table.status.code(), Some(3), "some nodes down");
    for node in (0..6).filter(|&node| node != 4) {
        cluster.kill(node).expect("kill");
    }
    let down = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["status", "--timeout-ms", "1000", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .output()
        .expect("remem status runs");
    assert_eq!(down.status.code(), Some(4), "every node down: {}", String::from_utf8_lossy(&down.stdout));
}

/// `remem status` of the cluster, as JSON.
fn status_json(cluster_file: &std::path::Path) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["status", "--json", "--timeout-ms", "1000", "--cluster"])
        .arg(cluster_file)
        .output()
        .expect("remem status runs");
    assert!(matches!(output.status.code(), Some(0 | 3 | 4)), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// Polls `remem status` until the first client's first region satisfies `done`; returns it.
fn wait_for_region(
    cluster_file: &std::path::Path,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let status = status_json(cluster_file);
        let region = &status["clients"][0]["regions"][0];
        if done(region) {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "{what} never shown: {status:#}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Starts `remem WORDS --cluster FILE` (a front end) on `cluster`, logging beside its cluster
/// file, and waits for its `listening` line.
/// The front end is killed and reaped when the guard drops, however the test ends.
fn start_front_end(cluster: &remem::launcher::LocalCluster, words: &[&str]) -> common::KillOnDrop {
    let dir = cluster.cluster_file_path.parent().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_remem"));
    command.args(words).arg("--cluster").arg(&cluster.cluster_file_path);
    let (child, line) = common::spawn_with_first_line(command, &dir.join(format!("{}.log", words[0])));
    let child = common::KillOnDrop(child);
    assert!(line.starts_with("listening"), "remem {} did not start: {line:?}", words[0]);
    child
}

/// A front end reports its regions: healthy, then degraded by one split when a node of its
/// ranges dies (six nodes for EC(4,2): nowhere to rebuild), then lost past r failures.
#[test]
fn status_shows_a_front_ends_regions_healthy_degraded_and_lost() {
    let mut cluster = common::start_cluster("status", "regions", 6, UnixSockets::None);
    let shape = ["-k", "4", "-r", "2", "--listen", "127.0.0.1:0"];
    let nbd =
        start_front_end(&cluster, &[&["nbd", "--size", "8MiB", "--export", "regions"][..], &shape].concat());
    let file = cluster.cluster_file_path.clone();

    let status = wait_for_region(&file, "a healthy region", |region| {
        region["ranges"].as_u64().is_some_and(|ranges| ranges > 0) && region["healthy"] == region["ranges"]
    });
    let client = &status["clients"][0];
    assert_eq!(client["front_end"], "nbd");
    assert_eq!(client["alive"], true);
    assert_eq!(client["regions"][0]["scheme"], "EC(4,2)");

    cluster.kill(5).expect("kill node 5");
    let degraded = wait_for_region(&file, "one missing split", |region| {
        region["degraded_by_missing_splits"][0] == region["ranges"] && region["lost"] == 0
    });
    let table = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["status", "--timeout-ms", "1000", "--cluster"])
        .arg(&file)
        .output()
        .expect("remem status runs");
    let text = String::from_utf8_lossy(&table.stdout);
    println!("{text}");
    assert!(text.contains("degraded (") && text.contains("missing 1 split"), "{text}\n{degraded:#}");

    cluster.kill(4).expect("kill node 4");
    cluster.kill(3).expect("kill node 3");
    wait_for_region(&file, "lost ranges", |region| region["lost"] == region["ranges"]);

    drop(nbd);
    let status = status_json(&file);
    assert_eq!(status["clients"][0]["alive"], false, "a dead front end is shown as gone: {status:#}");
}

/// A rebuild running on a node shows with its progress, speed and ETA, beside a dead node. One
/// source delays every reply by 400 ms, so rebuilding an 8 MiB slab of EC(4,2) (32 batches,
/// the four asked ahead answered after each delay) outlasts the two `status` runs (JSON and the table, printed) that watch
/// it, with progress during their one-second sample.
#[test]
fn status_shows_a_running_rebuild_with_its_speed_and_eta() {
    use remem::faults::{inject, Fault};
    use std::time::{Duration, Instant};
    let mut options = common::cluster_options("status", "eta", 8, UnixSockets::None);
    (options.slab_size_bytes, options.capacity_bytes) = (8 << 20, 32 << 20);
    let _ = std::fs::remove_dir_all(&options.dir);
    let mut cluster = remem::launcher::LocalCluster::start(env!("CARGO_BIN_EXE_remem").as_ref(), &options)
        .expect("cluster starts");
    let shape = Shape { data_splits: 4, parity_splits: 2, extra_reads: 0 };
    let mut config = ClientConfig::new(shape, 4 * (8 << 20));
    // The delayed node stays a member (and the rebuild's source): slow, not failed.
    config.request_timeout = Duration::from_secs(10);
    let mut client = Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(remem_placement::LeastLoaded::new(
            <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(2),
        )),
    )
    .expect("client connects");
    let slabs = client.ranges()[0].slabs.clone();
    // A node the range does not use dies (the other spare takes the rebuilt slab).
    let spare = (0..8).find(|&node| client.slabs_on(node) == 0).expect("two spare nodes");
    cluster.kill(spare).expect("SIGKILL a spare node");
    let address = |node: usize| cluster.file.nodes[node].address;
    let delay = Fault::Delay { delay_us: 400_000, fraction_ppm: 1_000_000, seed: 5 };
    inject(address(slabs[1].node), &cluster.secret, client.client_id(), delay).expect("delay split 1");
    inject(
        address(slabs[0].node),
        &cluster.secret,
        client.client_id(),
        Fault::Evict { slab_id: slabs[0].slab_id },
    )
    .expect("evict split 0");
    let deadline = Instant::now() + Duration::from_secs(20);
    // Until a node runs it (the client counts it in flight from the eviction notice on).
    let running = |client: &mut Client| {
        client
            .node_infos()
            .into_iter()
            .filter_map(|(_, info)| info.ok())
            .any(|info| info.regenerating_slabs > 0)
    };
    while !running(&mut client) {
        assert!(Instant::now() < deadline, "the rebuild never started");
        client.poll_background(Duration::from_millis(20));
    }
    // Both at once (replies to pipelined requests leave the delayed node together, so the
    // rebuild lasts about one delay); the client keeps driving its rebuild while they watch.
    let spawn = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_remem"));
        command.args(["status", "--timeout-ms", "3000", "--cluster"]).arg(&cluster.cluster_file_path);
        if json {
            command.arg("--json");
        }
        command.stdout(std::process::Stdio::piped()).spawn().expect("remem status runs")
    };
    let (mut json, mut text) = (spawn(true), spawn(false));
    while json.try_wait().expect("status").is_none() || text.try_wait().expect("status").is_none() {
        assert!(Instant::now() < deadline, "remem status did not finish");
        client.poll_background(Duration::from_millis(20));
    }
    let output = json.wait_with_output().expect("status output");
    let table = String::from_utf8(text.wait_with_output().expect("status output").stdout).expect("UTF-8");
    println!("{table}");
    assert!(table.contains("7 of 8 nodes up") && table.contains("DOWN") && table.contains("ETA"), "{table}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let rebuilding: Vec<&serde_json::Value> = report["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|node| node["rebuilds_running"] == 1)
        .collect();
    assert_eq!(rebuilding.len(), 1, "one node rebuilds: {report:#}");
    let node = rebuilding[0];
    let rate = node["rebuild_pages_per_second"].as_f64().expect("a speed");
    let eta = node["rebuild_eta_seconds"].as_f64().expect("an ETA");
    let percent = node["rebuild_percent"].as_f64().expect("progress");
    assert!(rate > 0.0 && eta > 0.0 && (0.0..100.0).contains(&percent), "{node:#}");
    // The delay lifted, the rebuild ends at full speed.
    inject(address(slabs[1].node), &cluster.secret, client.client_id(), Fault::Clear)
        .expect("clear the delay");
    assert!(client.wait_for_regenerations(Duration::from_secs(30)), "the rebuild finishes");
}

/// A SIGKILLed front end's report is shown dead in the next `remem status`, even before its
/// parent reaps it (a zombie's PID still answers `kill(pid, 0)`: it was shown alive), and once
/// older than the ten minutes a dead report is kept it is removed, not shown for ever.
#[test]
fn status_shows_a_killed_front_end_dead_at_once_and_forgets_it_later() {
    let cluster = common::start_cluster("status", "dead-client", 3, UnixSockets::None);
    let dir = cluster.cluster_file_path.parent().unwrap().to_path_buf();
    let mut command = Command::new(env!("CARGO_BIN_EXE_remem"));
    command
        .args(["nbd", "--cluster"])
        .arg(&cluster.cluster_file_path)
        .args(["--size", "2MiB", "--export", "dead", "-k", "2", "-r", "1", "--delta", "0"]);
    let (nbd, line) = common::spawn_with_first_line(command, &dir.join("nbd.log"));
    let mut nbd = common::KillOnDrop(nbd);
    assert!(line.starts_with("listening unix:"), "remem nbd did not start: {line:?}");
    let file = cluster.cluster_file_path.clone();
    wait_for_region(&file, "a report", |region| region["ranges"].as_u64().is_some_and(|ranges| ranges > 0));
    let report = dir.join("clients").join(format!("nbd-{}.json", nbd.0.id()));
    assert!(report.exists(), "the report is at {}", report.display());

    // SAFETY: kill with the PID of our child, not yet reaped (it stays a zombie until wait).
    unsafe { libc::kill(nbd.0.id() as libc::pid_t, libc::SIGKILL) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{}/stat", nbd.0.id()))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
    {
        assert!(std::time::Instant::now() < deadline, "the killed front end never became a zombie");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = status_json(&file);
    assert_eq!(status["clients"][0]["alive"], false, "a killed front end is shown dead: {status:#}");
    nbd.0.wait().expect("reaped");

    // Ten minutes later, as far as the report's timestamp says.
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("the report")).expect("JSON");
    let updated = text["updated_unix_ms"].as_u64().expect("a timestamp");
    text["updated_unix_ms"] = serde_json::json!(updated - 601_000);
    std::fs::write(&report, text.to_string()).expect("aged report");
    let status = status_json(&file);
    assert_eq!(
        status["clients"].as_array().map(Vec::len),
        Some(0),
        "a stale dead report is shown: {status:#}"
    );
    assert!(!report.exists(), "remem status removed the stale report");
}

/// `remem kv` with EOR values reports the region of their main copies by name, not as a second
/// `none` region (it was `region 4 none`).
#[test]
fn status_names_kvs_region_of_eor_main_copies() {
    let cluster = common::start_cluster("status", "eor", 6, UnixSockets::None);
    let shape = ["-k", "4", "-r", "2", "--listen", "127.0.0.1:0"];
    let _kv = start_front_end(
        &cluster,
        &[&["kv", "-m", "4MiB", "--scheme", "eor2", "--ephemeral"][..], &shape].concat(),
    );
    // An empty cache maps no range yet (docs/KV.md "Memory"): its regions are listed with 0.
    let status = wait_for_region(&cluster.cluster_file_path, "kv's regions", |region| {
        region["ranges"].as_u64() == Some(0) && region["scheme"].is_string()
    });
    let schemes: Vec<&str> = status["clients"][0]["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .map(|region| region["scheme"].as_str().expect("a scheme"))
        .collect();
    assert_eq!(schemes, ["EC(4,2)", "none (EOR main copies)"], "{status:#}");
}
