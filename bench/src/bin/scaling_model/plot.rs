//! The plots of docs/scaling.md (plotters, PNG): measured all-reduces beside the model, and
//! predicted scaling efficiency.

use crate::cluster::Algo;
use crate::fit::Point;
use crate::{fail, report, Model, SCALES};
use plotters::prelude::*;
use std::path::Path;

/// Registers a TrueType font as "sans-serif" for the labels: `--font`, else
/// OXTRAIN_PLOT_FONT, else DejaVu Sans where distributions install it (fonts-dejavu-core).
pub fn load_font(explicit: Option<&Path>) -> &'static str {
    let env = std::env::var("OXTRAIN_PLOT_FONT").ok();
    let candidates: Vec<String> =
        explicit.map(|p| vec![p.display().to_string()]).or(env.map(|e| vec![e])).unwrap_or_else(|| {
            [
                "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/TTF/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            ]
            .map(String::from)
            .to_vec()
        });
    for c in &candidates {
        if let Ok(bytes) = std::fs::read(c) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return "sans-serif";
            }
        }
    }
    fail(&format!("no TrueType font for the plots among {candidates:?}: install fonts-dejavu-core or pass --font FILE.ttf"))
}

fn log_sizes(lo: f64, hi: f64) -> Vec<f64> {
    let mut v = vec![];
    let mut n = lo;
    while n <= hi * 1.0001 {
        v.push(n);
        n *= 1.25;
    }
    v
}

type Series<'a> = (String, &'a [Point], Box<dyn Fn(f64) -> f64 + 'a>);

fn panel(area: &DrawingArea<BitMapBackend, plotters::coord::Shift>, title: &str, series: &[Series]) {
    let lo = series.iter().flat_map(|s| s.1.iter().map(|p| p.bytes)).fold(f64::INFINITY, f64::min);
    let hi = series.iter().flat_map(|s| s.1.iter().map(|p| p.bytes)).fold(0.0, f64::max);
    let tmin = series.iter().flat_map(|s| s.1.iter().map(|p| p.us)).fold(f64::INFINITY, f64::min);
    let tmax = series.iter().flat_map(|s| s.1.iter().map(|p| p.us)).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), (tmin / 1.5..tmax * 1.5).log_scale())
        .unwrap_or_else(|e| fail(&format!("plot: {e}")));
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("time per all-reduce (us)")
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .draw()
        .unwrap_or_else(|e| fail(&format!("plot: {e}")));
    for (i, (name, pts, pred)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(pts.iter().map(|p| Circle::new((p.bytes, p.us), 3, color.filled())))
            .unwrap_or_else(|e| fail(&format!("plot: {e}")))
            .label(format!("{name}: measured (dots), model (line)"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 3, color.filled()));
        chart
            .draw_series(LineSeries::new(
                log_sizes(lo, hi).into_iter().map(|n| (n, pred(n))),
                color.stroke_width(2),
            ))
            .unwrap_or_else(|e| fail(&format!("plot: {e}")));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .unwrap_or_else(|e| fail(&format!("plot: {e}")));
}

/// Left: the 2xH200 all-reduces and their fits; right: the CPU ones across namespaces, with
/// the 2 hosts x 2 ranks runs predicted from the others.
pub fn all_reduce_fits(m: &Model, path: &Path) {
    let root = BitMapBackend::new(path, (1600, 650)).into_drawing_area();
    root.fill(&WHITE).unwrap_or_else(|e| fail(&format!("plot: {e}")));
    let (left, right) = root.split_horizontally(800);
    let gpu: Vec<Series> = m
        .gpu_checks
        .iter()
        .filter(|c| c.3)
        .map(|(name, pts, f, _)| {
            (
                name.split(',').next().unwrap_or("").to_string(),
                pts.as_slice(),
                Box::new(move |n| f.predict_us(n)) as Box<dyn Fn(f64) -> f64>,
            )
        })
        .collect();
    panel(&left, "all-reduce, 2x H200 (fitted per size band)", &gpu);
    let mut cpu: Vec<Series> = m
        .cpu_points
        .iter()
        .zip(m.cpu_fits.iter())
        .map(|((name, pts), f)| {
            (
                format!("{name} (fitted)"),
                pts.as_slice(),
                Box::new(move |n| f.predict_us(n)) as Box<dyn Fn(f64) -> f64>,
            )
        })
        .collect();
    for (name, pts, c, algo) in &m.cpu_checks {
        let (c, algo) = (c.clone(), *algo);
        let short = name.split(", ").nth(1).unwrap_or(name).to_string();
        cpu.push((
            format!("2x2 {short} (predicted)"),
            pts.as_slice(),
            Box::new(move |n| c.all_reduce_us(n, 2, algo)),
        ));
    }
    panel(&right, "all-reduce, CPU: hosts as network namespaces", &cpu);
    root.present().unwrap_or_else(|e| fail(&format!("writing {}: {e}", path.display())));
}

/// Predicted scaling efficiency against GPUs, one panel per model (NCCL's fit inside nodes).
pub fn efficiency(m: &Model, path: &Path) {
    let root = BitMapBackend::new(path, (1600, 600)).into_drawing_area();
    root.fill(&WHITE).unwrap_or_else(|e| fail(&format!("plot: {e}")));
    let areas = root.split_evenly((1, m.profiles.len()));
    let (backend, c) = &m.clusters[0];
    for (area, p) in areas.iter().zip(&m.profiles) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{} (inside nodes: {backend})", p.name), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((6f64..1400f64).log_scale(), 0f64..105f64)
            .unwrap_or_else(|e| fail(&format!("plot: {e}")));
        chart
            .configure_mesh()
            .x_desc("GPUs (8 per node)")
            .y_desc("scaling efficiency (%)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .unwrap_or_else(|e| fail(&format!("plot: {e}")));
        let mut i = 0;
        for algo in [Algo::Flat, Algo::Hierarchical] {
            for overlap in [true, false] {
                let color = Palette99::pick(i).to_rgba();
                i += 1;
                let pts: Vec<(f64, f64)> = SCALES
                    .iter()
                    .map(|&g| {
                        (g as f64, 100.0 * p.compute_ms() / report::predict(p, c, g, algo, overlap).step_ms)
                    })
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .unwrap_or_else(|e| fail(&format!("plot: {e}")))
                    .label(format!("{}, {}", algo.name(), if overlap { "overlap" } else { "no overlap" }))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                chart
                    .draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, color.filled())))
                    .unwrap_or_else(|e| fail(&format!("plot: {e}")));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .unwrap_or_else(|e| fail(&format!("plot: {e}")));
    }
    root.present().unwrap_or_else(|e| fail(&format!("writing {}: {e}", path.display())));
}
