//! `remem kv`'s schemes from outside: EOR's layout survives any one node failure, the EOR ->
//! EC transition writes only the parities (and those parities then carry the data through two
//! failures), the naive transition costs what seed 003's Table 1 says, the hotness policy moves
//! objects both ways, and a get that arrives with its set is answered from the set (data
//! bypassing). Real node processes and a real `remem kv`, stopped by PID when the guards drop.

use crate::kv_support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use kv_support::Target;
use remem::kv_bench::TextClient;

fn value(index: usize, length: usize) -> Vec<u8> {
    (0..length).map(|byte| (byte as u64 * 31 + index as u64 * 7919 % 251) as u8).collect()
}

fn stat(client: &mut TextClient, name: &str) -> u64 {
    let stats = client.stats().expect("stats");
    stats.get(name).map(|value| value.parse().expect("a number")).unwrap_or(0)
}

fn check_all(client: &mut TextClient, keys: &[(String, Vec<u8>)], what: &str) {
    for (key, expected) in keys {
        let got = client.get(key).unwrap_or_else(|error| panic!("{what}: get {key}: {error}"));
        assert!(
            got.as_deref() == Some(&expected[..]),
            "{what}: {key} read back {:?} bytes, wrong or missing",
            got.map(|v| v.len())
        );
    }
}

#[test]
fn eor_values_survive_one_killed_node_and_eor_to_ec_writes_only_the_parities() {
    let mut target = Target::remem_kv("eor", "eor", "16MiB", &[]);
    let mut client = target.client();
    // Whole pages (64 KiB) and a chunk tail (64 KiB + 100 bytes): both layouts.
    let keys: Vec<(String, Vec<u8>)> = (0..24)
        .map(|index| (format!("eor{index}"), value(index, 65536 + if index % 2 == 1 { 100 } else { 0 })))
        .collect();
    for (key, bytes) in &keys {
        client.set(key, bytes).expect("set");
    }
    check_all(&mut client, &keys, "healthy");
    // EOR -> EC on whole-page values, all nodes up: the main copy read (S), the parities
    // written (S m/k), nothing else.
    let (early, late): (Vec<_>, Vec<_>) =
        keys.iter().cloned().enumerate().partition(|(index, _)| index % 4 == 0);
    for (_, (key, bytes)) in &early {
        let moved = client.transition(key, "ec", false).expect("transition").expect("found");
        assert_eq!(moved.bytes_read, bytes.len() as u64, "{key}: EOR -> EC reads the main copy once");
        assert_eq!(moved.bytes_written, bytes.len() as u64 * 2 / 8, "{key}: EOR -> EC writes only m/k S");
    }
    target.cluster.as_mut().expect("a cluster").kill(3).expect("kill node 3");
    check_all(&mut client, &keys, "one node killed");
    // The rest move after the failure: pages whose data split died with node 3 are written
    // whole (they are re-protected), the others get their parities; a chunk tail moves naively.
    for (_, (key, _)) in &late {
        let moved = client.transition(key, "ec", false).expect("transition").expect("found");
        assert!(moved.bytes_written > 0, "{key}: {moved:?}");
    }
    assert_eq!(stat(&mut client, "remem_transitions_eor_to_ec"), keys.len() as u64);
    // The parities are right: a second node killed (two in all), every EC value still reads.
    target.cluster.as_mut().expect("a cluster").kill(7).expect("kill node 7");
    check_all(&mut client, &keys, "two nodes killed after EOR -> EC");
    assert_eq!(stat(&mut client, "remem_lost_reads"), 0);
    target.assert_running();
}

