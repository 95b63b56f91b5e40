//! Ahead-of-time compiled kernels, embedded in the binary.
//!
//! Compiling every op family's source with NVRTC takes tens of seconds on a fresh machine, and
//! needs NVRTC at all. So the crate ships each family's cubin for the common data-centre
//! architectures, made by `scripts/aot_kernels.sh` (the `aot_kernels` example with NVRTC from
//! pip), compressed under `tensor/aot/` with a manifest, and embedded by `build.rs`. A device
//! uses an embedded cubin when its architecture can run it and the manifest's key equals the
//! key of the source compiled into this binary; otherwise it compiles as before. A CI test
//! fails when a source changed and its cubins were not made again.
//!
//! `OXTRAIN_DISABLE_AOT_KERNELS=1` ignores the embedded cubins.

use super::nvrtc::{cache_key, fnv1a, KernelSource};
use std::collections::BTreeSet;
use std::sync::OnceLock;

include!(concat!(env!("OUT_DIR"), "/aot_kernels.rs"));

/// One line of the manifest: the cubin of one family for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AotEntry {
    /// 90 for sm_90.
    pub arch: u32,
    pub family: String,
    /// [`cache_key`] of the source it was compiled from.
    pub key: u64,
    /// [`cubin_hash`] of the cubin: CI checks that the stored file is the cubin made.
    pub cubin_hash: u64,
    /// The NVRTC version that compiled it, e.g. "13.0".
    pub nvrtc: String,
    /// The cubin's size before compression.
    pub cubin_bytes: usize,
    /// How long NVRTC took where it was made: families without a cubin compile longest first.
    pub compile_ms: u64,
}

/// The manifest: which cubins there are and what they were made from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    pub entries: Vec<AotEntry>,
}

const HEADER: &str = "\
# Ahead-of-time compiled kernels (oxtrain-tensor's src/cuda/aot.rs): one line per architecture
# and op family, the cubin in <arch>/<family>.cubin.lzma beside this file. Written by
# scripts/aot_kernels.sh; do not edit by hand. key: nvrtc::cache_key of the family's source;
# cubin_hash: aot::cubin_hash of the uncompressed cubin.
# arch family key cubin_hash nvrtc cubin_bytes compile_ms
";

impl Manifest {
    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            entries.push(parse_line(line).ok_or_else(|| format!("manifest line {}: `{line}`", i + 1))?);
        }
        Ok(Manifest { entries })
    }

    /// The manifest's text, entries sorted by architecture and family.
    pub fn to_text(&self) -> String {
        let mut entries: Vec<&AotEntry> = self.entries.iter().collect();
        entries.sort_by(|a, b| (a.arch, &a.family).cmp(&(b.arch, &b.family)));
        let mut text = HEADER.to_string();
        for e in entries {
            text += &format!(
                "sm_{} {} {:016x} {:016x} {} {} {}\n",
                e.arch, e.family, e.key, e.cubin_hash, e.nvrtc, e.cubin_bytes, e.compile_ms
            );
        }
        text
    }

    pub fn get(&self, arch: u32, family: &str) -> Option<&AotEntry> {
        self.entries.iter().find(|e| e.arch == arch && e.family == family)
    }

    pub fn archs(&self) -> BTreeSet<u32> {
        self.entries.iter().map(|e| e.arch).collect()
    }

    /// The manifest embedded in this binary (empty if it does not parse: the CI test says so).
    pub fn embedded() -> &'static Manifest {
        static MANIFEST: OnceLock<Manifest> = OnceLock::new();
        MANIFEST.get_or_init(|| Manifest::parse(EMBEDDED_MANIFEST).unwrap_or_default())
    }
}

fn parse_line(line: &str) -> Option<AotEntry> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let [arch, family, key, cubin_hash, nvrtc, cubin_bytes, compile_ms] = f[..] else { return None };
    Some(AotEntry {
        arch: arch.strip_prefix("sm_")?.parse().ok()?,
        family: family.to_string(),
        key: u64::from_str_radix(key, 16).ok()?,
        cubin_hash: u64::from_str_radix(cubin_hash, 16).ok()?,
        nvrtc: nvrtc.to_string(),
        cubin_bytes: cubin_bytes.parse().ok()?,
        compile_ms: compile_ms.parse().ok()?,
    })
}

