//! remem-plot: PNG plots with plotters' bitmap backend and a TrueType font from the system
//! ([`load_font`]): latency CDFs ([`latency_cdf`], `remem bench pages`) and point series
//! ([`points_plot`], `remem bench apps`). remem-sim's `remem sim` figures draw with plotters
//! themselves after [`load_font`]. A crate of its own so that the benchmarks and the simulator
//! share it without importing each other.
//!
//! Architecture Invariant: nothing here knows remem; it draws the numbers it is given.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// Font files tried in order; Debian's fonts-dejavu-core provides the first.
const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

pub fn load_font() -> Result<()> {
    for path in FONT_PATHS {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    anyhow::bail!("no TrueType font found for the plot (install fonts-dejavu-core); tried {FONT_PATHS:?}")
}

/// One line of the plot: a name and its latencies in nanoseconds, sorted ascending.
pub struct Series<'a> {
    pub name: &'a str,
    pub sorted_nanos: &'a [u64],
}

/// Draws the CDF of every series, x in microseconds up to the largest p99.9.
pub fn latency_cdf(path: &Path, title: &str, series: &[Series<'_>]) -> Result<()> {
    load_font()?;
    let x_max = series
        .iter()
        .filter(|s| !s.sorted_nanos.is_empty())
        .map(|s| s.sorted_nanos[(s.sorted_nanos.len() * 999 / 1000).min(s.sorted_nanos.len() - 1)])
        .max()
        .unwrap_or(1000) as f64
        / 1000.0
        * 1.1;
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("latency (us)")
        .y_desc("fraction of operations")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (index, line) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let count = line.sorted_nanos.len().max(1) as f64;
        // At most ~2000 points per line keeps the file small and the curve exact enough.
        let step = (line.sorted_nanos.len() / 2000).max(1);
        let points = line
            .sorted_nanos
            .iter()
            .enumerate()
            .step_by(step)
            .map(|(rank, &nanos)| (nanos as f64 / 1000.0, (rank + 1) as f64 / count));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(line.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One series of `points_plot`: its points, joined by a line or drawn as markers only.
pub struct PointSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub joined: bool,
}

/// Draws each series over x in `x_range` and y from 0 to a little above the largest y (at
/// least `y_floor`), each point marked with a circle.
pub fn points_plot(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    x_range: std::ops::Range<f64>,
    y_floor: f64,
    series: &[PointSeries],
) -> Result<()> {
    load_font()?;
    let y_max = series
        .iter()
        .flat_map(|line| line.points.iter().map(|&(_, y)| y))
        .filter(|y| y.is_finite())
        .fold(y_floor, f64::max)
        * 1.1;
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range, 0f64..y_max)?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).label_style(("sans-serif", 15)).draw()?;
    for (index, line) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points: Vec<(f64, f64)> = line.points.iter().copied().filter(|(_, y)| y.is_finite()).collect();
        if line.joined {
            chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        }
        chart
            .draw_series(points.iter().map(|&point| Circle::new(point, 5, color.filled())))?
            .label(line.name.as_str())
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
