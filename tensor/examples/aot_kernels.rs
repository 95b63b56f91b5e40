//! Makes the ahead-of-time kernels in `tensor/aot/`: every op family's source compiled by NVRTC
//! for each shipped architecture, with the options the runtime uses, stored compressed with a
//! manifest that `build.rs` embeds. Run it through `scripts/aot_kernels.sh`, which installs
//! the NVRTC the committed cubins are made with.
//!
//! Usage: `aot_kernels [--all] [--arch 80,90] [--dir DIR]`. Families whose manifest key still
//! matches their source keep their cubin unless `--all`; `--arch` sets the architectures
//! shipped (default: those in the manifest, else 80 and 90).

use oxtrain_tensor::cuda::aot::{self, AotEntry, Manifest};
use oxtrain_tensor::cuda::{all_kernel_sources, nvrtc, KernelSource};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

struct Args {
    all: bool,
    archs: Option<Vec<u32>>,
    dir: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { all: false, archs: None, dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("aot") };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--all" => args.all = true,
            "--arch" => {
                let list = it.next().ok_or("--arch needs a list such as 80,90")?;
                let archs: Result<Vec<u32>, _> = list.split(',').map(|s| s.trim().parse()).collect();
                args.archs = Some(archs.map_err(|_| format!("--arch {list}: not a list of numbers"))?);
            }
            "--dir" => args.dir = it.next().ok_or("--dir needs a folder")?.into(),
            _ => {
                return Err(format!(
                    "unknown argument `{a}`; usage: aot_kernels [--all] [--arch 80,90] [--dir DIR]"
                ))
            }
        }
    }
    Ok(args)
}

/// Compiles `src` for `sm_{arch}`, writes its compressed cubin under `dir` and returns its line.
fn make(dir: &Path, src: &KernelSource, arch: u32, nvrtc_version: &str) -> Result<AotEntry, String> {
    let start = Instant::now();
    let cubin = nvrtc::compile(src, arch).map_err(|e| e.to_string())?;
    let compile_ms = start.elapsed().as_millis() as u64;
    let packed = aot::compress(&cubin);
    if aot::decompress(&packed, cubin.len()).as_ref() != Ok(&cubin) {
        return Err(format!("{}.cu for sm_{arch}: the compressed cubin does not read back", src.name));
    }
    let path = dir.join(aot::file_name(arch, src.name));
    std::fs::create_dir_all(path.parent().expect("a file in a folder"))
        .and_then(|_| std::fs::write(&path, packed))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(AotEntry {
        arch,
        family: src.name.to_string(),
        key: nvrtc::cache_key(src),
        cubin_hash: aot::cubin_hash(&cubin),
        nvrtc: nvrtc_version.to_string(),
        cubin_bytes: cubin.len(),
        compile_ms,
    })
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let (major, minor) = nvrtc::version().map_err(|e| e.to_string())?;
    let nvrtc_version = format!("{major}.{minor}");
    let manifest_path = args.dir.join("manifest.txt");
    let old = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => Manifest::parse(&text).map_err(|e| format!("{}: {e}", manifest_path.display()))?,
        Err(_) => Manifest::default(),
    };
    let archs = args.archs.unwrap_or_else(|| match old.archs() {
        a if a.is_empty() => vec![80, 90],
        a => a.into_iter().collect(),
    });
    let sources = all_kernel_sources();
    let mut kept = Vec::new();
    let mut todo = Vec::new();
    for &arch in &archs {
        for src in &sources {
            match old.get(arch, src.name) {
                Some(e) if !args.all && e.key == nvrtc::cache_key(src) => kept.push(e.clone()),
                _ => todo.push((*src, arch)),
            }
        }
    }
    println!("NVRTC {nvrtc_version}: compiling {} cubins, keeping {}", todo.len(), kept.len());
    // One compile per core; NVRTC compiles of different programs are independent.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(todo.len().max(1));
    let queue = Mutex::new(todo.into_iter());
    let made = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let Some((src, arch)) = queue.lock().unwrap().next() else { break };
                let entry = make(&args.dir, &src, arch, &nvrtc_version);
                if let Ok(e) = &entry {
                    println!(
                        "  sm_{arch} {:<10} {:>9} bytes  {:>6} ms",
                        e.family, e.cubin_bytes, e.compile_ms
                    );
                }
                made.lock().unwrap().push(entry);
            });
        }
    });
    let made: Result<Vec<AotEntry>, String> = made.into_inner().unwrap().into_iter().collect();
    let manifest = Manifest { entries: kept.into_iter().chain(made?).collect() };
    remove_unlisted(&args.dir, &manifest)?;
    let tmp = manifest_path.with_extension("txt.tmp");
    std::fs::write(&tmp, manifest.to_text())
        .and_then(|_| std::fs::rename(&tmp, &manifest_path))
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let stored: u64 = manifest
        .entries
        .iter()
        .map(|e| std::fs::metadata(args.dir.join(aot::file_name(e.arch, &e.family))).map_or(0, |m| m.len()))
        .sum();
    println!("{} cubins, {stored} bytes stored; commit {}", manifest.entries.len(), args.dir.display());
    Ok(())
}

/// Deletes cubin files the manifest no longer lists (a family or architecture dropped).
fn remove_unlisted(dir: &Path, manifest: &Manifest) -> Result<(), String> {
    let listed: Vec<PathBuf> =
        manifest.entries.iter().map(|e| dir.join(aot::file_name(e.arch, &e.family))).collect();
    for arch_dir in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let Ok(files) = std::fs::read_dir(arch_dir.path()) else { continue };
        for file in files.flatten().map(|f| f.path()) {
            if file.to_string_lossy().contains(".cubin.") && !listed.contains(&file) {
                std::fs::remove_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
                println!("  removed {}", file.display());
            }
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("aot_kernels: {e}");
        std::process::exit(1);
    }
}
