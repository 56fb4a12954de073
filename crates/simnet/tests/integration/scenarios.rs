//! Seeded scenarios of the client engine against the simulated cluster (see
//! `remem_simnet::scenario` for what a scenario is and checks).
//!
//! - `five_thousand_seeded_scenarios_within_r_lose_nothing_*`: 5,000 seeds (in parts, so nextest
//!   runs them in parallel) with at most r faulty nodes: no op fails, nothing is lost, and the
//!   cluster heals.
//! - `beyond_r_scenarios_*`: more than r faulty nodes: errors, never wrong data.
//! - `replay_seed_from_env`: `REMEM_SIM_SEED=<seed> [REMEM_SIM_TOLERANCE=within|beyond]` runs
//!   just that seed and prints its trace (`REMEM_SIM_LOG=1`: as it happens, between the engine's
//!   log lines); `REMEM_SIM_SEEDS=<first>..<end>` runs a range (`REMEM_SIM_MAX_FAILURES` failures
//!   at most, 5 by default). With either set, the sweeps skip, so the one-line replay command of
//!   a failure runs only what it names.
//! - Named scenarios: one fault decision each (healing without traffic, readmission, lossy
//!   rebuilds, corrupt sources, nodes above index 64, membership), and the engine bugs the
//!   simulator found, kept as the scenarios that show them.

use std::time::Instant;

use remem_simnet::scenario::replay_command;
use remem_simnet::scenario::Trace;
use remem_simnet::{run_plan, run_seed, ScenarioFailure, ScenarioPlan, ScenarioReport, Tolerance};

/// Seeds of the within-tolerance sweep, in this many parts.
const WITHIN_SEEDS: u64 = 5_000;
const WITHIN_PARTS: u64 = 4;
const BEYOND_SEEDS: u64 = 1_000;
/// A sweep stops after this many failures (each prints its replay command);
/// `REMEM_SIM_MAX_FAILURES` changes it.
const MAX_FAILURES: usize = 5;

fn max_failures() -> usize {
    std::env::var("REMEM_SIM_MAX_FAILURES").ok().and_then(|text| text.parse().ok()).unwrap_or(MAX_FAILURES)
}

fn replaying() -> bool {
    std::env::var_os("REMEM_SIM_SEED").is_some() || std::env::var_os("REMEM_SIM_SEEDS").is_some()
}

/// Runs `seeds` and prints what they did; panics with every failure's replay command.
fn sweep(name: &str, seeds: std::ops::Range<u64>, tolerance: Tolerance) -> ScenarioReport {
    let started = Instant::now();
    let mut total = ScenarioReport::default();
    let mut failures: Vec<ScenarioFailure> = Vec::new();
    let count = seeds.end - seeds.start;
    for seed in seeds.clone() {
        // A panic (an engine assertion, a livelock) is a failure of that seed like any other.
        let outcome = std::panic::catch_unwind(|| run_seed(seed, tolerance, false)).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_else(|| "a panic".to_owned());
            Err(ScenarioFailure {
                seed,
                tolerance,
                message: format!("panicked: {message}"),
                plan: ScenarioPlan::generate(seed, tolerance).to_string(),
                trace: Vec::new(),
            })
        });
        match outcome {
            Ok(report) => total.add(&report),
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure);
                if failures.len() == max_failures() {
                    break;
                }
            }
        }
    }
    println!(
        "{name}: {count} scenarios (seeds {}..{}, {} tolerance) in {:.1} s: reads {} ok / {} failed ({} decoded), \
         writes {} ok / {} failed, data-only writes {} ok / {} failed, parity writes {} ok / {} failed, {} reads \
         of parity-stale pages failed, {} pages verified, {} rebuilds, {:.1} s simulated; faults injected: {} \
         ({} in all; {} messages of crashed clients lost in flight), and {} nodes killed after healing to \
         check redundancy",
        seeds.start,
        seeds.end,
        tolerance.name(),
        started.elapsed().as_secs_f64(),
        total.reads_ok,
        total.reads_failed,
        total.reads_decoded,
        total.writes_ok,
        total.writes_failed,
        total.write_data_ok,
        total.write_data_failed,
        total.write_parity_ok,
        total.write_parity_failed,
        total.parity_stale_reads_failed,
        total.pages_verified,
        total.rebuilds_done,
        total.simulated_ns as f64 / 1e9,
        total.faults,
        total.faults.total(),
        total.torn_messages,
        total.redundancy_kills,
    );
    if !failures.is_empty() {
        let commands: Vec<String> = failures.iter().map(|failure| failure.replay_command()).collect();
        panic!("{} scenarios failed; replay with:\n{}", failures.len(), commands.join("\n"));
    }
    total
}