#[test]
fn naive_rep2_to_ec_costs_2k_plus_m_over_k_and_eor_to_ec_k_plus_m_over_k() {
    let target = Target::remem_kv("transition-cost", "auto", "16MiB", &[]);
    let mut client = target.client();
    let size = 256 * 1024;
    client.meta_set("viarep", &value(1, size), "Prep2").expect("ms rep2");
    client.meta_set("viaeor", &value(2, size), "Peor").expect("ms eor");
    let naive = client.transition("viarep", "ec", true).expect("transition").expect("found");
    let eor = client.transition("viaeor", "ec", false).expect("transition").expect("found");
    let s = size as u64;
    assert_eq!(
        (naive.bytes_read, naive.bytes_written),
        (s, s * 10 / 8),
        "rep2 -> EC(8,2): (2k+m)/k S in all"
    );
    assert_eq!((eor.bytes_read, eor.bytes_written), (s, s * 2 / 8), "EOR -> EC(8,2): (k+m)/k S in all");
    // And back: EC -> EOR writes the main copy only (r S in all, r = 2).
    let back = client.transition("viaeor", "eor", false).expect("transition").expect("found");
    assert_eq!((back.bytes_read, back.bytes_written), (s, s));
    assert_eq!(client.get("viaeor").expect("get"), Some(value(2, size)));
    assert_eq!(client.get("viarep").expect("get"), Some(value(1, size)));
    assert_eq!(client.request_line("transition nothere ec").expect("answer"), "NOT_FOUND");
    match client.request_line("transition viarep ec4+2") {
        Err(remem::kv_bench::ClientError::Server(line)) => {
            assert!(line.starts_with("CLIENT_ERROR"), "{line}")
        }
        other => panic!("a scheme this server lacks was accepted: {other:?}"),
    }
}

