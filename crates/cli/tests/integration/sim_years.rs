//! `remem sim durability` as a user runs it: a tiny cluster over a few simulated years, with
//! racks seen by placement and ignored by it. Ten racks of six for EC(4,2): a rebuild always
//! finds a live rack the range does not use (with only k+r racks it may not, and crowded
//! rebuilds then lose data to a later rack failure: docs/PLACEMENT.md).

use std::process::Command;

fn durability(extra: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["sim", "durability", "--nodes", "60", "-k", "4", "-r", "2", "--rack-size", "6"])
        .args(["--slabs-per-node", "8", "--node-mttf-years", "0", "--transient-mttf-years", "0"])
        .args(["--rack-mttf-years", "1", "--years", "5", "--trials", "2", "--json", "--quiet"])
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success(), "sim durability failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("sim durability --json prints JSON")
}

#[test]
fn rack_failures_lose_data_only_when_placement_ignores_racks() {
    let aware = durability(&["--policies", "ec-cache,codingsets"]);
    let aware = aware.as_array().unwrap();
    assert_eq!(aware.len(), 2 + 2, "two policies, then rep(2) and rep(3)");
    assert_eq!(aware[2]["scheme"], "rep(2)");
    for row in aware {
        assert_eq!(row["years_simulated"], 10.0);
        assert!(row["rack_failures_per_year"].as_f64().unwrap() > 2.0, "{row}");
        assert_eq!(row["ranges_lost"], 0, "one split per rack: a rack alone loses nothing: {row}");
    }
    let unaware =
        durability(&["--policies", "ec-cache,codingsets", "--ignore-racks", "--replication-policy", "none"]);
    for row in unaware.as_array().unwrap() {
        assert!(row["ranges_lost"].as_u64().unwrap() > 0, "racks of 6 >= k+r placed unaware: {row}");
        assert!(row["expected_ranges_lost_per_year"].as_f64().unwrap() > 0.0, "{row}");
    }
}

#[test]
fn durability_prints_a_table_with_progress_on_stderr() {
    let output = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["sim", "durability", "--nodes", "40", "-k", "2", "-r", "1", "--rack-size", "4"])
        .args(["--years", "1", "--trials", "1", "--policies", "p2c-slab"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("EC(2,1)  p2c-slab") && table.contains("rep(3)"), "{table}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("trials"), "progress on stderr");
}
