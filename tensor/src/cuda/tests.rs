//! Checks of the CUDA backend itself. Kernel compilation needs only NVRTC, so it runs in CI;
//! the rest needs a GPU and is ignored unless asked for (`-- --include-ignored`).

use super::*;
use crate::{DType, Device, Tensor};

/// Every kernel source compiles for every architecture we ship for: each (source, arch) either
/// has an embedded cubin that `scripts/aot_kernels.sh` compiled with NVRTC from exactly today's
/// source (key and cubin hash checked), or is compiled here; `OXTRAIN_NVRTC_COMPILE_ALL=1`
/// compiles them all. Without NVRTC this test skips, unless OXTRAIN_REQUIRE_NVRTC is set (CI
/// sets it, after installing NVRTC from pip).
#[test]
fn all_kernel_sources_compile_with_nvrtc() {
    if let Err(e) = nvrtc::version() {
        assert!(std::env::var_os("OXTRAIN_REQUIRE_NVRTC").is_none(), "NVRTC is required here: {e}");
        eprintln!("skipped: {e}");
        return;
    }
    // A (source, arch) with a verified embedded cubin was compiled by NVRTC from exactly this
    // source and these options; compiling it again would take minutes of CI and prove nothing
    // more. The smallest family always compiles, so the check also shows this NVRTC works.
    let compile_all = std::env::var("OXTRAIN_NVRTC_COMPILE_ALL").is_ok_and(|v| v == "1");
    let sources = all_kernel_sources();
    let smallest = sources.iter().min_by_key(|s| s.code.len()).map(|s| s.name);
    let mut to_compile = Vec::new();
    for arch in [80, 90] {
        for src in &sources {
            let verified = aot::verified_cubin(src, arch).is_some();
            if compile_all || !verified || Some(src.name) == smallest {
                to_compile.push((*src, arch));
            }
        }
    }
    eprintln!(
        "compiling {} of {} (source, arch) pairs; the rest have verified ahead-of-time cubins",
        to_compile.len(),
        2 * sources.len()
    );
    // One thread per (source, arch): NVRTC compiles are independent and take seconds each.
    std::thread::scope(|scope| {
        for (src, arch) in to_compile {
            scope.spawn(move || {
                let cubin = nvrtc::compile(&src, arch).unwrap_or_else(|e| panic!("{e}"));
                // An ELF image, as cuModuleLoadData expects.
                assert_eq!(&cubin[..4], b"\x7fELF", "{}.cu for sm_{arch} is not a cubin", src.name);
            });
        }
    });
}

/// On an architecture the crate ships cubins for, every family's embedded cubin loads (so the
/// first step needs no NVRTC) and the device opened without refusing them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn embedded_cubins_load_for_every_family() {
    if aot::disabled() {
        return;
    }
    let dev = device(0).unwrap();
    let arch = dev.arch();
    let shipped = aot::Manifest::embedded().archs().contains(&arch);
    for src in all_kernel_sources() {
        let Some(cubin) = aot::embedded_cubin(&src, arch) else {
            assert!(
                !shipped,
                "{}.cu has no embedded cubin for sm_{arch}: run scripts/aot_kernels.sh",
                src.name
            );
            continue;
        };
        if let Err(e) = dev.context().load_module(cudarc::nvrtc::Ptx::from_binary(cubin)) {
            panic!("the driver refused the embedded {}.cu for sm_{arch}: {e:?}", src.name);
        }
    }
    // A kernel from an embedded cubin runs and computes: x + x on a length that is no multiple
    // of the block.
    let x = Tensor::from_vec((0..1000).map(|i| i as f32).collect(), [1000], Device::Cuda(0)).unwrap();
    let want: Vec<f32> = (0..1000).map(|i| 2.0 * i as f32).collect();
    assert_eq!(x.add(&x).to_vec::<f32>(), want);
}

