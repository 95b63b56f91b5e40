//! The generated tables of docs/scaling.md.

use crate::cluster::Algo;
use crate::ddp;
use crate::fit::{Fit, Point};
use crate::{fail, Model, GPUS_PER_NODE, SCALES};
use std::fmt::Write;
use std::path::Path;

fn size(bytes: f64) -> String {
    let b = bytes as u64;
    match b {
        _ if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        _ if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        _ if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        _ => format!("{b} B"),
    }
}

/// A checked series: its name, the measured points, and the model's prediction (us by bytes).
type Checked<'a> = (String, Vec<Point>, Box<dyn Fn(f64) -> f64 + 'a>);

fn err_pct(model: f64, measured: f64) -> f64 {
    100.0 * (model - measured) / measured
}

fn fits_table(fits: &[Fit]) -> String {
    let mut s = String::from("| series | band | a (us) | b (GB/s) |\n| --- | --- | --- | --- |\n");
    for f in fits {
        let mut lo = 0.0;
        for b in &f.bands {
            let band = if b.hi.is_finite() {
                format!("{} - {}", size(lo), size(b.hi))
            } else {
                format!("above {}", size(lo))
            };
            let gbps = if b.gbps.is_finite() { format!("{:.2}", b.gbps) } else { "(latency only)".into() };
            let _ = writeln!(s, "| {} | {band} | {:.2} | {gbps} |", f.name, b.a_us);
            lo = b.hi;
        }
    }
    s
}

/// Mean and largest absolute relative error of `pred` over `points`.
fn error_summary(points: &[Point], pred: impl Fn(f64) -> f64) -> (f64, f64) {
    let errs: Vec<f64> = points.iter().map(|p| err_pct(pred(p.bytes), p.us).abs()).collect();
    (errs.iter().sum::<f64>() / errs.len() as f64, errs.iter().cloned().fold(0.0, f64::max))
}

/// One table, one row per size, three columns (measured, model, error) per series.
fn check_table(series: &[Checked]) -> String {
    let mut s = String::from("| size |");
    let mut rule = String::from("| --- |");
    for (name, _, _) in series {
        let _ = write!(s, " {name}: measured (us) | model (us) | error |");
        rule.push_str(" --- | --- | --- |");
    }
    let _ = writeln!(s, "\n{rule}");
    let mut sizes: Vec<f64> = series.iter().flat_map(|(_, p, _)| p.iter().map(|p| p.bytes)).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    for n in sizes {
        let _ = write!(s, "| {} |", size(n));
        for (_, pts, pred) in series {
            match pts.iter().find(|p| p.bytes == n) {
                Some(p) => {
                    let m = pred(n);
                    let _ = write!(s, " {:.2} | {:.2} | {:+.1}% |", p.us, m, err_pct(m, p.us));
                }
                None => s.push_str(" | | |"),
            }
        }
        s.push('\n');
    }
    s.push('\n');
    for (name, pts, pred) in series {
        let (mean, max) = error_summary(pts, pred);
        let _ = writeln!(
            s,
            "- {name}: mean absolute error {mean:.1}%, largest {max:.1}% over {} sizes",
            pts.len()
        );
    }
    s
}

fn gpu_checks(m: &Model) -> String {
    let series: Vec<Checked> = m
        .gpu_checks
        .iter()
        .map(|(name, pts, f, _)| {
            (name.clone(), pts.clone(), Box::new(move |n| f.predict_us(n)) as Box<dyn Fn(f64) -> f64>)
        })
        .collect();
    check_table(&series)
}

fn cpu_checks(m: &Model) -> String {
    let series: Vec<Checked> = m
        .cpu_checks
        .iter()
        .map(|(name, pts, c, algo)| {
            let (c, algo) = (c.clone(), *algo);
            (
                format!("{name} ({} model)", algo.name()),
                pts.clone(),
                Box::new(move |n| c.all_reduce_us(n, 2, algo)) as Box<dyn Fn(f64) -> f64>,
            )
        })
        .collect();
    let mut s = check_table(&series);
    if !m.cpu_notes.is_empty() {
        let _ = writeln!(s, "\nMeasurement notes: {}", m.cpu_notes);
    }
    s
}