fn within_part(part: u64) {
    if replaying() {
        return;
    }
    let per_part = WITHIN_SEEDS / WITHIN_PARTS;
    let name = format!("within r, part {} of {WITHIN_PARTS}", part + 1);
    let total = sweep(&name, part * per_part..(part + 1) * per_part, Tolerance::Within);
    assert_eq!(total.writes_failed, 0);
    assert!(total.faults.total() > per_part, "faults were injected");
    assert!(
        total.write_data_ok > 0 && total.write_parity_ok > 0,
        "parity-stale pages were written and completed"
    );
}

#[test]
fn five_thousand_seeded_scenarios_within_r_lose_nothing_part_1() {
    within_part(0);
}

#[test]
fn five_thousand_seeded_scenarios_within_r_lose_nothing_part_2() {
    within_part(1);
}

#[test]
fn five_thousand_seeded_scenarios_within_r_lose_nothing_part_3() {
    within_part(2);
}

#[test]
fn five_thousand_seeded_scenarios_within_r_lose_nothing_part_4() {
    within_part(3);
}

#[test]
fn beyond_r_scenarios_report_errors_never_wrong_data() {
    if replaying() {
        return;
    }
    // Seeds of their own range, so that a beyond seed never shares a plan with a within one.
    let first = 1_000_000;
    let total = sweep("beyond r", first..first + BEYOND_SEEDS, Tolerance::Beyond);
    assert!(total.reads_failed + total.writes_failed > 0, "beyond r some ops must fail");
}

#[test]
fn a_seed_replays_exactly() {
    // A plan with CodingSets placement and a client crash, the most stateful kind.
    let seed = (0..)
        .find(|&seed| {
            let plan = ScenarioPlan::generate(seed, Tolerance::Within);
            plan.crash.is_some() && matches!(plan.placement, PlacementPolicy::CodingSets { .. })
        })
        .expect("such a seed exists");
    let plan = ScenarioPlan::generate(seed, Tolerance::Within);
    let runs: Vec<(String, Vec<String>)> = (0..2)
        .map(|_| {
            let mut driver = None;
            let result = remem_simnet::scenario::run_plan_with(&plan, Trace::Keep, |finished| {
                driver = Some(finished.trace());
            });
            (format!("{result:?}"), driver.expect("the run hands its driver over"))
        })
        .collect();
    assert!(runs[0].1.len() > 100, "the trace records the run");
    assert_eq!(runs[0], runs[1], "seed {seed} gave two different runs");
}

#[test]
fn replay_seed_from_env() {
    let tolerance = match std::env::var("REMEM_SIM_TOLERANCE") {
        Ok(text) => Tolerance::parse(&text).expect("REMEM_SIM_TOLERANCE is within or beyond"),
        Err(_) => Tolerance::Within,
    };
    if let Ok(text) = std::env::var("REMEM_SIM_SEED") {
        let seed: u64 = text.parse().expect("REMEM_SIM_SEED is a number");
        if std::env::var_os("REMEM_SIM_LOG").is_some() {
            let _ =
                tracing_subscriber::fmt().with_env_filter("remem_client=debug").with_test_writer().try_init();
        }
        let plan = remem_simnet::ScenarioPlan::generate(seed, tolerance);
        println!("{plan}");
        let trace = if std::env::var_os("REMEM_SIM_LOG").is_some() { Trace::Echo } else { Trace::Keep };
        match run_plan(&plan, trace) {
            Ok(report) => println!("seed {seed} passed: {report:?}"),
            Err(failure) => panic!("{failure}"),
        }
    }
    if let Ok(text) = std::env::var("REMEM_SIM_SEEDS") {
        let (first, end) = text.split_once("..").expect("REMEM_SIM_SEEDS is <first>..<end>");
        let seeds = first.parse().expect("a number")..end.parse().expect("a number");
        sweep("seeds from REMEM_SIM_SEEDS", seeds, tolerance);
    }
    let _ = replay_command;
}