/// Skips without NVRTC as `all_kernel_sources_compile_with_nvrtc` does, failing instead where
/// OXTRAIN_REQUIRE_NVRTC is set (CI).
#[test]
fn a_kernel_typo_fails_with_the_compiler_log() {
    if let Err(e) = nvrtc::version() {
        assert!(std::env::var_os("OXTRAIN_REQUIRE_NVRTC").is_none(), "NVRTC is required here: {e}");
        eprintln!("skipped: {e}");
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
    // A private allocator: the device's own is shared with tests running in parallel.
    let dev = device(0).unwrap();
    let alloc = alloc::CachingAllocator::new(dev.context().clone());
    let stream = dev.default_stream().cu_stream() as usize;
    // One "training step": activations of a few sizes, freed in another order.
    let step = || {
        let a = alloc.alloc(4 << 20, stream).unwrap();
        let b = alloc.alloc(1000, stream).unwrap();
        let c = alloc.alloc(3 << 20, stream).unwrap();
        drop(b);
        let d = alloc.alloc(700, stream).unwrap();
        drop((a, c, d));
    };
    step();
    let warm = alloc.stats();
    for _ in 0..50 {
        step();
    }
    let after = alloc.stats();
    assert_eq!(after.driver_allocs, warm.driver_allocs, "{warm:?} -> {after:?}");
    assert_eq!((after.allocated, after.reserved), (0, warm.reserved));
    assert_eq!(after.peak_allocated, (4 << 20) + (4 << 20) + 1024);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_foreign_buffer_is_a_tensor_and_its_owner_goes_with_the_last_view() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // Memory the caching allocator knows nothing of, freed by its owner.
    struct Foreign(u64, Arc<AtomicBool>);
    impl Drop for Foreign {
        fn drop(&mut self) {
            // SAFETY: allocated below, used by no queued work any more (the test synchronised).
            unsafe { cudarc::driver::result::free_sync(self.0).unwrap() };
            self.1.store(true, Ordering::SeqCst);
        }
    }
    let dev = device(0).unwrap();
    dev.context().bind_to_thread().unwrap();
    // SAFETY: a plain allocation of 16 f32 in the bound context.
    let ptr = unsafe { cudarc::driver::result::malloc_sync(64) }.unwrap();
    let freed = Arc::new(AtomicBool::new(false));
    let owner = Arc::new(Foreign(ptr, freed.clone()));
    let before = dev.allocator().stats();
    // SAFETY: ptr holds 16 f32 on GPU 0 while `owner` lives.
    let t = unsafe { Tensor::from_cuda_blob(ptr, DType::F32, [4, 4], 0, owner) }.unwrap();
    assert_eq!(t.dims(), &[4, 4]);
    let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
    t.copy_(&Tensor::from_vec(values.clone(), [4, 4], Device::Cuda(0)).unwrap());
    let row = t.narrow(0, 1, 1);
    drop(t);
    let doubled = row.add(&row).to_vec::<f32>();
    assert_eq!(doubled, vec![8.0, 10.0, 12.0, 14.0]);
    assert!(!freed.load(Ordering::SeqCst), "a view still shares the storage");
    dev.default_stream().synchronize().unwrap();
    drop(row);
    assert!(freed.load(Ordering::SeqCst), "the owner goes with the last view");
    // The caching allocator neither took nor gave back the foreign block.
    assert_eq!(dev.allocator().stats().driver_frees, before.driver_frees);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn blocks_used_by_another_stream_wait_for_it() {
    let dev = device(0).unwrap();
    let alloc = alloc::CachingAllocator::new(dev.context().clone());
    let (main, side) = (Stream::new(0).unwrap(), Stream::new(0).unwrap());
    let mut a = alloc.alloc(1 << 20, main.id()).unwrap();
    a.record_stream(side.id());
    let ptr = a.device_ptr();
    drop(a);
    side.synchronize().unwrap();
    // The side stream is idle, so the pending block is back in the cache for its own stream.
    let b = alloc.alloc(1 << 20, main.id()).unwrap();
    assert_eq!(b.device_ptr(), ptr);
    assert_eq!(alloc.stats().driver_allocs, 1);
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

/// Deterministic values in [-3, 3) with a few special ones, as f64.
fn sample(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            match i % 97 {
                0 => 0.0,
                1 => -0.0,
                _ => ((x >> 11) as f64 / (1u64 << 53) as f64) * 6.0 - 3.0,
            }
        })
        .collect()
}

fn both(shape: &[usize], dtype: DType, seed: u64) -> (Tensor, Tensor) {
    let n = shape.iter().product();
    let cpu = Tensor::from_vec(sample(n, seed), shape, Device::Cpu).unwrap().to_dtype(dtype);
    let gpu = cpu.to_device(Device::Cuda(0)).unwrap();
    (cpu, gpu)
}

fn check(gpu: &Tensor, cpu: &Tensor, what: &str) {
    assert_eq!(gpu.device(), Device::Cuda(0), "{what}");
    assert_eq!(gpu.dtype(), cpu.dtype(), "{what}");
    let (rtol, atol) = match cpu.dtype() {
        DType::F32 => (1e-5, 1e-6),
        DType::F64 => (1e-12, 1e-12),
        DType::BF16 => (1e-2, 1e-2),
        DType::F16 => (2e-3, 1e-3),
        _ => (0.0, 0.0),
    };
    crate::testing::assert_close(gpu, cpu, rtol, atol, what);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn unary_ops_match_the_cpu_backend() {
    use crate::UnaryOp::*;
    let ops = crate::testing::UNARY_OPS;
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let (cpu, gpu) = both(&[7, 33, 9], dtype, 1);
        // Contiguous and a transposed, narrowed view.
        let (cv, gv) = (cpu.transpose(0, 2).narrow(1, 3, 20), gpu.transpose(0, 2).narrow(1, 3, 20));
        for op in ops {
            check(&gpu.unary(op), &cpu.unary(op), &format!("{} {dtype}", op.name()));
            check(&gv.unary(op), &cv.unary(op), &format!("{} {dtype} strided", op.name()));
        }
    }
    let (cpu, gpu) = both(&[100], DType::F32, 2);
    let (ci, gi) = (cpu.mul_scalar(10.0).to_dtype(DType::I64), gpu.mul_scalar(10.0).to_dtype(DType::I64));
    for op in [Neg, Abs, Relu, Square, Sign, Affine { mul: 3.0, add: 1.0 }, Clamp { min: -5.0, max: 7.0 }] {
        check(&gi.unary(op), &ci.unary(op), &format!("{} i64", op.name()));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn binary_ops_compare_and_where_match_the_cpu_backend() {
    use crate::{BinaryOp::*, CmpOp};
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let (ca, ga) = both(&[5, 1, 40], dtype, 3);
        let (cb, gb) = both(&[6, 40], dtype, 4);
        let (cbt, gbt) = (cb.t().contiguous().t(), gb.t().contiguous().t()); // non-contiguous
        for op in [Add, Sub, Mul, Div, Maximum, Minimum] {
            check(&ga.binary(&gb, op), &ca.binary(&cb, op), &format!("{} {dtype}", op.name()));
            check(&ga.binary(&gbt, op), &ca.binary(&cbt, op), &format!("{} {dtype} strided", op.name()));
        }
        // Contiguous operands take the 16-byte-vector kernel (with a ragged tail), an offset of
        // 8 elements keeps it aligned, an offset of 1 falls back to the strided kernel.
        let (cx, gx) = both(&[1003], dtype, 7);
        let (cy, gy) = both(&[1003], dtype, 8);
        for off in [0, 1, 8] {
            let len = 1003 - 8;
            let (cxs, cys) = (cx.narrow(0, off, len), cy.narrow(0, 8 - off.min(8), len));
            let (gxs, gys) = (gx.narrow(0, off, len), gy.narrow(0, 8 - off.min(8), len));
            for op in [Add, Sub, Mul, Div, Maximum, Minimum] {
                check(
                    &gxs.binary(&gys, op),
                    &cxs.binary(&cys, op),
                    &format!("{} {dtype} offset {off}", op.name()),
                );
            }
        }
        let (ce, ge) = (ca.abs(), ga.abs());
        check(&ge.pow(&gb), &ce.pow(&cb), &format!("pow {dtype}"));
        for op in [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            check(&ga.cmp(&gb, op), &ca.cmp(&cb, op), &format!("{} {dtype}", op.name()));
        }
        let (cm, gm) = (ca.gt(&cb), ga.gt(&gb));
        check(&gm.where_cond(&ga, &gbt), &cm.where_cond(&ca, &cbt), &format!("where {dtype}"));
        let (cs, gs) = (&ca + &cb, &ga + &gb); // the mask's shape
        check(&gs.masked_fill(&gm, -7.0), &cs.masked_fill(&cm, -7.0), &format!("masked_fill {dtype}"));
    }
    for dtype in [DType::I64, DType::U8, DType::U32] {
        let (ca, ga) = both(&[4, 50], DType::F32, 5);
        let (ca, ga) = (ca.mul_scalar(40.0).abs().to_dtype(dtype), ga.mul_scalar(40.0).abs().to_dtype(dtype));
        let (cb, gb) = (ca.narrow(0, 1, 1), ga.narrow(0, 1, 1));
        for op in [Add, Sub, Mul, Maximum, Minimum] {
            check(&ga.binary(&gb, op), &ca.binary(&cb, op), &format!("{} {dtype}", op.name()));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conversions_and_copies_match_the_cpu_backend() {
    let all =
        [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::U32, DType::U8, DType::Bool];
    let (base, _) = both(&[3, 64, 5], DType::F64, 6);
    // Include values that round differently and that saturate integer types.
    let base = base.mul_scalar(100.0);
    for from in all {
        let c = base.to_dtype(from);
        let g = c.to_device(Device::Cuda(0)).unwrap();
        for to in all {
            check(&g.to_dtype(to), &c.to_dtype(to), &format!("{from} -> {to}"));
            let (cv, gv) = (c.permute([2, 0, 1]).narrow(2, 1, 60), g.permute([2, 0, 1]).narrow(2, 1, 60));
            check(&gv.to_dtype(to), &cv.to_dtype(to), &format!("{from} -> {to} strided"));
        }
        let gv = g.permute([1, 2, 0]);
        check(&gv.contiguous(), &c.permute([1, 2, 0]).contiguous(), &format!("copy {from}"));
    }
}