/// The CPU DDP steps, measured and predicted, with the error of each.
fn ddp_checks(m: &Model) -> String {
    if m.cpu_ddp.is_empty() {
        return "No CPU DDP step has been measured yet: run `scripts/netns/ddp_step.sh` (see below).\n"
            .into();
    }
    let mut s = String::from(
        "| run | ranks | buckets | overlap | a rank's compute alone (ms) | measured step (ms) | model step (ms) | error | measured exposed comm (ms) | model exposed comm (ms) | measured all-reduce (ms) | model all-reduce (ms) | error |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for c in &m.cpu_ddp {
        let (ms, ps) = (c.measured.step_ms, c.predicted.step_ms);
        let (ma, pa) = (c.measured.all_reduce_ms(), c.predicted.comm_ms);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {ms:.1} | {ps:.1} | {:+.1}% | {:.1} | {:.1} | {ma:.1} | {pa:.1} | {:+.1}% |",
            c.label,
            c.ranks,
            c.buckets,
            if c.overlap { "yes" } else { "no" },
            c.compute_ms,
            err_pct(ps, ms),
            c.measured.exposed_ms,
            c.predicted.exposed_ms,
            err_pct(pa, ma),
        );
    }
    let errs: Vec<f64> =
        m.cpu_ddp.iter().map(|c| err_pct(c.predicted.step_ms, c.measured.step_ms).abs()).collect();
    let _ = writeln!(
        s,
        "\n- step time: mean absolute error {:.1}%, largest {:.1}% over {} runs",
        errs.iter().sum::<f64>() / errs.len() as f64,
        errs.iter().cloned().fold(0.0, f64::max),
        errs.len()
    );
    if let Some(one) = m.one_process_ms {
        let _ = writeln!(s, "- one process (a group of one, the same program): {one:.1} ms per step");
    }
    if !m.cpu_ddp_notes.is_empty() {
        let _ = writeln!(s, "\nMeasurement notes: {}", m.cpu_ddp_notes);
    }
    s
}

/// The predicted step of `p` at `gpus` GPUs on cluster `c`.
pub fn predict(
    p: &ddp::Profile,
    c: &crate::cluster::Cluster,
    gpus: usize,
    algo: Algo,
    overlap: bool,
) -> ddp::Step {
    let buckets = ddp::buckets(p, 1048576.0, 25.0 * 1048576.0);
    let nodes = gpus.div_ceil(GPUS_PER_NODE);
    ddp::step(p, &buckets, overlap, |bytes| c.all_reduce_us(bytes, nodes, algo) / 1e3)
}

fn predictions(m: &Model) -> String {
    let mut s = String::new();
    for (backend, c) in &m.clusters {
        for p in &m.profiles {
            let buckets = ddp::buckets(p, 1048576.0, 25.0 * 1048576.0);
            let _ = writeln!(
                s,
                "**{}**, inside the node: {backend}'s fit; one GPU's step {:.1} ms (forward {:.1}, backward {:.1}, optimizer {:.1}); {:.0} MB of fp32 gradients in {} buckets\n",
                p.name,
                p.compute_ms(),
                p.forward_ms,
                p.backward_ms,
                p.optimizer_ms,
                p.grad_bytes() / 1e6,
                buckets.len()
            );
            s.push_str("| GPUs | all-reduce | comm per step (ms) | step, no overlap (ms) | efficiency | step, overlap (ms) | exposed comm (ms) | efficiency |\n");
            s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
            for gpus in SCALES {
                for algo in [Algo::Flat, Algo::Hierarchical] {
                    if gpus <= GPUS_PER_NODE && algo == Algo::Hierarchical {
                        continue; // one node: the same ring
                    }
                    let (no, yes) = (predict(p, c, gpus, algo, false), predict(p, c, gpus, algo, true));
                    let eff = |st: ddp::Step| 100.0 * p.compute_ms() / st.step_ms;
                    let label = if gpus <= GPUS_PER_NODE { "ring (one node)" } else { algo.name() };
                    let _ = writeln!(
                        s,
                        "| {gpus} | {label} | {:.1} | {:.1} | {:.0}% | {:.1} | {:.1} | {:.0}% |",
                        no.comm_ms,
                        no.step_ms,
                        eff(no),
                        yes.step_ms,
                        yes.exposed_ms,
                        eff(yes)
                    );
                }
            }
            s.push('\n');
        }
    }
    s
}

/// (name, markdown) of every generated section.
pub fn sections(m: &Model) -> Vec<(&'static str, String)> {
    let mut fits = m.gpu_fits.clone();
    fits.extend(m.cpu_fits.iter().cloned());
    vec![
        ("fits", fits_table(&fits)),
        ("gpu-checks", gpu_checks(m)),
        ("cpu-checks", cpu_checks(m)),
        ("ddp-checks", ddp_checks(m)),
        ("predictions", predictions(m)),
    ]
}

/// Replaces each `<!-- generated:NAME -->` ... `<!-- /generated:NAME -->` block of `doc`.
pub fn write_doc(doc: &Path, sections: &[(&str, String)]) {
    let mut text =
        std::fs::read_to_string(doc).unwrap_or_else(|e| fail(&format!("reading {}: {e}", doc.display())));
    for (name, body) in sections {
        let (open, close) = (format!("<!-- generated:{name} -->"), format!("<!-- /generated:{name} -->"));
        let (Some(a), Some(b)) = (text.find(&open), text.find(&close)) else {
            fail(&format!("{} lacks the markers {open} ... {close}", doc.display()))
        };
        if b < a {
            fail(&format!("{}: {close} comes before {open}", doc.display()));
        }
        text.replace_range(a + open.len()..b, &format!("\n{body}"));
    }
    std::fs::write(doc, text).unwrap_or_else(|e| fail(&format!("writing {}: {e}", doc.display())));
}
