//! The NVSHMEM kernels' whole build chain without a GPU: NVRTC compiles `collectives.cu` to
//! LTO-IR and nvJitLink links it with `libnvshmem_device.a` into a cubin.
//!
//! Needs pip's nvidia-nvshmem-cu13, nvidia-nvjitlink, nvidia-cuda-nvrtc, nvidia-cuda-runtime
//! and nvidia-cuda-cccl (found through OXTRAIN_CUDA_LIB_DIRS or an active virtualenv). Skipped
//! with a message when they are absent, unless OXTRAIN_REQUIRE_NVSHMEM_BUILD=1 (CI).

use oxtrain_comm::nvshmem::device_code::{kernel_name, Toolchain};

#[test]
fn nvshmem_kernels_compile_and_link_with_the_device_library() {
    let required = std::env::var("OXTRAIN_REQUIRE_NVSHMEM_BUILD").is_ok_and(|v| v == "1");
    let tc = match Toolchain::find() {
        Ok(tc) => tc,
        Err(e) if !required => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("OXTRAIN_REQUIRE_NVSHMEM_BUILD=1 but {e}"),
    };
    let (cubin, log) = match tc.build_cubin_verbose(90, true) {
        Ok(c) => c,
        Err(e) if !required && e.to_string().contains("cannot be loaded") => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    println!("{log}");
    // For reading the machine code (nvdisasm) without a GPU.
    if let Ok(path) = std::env::var("OXTRAIN_NVSHMEM_CUBIN_OUT") {
        std::fs::write(&path, &cubin).expect("writing the cubin");
    }
    // Every kernel fits its 512 threads per block (at most 128 registers each) with no spills;
    // only the out-of-line timeout paths (`*_slow`, run when a peer never comes) may spill.
    let mut function = "";
    for line in log.lines() {
        if let Some(f) = line.split("Function properties for ").nth(1) {
            function = f.trim();
        }
        if line.contains("spill stores") && !function.contains("_slow") {
            assert!(line.contains(" 0 bytes spill stores"), "{function} spills registers:\n{log}");
        }
        if let Some(n) =
            line.split("used ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<u32>().ok())
        {
            assert!(n <= 128, "a kernel uses {n} registers, too many for 512 threads per block:\n{log}");
        }
    }
    // An ELF cubin that holds every kernel the backend launches (the list `connect.rs` loads;
    // the stream kernels went with `stream.cu`).
    assert_eq!(&cubin[..4], b"\x7fELF", "nvJitLink did not return an ELF cubin");
    let families =
        ["f32", "bf16", "f16"].iter().flat_map(|d| [d.to_string(), format!("ll_{d}"), format!("symm_{d}")]);
    for suffix in families.chain(["atomic", "nop", "nop8"].map(String::from)) {
        let name = kernel_name(&suffix);
        assert!(
            cubin.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name} missing from the linked cubin"
        );
    }
}