#[test]
fn cold_objects_move_to_ec_and_hot_ones_move_back() {
    let target =
        Target::remem_kv("hotness", "auto", "16MiB", &["--cold-after-secs", "1", "--hot-reads", "2"]);
    let mut client = target.client();
    let big = value(5, 40_000);
    client.set("big", &big).expect("set");
    let deadline = Instant::now() + Duration::from_secs(20);
    while stat(&mut client, "remem_transitions_eor_to_ec") == 0 {
        assert!(Instant::now() < deadline, "a cold EOR object did not move to EC");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(stat(&mut client, "remem_items_ec"), 1);
    for _ in 0..3 {
        assert_eq!(client.get("big").expect("get"), Some(big.clone()));
    }
    while stat(&mut client, "remem_transitions_ec_to_eor") == 0 {
        assert!(Instant::now() < deadline, "a hot EC object did not move back to EOR");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(client.get("big").expect("get"), Some(big));
}

#[test]
fn a_get_pipelined_with_its_set_is_answered_from_the_set() {
    let target = Target::remem_kv("bypass", "ec", "16MiB", &[]);
    let data = value(9, 20_000);
    let mut stream = std::net::TcpStream::connect(target.server.address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut request = format!("set pipelined 7 0 {}\r\n", data.len()).into_bytes();
    request.extend_from_slice(&data);
    request.extend_from_slice(b"\r\nget pipelined\r\nget pipelined\r\n");
    stream.write_all(&request).expect("write");
    let mut expected = b"STORED\r\n".to_vec();
    for _ in 0..2 {
        expected.extend_from_slice(format!("VALUE pipelined 7 {}\r\n", data.len()).as_bytes());
        expected.extend_from_slice(&data);
        expected.extend_from_slice(b"\r\nEND\r\n");
    }
    let mut reply = vec![0; expected.len()];
    stream.read_exact(&mut reply).expect("the replies");
    assert!(reply == expected, "replies differ from set + two values");
    let mut client = target.client();
    assert!(stat(&mut client, "remem_bypassed_gets") >= 1, "the gets did not use the set's value");
}

/// `stats schemes` as a map.
fn scheme_stats(client: &mut TextClient) -> std::collections::BTreeMap<String, f64> {
    client.send_raw(b"stats schemes\r\n").expect("send");
    let mut stats = std::collections::BTreeMap::new();
    loop {
        let line = client.read_line().expect("a stat line");
        if line == "END" {
            return stats;
        }
        let mut words = line.split(' ').skip(1);
        let (Some(name), Some(value)) = (words.next(), words.next()) else { panic!("bad line {line:?}") };
        stats.insert(name.to_string(), value.parse().unwrap_or(f64::NAN));
    }
}

#[test]
fn node_memory_per_scheme_is_the_ideal_for_whole_pages_and_within_a_quarter_for_small_values() {
    let target = Target::remem_kv("memory", "auto", "16MiB", &[]);
    let mut client = target.client();
    for scheme in ["none", "rep2", "rep3", "ec", "eor"] {
        for index in 0..8 {
            client
                .meta_set(&format!("{scheme}-big-{index}"), &value(index, 65536), &format!("P{scheme}"))
                .expect("ms");
        }
    }
    let stats = scheme_stats(&mut client);
    for (scheme, ideal) in [("none", 1.0), ("rep2", 2.0), ("rep3", 3.0), ("ec", 1.25), ("eor", 2.0)] {
        assert_eq!(stats[&format!("{scheme}:ideal_overhead")], ideal);
        assert_eq!(
            stats[&format!("{scheme}:overhead")],
            ideal,
            "{scheme}: 64 KiB values take exactly the ideal"
        );
    }
    // Small values of random sizes: chunk classes grow by 1.25x.
    for index in 0..200 {
        let length = 50 + (index * 37) % 1900;
        client.meta_set(&format!("small-{index}"), &value(index, length), "Pec").expect("ms");
    }
    let stats = scheme_stats(&mut client);
    let overhead = stats["ec:overhead"];
    assert!(overhead > 1.25 && overhead < 1.25 * 1.25, "small EC values: {overhead} node bytes per byte");
}

#[test]
fn auth_file_keeps_unauthenticated_clients_out_and_the_unix_socket_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = kv_support::test_dir("auth-files");
    let auth = dir.join("auth");
    std::fs::write(&auth, "alice:s3cret\n").expect("auth file");
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let socket = dir.join("kv.sock");
    let auth_arg = auth.to_str().expect("utf-8 path");
    let socket_arg = socket.to_str().expect("utf-8 path");
    let target = Target::remem_kv("auth", "rep2", "16MiB", &["--auth-file", auth_arg, "--unix", socket_arg]);
    let mut client = target.client();
    let answer = |client: &mut TextClient, line: &[u8]| {
        client.send_raw(line).expect("send");
        client.read_line().expect("a line")
    };
    assert_eq!(answer(&mut client, b"get k\r\n"), "CLIENT_ERROR unauthenticated");
    assert_eq!(
        answer(&mut client, b"set k 0 0 12\r\nalice wrong!\r\n"),
        "CLIENT_ERROR authentication failure"
    );
    assert_eq!(answer(&mut client, b"set k 0 0 12\r\nalice s3cret\r\n"), "STORED");
    client.set("k", b"value").expect("set after authenticating");
    assert_eq!(client.get("k").expect("get"), Some(b"value".to_vec()));
    // Each connection authenticates on its own.
    let mut other = target.client();
    assert_eq!(answer(&mut other, b"version\r\n"), "CLIENT_ERROR unauthenticated");
    // The Unix socket is 0600: another local user cannot connect to it.
    let mode = std::fs::metadata(&socket).expect("socket exists").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let as_nobody = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "python3", "-c"])
        .arg(format!("import socket; s = socket.socket(socket.AF_UNIX); s.connect({socket_arg:?})"))
        .output()
        .expect("setpriv runs (util-linux)");
    assert!(!as_nobody.status.success(), "nobody connected to the owner-only socket");
    assert!(String::from_utf8_lossy(&as_nobody.stderr).contains("Permission denied"));
    // A world-readable auth file is refused at start.
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let cluster = target.cluster.as_ref().expect("a cluster");
    let refused = std::process::Command::new(kv_support::binary())
        .args(["kv", "--listen", "127.0.0.1:0", "--auth-file", auth_arg, "--cluster"])
        .arg(&cluster.cluster_file_path)
        .output()
        .expect("remem kv runs");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("readable by group or others"));
}

