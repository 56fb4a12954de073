//! `remem kv --standby` (docs/KV.md "Standby", seed 004): a primary serves a write-heavy load
//! (sets of every size and deletes) with a standby attached; the primary is SIGKILLed at a
//! random moment; the standby takes over its address from its own copy of the backup region;
//! every acknowledged write is there byte for byte, no deleted key comes back, nothing else is
//! served. A new standby attaches to the new primary (synced while it serves) and the next
//! round kills that one, for each replication mode. A standby whose region is damaged (while its
//! primary hangs, found by the lapsed heartbeat) drops what does not check, never serves it.
//! A standby the primary gave up (stopped while writes went on) never takes over, also when the
//! primary dies before it wakes; one with other settings is refused, naming them; one with no
//! primary says so; one killed right after attaching does not keep the next from syncing.
//! Real node processes and real `remem kv` processes, stopped by PID when the guards drop.

use crate::kv_crash;
use crate::kv_support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use kv_crash::{damage, settle, sigkill, verify, write_ops, write_until_killed, Rng};
use kv_support::{binary, Target};
use remem::kv_bench::ServerProcess;

const ROUNDS: u64 = 5;

fn args(mode: &str) -> Vec<String> {
    ["--scheme", "auto", "-m", "16MiB", "--replication", mode].iter().map(|arg| arg.to_string()).collect()
}

fn state_dir(target: &Target) -> PathBuf {
    target.dir.join("cluster").join("kv-default")
}

/// Starts `remem kv --standby` for the target's primary.
fn spawn_standby(target: &Target, mode: &str, log: &str) -> (ServerProcess, Receiver<String>) {
    let args = args(mode);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_standby_with(target, &args, log)
}

/// Starts `remem kv ARGS --standby` for the target's primary.
fn spawn_standby_with(target: &Target, args: &[&str], log: &str) -> (ServerProcess, Receiver<String>) {
    let mut args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    args.push("--standby".into());
    let cluster = target.cluster.as_ref().expect("a remem cluster");
    ServerProcess::spawn_remem_kv(
        binary(),
        &cluster.cluster_file_path,
        &args,
        &target.dir.join(log),
        "standby",
    )
    .unwrap_or_else(|error| panic!("{error:#}"))
}

/// Waits until `process`'s log holds `text` `count` times; returns the log. Panics, with the
/// log, if it exits first or `timeout` passes.
fn wait_for_log(process: &mut ServerProcess, text: &str, count: usize, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let log = process.log_full();
        if log.matches(text).count() >= count {
            return log;
        }
        assert!(process.exited().is_none(), "{} exited before saying {text:?}:\n{log}", process.name);
        assert!(Instant::now() < deadline, "{} did not say {text:?} in {timeout:?}:\n{log}", process.name);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `process` to exit; returns its exit status and log.
fn wait_exit(process: &mut ServerProcess, timeout: Duration) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.exited() {
            return (status, process.log_full());
        }
        assert!(
            Instant::now() < deadline,
            "{} did not exit in {timeout:?}:\n{}",
            process.name,
            process.log_full()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(process: &ServerProcess, signal: libc::c_int) {
    // SAFETY: kill with the PID of a child the test spawned and has not reaped.
    unsafe { libc::kill(process.pid() as libc::pid_t, signal) };
}

/// The attached standby's region in the state directory (its name carries the attach id).
fn standby_region(target: &Target) -> PathBuf {
    let mut regions: Vec<PathBuf> = std::fs::read_dir(state_dir(target))
        .expect("the state directory")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
            name.starts_with("standby-") && name.ends_with("-backup")
        })
        .collect();
    assert_eq!(regions.len(), 1, "one standby region: {regions:?}");
    regions.pop().expect("one")
}

