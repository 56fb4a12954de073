//! `remem-sim`: the availability and load-balance simulator behind `remem sim`.
//!
//! It places ranges with the placement code the cluster runs (`remem-placement`), then
//! measures (a) the probability of losing data when f% of N nodes fail at once, by the seed's
//! closed form ([`closed_form`]) and by Monte Carlo over the actual layouts ([`layout`]), and
//! (b) load balance (max/mean and coefficient of variation of slabs per node). [`run`] holds
//! the scenarios, the experiments of seed 000 Figures 15 and 16 and the job runner; this file
//! writes the rows as a table or CSV (JSON is `serde_json` over [`Row`]). With the `cli` feature,
//! `cli` is the `remem sim` command itself (arguments, progress, the PNG figures).
//!
//! Fault model: nodes fail together, uniformly at random, F = round(N*f) of them; a range is
//! lost when more than r of its k+r nodes failed. Every node is its own failure domain and has
//! room for any number of slabs. The simulator does no I/O besides the writers it is given.

#[cfg(feature = "cli")]
pub mod cli;
pub mod closed_form;
pub mod durability;
pub mod layout;
pub mod policy;
pub mod run;

pub use policy::Policy;
pub use run::{run_job, run_jobs, Budget, Job, Row, Scenario};

use std::io::{self, Write};

/// CSV columns, in order.
pub const CSV_HEADER: &str = "experiment,policy,nodes,data_splits,parity_splits,load_balancing_factor,\
slabs_per_node,failed_percent,failed_nodes,ranges,loss_closed_form,copysets,loss_copysets_form,\
loss_monte_carlo,loss_standard_error,loss_upper_95,trials,losing_trials,load_max_over_mean,\
load_coefficient_of_variation,layouts,seconds";

fn optional<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

/// Writes `rows` as CSV with [`CSV_HEADER`]; empty fields are values not computed.
pub fn write_csv(rows: &[Row], out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    for row in rows {
        let s = &row.scenario;
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{:e},{},{},{},{},{},{},{},{:.6},{:.6},{},{:.3}",
            row.experiment,
            row.policy.name(),
            s.nodes,
            s.data_splits,
            s.parity_splits,
            s.load_balancing_factor,
            s.slabs_per_node,
            s.failed_percent,
            row.failed_nodes,
            row.ranges,
            row.loss_closed_form,
            optional(row.copysets),
            optional(row.loss_copysets_form.map(|v| format!("{v:e}"))),
            optional(row.loss_monte_carlo.map(|v| format!("{v:e}"))),
            optional(row.loss_standard_error.map(|v| format!("{v:e}"))),
            optional(row.loss_upper_95.map(|v| format!("{v:e}"))),
            row.trials,
            row.losing_trials,
            row.load_max_over_mean,
            row.load_coefficient_of_variation,
            row.layouts,
            row.seconds,
        )?;
    }
    Ok(())
}

/// A probability with three significant digits, or "-".
fn probability(value: Option<f64>) -> String {
    match value {
        Some(0.0) => "0".into(),
        Some(v) => format!("{v:.2e}"),
        None => "-".into(),
    }
}

/// Writes `rows` as an aligned table, one block per experiment, with each row's Monte Carlo
/// loss beside the closed form as a ratio.
pub fn write_table(rows: &[Row], out: &mut dyn Write) -> io::Result<()> {
    let mut experiment = "";
    for row in rows {
        if row.experiment != experiment {
            experiment = &row.experiment;
            writeln!(out, "\n== {experiment}")?;
            writeln!(
                out,
                "{:<17} {:>7} {:>2} {:>2} {:>2} {:>4} {:>5} | {:>9} {:>9} {:>9} {:>19} {:>6} {:>9} | {:>8} {:>6}",
                "policy",
                "N",
                "k",
                "r",
                "l",
                "S",
                "f%",
                "closed",
                "copysets",
                "cs-form",
                "monte carlo +- se",
                "mc/cf",
                "trials",
                "max/mean",
                "cv"
            )?;
        }
        let s = &row.scenario;
        let monte_carlo = match (row.loss_monte_carlo, row.loss_standard_error) {
            (Some(_), Some(_)) if row.losing_trials == 0 => format!("0 (<{:.1e})", 3.0 / row.trials as f64),
            (Some(p), Some(se)) => format!("{} +- {:.1e}", probability(Some(p)), se),
            _ => "-".into(),
        };
        let ratio = match row.loss_monte_carlo {
            Some(p) if row.loss_closed_form > 0.0 && row.losing_trials > 0 => {
                format!("{:.2}", p / row.loss_closed_form)
            }
            _ => "-".into(),
        };
        writeln!(
            out,
            "{:<17} {:>7} {:>2} {:>2} {:>2} {:>4} {:>5} | {:>9} {:>9} {:>9} {:>19} {:>6} {:>9} | {:>8.3} {:>6.3}",
            row.policy.name(),
            s.nodes,
            s.data_splits,
            s.parity_splits,
            if row.policy.is_coding_sets() { s.load_balancing_factor.to_string() } else { "-".into() },
            s.slabs_per_node,
            s.failed_percent,
            probability(Some(row.loss_closed_form)),
            optional(row.copysets),
            probability(row.loss_copysets_form),
            monte_carlo,
            ratio,
            if row.loss_monte_carlo.is_some() { row.trials.to_string() } else { "-".into() },
            row.load_max_over_mean,
            row.load_coefficient_of_variation,
        )?;
    }
    Ok(())
}
