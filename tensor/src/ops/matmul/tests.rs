use crate::testing::assert_close;
use crate::*;

/// Deterministic values in [-1, 1), different for each `seed`.
pub(crate) fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

pub(crate) fn rand(shape: &[usize], seed: u64, dtype: DType, dev: Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed), shape, dev).unwrap().to_dtype(dtype)
}

/// torch.matmul by the definition: a triple loop per batch index, batch dims broadcast by
/// index arithmetic. Returns the result's shape and values.
fn reference(a: &Tensor, b: &Tensor) -> (Vec<usize>, Vec<f64>) {
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let mut ash = a.dims().to_vec();
    let mut bsh = b.dims().to_vec();
    if ash.len() == 1 {
        ash.insert(0, 1);
    }
    if bsh.len() == 1 {
        bsh.push(1);
    }
    let (m, k, n) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
    let (abatch, bbatch) = (&ash[..ash.len() - 2], &bsh[..bsh.len() - 2]);
    let rank = abatch.len().max(bbatch.len());
    let pad = |s: &[usize]| [vec![1; rank - s.len()], s.to_vec()].concat();
    let (pa, pb) = (pad(abatch), pad(bbatch));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    let count: usize = batch.iter().product();
    let linear = |idx: &[usize], dims: &[usize]| {
        idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
    };
    let mut out = vec![0.0; count * m * n];
    for bi in 0..count {
        let mut idx = vec![0; rank];
        let mut rest = bi;
        for d in (0..rank).rev() {
            idx[d] = rest % batch[d];
            rest /= batch[d];
        }
        let (ia, ib) = (linear(&idx, &pa), linear(&idx, &pb));
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for p in 0..k {
                    acc += av[ia * m * k + i * k + p] * bv[ib * k * n + p * n + j];
                }
                out[bi * m * n + i * n + j] = acc;
            }
        }
    }
    let mut shape = batch;
    if a.rank() > 1 {
        shape.push(m);
    }
    if b.rank() > 1 {
        shape.push(n);
    }
    (shape, out)
}

fn check(a: &Tensor, b: &Tensor, what: &str) {
    let got = a.matmul(b);
    let (shape, want) = reference(a, b);
    assert_eq!(got.dims(), &shape[..], "{what}: shape");
    assert_eq!(got.dtype(), a.dtype(), "{what}: dtype");
    let want = Tensor::from_vec(want, shape, Device::Cpu).unwrap();
    let (rtol, atol) = match a.dtype() {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (2e-3, 1e-2),
        _ => (1e-2, 1e-2),
    };
    assert_close(&got, &want, rtol, atol, what);
}

const SHAPES: &[(&[usize], &[usize])] = &[
    (&[7], &[7]),
    (&[5, 7], &[7]),
    (&[7], &[7, 3]),
    (&[5, 7], &[7, 3]),
    (&[2, 5, 7], &[7]),
    (&[7], &[2, 7, 3]),
    (&[2, 1, 3, 4], &[3, 4, 5]),
    (&[4, 6, 8], &[8, 5]),
    (&[3, 4, 6], &[3, 6, 2]),
    (&[16, 9, 9], &[16, 9, 9]),
    (&[0, 3], &[3, 4]),
    (&[3, 0], &[0, 4]),
    (&[130, 70], &[70, 150]),
];

device_test! {
    fn matmul_matches_the_definition_in_every_float_dtype(dev: Device) {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for (i, (sa, sb)) in SHAPES.iter().enumerate() {
                let a = rand(sa, 2 * i as u64, dtype, dev);
                let b = rand(sb, 2 * i as u64 + 1, dtype, dev);
                check(&a, &b, &format!("{dtype} {sa:?} @ {sb:?}"));
            }
        }
    }
}

