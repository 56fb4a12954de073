//! PNG figures of `remem sim`, drawn like seed 000 Figures 15 and 16 (reconstructed from the
//! seed's captions and text): loss probability against r, l, S and f at N=1000, and load
//! balance (max/mean slabs per node) against the cluster size and against l.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Policy, Row};
use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// One named line of (x, y) points.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Lines of one panel keyed by name, points sorted by x.
fn collect(
    rows: &[&Row],
    x: impl Fn(&Row) -> f64,
    lines: impl Fn(&Row) -> Vec<(String, Option<f64>)>,
) -> Vec<Line> {
    let mut map: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for row in rows {
        for (name, y) in lines(row) {
            if let Some(y) = y {
                map.entry(name).or_default().push((x(row), y));
            }
        }
    }
    map.into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points.dedup_by(|a, b| a.0 == b.0);
            Line { name, points }
        })
        .collect()
}

fn draw_panel(
    area: &Area<'_>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
    log_x: bool,
    log_y: bool,
) -> Result<()> {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let ys: Vec<f64> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).filter(|y| *y > 0.0).collect();
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (x_min, x_max) = if x_min > x_max {
        (0.0, 1.0)
    } else if x_min == x_max {
        (x_min - 1.0, x_max + 1.0)
    } else {
        (x_min, x_max)
    };
    let y_lo = ys.iter().copied().fold(f64::MAX, f64::min);
    let y_hi = ys.iter().copied().fold(f64::MIN, f64::max);
    let (y_lo, y_hi) = if ys.is_empty() { (1e-6, 1.0) } else { (y_lo, y_hi) };
    let mut builder = ChartBuilder::on(area);
    builder.caption(title, ("sans-serif", 18)).margin(10).x_label_area_size(36).y_label_area_size(64);
    // Four axis kinds are four chart types in plotters; one macro body draws them all.
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).label_style(("sans-serif", 13)).draw()?;
            for (index, line) in lines.iter().enumerate() {
                let color = Palette99::pick(index).to_rgba();
                let points: Vec<(f64, f64)> =
                    line.points.iter().copied().filter(|p| !log_y || p.1 > 0.0).collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                    .label(line.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 12))
                .position(SeriesLabelPosition::LowerRight)
                .draw()?;
        }};
    }
    let y_range =
        if log_y { (y_lo / 2.0)..(y_hi * 2.0).min(1.5) } else { (y_lo * 0.95).min(1.0)..(y_hi * 1.05) };
    match (log_x, log_y) {
        (true, true) => draw!(builder.build_cartesian_2d((x_min..x_max).log_scale(), y_range.log_scale())?),
        (true, false) => draw!(builder.build_cartesian_2d((x_min..x_max).log_scale(), y_range)?),
        (false, true) => draw!(builder.build_cartesian_2d(x_min..x_max, y_range.log_scale())?),
        (false, false) => draw!(builder.build_cartesian_2d(x_min..x_max, y_range)?),
    }
    Ok(())
}

/// Loss lines of a Figure 15 panel: Monte Carlo per policy (points with no loss are left
/// out of the log axis), and the seed's closed form for random placement and for CodingSets.
fn loss_lines(row: &Row) -> Vec<(String, Option<f64>)> {
    let mut lines = vec![(
        format!("{} (monte carlo)", row.policy.name()),
        row.loss_monte_carlo.filter(|_| row.losing_trials > 0),
    )];
    match row.policy {
        Policy::EcCache => lines.push(("closed form: random".into(), Some(row.loss_closed_form))),
        Policy::CodingSets => lines.push(("closed form: codingsets".into(), Some(row.loss_closed_form))),
        _ => {}
    }
    lines
}

/// Figure 15: probability of data loss at N=1000 against r, l, S and f (one panel each, the
/// other parameters at k=8, r=2, l=2, S=16, f=1%).
pub fn figure15(path: &Path, rows: &[Row]) -> Result<()> {
    remem_plot::load_font()?;
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    type Axis = fn(&Row) -> f64;
    let specs: [(&str, &str, &str, Axis, bool); 4] = [
        ("fig15-r", "(a) parity splits r", "r", |r| r.scenario.parity_splits as f64, false),
        ("fig15-l", "(b) load-balancing factor l", "l", |r| r.scenario.load_balancing_factor as f64, false),
        ("fig15-S", "(c) slabs per node S", "S", |r| r.scenario.slabs_per_node as f64, true),
        ("fig15-f", "(d) failed nodes f", "f (%)", |r| r.scenario.failed_percent, false),
    ];
    for (area, (experiment, title, x_desc, x, log_x)) in panels.iter().zip(specs) {
        let selected: Vec<&Row> = rows.iter().filter(|r| r.experiment == experiment).collect();
        let lines = collect(&selected, x, loss_lines);
        draw_panel(area, title, x_desc, "probability of data loss", &lines, log_x, true)?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Figure 16: max/mean slabs per node (k=8, r=2, S=16) against N, and against l at N=1000.
pub fn figure16(path: &Path, rows: &[Row]) -> Result<()> {
    remem_plot::load_font()?;
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 2));
    let by_nodes: Vec<&Row> = rows.iter().filter(|r| r.experiment == "fig16-nodes").collect();
    let lines = collect(
        &by_nodes,
        |r| r.scenario.nodes as f64,
        |r| {
            let name = if r.policy.is_coding_sets() {
                format!("{} l={}", r.policy.name(), r.scenario.load_balancing_factor)
            } else {
                r.policy.name().to_string()
            };
            vec![(name, Some(r.load_max_over_mean))]
        },
    );
    draw_panel(
        &panels[0],
        "(a) load imbalance vs cluster size",
        "nodes N",
        "max / mean slabs per node",
        &lines,
        true,
        false,
    )?;
    let by_extra: Vec<&Row> = rows.iter().filter(|r| r.experiment == "fig16-l").collect();
    let lines = collect(
        &by_extra,
        |r| r.scenario.load_balancing_factor as f64,
        |r| vec![(r.policy.name().to_string(), Some(r.load_max_over_mean))],
    );
    draw_panel(
        &panels[1],
        "(b) load imbalance vs l (N=1000)",
        "l",
        "max / mean slabs per node",
        &lines,
        false,
        false,
    )?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