/// Where a cubin lives, relative to the manifest (build.rs writes the same).
pub fn file_name(arch: u32, family: &str) -> String {
    format!("sm_{arch}/{family}.cubin.lzma")
}

/// A cubin compressed as it is stored: LZMA (the `.lzma` format, which records the size), with
/// a dictionary as large as the cubin.
pub fn compress(cubin: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut options = lzma_rust2::LzmaOptions::with_preset(9);
    options.dict_size = (cubin.len() as u32).max(4096);
    let packed = lzma_rust2::LzmaWriter::new_use_header(Vec::new(), &options, Some(cubin.len() as u64))
        .and_then(|mut w| w.write_all(cubin).and_then(|_| w.finish()));
    packed.expect("compressing into memory cannot fail")
}

/// The cubin back from [`compress`]'s output, checked to be `len` bytes of ELF.
pub fn decompress(data: &[u8], len: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    // A dictionary the size of the largest cubin is a few MiB; refuse a damaged header's claim.
    const MEMORY_LIMIT_KIB: u32 = 256 << 10;
    let reader = lzma_rust2::LzmaReader::new_mem_limit(data, MEMORY_LIMIT_KIB, None)
        .map_err(|e| format!("does not decompress: {e}"))?;
    let mut cubin = Vec::with_capacity(len);
    reader.take(len as u64 + 1).read_to_end(&mut cubin).map_err(|e| format!("does not decompress: {e}"))?;
    if cubin.len() != len || !cubin.starts_with(b"\x7fELF") {
        return Err(format!("decompresses to {} bytes, not a cubin of {len}", cubin.len()));
    }
    Ok(cubin)
}

/// A hash of a cubin, for the manifest.
pub fn cubin_hash(cubin: &[u8]) -> u64 {
    fnv1a(&[cubin])
}