/// Starts a standby for the target's primary and waits until its copy is complete.
fn standby(target: &Target, mode: &str, log: &str) -> (ServerProcess, Receiver<String>) {
    let (mut process, first_line) = spawn_standby(target, mode, log);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !process.log().contains("standby synced") {
        assert!(process.exited().is_none(), "the standby exited: {}", process.log());
        assert!(Instant::now() < deadline, "the standby never synced: {}", process.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    (process, first_line)
}

fn primary_and_standby_rounds(mode: &str) {
    let mut target = Target::remem_kv(&format!("standby-{mode}"), "auto", "16MiB", &["--replication", mode]);
    let mut known = HashMap::new();
    let mut generation = 1;
    for round in 0..ROUNDS {
        let (mut standby, first_line) = standby(&target, mode, &format!("standby-{round}.log"));
        let address = target.server.address;
        let seed = 0x51a7_db1e_u64 ^ ((round + 1) << 8) ^ mode.len() as u64;
        let before = known.clone();
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&progress);
        let writer = std::thread::spawn(move || {
            kv_crash::write_until_killed_counting(address, before, seed, generation, counter)
        });
        // Killed at a different moment each round, once the writer is going (on a loaded host
        // it may take a while to start).
        kv_crash::wait_for_writes(&progress, 25);
        std::thread::sleep(Duration::from_millis(300 + seed % 700));
        sigkill(&mut target.server);
        let killed = Instant::now();
        let (after, in_flight, acknowledged) = writer.join().expect("the writer");
        known = after;
        generation += 1_000_000;
        assert!(acknowledged > 20, "the writer made progress: {acknowledged}");
        standby
            .wait_listening(&first_line, Duration::from_secs(30))
            .unwrap_or_else(|error| panic!("{error:#}"));
        let failover = killed.elapsed();
        assert_eq!(standby.address, address, "the standby serves on the primary's address");
        let log = standby.log();
        assert!(log.contains("took over") && log.contains("items restored"), "{log}");
        assert!(log.contains("0 damaged and 0 invalid"), "{log}");
        target.server = standby;
        let (present, missing, _) = verify(&mut target.client(), &known, in_flight, true);
        eprintln!(
            "{mode} round {round}: {acknowledged} writes acknowledged before SIGKILL, failover in {:.0} ms; \
             {present} keys present, {missing} absent, as acknowledged",
            failover.as_secs_f64() * 1e3
        );
        settle(&mut target.client(), &mut known, in_flight);
    }
    // One standby at a time.
    let (_standby, _) = standby(&target, mode, "standby-last.log");
    let (mut second, _) = spawn_standby(&target, mode, "second.log");
    let deadline = Instant::now() + Duration::from_secs(20);
    while second.exited().is_none() {
        assert!(Instant::now() < deadline, "a second standby was not refused: {}", second.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(second.log().contains("has a standby already"), "{}", second.log());
    target.assert_running();
}

#[test]
fn one_sided_every_acknowledged_write_survives_failover_to_the_standby() {
    primary_and_standby_rounds("one-sided");
}

#[test]
fn rpc_every_acknowledged_write_survives_failover_to_the_standby() {
    primary_and_standby_rounds("rpc");
}

#[test]
fn log_shipping_every_acknowledged_write_survives_failover_to_the_standby() {
    primary_and_standby_rounds("log");
}

#[test]
fn a_hung_primary_is_killed_and_a_damaged_standby_region_is_never_served() {
    let mut target = Target::remem_kv("standby-damaged", "auto", "16MiB", &[]);
    let (mut standby, first_line) = standby(&target, "one-sided", "standby.log");
    let address = target.server.address;
    let writer = std::thread::spawn(move || write_until_killed(address, HashMap::new(), 0xdead_beef, 1));
    std::thread::sleep(Duration::from_millis(800));
    // The primary hangs: its heartbeats stop, and nothing changes the region while it is damaged.
    // SAFETY: kill with the PID of a child the test spawned and has not reaped.
    unsafe { libc::kill(target.server.pid() as libc::pid_t, libc::SIGSTOP) };
    let region = standby_region(&target);
    let forged = damage(&region, 20);
    let (known, in_flight, acknowledged) = writer.join().expect("the writer");
    standby.wait_listening(&first_line, Duration::from_secs(30)).unwrap_or_else(|error| panic!("{error:#}"));
    let log = standby.log();
    assert!(log.contains("heartbeats stopped") && log.contains("killing it"), "{log}");
    assert!(log.contains("20 damaged"), "{log}");
    assert!(target.server.exited().is_some(), "the hung primary was killed");
    target.server = standby;
    let (present, missing, refused) = verify(&mut target.client(), &known, in_flight, false);
    eprintln!(
        "{acknowledged} writes acknowledged; after damage: {present} keys served as acknowledged, {missing} \
         absent, {refused} refused; forged {forged:?}"
    );
    assert!(present > 0);
    assert!(refused >= 1 || forged.is_empty(), "a forged record's value must not be served");
    target.assert_running();
}

/// The primary (RPC) gives up a standby that stopped answering (SIGSTOP) and acknowledges writes
/// it lacks (overwrites and deletes of keys it has); the primary dies before the standby wakes.
/// The standby must not take over with its copy: it says it was given up, nothing serves the
/// address, and a plain restart serves every acknowledged write. The standby attaches to that
/// one from scratch and takes over with everything when it dies.
#[test]
fn rpc_a_standby_given_up_while_stopped_never_takes_over_and_attaches_again() {
    let mode = "rpc";
    let mut target = Target::remem_kv("standby-given-up", "auto", "16MiB", &["--replication", mode]);
    let (mut standby, first_line) = standby(&target, mode, "standby.log");
    let old_address = target.server.address;
    let (mut known, mut rng, mut generation) = (HashMap::new(), Rng(0x0917_e1b0), 1);
    write_ops(old_address, &mut known, &mut rng, &mut generation, 200);
    signal(&standby, libc::SIGSTOP);
    // The first of these waits for the stopped standby's acknowledgement until the primary
    // gives it up; every one is acknowledged.
    write_ops(old_address, &mut known, &mut rng, &mut generation, 300);
    wait_for_log(&mut target.server, "is given up", 1, Duration::from_secs(10));
    sigkill(&mut target.server);
    signal(&standby, libc::SIGCONT);
    let log = wait_for_log(&mut standby, "no primary to stand by for", 1, Duration::from_secs(30));
    assert!(log.contains("this standby was given up") && !log.contains("taking over"), "{log}");
    assert!(first_line.try_recv().is_err(), "the given-up standby serves:\n{log}");
    assert!(std::net::TcpStream::connect(old_address).is_err(), "nothing serves the dead primary's address");

    let cluster_file = target.cluster.as_ref().expect("a remem cluster").cluster_file_path.clone();
    target.server = ServerProcess::start_remem_kv(
        binary(),
        &cluster_file,
        &args(mode),
        &target.dir.join("restarted.log"),
        "restarted",
    )
    .unwrap_or_else(|error| panic!("{error:#}"));
    let (present, missing, _) = verify(&mut target.client(), &known, None, true);
    eprintln!("after the plain restart: {present} keys present, {missing} absent, as acknowledged");

    wait_for_log(&mut standby, "standby synced", 2, Duration::from_secs(30));
    let address = target.server.address;
    write_ops(address, &mut known, &mut rng, &mut generation, 200);
    sigkill(&mut target.server);
    standby.wait_listening(&first_line, Duration::from_secs(30)).unwrap_or_else(|error| panic!("{error:#}"));
    assert_eq!(standby.address, address, "the standby serves on the restarted primary's address");
    let log = standby.log();
    assert!(log.contains("took over") && log.contains("0 damaged and 0 invalid"), "{log}");
    target.server = standby;
    let (present, missing, _) = verify(&mut target.client(), &known, None, true);
    eprintln!("after the standby took over: {present} keys present, {missing} absent, as acknowledged");
    target.assert_running();
}

#[test]
fn a_standby_with_other_settings_is_refused_naming_each_difference() {
    let mut target = Target::remem_kv("standby-settings", "auto", "16MiB", &[]);
    let cases: [(&[&str], &[&str]); 3] = [
        (&["-m", "32MiB"], &["-m 32MiB on the standby, 16MiB on the primary"]),
        (
            &["-m", "16MiB", "-k", "6", "-r", "3"],
            &["-k 6 on the standby, 8 on the primary", "-r 3 on the standby, 2 on the primary"],
        ),
        (&["-m", "16MiB", "--scheme", "ec"], &["--scheme ec8+2 on the standby, auto on the primary"]),
    ];
    for (round, (flags, differences)) in cases.into_iter().enumerate() {
        let (mut refused, _) = spawn_standby_with(&target, flags, &format!("refused-{round}.log"));
        let (status, log) = wait_exit(&mut refused, Duration::from_secs(20));
        assert!(!status.success(), "{log}");
        assert!(log.contains("standby refused by the primary"), "{log}");
        for difference in differences {
            assert!(log.contains(difference), "{difference:?} not in:\n{log}");
        }
    }
    // The primary serves on and takes a standby with its settings.
    let (_standby, _) = standby(&target, "one-sided", "matching.log");
    target.assert_running();
}

#[test]
fn a_standby_with_no_primary_says_so_at_once_and_attaches_when_one_starts() {
    let target = Target::remem_kv("standby-no-primary", "auto", "16MiB", &[]);
    let flags = ["--scheme", "auto", "-m", "16MiB", "--name", "other"];
    let (mut standby, _) = spawn_standby_with(&target, &flags, "standby.log");
    let log = wait_for_log(&mut standby, "no primary to stand by for", 1, Duration::from_secs(20));
    assert!(log.contains("kv-other does not exist") && log.contains("those that did: default"), "{log}");
    wait_for_log(&mut standby, "still no primary", 1, Duration::from_secs(20));
    let cluster_file = &target.cluster.as_ref().expect("a remem cluster").cluster_file_path;
    let flags: Vec<String> = flags.iter().map(|flag| flag.to_string()).collect();
    let _other =
        ServerProcess::start_remem_kv(binary(), cluster_file, &flags, &target.dir.join("other.log"), "other")
            .unwrap_or_else(|error| panic!("{error:#}"));
    wait_for_log(&mut standby, "standby synced", 1, Duration::from_secs(30));
}

/// A standby SIGKILLed right after it attached may not be found gone before the next one says
/// hello (nothing was written to it since): the next one attaches and syncs all the same.
#[test]
fn a_standby_killed_right_after_attaching_does_not_keep_the_next_from_syncing() {
    let mut target = Target::remem_kv("standby-killed-early", "auto", "16MiB", &[]);
    for round in 0..3 {
        let (mut killed, _) = spawn_standby(&target, "one-sided", &format!("killed-{round}.log"));
        wait_for_log(&mut killed, "standing by", 1, Duration::from_secs(20));
        sigkill(&mut killed);
    }
    let (_standby, _) = standby(&target, "one-sided", "next.log");
    target.assert_running();
}

#[test]
fn the_high_availability_bench_runs_every_mode_and_checks_what_it_reads() {
    kv_support::require_remem_kv();
    let output = kv_support::run_bounded(
        240,
        binary().to_str().expect("a UTF-8 path"),
        &["bench", "kv-ha", "--quick", "--json"],
        None,
    );
    assert!(output.status.success(), "{}", kv_support::text(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    let mixes = report["mixes"].as_array().expect("mixes");
    assert_eq!(mixes.len(), 15, "5 modes x 3 write ratios");
    for row in mixes {
        assert!(row["ops_per_second"].as_f64().unwrap() > 0.0, "{row}");
        let standby = !matches!(row["mode"].as_str().unwrap(), "ephemeral" | "none");
        assert_eq!(row["standby_cpu_seconds_per_million_writes"].is_number(), standby, "{row}");
        assert!(row["ops_ratio_to_none"].is_number(), "{row}");
    }
    let syncs = report["syncs"].as_array().expect("syncs");
    assert_eq!(syncs.len(), 3);
    for row in syncs {
        assert_eq!(row["records"].as_u64(), Some(5000), "{row}");
        match row["policy"].as_str().unwrap() {
            "bulk" => assert_eq!(row["chunks_by_slot"].as_u64(), Some(0), "{row}"),
            "per-item" => assert_eq!(row["chunks_whole"].as_u64(), Some(0), "{row}"),
            _ => {}
        }
    }
    let failovers = report["failovers"].as_array().expect("failovers");
    assert_eq!(failovers.len(), 1);
    assert_eq!(failovers[0]["keys_checked"].as_u64(), Some(1000));
}