// ---- named scenarios ----------------------------------------------------------------------------
//
// Each is the simulator version of one fault decision the engine must get right, and asserts
// what would break if the engine regressed.

use crate::common;
use common::*;
use remem_simnet::{
    FaultAction, InFlightFate, NetworkOptions, PlacementPolicy, ScheduledFault, SimCluster, SimOp,
    MICROSECOND, MILLISECOND,
};

#[test]
fn idle_client_heals_without_traffic() {
    let mut driver = start(101, 12, 8, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let first = range_nodes(&driver, 0);
    let victims = [first[0], first[9]];
    let lost_slabs = driver
        .engine()
        .ranges()
        .iter()
        .flat_map(|range| &range.slabs)
        .filter(|slab| victims.contains(&slab.node))
        .count();
    let submitted = driver.stats().ops_submitted;
    let rebuilds_before = driver.engine().regeneration_status().done;
    for node in victims {
        kill(&mut driver, node);
    }
    // Only ticks from here: no op is submitted.
    driver.run_for(2 * SECOND);
    assert_eq!(driver.stats().ops_submitted, submitted);
    assert!(driver.is_healed(), "an idle client must heal by itself\n{}", trace_of(&driver));
    assert!(driver.engine().regeneration_status().done >= rebuilds_before + lost_slabs as u64);
    assert!(victims.iter().all(|&node| !named_anywhere(&driver, node)));
    // Full redundancy is back: r more nodes may die.
    let second = range_nodes(&driver, 1);
    let more: Vec<usize> = second.iter().copied().filter(|node| !victims.contains(node)).take(2).collect();
    for node in more {
        kill(&mut driver, node);
    }
    verify_all(&mut driver, pages, |_| 1);
}

#[test]
fn stalled_node_is_probed_and_readmitted() {
    let mut driver = start(102, 15, 8, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let stalled = range_nodes(&driver, 0)[3];
    let held = our_slabs_on(&driver, stalled);
    assert!(!held.is_empty());
    let until = driver.now() + 5 * REQUEST_TIMEOUT;
    driver.fault_now(stalled, FaultAction::Stall { until });
    // Writes meet the stall: the node is declared failed, the writes complete without it.
    write_all(&mut driver, pages.clone(), 2);
    assert!(!driver.engine().node(stalled).connected, "a node silent past the timeout is failed");
    assert_eq!(
        driver.dropped_nodes().iter().map(|(_, node)| *node).collect::<Vec<_>>(),
        vec![stalled],
        "only the stalled node is failed"
    );
    heal(&mut driver);
    assert!(!named_anywhere(&driver, stalled), "its slabs were rebuilt elsewhere");
    let readmitted =
        driver.run_until_condition(until + LIMIT, |driver| driver.engine().node(stalled).connected);
    assert!(readmitted, "a failed node that answers again is readmitted\n{}", trace_of(&driver));
    driver.run_for(REQUEST_TIMEOUT);
    let still_ours = our_slabs_on(&driver, stalled);
    assert!(
        still_ours.iter().all(|slab_id| !held.contains(slab_id)),
        "the slabs it held, which no range names any more, are unmapped: it still holds {still_ours:?}"
    );
    verify_all(&mut driver, pages.clone(), |_| 2);
    // Four more nodes die one at a time, each healed before the next: nothing is lost.
    for round in 0..4 {
        let victim = (0..15)
            .find(|&node| node != stalled && driver.cluster().is_alive(node) && named_anywhere(&driver, node))
            .expect("a live node holds slabs");
        kill(&mut driver, victim);
        heal(&mut driver);
        verify_all(&mut driver, pages.clone(), |_| 2);
        assert!(!named_anywhere(&driver, victim), "round {round}");
    }
}

#[test]
fn a_client_cut_off_from_every_node_writes_again_when_they_answer_with_no_spare_node() {
    // Ten nodes for EC(8,2): every range is on all of them, so no rebuild could ever be placed.
    let mut driver = start(104, 10, 8, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let until = driver.now() + 5 * REQUEST_TIMEOUT;
    for node in 0..10 {
        driver.fault_now(node, FaultAction::Stall { until });
    }
    let all_failed =
        driver.run_until_condition(until, |driver| (0..10).all(|node| !driver.engine().node(node).connected));
    assert!(all_failed, "every silent node is failed\n{}", trace_of(&driver));
    // They answer again having missed no write: each slab is its range's split again, no rebuild.
    let back = driver.run_until_condition(until + LIMIT, |driver| {
        (0..10).all(|node| driver.engine().node(node).connected)
            && driver.engine().ranges().iter().all(|range| range.unavailable == 0)
    });
    assert!(back, "{:?}\n{}", driver.engine().regeneration_status(), trace_of(&driver));
    assert_eq!(driver.engine().regeneration_status().in_flight, 0);
    verify_all(&mut driver, pages.clone(), |_| 1);
    write_all(&mut driver, pages.clone(), 2);
    verify_all(&mut driver, pages.clone(), |_| 2);

    // One node away while every page is rewritten: its slabs missed writes and stay unavailable
    // (no spare node takes a rebuild), never read again; the pages read from the others.
    let away = range_nodes(&driver, 0)[0];
    let until = driver.now() + 5 * REQUEST_TIMEOUT;
    driver.fault_now(away, FaultAction::Stall { until });
    write_all(&mut driver, pages.clone(), 3);
    let readmitted = driver.run_until_condition(until + LIMIT, |driver| driver.engine().node(away).connected);
    assert!(readmitted, "{}", trace_of(&driver));
    assert!(driver.engine().ranges().iter().all(|range| range.unavailable.count_ones() == 1));
    verify_all(&mut driver, pages, |_| 3);
}

#[test]
fn rebuild_that_loses_pages_is_retried_not_accepted() {
    let mut driver = start(103, 12, 8, slow_rebuilds(), config());
    let region = driver.create_region(EC_8_2, 32).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let nodes = range_nodes(&driver, 0);
    // r nodes die: each rebuild has exactly k sources left.
    kill(&mut driver, nodes[0]);
    kill(&mut driver, nodes[1]);
    let started = driver
        .run_until_condition(driver.now() + LIMIT, |driver| driver.engine().ranges()[0].rebuilding == 0b11);
    assert!(started, "both rebuilds start\n{}", trace_of(&driver));
    // A source hiccups in the middle of the rebuilds (shorter than the request timeout, so the
    // client never fails it): the rebuilds lose the pages after it.
    driver.run_for(MILLISECOND);
    let until = driver.now() + 3 * MILLISECOND;
    driver.fault_now(nodes[2], FaultAction::Stall { until });
    let lossy = |driver: &SimDriver| {
        driver.cluster().regeneration_reports().iter().any(|report| report.pages_lost > 0)
    };
    assert!(
        driver.run_until_condition(driver.now() + LIMIT, lossy),
        "a rebuild loses pages\n{}",
        trace_of(&driver)
    );
    // Its report reaches the client: the slab must stay unavailable.
    driver.run_for(MILLISECOND);
    let range = &driver.engine().ranges()[0];
    for report in driver.cluster().regeneration_reports().iter().filter(|report| report.pages_lost > 0) {
        let split =
            range.slabs.iter().position(|slab| slab.node == report.node && slab.slab_id == report.slab_id);
        if let Some(split) = split {
            assert_ne!(
                range.unavailable & (1 << split),
                0,
                "a rebuild with holes was accepted\n{}",
                trace_of(&driver)
            );
        }
    }
    heal(&mut driver);
    let reports = driver.cluster().regeneration_reports();
    assert!(
        reports.iter().any(|report| report.pages_lost == 0 && report.pages_rebuilt > 0),
        "the retry completes"
    );
    verify_all(&mut driver, pages.clone(), |_| 1);
    // The rebuilt slabs hold every page: r more nodes of the range may die.
    kill(&mut driver, nodes[3]);
    kill(&mut driver, nodes[4]);
    verify_all(&mut driver, pages, |_| 1);
}

#[test]
fn corrupt_node_slab_stays_a_source_until_rebuilt() {
    let mut config = config();
    config.error_rate_min_samples = 16;
    config.error_correction_limit = 0.01;
    config.slab_regeneration_limit = 0.05;
    let mut driver = start(104, 12, 8, slow_rebuilds(), config);
    let region = driver.create_region(EC_8_2, 32).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let slabs = driver.engine().ranges()[0].slabs.clone();
    let (corrupt, dead, other) = (slabs[0], slabs[1], slabs[2]);
    let now = driver.now();
    // The corrupt node's split is bad on pages 0..24, another node's on pages 24..28: at most two
    // bad splits per page with the dead one, but pages 24..28 need the corrupt node's good split.
    for slot in 0..24 {
        driver.cluster_mut().corrupt_split(now, corrupt.node, corrupt.slab_id, slot, 100).unwrap();
    }
    for slot in 24..28 {
        driver.cluster_mut().corrupt_split(now, other.node, other.slab_id, slot, 100).unwrap();
    }
    // Reading the corrupt pages crosses the corruption threshold: the node's slab is rebuilt.
    verify_all(&mut driver, 0..24, |_| 1);
    let rebuilding = driver
        .run_until_condition(driver.now() + LIMIT, |driver| driver.engine().ranges()[0].rebuilding & 1 != 0);
    assert!(rebuilding, "corruption above the limit rebuilds the slab\n{}", trace_of(&driver));
    // A node of the range dies while the rebuild runs.
    driver.run_for(500 * MICROSECOND);
    kill(&mut driver, dead.node);
    heal(&mut driver);
    let target = driver.engine().ranges()[0].slabs[0];
    let first_report = driver
        .cluster()
        .regeneration_reports()
        .iter()
        .find(|report| report.node == target.node && report.slab_id == target.slab_id)
        .copied()
        .expect("the rebuild reported");
    assert_eq!(
        first_report.pages_lost,
        0,
        "pages 24..28 need the corrupt node's good splits: its old slab must stay a source\n{}",
        trace_of(&driver)
    );
    verify_all(&mut driver, pages, |_| 1);
}

#[test]
fn node_above_index_64_stalled_under_writes() {
    let mut driver = start(105, 100, 4, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 20 * 32).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let (range, node) = (0..driver.engine().ranges().len())
        .find_map(|range| {
            range_nodes(&driver, range).into_iter().find(|&node| node >= 64).map(|node| (range, node))
        })
        .expect("some range has a split on a node >= 64");
    let range_pages = range as u64 * 32..(range as u64 + 1) * 32;
    let until = driver.now() + 5 * REQUEST_TIMEOUT;
    driver.fault_now(node, FaultAction::Stall { until });
    write_all(&mut driver, range_pages.clone(), 2);
    assert_eq!(
        driver.dropped_nodes().iter().map(|(_, dropped)| *dropped).collect::<Vec<_>>(),
        vec![node],
        "the stalled node {node}, and only it, is declared failed\n{}",
        trace_of(&driver)
    );
    heal(&mut driver);
    verify_all(&mut driver, pages, |page| if range_pages.contains(&page) { 2 } else { 1 });
}

#[test]
fn added_node_takes_rebuilt_slabs() {
    // Ten nodes for k + r = 10: a lost slab has nowhere to go until a node joins.
    let mut driver = start(106, 10, 4, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let victim = range_nodes(&driver, 0)[4];
    kill(&mut driver, victim);
    driver.run_for(SECOND);
    assert!(!driver.is_healed(), "no node can take the slabs yet");
    let added = driver.add_node("d10".to_owned(), 4, SLAB_BYTES);
    heal(&mut driver);
    for (index, range) in driver.engine().ranges().iter().enumerate() {
        assert!(range.slabs.iter().any(|slab| slab.node == added), "range {index} moved to the new node");
    }
    assert_eq!(our_slabs_on(&driver, added).len(), 2, "the new node holds the rebuilt slabs");
    verify_all(&mut driver, pages.clone(), |_| 1);
    let others: Vec<usize> =
        range_nodes(&driver, 0).into_iter().filter(|&node| node != added).take(2).collect();
    for node in others {
        kill(&mut driver, node);
    }
    verify_all(&mut driver, pages, |_| 1);
}

/// A client that starts with two of twelve nodes dead (issue 14, item 3) places nothing on them,
/// probes them, and readmits them once they come back: the two rebuilds after two later deaths
/// can only go to them, since every range spans the ten nodes that answered at start.
#[test]
fn client_started_with_two_nodes_dead_readmits_them_when_they_return() {
    let seed = 108;
    let mut cluster = SimCluster::new(seed, NetworkOptions::default());
    for node in 0..12 {
        cluster.add_node(format!("d{node}"), 8, SLAB_BYTES);
    }
    let dead = [2, 5];
    for node in dead {
        cluster.apply_fault(0, &ScheduledFault { at: 0, node, action: FaultAction::Kill }).unwrap();
    }
    let mut driver = SimDriver::new(cluster, config(), PlacementPolicy::LeastLoaded, seed);
    driver.enable_trace();
    assert!(dead.iter().all(|&node| !driver.engine().node(node).connected));
    let region = driver.create_region(EC_8_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    assert!(dead.iter().all(|&node| !named_anywhere(&driver, node)), "no slab on a dead node");
    write_all(&mut driver, pages.clone(), 1);
    for node in dead {
        driver.fault_now(node, FaultAction::RestartEmpty);
    }
    let readmitted = driver.run_until_condition(driver.now() + LIMIT, |driver| {
        dead.iter().all(|&node| driver.engine().node(node).connected)
    });
    assert!(readmitted, "nodes dead at start that come back are readmitted\n{}", trace_of(&driver));
    let victims: Vec<usize> = range_nodes(&driver, 0).into_iter().take(2).collect();
    for node in victims {
        kill(&mut driver, node);
    }
    // Idle: heartbeats find the deaths.
    driver.run_for(SECOND);
    heal(&mut driver);
    let ranges: Vec<Vec<usize>> =
        (0..driver.engine().ranges().len()).map(|range| range_nodes(&driver, range)).collect();
    assert!(
        dead.iter().all(|&node| named_anywhere(&driver, node)),
        "the readmitted nodes took the rebuilds: {ranges:?}\n{}",
        trace_of(&driver)
    );
    verify_all(&mut driver, pages, |_| 1);
}

#[test]
fn drained_node_ends_with_no_slabs() {
    let mut driver = start(107, 12, 8, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 64).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    let drained = range_nodes(&driver, 0)[0];
    assert!(!our_slabs_on(&driver, drained).is_empty());
    // Drained while reads are in flight on it, and written to throughout.
    for page in pages.clone() {
        driver.submit(SimOp::Read { page });
    }
    driver.drain_node(drained);
    write_all(&mut driver, pages.clone(), 2);
    heal(&mut driver);
    driver.run_for(REQUEST_TIMEOUT);
    assert!(!named_anywhere(&driver, drained), "no range names the drained node");
    assert_eq!(our_slabs_on(&driver, drained), Vec::<u32>::new(), "its old slabs are released");
    assert!(driver.engine().node(drained).connected, "a drained node is not a failed one");
    assert_eq!(driver.dropped_nodes(), &[], "no node was dropped\n{}", trace_of(&driver));
    assert!(driver.first_protocol_violation().is_none(), "{:?}", driver.first_protocol_violation());
    verify_all(&mut driver, pages.clone(), |_| 2);
    let others: Vec<usize> = range_nodes(&driver, 1).into_iter().take(2).collect();
    for node in others {
        kill(&mut driver, node);
    }
    verify_all(&mut driver, pages, |_| 2);
}

// ---- engine bugs found by the simulator, kept as scenarios -------------------------------------

/// Runs a within-tolerance seed as it was when it found its bug: its workload had no data-only
/// or parity writes then, and a seed that now draws them would run another workload.
fn run_kept_seed(seed: u64) {
    let mut plan = ScenarioPlan::generate(seed, Tolerance::Within);
    plan.eor = false;
    if let Err(failure) = run_plan(&plan, Trace::Keep) {
        panic!("{failure}");
    }
}

/// After a reopen every page's version is unknown; a write before any read must still use a
/// version newer than every split of the page, or a split that misses the write (a dropped write)
/// passes for the new version and a rebuild decodes a mix of old and new bytes.
/// Within tolerance: one node drops a write, one node dies.
#[test]
fn write_after_reopen_is_newer_than_every_split_of_its_page() {
    let mut driver = start(108, 12, 8, NetworkOptions::default(), config());
    let region = driver.create_region(EC_8_2, 32).unwrap();
    let pages = region.first_page..region.first_page + region.page_count;
    write_all(&mut driver, pages.clone(), 1);
    driver.crash_client(InFlightFate::Delivered, MILLISECOND);
    driver.reopen();
    let nodes = range_nodes(&driver, 0);
    let (dropping, dying) = (nodes[2], nodes[3]);
    driver.fault_now(dropping, FaultAction::DropNextWrites { count: 1 });
    let page = 5;
    let id = driver.submit(SimOp::Write { page, data: page_pattern(page, 2) });
    // The write's splits have landed (one dropped) when another node of the range dies.
    driver.run_for(200 * MICROSECOND);
    kill(&mut driver, dying);
    assert!(driver.run_until_idle(driver.now() + LIMIT));
    let completion = driver.take_completed().into_iter().find(|completion| completion.id == id).unwrap();
    assert!(completion.result.is_ok(), "{:?}", completion.result);
    heal(&mut driver);
    verify_all(&mut driver, pages, |other| if other == page { 2 } else { 1 });
}

/// Seed 7520 of the within sweep, with no dropped write at all: node 9 is stalled when the client
/// reopens, so its slab of range 1 (split 0) is rebuilt on node 0, with node 9's slab kept as the
/// old source. The rebuild loses the pages the crash tore and waits to be retried. Page 35 is
/// written meanwhile (generation 2) with version 1, the version generation 1 has on node 9's
/// stale slab. Node 9 answers again; node 0 stalls and is failed; the retry goes to node 6 and
/// names node 9's stale slab as a source: its generation-1 split votes with the generation-2
/// ones, and page 35 reads back as a mix of both.
#[test]
fn reopened_client_reads_no_mix_of_generations_seed_7520() {
    run_kept_seed(7520);
}

/// Seed 17117 of the within sweep, no client crash: node 3 is killed and its slab of range 0
/// (slab id 1) is rebuilt on node 6, but the rebuild loses a page (a write raced it) and is
/// retried 200 ms later. Meanwhile node 3 restarts empty with the same node id and is
/// readmitted, and a rebuild of range 0 split 2 maps a new slab there: slab id 1 again. The retry
/// names the stale (node 3, slab 1) as a source of split 1, and on completion unmaps it: the
/// live slab of split 2 is destroyed while the engine still counts it available.
#[test]
fn restarted_node_keeps_the_slabs_mapped_in_its_new_life_seed_17117() {
    run_kept_seed(17117);
}

/// Seed 2676 of the within sweep: a `MapSlab` for a rebuild is sent to a node that is stalled;
/// the node is declared failed before it answers and the rebuild goes elsewhere, but when the
/// stall ends the node serves the queued `MapSlab`: a slab of ours no range names. The client
/// cannot learn its id (the answer went to a closed connection); it counts the abandoned
/// mapping, loses no data, and the slab waits for slab leases (the operations issue). The run
/// passes only if every leaked slab is accounted for that way.
#[test]
fn slab_mapped_by_a_node_after_it_was_declared_failed_is_counted_seed_2676() {
    run_kept_seed(2676);
}
