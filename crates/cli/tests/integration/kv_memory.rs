//! `remem kv`'s node memory follows what it stores (docs/KV.md "Memory"): an empty cache maps
//! no slab whatever its `-m`; filled with values of 1 KiB to 1 MiB, the nodes hold about the
//! scheme's overhead times the bytes stored plus at most one partly used range; emptied, the
//! ranges go back to the nodes; a restart after SIGKILL serves every value from the ranges its
//! saved slab map names. Node memory is read from outside (`remem status --json`).
//! Real node processes and a real `remem kv`, stopped by PID when the guards drop.

use crate::kv_support;

use std::time::{Duration, Instant};

use kv_support::{Target, SLAB_BYTES};

/// Node memory the cluster lends now: every node's used bytes (slabs and their metadata).
fn node_bytes(target: &Target) -> u64 {
    let cluster = target.cluster.as_ref().expect("a remem cluster");
    let path = cluster.cluster_file_path.to_str().expect("utf-8");
    let text = crate::common::remem_status(30, &["--cluster", path, "--json"]);
    let status: serde_json::Value = serde_json::from_str(&text).expect("status JSON");
    let nodes = status["nodes"].as_array().expect("nodes");
    nodes.iter().map(|node| node["used_bytes"].as_u64().expect("used_bytes")).sum()
}

fn value(index: usize, length: usize) -> Vec<u8> {
    (0..length).map(|byte| (byte as u64 * 131 + index as u64 * 7919 % 253) as u8).collect()
}

/// Values of 1 KiB, 64 KiB + 100 bytes and 1 MiB, in turn: whole pages, chunk tails and chunks.
const SIZES: [usize; 3] = [1024, 65536 + 100, 1 << 20];

/// Sets values from `next` on until `goal` value bytes are stored in all; returns the new
/// total.
fn fill(target: &Target, keys: &mut Vec<(String, usize)>, stored: u64, goal: u64) -> u64 {
    let mut client = target.client();
    let mut stored = stored;
    while stored < goal {
        let index = keys.len();
        let length = SIZES[index % SIZES.len()];
        let key = format!("memory:{index}");
        client.set(&key, &value(index, length)).unwrap_or_else(|error| panic!("set {key}: {error}"));
        keys.push((key, length));
        stored += length as u64;
    }
    stored
}

fn check_all(target: &Target, keys: &[(String, usize)]) {
    let mut client = target.client();
    for (index, (key, length)) in keys.iter().enumerate() {
        let got = client.get(key).unwrap_or_else(|error| panic!("get {key}: {error}"));
        assert!(got.as_deref() == Some(&value(index, *length)[..]), "{key}: wrong or missing");
    }
}

/// The node memory `stored` value bytes may take at `overhead`: 10% above the overhead (slab
/// metadata, chunk slots left empty, one partly used chunk page per class), plus one partly
/// used range of `range_slabs` slabs.
fn bound(stored: u64, overhead: f64, range_slabs: u64) -> u64 {
    (stored as f64 * overhead * 1.1) as u64 + range_slabs * SLAB_BYTES * 11 / 10
}

#[test]
fn node_memory_follows_the_items_stored_and_goes_back_when_they_go() {
    // EC(8,2): ranges of 10 slabs, 1.25x; rep2: ranges of 2 slabs, 2x.
    for (scheme, overhead, range_slabs) in [("ec", 1.25, 10), ("rep2", 2.0, 2)] {
        let mut target = Target::remem_kv(&format!("memory-{scheme}"), scheme, "64MiB", &[]);
        assert_eq!(node_bytes(&target), 0, "{scheme}: an empty cache maps no slab");
        let mut keys = Vec::new();
        let mut stored = 0;
        for percent in [10, 90] {
            stored = fill(&target, &mut keys, stored, (64 << 20) * percent / 100);
            let used = node_bytes(&target);
            let most = bound(stored, overhead, range_slabs);
            eprintln!(
                "{scheme} at {percent}%: {stored} value bytes, {used} node bytes ({:.3}x), at most {most}",
                used as f64 / stored as f64
            );
            assert!(
                used <= most,
                "{scheme} at {percent}%: {used} node bytes for {stored} stored, more than {most}"
            );
            assert!(used as f64 >= stored as f64 * overhead, "{scheme}: the overhead is paid");
            // The cache's own account (`stats`, `--metrics`) is what the nodes say.
            let stats = target.client().stats().expect("stats");
            assert_eq!(stats.get("remem_node_bytes_mapped"), Some(&used.to_string()), "{scheme}: {stats:?}");
            check_all(&target, &keys);
        }
        // SIGKILLed and restarted: every value is served from the ranges of the saved map.
        kv_crash_restart(&mut target, scheme);
        check_all(&target, &keys);
        // Emptied: the ranges go back, one a second per region, down to the first.
        let mut client = target.client();
        for (key, _) in &keys {
            assert!(client.delete(key).expect("delete"), "{key} was there");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let first_range = range_slabs * SLAB_BYTES * 11 / 10;
        while node_bytes(&target) > first_range && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
        }
        let used = node_bytes(&target);
        assert!(used <= first_range, "{scheme}: {used} node bytes after every item went");
        // And it grows again.
        keys.clear();
        fill(&target, &mut keys, 0, 8 << 20);
        check_all(&target, &keys);
    }
}

/// SIGKILLs the server and starts it again on its state directory.
fn kv_crash_restart(target: &mut Target, scheme: &str) {
    crate::kv_crash::sigkill(&mut target.server);
    let cluster = target.cluster.as_ref().expect("a remem cluster");
    let args: Vec<String> = ["--scheme", scheme, "-m", "64MiB"].iter().map(|arg| arg.to_string()).collect();
    target.server = remem::kv_bench::ServerProcess::start_remem_kv(
        kv_support::binary(),
        &cluster.cluster_file_path,
        &args,
        &target.dir.join("kv-restarted.log"),
        "remem kv restarted",
    )
    .unwrap_or_else(|error| panic!("{error:#}"));
    let log = target.server.log();
    assert!(log.contains("items restored"), "{log}");
}
