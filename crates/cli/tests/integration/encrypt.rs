//! Encrypted node traffic (`remem node --encrypt`, `ClientConfig::encrypt`, docs/SECURITY.md):
//! real node processes that require encryption on TCP. An EC(8,2) client writes, a node is
//! SIGKILLed, the rebuild (node to node, encrypted too) makes the range whole and every byte reads
//! back; a plaintext client, a client that asks a plaintext node for encryption and a client
//! with another secret are each refused with a reason that says what to change.

use crate::common::{self, Model};

use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem::launcher::{LocalCluster, UnixSockets};
use remem_client::{Client, ClientConfig, Shape};
use remem_placement::LeastLoaded;

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };

/// `nodes` node processes, TCP only (no Unix sockets: nothing here may take the unencrypted
/// same-host path), with `--encrypt` if `encrypt`.
fn cluster(name: &str, nodes: usize, encrypt: bool) -> LocalCluster {
    let mut options = common::cluster_options("encrypt", name, nodes, UnixSockets::None);
    options.encrypt = encrypt;
    options.fault_injection = false;
    let _ = std::fs::remove_dir_all(&options.dir);
    let mut cluster =
        LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_remem")), &options).expect("cluster starts");
    cluster.remove_dir_on_drop();
    cluster
}

fn config(pages: u64, encrypt: bool) -> ClientConfig {
    let mut config = ClientConfig::new(EC82, pages * 4096);
    config.request_timeout = Duration::from_millis(1500);
    config.connect_timeout = Duration::from_secs(3);
    config.encrypt = encrypt;
    config
}

fn connect(
    cluster: &LocalCluster,
    secret: &remem_proto::auth::Secret,
    config: ClientConfig,
) -> Result<Client, String> {
    Client::connect(
        &cluster.addresses(),
        secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(27))),
    )
    .map_err(|error| format!("{error:#}"))
}

/// Node `node`'s log once it holds `text` (the node logs a refusal after its brief linger on
/// the socket), or as it is after 5 s.
fn node_log_with(cluster: &LocalCluster, node: usize, text: &str) -> String {
    let path =
        cluster.cluster_file_path.parent().expect("cluster directory").join(format!("node-{node}.log"));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        if log.contains(text) || std::time::Instant::now() >= deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn encrypted_ec82_cluster_rebuilds_a_sigkilled_node_and_reads_back_every_byte() {
    // 10 nodes hold the range, one spare takes the rebuilt slab.
    let mut cluster = cluster("rebuild", 11, true);
    let pages = 2048;
    let mut client =
        connect(&cluster, &cluster.secret, config(pages, true)).expect("an encrypting client connects");
    let mut model = Model::default();
    let all: Vec<u64> = (0..pages).collect();
    model.write(&mut client, &all);
    model.read(&mut client, &all);
    let victim = client.range_nodes(0)[2];
    cluster.kill(victim).expect("SIGKILL");
    // Degraded reads decode around the dead node, then writes go on while the rebuild runs.
    model.read(&mut client, &all);
    model.write(&mut client, &all[..256]);
    assert!(client.wait_for_regenerations(Duration::from_secs(30)), "the rebuild did not finish");
    assert_eq!(client.ranges()[0].unavailable, 0, "full redundancy restored");
    assert_eq!(client.regeneration_status().done, 1);
    assert!(!client.range_nodes(0).contains(&victim), "the slab moved off the dead node");
    model.read(&mut client, &all);
    assert_eq!(model.mismatches, 0);
    eprintln!("{} pages verified over encrypted TCP, node {victim} killed and rebuilt", model.verified);
}

#[test]
fn a_plaintext_client_is_refused_by_an_encrypted_node_with_the_reason() {
    let cluster = cluster("plaintext-client", 2, true);
    let shape = Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 };
    let mut plaintext = ClientConfig::new(shape, 1 << 20);
    plaintext.connect_timeout = Duration::from_secs(3);
    let error = connect(&cluster, &cluster.secret, plaintext).err().expect("a plaintext client is refused");
    assert!(error.contains("this node requires encrypted TCP connections"), "{error}");
    assert!(error.contains("--encrypt"), "{error}");
    let log = node_log_with(&cluster, 0, "this node requires encrypted TCP connections");
    assert!(log.contains("this node requires encrypted TCP connections"), "the node says why too:\n{log}");
    // The same client with --encrypt is served.
    let mut encrypted = ClientConfig::new(shape, 1 << 20);
    encrypted.encrypt = true;
    connect(&cluster, &cluster.secret, encrypted).expect("an encrypting client connects");
    // `remem status --encrypt` asks them too.
    let file = cluster.cluster_file_path.to_str().expect("UTF-8 path");
    let status = common::remem_status(20, &["--cluster", file, "--encrypt"]);
    assert!(!status.contains("DOWN"), "{status}");
}