device_test! {
    fn strided_operands_are_multiplied_in_place(dev: Device) {
        for dtype in [DType::F32, DType::F64] {
            // Transposed lhs and rhs.
            let a = rand(&[9, 6], 1, dtype, dev).t();
            let b = rand(&[5, 9], 2, dtype, dev).t();
            check(&a, &b, "a.t() @ b.t()");
            check(&a, &rand(&[9, 5], 3, dtype, dev), "a.t() @ b");
            // Narrowed rows and columns, and a stepped slice (neither stride is 1).
            let wide = rand(&[8, 12], 4, dtype, dev);
            check(&wide.narrow(1, 3, 6), &rand(&[6, 4], 5, dtype, dev), "narrowed cols @ b");
            let stepped = wide.slice(1, 0, 12, 2).slice(0, 1, 8, 2);
            check(&stepped, &wide.narrow(0, 2, 6), "stepped @ narrowed rows");
            // Batched with transposed inner matrices and an expanded (stride 0) batch dim.
            let q = rand(&[2, 3, 5, 4], 6, dtype, dev);
            let k = rand(&[2, 3, 7, 4], 7, dtype, dev);
            check(&q, &k.transpose(-1, -2), "q @ k^T");
            let shared = rand(&[1, 4, 6], 8, dtype, dev).expand([5, -1, -1]);
            check(&rand(&[5, 2, 4], 9, dtype, dev), &shared, "x @ expanded");
            check(&shared.transpose(1, 2), &rand(&[5, 4, 3], 10, dtype, dev), "expanded^T @ y");
            // The tall-product path with a transposed weight, and a lhs whose rows do not stack.
            let x = rand(&[3, 4, 6], 11, dtype, dev);
            let w = rand(&[5, 6], 12, dtype, dev);
            check(&x, &w.t(), "x @ w.t()");
            check(&x.transpose(0, 1), &w.t(), "x.transpose(0, 1) @ w.t()");
            // A permuted batch whose rows still stack evenly.
            let p = rand(&[4, 3, 6], 13, dtype, dev).permute([1, 0, 2]);
            check(&p, &w.t(), "permuted @ w.t()");
        }
    }
}

device_test! {
    fn big_batched_products_split_over_threads(dev: Device) {
        // Large enough that gemm itself spreads each product over threads, and a batch of many
        // small products that runs one product per thread.
        check(&rand(&[2, 160, 96], 1, DType::F32, dev), &rand(&[2, 96, 128], 2, DType::F32, dev), "big");
        check(&rand(&[40, 5, 3], 3, DType::F32, dev), &rand(&[40, 3, 4], 4, DType::F32, dev), "many");
    }
}

#[test]
fn a_long_inner_dim_is_split_over_threads_and_summed() {
    // k far longer than the output (as a language model head's input gradient): the product
    // is split into one range of k per thread, 3 unequal ranges here, and the partials added.
    let (m, n, k) = (16, 12, 40_001);
    assert!(super::cpu::splits_k(m, n, k, 3), "the case must take the split path");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    for dtype in [DType::F32, DType::F64] {
        let a = rand(&[m, k], 21, dtype, Device::Cpu);
        let at = rand(&[k, m], 22, dtype, Device::Cpu).t();
        let b = rand(&[k, n], 23, dtype, Device::Cpu);
        for (lhs, what) in [(&a, "a @ b"), (&at, "a.t() @ b")] {
            let got = pool.install(|| lhs.matmul(&b));
            let (_, want) = reference(lhs, &b);
            // Each entry sums k products of values in [-1, 1): an f32 bound of k ulps of 1.
            let atol = if dtype == DType::F64 { 1e-10 } else { k as f64 * 6e-8 };
            let want = Tensor::from_vec(want, [m, n], Device::Cpu).unwrap();
            assert_close(&got, &want, 0.0, atol, &format!("{dtype} {what}"));
        }
    }
}

device_test! {
    fn bmm_is_strict_batched_matmul(dev: Device) {
        let a = rand(&[3, 4, 5], 1, DType::F64, dev);
        let b = rand(&[3, 5, 2], 2, DType::F64, dev);
        let got = a.bmm(&b);
        let (shape, want) = reference(&a, &b);
        assert_close(&got, &Tensor::from_vec(want, shape, dev).unwrap(), 1e-12, 1e-12, "bmm");
    }
}

device_test! {
    #[should_panic(expected = "bmm: shapes [3, 4, 5] and [1, 5, 2] do not match")]
    fn bmm_does_not_broadcast(dev: Device) {
        rand(&[3, 4, 5], 1, DType::F32, dev).bmm(&rand(&[1, 5, 2], 2, DType::F32, dev));
    }
}

device_test! {
    #[should_panic(expected = "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (2x3 and 4x5)")]
    fn mismatched_inner_dims_panic(dev: Device) {
        rand(&[2, 3], 1, DType::F32, dev).matmul(&rand(&[4, 5], 2, DType::F32, dev));
    }
}

