//! The scaling model: alpha-beta fits of measured all-reduces, put together into a cluster of
//! nodes of 8 GPUs joined by InfiniBand NDR, and DDP's bucketed all-reduces placed on one GPU's
//! measured step, predicting step time and scaling efficiency of ResNet-50 and GPT-2 124M at 8
//! to 1024 GPUs (flat and hierarchical all-reduce, with and without overlap). Checks the model
//! against every measured point it can: the 2xH200 all-reduces (a second sitting of NCCL's,
//! not fitted, too) and the CPU all-reduces across network namespaces (2 hosts x 2 ranks
//! predicted from the 1x2 and 2x1 runs), and CPU DDP steps measured on 1 host x 2 ranks
//! (shm) and 2 hosts x 2 ranks across the namespaces (mpi), predicted from each rank's
//! compute alone and the CPU all-reduce fits (`ddp-cpu-netns.json`, optional).
//!
//! Writes the generated parts of docs/scaling.md (between `<!-- generated:NAME -->` and
//! `<!-- /generated:NAME -->`) and the plots docs/img/scaling-*.png.
//!
//! Usage: scaling_model [--results bench/results] [--doc docs/scaling.md] [--img docs/img]
//!        [--font FILE.ttf]   (run from the repository root)

mod cluster;
mod cpu_ddp;
mod ddp;
mod fit;
mod plot;
mod report;

use cluster::{Algo, Cluster, Link};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// InfiniBand NDR, one 400 Gb/s port per GPU (DGX H100/H200: eight single-port ConnectX-7),
/// as bytes: 50 GB/s each way. Per-step latencies: NCCL's own tuning model (hwLat, NET, Ring:
/// LL 2.7 us for small messages, Simple 14 us for large ones).
pub fn infiniband_ndr() -> Link {
    Link {
        name: "InfiniBand NDR 400 Gb/s per GPU".into(),
        bands: vec![(65536.0, 2.7, 50.0), (f64::INFINITY, 14.0, 50.0)],
    }
}

pub const GPUS_PER_NODE: usize = 8;
pub const SCALES: [usize; 4] = [8, 64, 256, 1024];

struct Args {
    results: PathBuf,
    doc: PathBuf,
    img: PathBuf,
    font: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        results: "bench/results".into(),
        doc: "docs/scaling.md".into(),
        img: "docs/img".into(),
        font: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| fail(&format!("{k} needs a value")));
        match k.as_str() {
            "--results" => a.results = v().into(),
            "--doc" => a.doc = v().into(),
            "--img" => a.img = v().into(),
            "--font" => a.font = Some(v().into()),
            "-h" | "--help" => {
                println!("scaling_model [--results DIR] [--doc FILE] [--img DIR] [--font FILE.ttf]");
                std::process::exit(0);
            }
            other => fail(&format!("unknown argument {other:?} (see --help)")),
        }
    }
    a
}

pub fn fail(msg: &str) -> ! {
    eprintln!("scaling_model: {msg}");
    std::process::exit(2)
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        fail(&format!("reading {}: {e} (run from the repository root, or pass --results)", path.display()))
    });
    serde_json::from_str(&text).unwrap_or_else(|e| fail(&format!("{} is not JSON: {e}", path.display())))
}

/// Everything the report needs, computed once.
pub struct Model {
    pub gpu_fits: Vec<fit::Fit>,
    /// (series name, measured points, the fit that predicts them, whether they were fitted)
    pub gpu_checks: Vec<(String, Vec<fit::Point>, fit::Fit, bool)>,
    pub cpu_fits: Vec<fit::Fit>,
    /// (series, measured points, predicted by (algorithm, cluster))
    pub cpu_checks: Vec<(String, Vec<fit::Point>, Cluster, Algo)>,
    pub cpu_points: Vec<(String, Vec<fit::Point>)>,
    pub cpu_notes: String,
    /// The DDP steps measured on CPU beside their predictions, the 1-process step, the notes.
    pub cpu_ddp: Vec<cpu_ddp::Check>,
    pub one_process_ms: Option<f64>,
    pub cpu_ddp_notes: String,
    pub profiles: Vec<ddp::Profile>,
    /// One cluster per intra-node backend (nccl, nvshmem).
    pub clusters: Vec<(String, Cluster)>,
}

