//! Embeds the ahead-of-time kernels: for each line of `aot/manifest.txt` (written by
//! `scripts/aot_kernels.sh`), the compressed cubin beside it, as a table `cuda::aot` reads.
//!
//! The `[build-dependencies]` in Cargo.toml are not used here: they only unify the proc macros'
//! syn features across builds of one package and of the workspace, and count only because a
//! build script exists.

use std::fmt::Write as _;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=aot/manifest.txt");
    let manifest = std::fs::read_to_string("aot/manifest.txt").unwrap_or_default();
    let mut table = String::new();
    for line in manifest.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let mut fields = line.split_whitespace();
        let (Some(arch), Some(family)) = (fields.next(), fields.next()) else { continue };
        // Names go into a Rust string and a path: allow only what the generator writes.
        let plain = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !plain(arch) || !plain(family) {
            panic!("aot/manifest.txt: bad line `{line}`");
        }
        // The same file name as `cuda::aot::file_name`.
        writeln!(
            table,
            "    ({arch:?}, {family:?}, include_bytes!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/aot/{arch}/{family}.cubin.lzma\"))),"
        )
        .unwrap();
    }
    let code = format!(
        "/// The text of `aot/manifest.txt`.\n\
         const EMBEDDED_MANIFEST: &str = {manifest:?};\n\
         /// (architecture folder, family, compressed cubin) for each line of the manifest.\n\
         static EMBEDDED_CUBINS: &[(&str, &str, &[u8])] = &[\n{table}];\n"
    );
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("aot_kernels.rs");
    std::fs::write(out, code).unwrap();
}
