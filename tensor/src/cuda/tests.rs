//! Checks of the CUDA backend itself. Kernel compilation needs only NVRTC, so it runs in CI;
//! the rest needs a GPU and is ignored unless asked for (`-- --include-ignored`).

use super::*;
use crate::{DType, Device, Tensor};

/// Every kernel source compiles for every architecture we ship for. Without NVRTC this test
/// skips, unless OXTRAIN_REQUIRE_NVRTC is set (CI sets it, after installing NVRTC from pip).
#[test]
fn all_kernel_sources_compile_with_nvrtc() {
    if let Err(e) = nvrtc::version() {
        assert!(std::env::var_os("OXTRAIN_REQUIRE_NVRTC").is_none(), "NVRTC is required here: {e}");
        eprintln!("skipped: {e}");
        return;
    }
    for arch in [80, 90] {
        for src in all_kernel_sources() {
            let cubin = nvrtc::compile(&src, arch).unwrap_or_else(|e| panic!("{e}"));
            // An ELF image, as cuModuleLoadData expects.
            assert_eq!(&cubin[..4], b"\x7fELF", "{}.cu for sm_{arch} is not a cubin", src.name);
        }
    }
}

#[test]
fn a_kernel_typo_fails_with_the_compiler_log() {
    if nvrtc::version().is_err() {
        return;
    }
    let bad = KernelSource { name: "typo", code: "extern \"C\" __global__ void k(float* x) { x[0] = y; }" };
    let err = nvrtc::compile(&bad, 90).unwrap_err().to_string();
    assert!(err.contains("typo.cu") && err.contains("identifier \"y\" is undefined"), "{err}");
}

#[test]
fn no_gpu_gives_an_error_that_says_what_was_searched() {
    if is_available(0) {
        return;
    }
    let err = Tensor::zeros([2], DType::F32, Device::Cuda(0)).unwrap_err().to_string();
    assert!(err.contains("CUDA device 0 is not available"), "{err}");
    assert_eq!(Device::cuda_if_available(0), Device::Cpu);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn caching_allocator_reuses_blocks_in_a_steady_loop() {
    let dev = device(0).unwrap();
    let x = Tensor::ones([1 << 20], DType::F32, Device::Cuda(0)).unwrap();
    for _ in 0..3 {
        let _ = (&x + &x).exp();
    }
    dev.synchronize().unwrap();
    let before = dev.memory_stats();
    for _ in 0..20 {
        let y = (&x + &x).exp();
        drop(y);
    }
    dev.synchronize().unwrap();
    let after = dev.memory_stats();
    assert_eq!(after.driver_allocs, before.driver_allocs, "{before:?} -> {after:?}");
    assert!(after.peak_allocated >= 2 * 4 << 20 && after.reserved >= after.allocated);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_reports_asked_allocated_and_reserved() {
    let err = Tensor::zeros([1usize << 40], DType::F32, Device::Cuda(0)).unwrap_err().to_string();
    assert!(err.contains("CUDA out of memory") && err.contains("4398046511104 bytes"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn streams_order_work_and_events_join_them() {
    let side = Stream::new(0).unwrap();
    let main = Stream::current(0).unwrap();
    let x = Tensor::full([1 << 16], 2.0, DType::F32, Device::Cuda(0)).unwrap();
    let y = {
        let _g = side.make_current();
        side.wait_stream(&main).unwrap();
        x.square()
    };
    main.wait_stream(&side).unwrap();
    assert!(y.to_vec::<f32>().iter().all(|&v| v == 4.0));
}
