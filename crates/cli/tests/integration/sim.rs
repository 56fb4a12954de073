//! `remem sim` as a user runs it: a sweep as JSON and CSV, and the figures as PNG.

use std::process::Command;

fn remem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_remem"))
}

#[test]
fn sim_sweep_prints_json_and_writes_csv_for_every_policy() {
    let dir = std::env::temp_dir().join(format!("remem-test-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("sim.csv");
    let output = remem()
        .args(["sim", "--nodes", "60", "-k", "4", "-r", "1", "-l", "1", "--slabs-per-node", "4"])
        .args(["--failed-percent", "5,10", "--layouts", "2", "--max-trials", "2000", "--json", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(output.status.success(), "sim failed: {}", String::from_utf8_lossy(&output.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).expect("sim --json prints JSON");
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2 * 6, "two failure rates times six policies");
    for row in rows {
        assert_eq!(row["nodes"], 60);
        assert!(row["loss_monte_carlo"].as_f64().unwrap() >= 0.0);
        assert!(row["load_max_over_mean"].as_f64().unwrap() >= 1.0);
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 1 + rows.len());
    assert!(text.starts_with("experiment,policy,nodes,"));
    assert!(text.contains(",codingsets-p2c,60,4,1,1,4,5,3,"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sim_smoke_draws_both_figures() {
    let dir = std::env::temp_dir().join(format!("remem-test-sim-plot-{}", std::process::id()));
    let output = remem().args(["sim", "--smoke", "--quiet", "--plot-dir"]).arg(&dir).output().unwrap();
    assert!(output.status.success(), "sim failed: {}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("== acceptance") && table.contains("== fig16-l"), "{table}");
    for name in ["figure15.png", "figure16.png"] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{name} is a PNG");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sim_rejects_an_unknown_policy() {
    let output = remem().args(["sim", "--nodes", "20", "--policies", "nope"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown policy"));
}
