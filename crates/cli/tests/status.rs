//! `remem status` against real node processes: every node's row, a killed node shown DOWN with
//! the reason, the others with their memory and slabs, as a table and as JSON.

#[allow(dead_code)] // the shared helpers this test does not use
mod common;

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
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
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
}
