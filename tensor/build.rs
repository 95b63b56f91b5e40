//! Does nothing: it exists so that the `[build-dependencies]` in Cargo.toml, which only unify
//! the proc macros' syn features across builds of one package and of the workspace, count.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
