//! PNG plots of a run against the optimizer step: `loss.png` (training in blue, evaluation in
//! red), `accuracy.png` (top-1 blue, top-5 green) or `perplexity.png` (red), and `lr.png`
//! (blue). Drawn with plotters' bitmap backend; text needs a TrueType font, found among the
//! system's fonts (or `OXTRAIN_PLOT_FONT`); without one the plots have lines and no labels.

use super::{EvalRecord, StepRecord};
use crate::runtime::TrainError;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One line of a plot: a legend name, a colour and (step, value) points.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

fn find_font() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OXTRAIN_PLOT_FONT") {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> =
        ["/usr/share/fonts", "/usr/local/share/fonts"].iter().map(PathBuf::from).collect();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".local/share/fonts"));
        dirs.push(Path::new(&home).join(".fonts"));
    }
    // DejaVu Sans or Liberation Sans when present, else the first TrueType font found.
    let mut found = Vec::new();
    let mut stack = dirs;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("ttf")) {
                found.push(p);
            }
        }
    }
    found.sort();
    let pick = |name: &str| found.iter().find(|p| p.file_name().is_some_and(|f| f == name)).cloned();
    pick("DejaVuSans.ttf").or_else(|| pick("LiberationSans-Regular.ttf")).or_else(|| found.first().cloned())
}

/// Registers a font once; whether text can be drawn.
fn have_font() -> bool {
    static FONT: OnceLock<bool> = OnceLock::new();
    *FONT.get_or_init(|| {
        let Some(bytes) = find_font().and_then(|p| std::fs::read(p).ok()) else { return false };
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 1e-3).max(1e-12);
    (lo - pad, hi + pad)
}

/// Draws `series` into `path` (800 x 480 PNG).
pub fn line_plot(path: &Path, title: &str, y_name: &str, series: &[Series]) -> Result<(), TrainError> {
    let err = |e: &dyn std::fmt::Display| TrainError::output(path, crate::Error::other(e.to_string()));
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (x0, x1) = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (y0, y1) = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let text = have_font();
    let mut builder = ChartBuilder::on(&root);
    builder.margin(16);
    if text {
        builder.caption(title, ("sans-serif", 22)).x_label_area_size(40).y_label_area_size(70);
    }
    let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(|e| err(&e))?;
    if text {
        chart.configure_mesh().x_desc("step").y_desc(y_name).draw().map_err(|e| err(&e))?;
    }
    for s in series {
        let color = s.color;
        let drawn = chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?;
        if text {
            drawn
                .label(s.name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        // A lone point has no line: mark every point, so short series show too.
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The run's plots, beside its metrics file.
pub fn write_all(dir: &Path, steps: &[StepRecord], evals: &[EvalRecord]) -> Result<(), TrainError> {
    let train: Vec<(f64, f64)> = steps.iter().map(|r| (r.step as f64, r.loss)).collect();
    let eval_loss: Vec<(f64, f64)> = evals.iter().map(|r| (r.step as f64, r.loss)).collect();
    line_plot(
        &dir.join("loss.png"),
        "loss",
        "loss",
        &[
            Series { name: "train", color: BLUE, points: train },
            Series { name: "eval", color: RED, points: eval_loss },
        ],
    )?;
    let metric = |name: &str| -> Vec<(f64, f64)> {
        evals
            .iter()
            .filter_map(|r| r.metrics.iter().find(|(n, _)| n == name).map(|(_, v)| (r.step as f64, *v)))
            .collect()
    };
    let top1 = metric("accuracy");
    if !top1.is_empty() {
        let mut series = vec![Series { name: "top-1", color: BLUE, points: top1 }];
        let top5 = metric("top5");
        if !top5.is_empty() {
            series.push(Series { name: "top-5", color: GREEN, points: top5 });
        }
        line_plot(&dir.join("accuracy.png"), "evaluation accuracy", "accuracy", &series)?;
    }
    let ppl = metric("perplexity");
    if !ppl.is_empty() {
        line_plot(
            &dir.join("perplexity.png"),
            "evaluation perplexity",
            "perplexity",
            &[Series { name: "eval", color: RED, points: ppl }],
        )?;
    }
    let lr: Vec<(f64, f64)> = steps.iter().map(|r| (r.step as f64, r.lr)).collect();
    line_plot(&dir.join("lr.png"), "learning rate", "lr", &[Series { name: "lr", color: BLUE, points: lr }])
}