#[test]
fn a_3000_key_multi_get_after_noreply_sets_returns_every_value_in_order() {
    let target = Target::remem_kv("multiget", "ec", "16MiB", &[]);
    let mut client = target.client();
    let keys: Vec<String> = (0..3000).map(|index| format!("m{index:05}")).collect();
    let mut request = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        let data = value(index, 20 + index % 3000);
        request.extend_from_slice(format!("set {key} {index} 0 {} noreply\r\n", data.len()).as_bytes());
        request.extend_from_slice(&data);
        request.extend_from_slice(b"\r\n");
    }
    client.send_raw(&request).expect("pipelined noreply sets");
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let items = client.retrieve("get", &key_refs).expect("one multi-get");
    assert_eq!(items.len(), keys.len());
    for (index, item) in items.iter().enumerate() {
        assert_eq!((item.key.as_str(), item.flags), (keys[index].as_str(), index as u32));
        assert!(item.value == value(index, 20 + index % 3000), "{}: wrong value", item.key);
    }
}

#[test]
fn a_node_added_to_the_cluster_file_joins_the_running_cache() {
    let mut target = Target::remem_kv("join", "ec", "16MiB", &[]);
    let mut client = target.client();
    assert_eq!(stat(&mut client, "remem_nodes"), kv_support::NODES as u64);
    let options = remem::launcher::ClusterOptions {
        lease_grace: None,
        nodes: kv_support::NODES,
        capacity_bytes: kv_support::SLABS_PER_NODE * kv_support::SLAB_BYTES,
        slab_size_bytes: kv_support::SLAB_BYTES,
        nodes_per_domain: 1,
        dir: target.dir.join("cluster"),
        fault_injection: true,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::None,
        encrypt: false,
    };
    target.cluster.as_mut().expect("a cluster").add_node(kv_support::binary(), &options).expect("add a node");
    let deadline = Instant::now() + Duration::from_secs(15);
    while stat(&mut client, "remem_nodes") != kv_support::NODES as u64 + 1 {
        assert!(Instant::now() < deadline, "the new node never joined the cache's client");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(stat(&mut client, "remem_nodes_connected"), kv_support::NODES as u64 + 1);
    client.set("after-join", b"works").expect("set");
    assert_eq!(client.get("after-join").expect("get"), Some(b"works".to_vec()));
}

/// Values lost past r (five of twelve nodes SIGKILLed under EC(8,2)): a multi-key get answers
/// `SERVER_ERROR` and nothing more of that get, as memcached ends a response on an error, so a
/// client reading `SERVER_ERROR` as the whole answer stays in step with the connection (a
/// trailing `END` would be taken for the next command's answer).
#[test]
fn a_lost_value_ends_a_multi_key_get_with_server_error_and_the_connection_stays_in_step() {
    let mut target = Target::remem_kv("lost", "ec", "16MiB", &[]);
    let mut client = target.client();
    for index in 0..6 {
        client.set(&format!("lost{index}"), &value(index, 65536)).expect("set");
    }
    let cluster = target.cluster.as_mut().expect("a cluster");
    for node in 0..5 {
        cluster.kill(node).expect("SIGKILL");
    }
    client.send_raw(b"get lost0 lost1 lost2 lost3 lost4 lost5\r\n").expect("send");
    let line = client.read_line().expect("an answer");
    assert!(line.starts_with("SERVER_ERROR"), "{line}");
    // The next answer on the connection is the next command's.
    let version = client.request_line("version").expect("version");
    assert!(version.starts_with("VERSION "), "after the error came {version:?}");
    // What could not be read is dropped, as a cache drops it: now a miss, never other bytes.
    client.send_raw(b"get lost0 lost1 lost2 lost3 lost4 lost5\r\n").expect("send");
    assert_eq!(client.read_line().expect("an answer"), "END");
    assert!(client.request_line("version").expect("version").starts_with("VERSION "));
    assert!(stat(&mut client, "remem_lost_reads") > 0);
    target.assert_running();
}