/// Whether `OXTRAIN_DISABLE_AOT_KERNELS` asks to compile everything as before.
pub fn disabled() -> bool {
    std::env::var("OXTRAIN_DISABLE_AOT_KERNELS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Whether a cubin for `sm_{built}` runs on a device of `sm_{device}`: the same major version
/// and a minor version no higher (CUDA's binary compatibility; sm_80 runs on sm_86 and sm_89).
fn runs_on(built: u32, device: u32) -> bool {
    built / 10 == device / 10 && built % 10 <= device % 10
}

/// The manifest entry and compressed bytes of the embedded cubin that a device of `sm_{arch}`
/// can run for today's `src`, preferring its own architecture.
fn select(manifest: &Manifest, src: &KernelSource, arch: u32) -> Option<(&'static [u8], usize)> {
    let key = cache_key(src);
    let entry = manifest
        .entries
        .iter()
        .filter(|e| e.family == src.name && e.key == key && runs_on(e.arch, arch))
        .max_by_key(|e| e.arch)?;
    let dir = format!("sm_{}", entry.arch);
    let (_, _, data) = EMBEDDED_CUBINS.iter().find(|(a, f, _)| *a == dir && *f == src.name)?;
    Some((data, entry.cubin_bytes))
}

/// Whether this binary holds a cubin of today's `src` that a device of `sm_{arch}` can run.
pub fn has_embedded(src: &KernelSource, arch: u32) -> bool {
    !disabled() && select(Manifest::embedded(), src, arch).is_some()
}

/// That cubin, decompressed; `None` when there is none (or it is damaged, which CI catches).
pub fn embedded_cubin(src: &KernelSource, arch: u32) -> Option<Vec<u8>> {
    if disabled() {
        return None;
    }
    let (data, len) = select(Manifest::embedded(), src, arch)?;
    decompress(data, len).ok()
}

/// The embedded cubin made for exactly `sm_{arch}` from today's `src`, its hash checked against
/// the manifest: the proof that NVRTC compiled this source for this architecture when
/// `scripts/aot_kernels.sh` made it, which lets CI's compile check skip it.
pub fn verified_cubin(src: &KernelSource, arch: u32) -> Option<Vec<u8>> {
    let entry = Manifest::embedded().get(arch, src.name).filter(|e| e.key == cache_key(src))?;
    let dir = format!("sm_{arch}");
    let (_, _, data) = EMBEDDED_CUBINS.iter().find(|(a, f, _)| *a == dir && *f == src.name)?;
    decompress(data, entry.cubin_bytes).ok().filter(|cubin| cubin_hash(cubin) == entry.cubin_hash)
}

/// How long `src` took to compile where the cubins were made (the longest such time for a
/// family the manifest does not know: a new family is likely the one being worked on).
pub fn compile_ms_hint(src: &KernelSource) -> u64 {
    let times = Manifest::embedded().entries.iter().filter(|e| e.family == src.name);
    times.map(|e| e.compile_ms).max().unwrap_or(u64::MAX)
}

/// What is wrong with the embedded cubins for these sources: families whose source changed
/// since their cubin was made, families without one, entries of families that are gone, and
/// files that do not decompress. Empty when all is well.
pub fn problems(manifest: &Manifest, sources: &[KernelSource]) -> Vec<String> {
    let mut problems = Vec::new();
    if manifest.entries.is_empty() {
        problems.push("the manifest lists no cubins".to_string());
    }
    for arch in manifest.archs() {
        for src in sources {
            match manifest.get(arch, src.name) {
                None => problems.push(format!("sm_{arch} {}: no cubin", src.name)),
                Some(e) if e.key != cache_key(src) => {
                    problems.push(format!("sm_{arch} {}: stale (its .cu or common.cuh changed)", src.name))
                }
                Some(_) => {}
            }
        }
    }
    for e in &manifest.entries {
        if !sources.iter().any(|s| s.name == e.family) {
            problems.push(format!("sm_{} {}: no such kernel family any more", e.arch, e.family));
            continue;
        }
        let dir = format!("sm_{}", e.arch);
        match EMBEDDED_CUBINS.iter().find(|(a, f, _)| *a == dir && *f == e.family) {
            None => problems.push(format!("{}: not embedded", file_name(e.arch, &e.family))),
            Some((_, _, data)) => match decompress(data, e.cubin_bytes) {
                Err(why) => problems.push(format!("{}: {why}", file_name(e.arch, &e.family))),
                Ok(cubin) if cubin_hash(&cubin) != e.cubin_hash => problems
                    .push(format!("{}: not the cubin the manifest lists", file_name(e.arch, &e.family))),
                Ok(_) => {}
            },
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::all_kernel_sources;

    /// CI's guard: every family's embedded cubin was made from the source in this tree. Needs
    /// no NVRTC; making them again does.
    #[test]
    fn ahead_of_time_kernels_match_their_sources() {
        let manifest = Manifest::parse(EMBEDDED_MANIFEST).unwrap_or_else(|e| panic!("tensor/aot/{e}"));
        let problems = problems(&manifest, &all_kernel_sources());
        assert!(
            problems.is_empty(),
            "the ahead-of-time kernels in tensor/aot/ are out of date:\n  {}\nmake them again with \
             `scripts/aot_kernels.sh` (it installs NVRTC from pip and compiles only what changed), \
             then commit tensor/aot/",
            problems.join("\n  ")
        );
    }

    fn entry(arch: u32, family: &str, key: u64) -> AotEntry {
        AotEntry {
            arch,
            family: family.into(),
            key,
            cubin_hash: 0x0123_4567_89ab_cdef,
            nvrtc: "13.0".into(),
            cubin_bytes: 2_753_176,
            compile_ms: 12_070,
        }
    }

    #[test]
    fn the_manifest_reads_back_what_it_wrote() {
        let manifest = Manifest {
            entries: vec![entry(90, "reduce", 0x00ab_cdef_0123_4567), entry(80, "norm_cl", u64::MAX)],
        };
        let text = manifest.to_text();
        assert!(
            text.contains("sm_90 reduce 00abcdef01234567 0123456789abcdef 13.0 2753176 12070\n"),
            "{text}"
        );
        // Sorted: sm_80 first.
        let back = Manifest::parse(&text).unwrap().entries;
        assert_eq!(back, vec![manifest.entries[1].clone(), manifest.entries[0].clone()]);
        assert!(Manifest::parse("sm_90 reduce 00ab 01 13.0 12").unwrap_err().contains("line 1"));
        assert!(Manifest::parse("sm90 reduce 00ab 01 13.0 12 5").is_err());
    }

    #[test]
    fn compression_round_trips_and_rejects_a_wrong_size_or_a_cut_file() {
        let cubin: Vec<u8> =
            b"\x7fELF".iter().copied().chain((0..100_000u32).map(|i| (i % 251) as u8)).collect();
        let packed = compress(&cubin);
        assert!(packed.len() < cubin.len() / 10);
        assert_eq!(decompress(&packed, cubin.len()).unwrap(), cubin);
        assert!(decompress(&packed, cubin.len() - 1).is_err(), "a size that differs from the manifest's");
        assert!(decompress(&packed[..packed.len() / 2], cubin.len()).is_err());
        assert!(decompress(&compress(b"not an ELF file"), 15).is_err());
        assert_ne!(cubin_hash(&cubin), cubin_hash(&cubin[1..]));
    }

    #[test]
    fn a_cubin_runs_on_its_architecture_and_later_minor_versions_only() {
        assert!(runs_on(90, 90) && runs_on(80, 86) && runs_on(80, 89));
        assert!(!runs_on(80, 90) && !runs_on(90, 100) && !runs_on(86, 80) && !runs_on(90, 89));
    }

    #[test]
    fn selection_wants_the_current_key_and_prefers_the_device_architecture() {
        let src = crate::ops::join::cuda::SOURCE;
        let key = cache_key(&src);
        let stale = Manifest { entries: vec![entry(80, src.name, key ^ 1), entry(90, src.name, key ^ 1)] };
        assert!(select(&stale, &src, 90).is_none() && select(&stale, &src, 80).is_none());
        let fresh = Manifest { entries: vec![entry(80, src.name, key), entry(90, src.name, key)] };
        let bytes = |arch: u32| {
            let dir = format!("sm_{arch}");
            let found = EMBEDDED_CUBINS.iter().find(|(a, f, _)| *a == dir && *f == src.name);
            found.unwrap_or_else(|| panic!("no embedded {dir} {}", src.name)).2.as_ptr()
        };
        assert_eq!(select(&fresh, &src, 90).unwrap().0.as_ptr(), bytes(90));
        assert_eq!(select(&fresh, &src, 89).unwrap().0.as_ptr(), bytes(80));
        assert_eq!(select(&fresh, &src, 80).unwrap().0.as_ptr(), bytes(80));
        assert!(select(&fresh, &src, 75).is_none() && select(&fresh, &src, 100).is_none());
    }

    #[test]
    fn problems_name_stale_missing_and_removed_families() {
        let sources = [crate::ops::join::cuda::SOURCE, crate::ops::inplace::cuda::SOURCE];
        let manifest =
            Manifest { entries: vec![entry(90, "join", cache_key(&sources[0]) ^ 1), entry(90, "gone", 5)] };
        let found = problems(&manifest, &sources);
        assert!(found.iter().any(|p| p == "sm_90 join: stale (its .cu or common.cuh changed)"), "{found:?}");
        assert!(found.iter().any(|p| p == "sm_90 inplace: no cubin"), "{found:?}");
        assert!(found.iter().any(|p| p == "sm_90 gone: no such kernel family any more"), "{found:?}");
        assert_eq!(
            problems(&Manifest::default(), &sources),
            vec!["the manifest lists no cubins".to_string()]
        );
        // The embedded join cubin under a manifest line of another cubin.
        let mut wrong = Manifest::embedded().get(90, "join").expect("join is embedded").clone();
        wrong.cubin_hash ^= 1;
        let found = problems(&Manifest { entries: vec![wrong] }, &sources[..1]);
        assert_eq!(found, vec!["sm_90/join.cubin.lzma: not the cubin the manifest lists".to_string()]);
    }
}
