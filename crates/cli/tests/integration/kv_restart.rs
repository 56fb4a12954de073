//! `remem kv` restarted without loss (docs/KV.md "Restarts"): a writer sets and deletes keys of
//! every size while the server is SIGKILLed at a random moment, several times on one cluster;
//! after each restart every acknowledged write is there, byte for byte, no deleted key comes
//! back, and nothing else is served (the one write in flight at the kill may be old or new).
//! Values move between schemes meanwhile (`--cold-after-secs 1`). Then the backup region is
//! damaged and forged by hand: what does not check is dropped, never served.
//! A server stopped past its lease whose client id another process took stops, fenced.
//! Real node processes and a real `remem kv`, stopped by PID when the guards drop.

use crate::kv_crash;
use crate::kv_support;

use std::collections::HashMap;
use std::time::Duration;

use kv_crash::{damage, settle, sigkill, verify};
use kv_support::{binary, Target};
use remem::kv_bench::{ServerProcess, StoreOutcome, TextClient};

const ARGS: [&str; 4] = ["-m", "16MiB", "--cold-after-secs", "1"];

fn start(target: &Target, log: &str) -> ServerProcess {
    let args: Vec<String> = ARGS.iter().map(|arg| arg.to_string()).collect();
    let cluster = target.cluster.as_ref().expect("a remem cluster");
    ServerProcess::start_remem_kv(
        binary(),
        &cluster.cluster_file_path,
        &args,
        &target.dir.join(log),
        "remem kv",
    )
    .unwrap_or_else(|error| panic!("{error:#}"))
}

#[test]
fn every_acknowledged_write_survives_sigkill_and_restart_and_a_damaged_backup_is_never_served() {
    let mut target = Target::remem_kv("restart", "auto", "16MiB", &["--cold-after-secs", "1"]);
    let mut known = HashMap::new();
    let mut generation = 1;
    for round in 0..4u64 {
        let address = target.server.address;
        let seed = 0x9e37_79b9_7f4a_7c15 ^ (round + 1);
        let before = known.clone();
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&progress);
        let writer = std::thread::spawn(move || {
            kv_crash::write_until_killed_counting(address, before, seed, generation, counter)
        });
        // Killed at a different moment each round, under load, once the writer is going.
        kv_crash::wait_for_writes(&progress, 25);
        std::thread::sleep(Duration::from_millis(400 + seed % 900));
        sigkill(&mut target.server);
        let (after, in_flight, acknowledged) = writer.join().expect("the writer");
        known = after;
        generation += 1_000_000;
        eprintln!(
            "round {round}: {acknowledged} writes acknowledged before SIGKILL; in flight {in_flight:?}"
        );
        assert!(acknowledged > 20, "the writer made progress");
        target.server = start(&target, &format!("kv-{round}.log"));
        let log = target.server.log();
        assert!(log.contains("items restored"), "{log}");
        let (present, missing, _) = verify(&mut target.client(), &known, in_flight, true);
        eprintln!("round {round}: {present} keys present, {missing} absent, as acknowledged");
        settle(&mut target.client(), &mut known, in_flight);
    }

    // Damage: flip payload bits in 20 live records, and forge two records that hold each
    // other's key (their checksums recomputed, so only the value's checksum can tell).
    sigkill(&mut target.server);
    let backup = target.dir.join("cluster").join("kv-default").join("backup");
    let forged = damage(&backup, 20);
    target.server = start(&target, "kv-damaged.log");
    let log = target.server.log();
    assert!(log.contains("20 damaged"), "{log}");
    let (present, missing, refused) = verify(&mut target.client(), &known, None, false);
    eprintln!("after damage: {present} keys served as acknowledged, {missing} absent, {refused} refused; forged {forged:?}");
    assert!(present > 0);
    assert!(refused >= 1 || forged.is_empty(), "a forged record's value must not be served");
    target.assert_running();
}

/// A server stopped (SIGSTOP) for longer than the nodes' lease (10 s), whose client id another
/// process took meanwhile (from a copy of its state directory), stops when it wakes and says it
/// was fenced: it never serves beside the process that owns its slabs now.
#[test]
fn a_server_whose_client_id_was_taken_while_it_was_stopped_stops_fenced_at_a_node() {
    let mut target = Target::remem_kv("fenced", "rep2", "16MiB", &[]);
    assert!(matches!(target.client().set("kept", b"before the stop"), Ok(StoreOutcome::Stored)));
    // SAFETY: kill with the PID of a child the test spawned and has not reaped.
    unsafe { libc::kill(target.server.pid() as libc::pid_t, libc::SIGSTOP) };
    let state = target.dir.join("cluster").join("kv-default");
    let copy = target.dir.join("kv-copy");
    std::fs::create_dir_all(&copy).expect("mkdir");
    for entry in std::fs::read_dir(&state).expect("the state directory") {
        let entry = entry.expect("an entry");
        if entry.file_type().expect("its type").is_file() {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("copy the state");
        }
    }
    std::thread::sleep(Duration::from_secs(11));
    let cluster = target.cluster.as_ref().expect("a remem cluster");
    let args = ["--state", &copy.display().to_string(), "--scheme", "rep2", "-m", "16MiB"].map(str::to_owned);
    let log = target.dir.join("second.log");
    let mut second =
        ServerProcess::start_remem_kv(binary(), &cluster.cluster_file_path, &args, &log, "remem kv")
            .unwrap_or_else(|error| panic!("{error:#}"));
    assert!(second.log().contains("items restored"), "{}", second.log());
    let mut client = TextClient::connect(second.address, Duration::from_secs(10)).expect("connect");
    assert_eq!(client.get("kept").expect("a get"), Some(b"before the stop".to_vec()));

    // SAFETY: as above.
    unsafe { libc::kill(target.server.pid() as libc::pid_t, libc::SIGCONT) };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while target.server.exited().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the fenced server still runs: {}",
            target.server.log()
        );
        // A request makes it reach the nodes at once; its answer does not matter.
        let _ =
            TextClient::connect(target.server.address, Duration::from_secs(2)).map(|mut old| old.get("kept"));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(target.server.log().contains("fenced at a node"), "{}", target.server.log());
    assert_eq!(client.get("kept").expect("a get"), Some(b"before the stop".to_vec()));
    second.stop(Duration::from_secs(5));
}