device_test! {
    #[should_panic(expected = "matmul: shapes [2, 3, 4] and [5, 4, 2] cannot be broadcast together")]
    fn batch_dims_must_broadcast(dev: Device) {
        rand(&[2, 3, 4], 1, DType::F32, dev).matmul(&rand(&[5, 4, 2], 2, DType::F32, dev));
    }
}

device_test! {
    #[should_panic(expected = "matmul: expected floating-point tensors, got int64")]
    fn integer_matmul_panics(dev: Device) {
        let a = Tensor::zeros([2, 2], DType::I64, dev).unwrap();
        a.matmul(&a);
    }
}

/// The product on the GPU (through cuBLAS) against the same product on the CPU.
fn check_gpu(a: &Tensor, b: &Tensor, what: &str) {
    let gpu = Device::Cuda(0);
    let want = a.matmul(b);
    let got = a.to_device(gpu).unwrap().matmul(&b.to_device(gpu).unwrap());
    assert_eq!(got.device(), gpu, "{what}: device");
    assert_eq!(got.dtype(), a.dtype(), "{what}: dtype");
    let (rtol, atol) = match a.dtype() {
        DType::F64 => (1e-12, 1e-12),
        // TF32 is off by default, so f32 products are full precision.
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (2e-3, 1e-2),
        _ => (1e-2, 1e-2),
    };
    assert_close(&got.to_device(Device::Cpu).unwrap(), &want, rtol, atol, what);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cublas_matches_the_cpu() {
    let cpu = Device::Cpu;
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let r = |shape: &[usize], seed| rand(shape, seed, dtype, cpu);
        let w = |s: &str| format!("{dtype} {s}");
        check_gpu(&r(&[257, 129], 1), &r(&[129, 65], 2), &w("257x129 @ 129x65"));
        // Transposed operands go to cuBLAS as op T, without a copy.
        check_gpu(&r(&[129, 257], 3).t(), &r(&[65, 129], 4).t(), &w("a.t() @ b.t()"));
        check_gpu(&r(&[257, 129], 5), &r(&[65, 129], 6).t(), &w("a @ b.t()"));
        // Narrowed columns: a leading dimension larger than the row.
        check_gpu(&r(&[40, 30], 7).narrow(1, 3, 20), &r(&[20, 9], 8), &w("narrowed @ b"));
        // Stepped slices on both axes are copied first.
        check_gpu(
            &r(&[40, 30], 9).slice(0, 0, 40, 2).slice(1, 1, 30, 3),
            &r(&[10, 7], 10),
            &w("stepped @ b"),
        );
        // Broadcast batch dims: runs of evenly stepping products, and stride-0 batches.
        check_gpu(&r(&[3, 1, 33, 17], 11), &r(&[4, 17, 9], 12), &w("[3,1,33,17] @ [4,17,9]"));
        check_gpu(&r(&[5, 2, 4], 13), &r(&[1, 4, 6], 14).expand([5, -1, -1]), &w("x @ expanded"));
        check_gpu(&r(&[2, 3, 7, 4], 15), &r(&[2, 3, 5, 4], 16).transpose(-1, -2), &w("q @ k^T"));
        // The tall product (shared rhs) and a lhs whose rows do not stack.
        check_gpu(&r(&[3, 40, 24], 17), &r(&[16, 24], 18).t(), &w("x @ w.t()"));
        check_gpu(&r(&[3, 40, 24], 19).transpose(0, 1), &r(&[24, 16], 20), &w("x.transpose(0, 1) @ w"));
        // A permuted batch whose offsets step back between runs, vectors, and empty sums.
        check_gpu(
            &r(&[4, 3, 6], 21).permute([1, 0, 2]).unsqueeze(2),
            &r(&[3, 4, 6, 5], 22),
            &w("permuted batch"),
        );
        check_gpu(&r(&[9], 23), &r(&[9], 24), &w("dot"));
        check_gpu(&r(&[2, 5, 9], 25), &r(&[9], 26), &w("batched matrix @ vector"));
        check_gpu(&r(&[3, 0], 27), &r(&[0, 4], 28), &w("k = 0"));
        check_gpu(&r(&[0, 3], 29), &r(&[3, 4], 30), &w("m = 0"));
    }
}