#[test]
fn an_encrypting_client_is_refused_by_a_plaintext_node_with_the_reason() {
    let cluster = cluster("plaintext-node", 2, false);
    let shape = Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 };
    let mut encrypted = ClientConfig::new(shape, 1 << 20);
    encrypted.encrypt = true;
    encrypted.connect_timeout = Duration::from_secs(3);
    let error = connect(&cluster, &cluster.secret, encrypted).err().expect("refused");
    assert!(error.contains("the node does not encrypt its TCP traffic"), "{error}");
    assert!(error.contains("start the node with --encrypt, or the client without it"), "{error}");
    let log = node_log_with(&cluster, 0, "this node does not encrypt TCP traffic");
    assert!(log.contains("this node does not encrypt TCP traffic"), "the node says why too:\n{log}");
}

#[test]
fn a_client_with_another_secret_fails_the_encryption_handshake() {
    let cluster = cluster("secret", 2, true);
    let secret =
        remem_proto::auth::Secret::from_bytes(b"not the cluster secret at all".to_vec()).expect("secret");
    let shape = Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 };
    let mut encrypted = ClientConfig::new(shape, 1 << 20);
    encrypted.encrypt = true;
    encrypted.connect_timeout = Duration::from_secs(3);
    let error = connect(&cluster, &secret, encrypted).err().expect("refused");
    assert!(error.contains("the encryption handshake failed"), "{error}");
    let log = node_log_with(&cluster, 0, "the encryption handshake failed");
    assert!(log.contains("the encryption handshake failed"), "the node says why too:\n{log}");
}

/// `remem bench pages --encryption` with tiny parameters, so the benchmark never rots: both
/// rows, plaintext and encrypted, and every page checked.
#[test]
fn bench_pages_encryption_reports_plaintext_beside_encrypted() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_remem"))
        .args([
            "bench",
            "pages",
            "--encryption",
            "--size",
            "4MiB",
            "--slab-size",
            "1MiB",
            "--ops",
            "200",
            "--json",
        ])
        .output()
        .expect("remem runs");
    assert!(output.status.success(), "bench failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("bench --json prints JSON");
    let cost = &report["encryption"];
    let rows = cost["rows"].as_array().expect("rows");
    for operation in ["read", "write"] {
        let row = rows.iter().find(|row| row["operation"] == operation).expect("a row per operation");
        assert_eq!(row["plaintext"]["count"], 200, "{row}");
        assert_eq!(row["encrypted"]["count"], 200, "{row}");
        assert!(row["p50_ratio"].as_f64().expect("ratio") > 0.0, "{row}");
    }
    assert_eq!(cost["pages_verified"], 2 * 1024, "{cost}");
}

/// `remem run --paging uffd --encrypt` over TCP to encrypted nodes: python3's 40 MiB of blocks
/// under an 8 MiB budget come back intact from remem, and the pager fetched some of them. The
/// same run without `--encrypt` encrypts too: the cluster file says its nodes require it.
#[test]
fn remem_run_pages_a_program_through_encrypted_nodes() {
    let cluster = cluster("run", 10, true);
    let program = "blocks = [bytes([i % 251]) * 65536 for i in range(640)]\n\
        assert all(b == bytes([i % 251]) * 65536 for i, b in enumerate(blocks)), 'wrong bytes'\n\
        print('intact')";
    let run = |encrypt: bool| {
        let mut command = std::process::Command::new("timeout");
        command
            .args(["-k", "5", "120"])
            .arg(env!("CARGO_BIN_EXE_remem"))
            .args(["run", "--paging", "uffd", "--transport", "tcp", "--memory-limit", "8MiB"])
            .args(["--remote-size", "96MiB", "--cluster"])
            .arg(&cluster.cluster_file_path)
            .args(encrypt.then_some("--encrypt"))
            .args(["--", "/usr/bin/python3", "-c", program]);
        let output = command.output().expect("remem run runs");
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned(), {
            String::from_utf8_lossy(&output.stderr).into_owned()
        })
    };
    let (ok, stdout, stderr) = run(true);
    assert!(ok && stdout == "intact\n", "encrypted run: {stdout}\n{stderr}");
    let report = stderr.lines().find(|line| line.starts_with("remem run: pager ")).unwrap_or_default();
    let fetched: u64 = report
        .split("\"fetch_faults\":")
        .nth(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0);
    assert!(fetched > 0, "python3's pages came back from remem over encrypted TCP: {stderr}");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster.cluster_file_path).expect("cluster file"))
            .expect("JSON");
    assert_eq!(file["encrypt"], true, "the cluster file records --encrypt: {file}");
    let (ok, stdout, stderr) = run(false);
    assert!(ok && stdout == "intact\n", "the cluster file's encrypt is taken: {stdout}\n{stderr}");
}