fn main() {
    let args = parse_args();
    let comm = read_json(&args.results.join("comm-2xh200.json"));
    let comm_again = read_json(&args.results.join("comm-2xh200-32blocks.json"));
    let cpu = read_json(&args.results.join("comm-netns-cpu.json"));
    let steps = read_json(&args.results.join("step-profile-h200.json"));

    let mut gpu_fits = vec![];
    let mut gpu_checks = vec![];
    for backend in ["nccl", "nvshmem"] {
        let pts = fit::points(&comm, &format!("{backend}_2r"));
        if pts.is_empty() {
            fail(&format!("comm-2xh200.json has no all_reduce_{backend}_2r_f32 rows"));
        }
        let f = fit::fit(&format!("{backend} 2xH200"), &pts);
        gpu_checks.push((format!("{backend}, comm-2xh200.json (fitted)"), pts, f.clone(), true));
        gpu_fits.push(f);
    }
    let again = fit::points(&comm_again, "nccl_2r");
    if !again.is_empty() {
        gpu_checks.push((
            "nccl, comm-2xh200-32blocks.json (another sitting, not fitted)".into(),
            again,
            gpu_fits[0].clone(),
            false,
        ));
    }

    let series = |s: &str| fit::points(&cpu, s);
    let (intra_pts, inter_pts) = (series("mpi-1h2r"), series("mpi-2h1r"));
    if intra_pts.is_empty() || inter_pts.is_empty() {
        fail("comm-netns-cpu.json needs the mpi-1h2r and mpi-2h1r series (scripts/netns/comm_bench.sh)");
    }
    let intra = fit::fit("mpi, 1 host x 2 ranks (shared memory)", &intra_pts);
    let inter = fit::fit("mpi, 2 hosts x 1 rank (TCP over veth)", &inter_pts);
    let mut cpu_fits = vec![intra.clone(), inter.clone()];
    let shm = series("shm_2r");
    let shm_fit = (!shm.is_empty()).then(|| fit::fit("shm, 1 host x 2 ranks", &shm));
    cpu_fits.extend(shm_fit.clone());
    let ns = Cluster {
        g: 2,
        nics: 1,
        intra: Link::from_two_rank_fit(&intra),
        inter: Link::from_two_rank_fit(&inter),
    };
    let mut cpu_checks = vec![];
    let checks = [
        ("mpi-2h2r-ring", "mpi 2 hosts x 2 ranks, Open MPI's ring forced", Algo::Flat),
        ("mpi-2h2r", "mpi 2 hosts x 2 ranks, Open MPI's default choice", Algo::OpenMpiDefault),
    ];
    for (s, label, algo) in checks {
        let pts = series(s);
        if !pts.is_empty() {
            cpu_checks.push((label.to_string(), pts, ns.clone(), algo));
        }
    }
    // Absent until scripts/netns/ddp_step.sh has run: the section then says so.
    let ddp_doc: Option<Value> =
        std::fs::read_to_string(args.results.join("ddp-cpu-netns.json")).ok().map(|t| {
            serde_json::from_str(&t).unwrap_or_else(|e| fail(&format!("ddp-cpu-netns.json is not JSON: {e}")))
        });
    let cpu_ddp = ddp_doc.as_ref().map(|d| cpu_ddp::checks(d, shm_fit.as_ref(), &ns)).unwrap_or_default();
    let one_process_ms = ddp_doc.as_ref().and_then(|d| cpu_ddp::slowest(d, "alone-1")).map(|r| r.step_ms);
    let cpu_ddp_notes = ddp_doc.as_ref().and_then(|d| d["notes"].as_str()).unwrap_or("").to_string();
    let cpu_points = vec![("mpi 1x2".to_string(), intra_pts), ("mpi 2x1".to_string(), inter_pts)];
    let profiles: Vec<ddp::Profile> = steps["models"]
        .as_array()
        .map(|a| a.iter().filter_map(ddp::Profile::from_json).collect())
        .unwrap_or_default();
    if profiles.is_empty() {
        fail("step-profile-h200.json has no models (bench/peers/step_profile.py writes it)");
    }
    let clusters = gpu_fits
        .iter()
        .map(|f| {
            let name = f.name.split(' ').next().unwrap_or("").to_string();
            (
                name,
                Cluster {
                    g: GPUS_PER_NODE,
                    nics: GPUS_PER_NODE,
                    intra: Link::from_two_rank_fit(f),
                    inter: infiniband_ndr(),
                },
            )
        })
        .collect();
    let model = Model {
        gpu_fits,
        gpu_checks,
        cpu_fits,
        cpu_checks,
        cpu_points,
        cpu_notes: cpu["notes"].as_str().unwrap_or("").to_string(),
        cpu_ddp,
        one_process_ms,
        cpu_ddp_notes,
        profiles,
        clusters,
    };

    std::fs::create_dir_all(&args.img)
        .unwrap_or_else(|e| fail(&format!("creating {}: {e}", args.img.display())));
    plot::load_font(args.font.as_deref());
    plot::all_reduce_fits(&model, &args.img.join("scaling-allreduce.png"));
    plot::efficiency(&model, &args.img.join("scaling-efficiency.png"));
    let sections = report::sections(&model);
    report::write_doc(&args.doc, &sections);
    println!("wrote {} and {}/scaling-*.png", args.doc.display(), args.img.display());
}
