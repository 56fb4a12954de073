//! `remem bench codec`: nanoseconds per page of remem's codec beside Intel ISA-L.
//!
//! The ISA-L baseline is Debian's libisal (libisal-dev), measured by `remem-isal-baseline`, a
//! separate binary of this workspace: a separate process, because remem's codec links its own
//! ISA-L build and the two must never share one address space (same symbol names). Both
//! measure the same way (remem_codec::bench's method) on the same machine in the same run.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use remem_codec::bench::{measure, CodecTimings};
use remem_codec::{new_codec, CodecParams, ReferenceCodec};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, Serialize)]
struct Baseline {
    library: String,
    encode_ns: f64,
    decode_one_lost_ns: Option<f64>,
    decode_two_lost_ns: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Row {
    codec: String,
    encode_ns: f64,
    decode_one_lost_ns: Option<f64>,
    decode_two_lost_ns: Option<f64>,
}

pub fn run(
    k: usize,
    r: usize,
    page_bytes: usize,
    iterations: usize,
    json: bool,
    binary: &Path,
) -> Result<()> {
    let params = CodecParams::new(k, r, page_bytes).context("coding parameters")?;
    let baseline_binary = binary.with_file_name("remem-isal-baseline");
    if !baseline_binary.exists() {
        bail!(
            "{} not found: build it with the same profile as this remem, e.g. `cargo build --release -p remem-isal-baseline` (needs Debian's libisal-dev, see scripts/setup.sh)",
            baseline_binary.display()
        );
    }
    let mut rows = Vec::new();
    // Interleave the two so that machine noise hits both alike; keep the median of 3 runs.
    let mut ours_runs: Vec<CodecTimings> = Vec::new();
    let mut baseline_runs: Vec<Baseline> = Vec::new();
    for _ in 0..3 {
        ours_runs.push(measure(new_codec(params).as_mut(), iterations));
        let output = Command::new(&baseline_binary)
            .args(["--data-splits", &k.to_string(), "--parity-splits", &r.to_string()])
            .args(["--page-bytes", &page_bytes.to_string(), "--iterations", &iterations.to_string()])
            .output()
            .with_context(|| format!("running {}", baseline_binary.display()))?;
        if !output.status.success() {
            bail!("{} failed: {}", baseline_binary.display(), String::from_utf8_lossy(&output.stderr));
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text.lines().last().unwrap_or_default();
        baseline_runs
            .push(serde_json::from_str(line).with_context(|| format!("parsing baseline output {line:?}"))?);
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let median_option = |values: Vec<Option<f64>>| -> Option<f64> {
        let present: Vec<f64> = values.into_iter().flatten().collect();
        (!present.is_empty()).then(|| median(present))
    };
    let ours = Row {
        codec: "remem (erasure-isa-l, ISA-L 2.32 built from source)".into(),
        encode_ns: median(ours_runs.iter().map(|t| t.encode_ns).collect()),
        decode_one_lost_ns: median_option(ours_runs.iter().map(|t| t.decode_one_lost_ns).collect()),
        decode_two_lost_ns: median_option(ours_runs.iter().map(|t| t.decode_two_lost_ns).collect()),
    };
    let base = Row {
        codec: baseline_runs[0].library.clone(),
        encode_ns: median(baseline_runs.iter().map(|t| t.encode_ns).collect()),
        decode_one_lost_ns: median_option(baseline_runs.iter().map(|t| t.decode_one_lost_ns).collect()),
        decode_two_lost_ns: median_option(baseline_runs.iter().map(|t| t.decode_two_lost_ns).collect()),
    };
    let reference = measure(&mut ReferenceCodec::new(params), (iterations / 50).max(10));
    let reference_row = Row {
        codec: "remem scalar reference (tests only)".into(),
        encode_ns: reference.encode_ns,
        decode_one_lost_ns: reference.decode_one_lost_ns,
        decode_two_lost_ns: reference.decode_two_lost_ns,
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let ratios = [
        ("encode", Some(ours.encode_ns / base.encode_ns)),
        ("decode, 1 lost", ratio(ours.decode_one_lost_ns, base.decode_one_lost_ns)),
        ("decode, 2 lost", ratio(ours.decode_two_lost_ns, base.decode_two_lost_ns)),
    ];
    if json {
        let ratios_json: Vec<_> = ratios
            .iter()
            .map(|(name, value)| serde_json::json!({"name": name, "remem_over_isal": value}))
            .collect();
        rows.extend([ours, base, reference_row]);
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"k": k, "r": r, "page_bytes": page_bytes, "rows": rows, "ratios": ratios_json})
            )?
        );
        return Ok(());
    }
    println!("EC({k},{r}), {page_bytes}-byte page, ns per page (median of 3 runs, cache hot):");
    println!("{:<56} {:>9} {:>14} {:>14}", "codec", "encode", "decode 1 lost", "decode 2 lost");
    let show = |value: Option<f64>| value.map_or("-".to_string(), |v| format!("{v:.1}"));
    for row in [&ours, &base, &reference_row] {
        println!(
            "{:<56} {:>9.1} {:>14} {:>14}",
            row.codec,
            row.encode_ns,
            show(row.decode_one_lost_ns),
            show(row.decode_two_lost_ns)
        );
    }
    println!();
    for (name, value) in ratios {
        if let Some(value) = value {
            println!(
                "remem / ISA-L {name:<16} {value:>5.2}  (target <= 1.2: {})",
                if value <= 1.2 { "met" } else { "NOT met" }
            );
        }
    }
    Ok(())
}
