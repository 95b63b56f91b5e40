//! Tests of the index ops: PyTorch fixtures on strided views (from `fixtures.py`), and naive
//! f64 loops over multi-indices for more dims, dtypes and the multithreaded paths.

use crate::testing::{assert_close, tolerance, Fixtures};
use crate::{device_test, DType, Device, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "index/fixtures.json")
}

/// Row-major position of multi-index `at` in `dims`.
fn ravel(at: &[usize], dims: &[usize]) -> usize {
    at.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut at = vec![0; dims.len()];
    for (a, &d) in at.iter_mut().zip(dims).rev() {
        *a = i % d;
        i /= d;
    }
    at
}

/// A float tensor of `n` pseudo-random values in [-2, 2) (a fixed LCG, no dependency).
fn randn_like(shape: &[usize], seed: u64, dtype: DType, dev: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype)
}

/// Pseudo-random indices in `0..bound`.
fn random_ids(shape: &[usize], bound: usize, seed: u64, dev: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed ^ 0x9e3779b97f4a7c15;
    let v: Vec<i64> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % bound as u64) as i64
        })
        .collect();
    Tensor::from_vec(v, shape, dev).unwrap()
}

device_test! {
    fn fixtures_match_torch_on_strided_views(dev: Device) {
        let f = fixtures();
        let t = |case: &str, name: &str| f.tensor(case, name, dev);
        let tol = tolerance(DType::F32);

        let view = t("index_select", "base").transpose(0, 2);
        assert!(!view.is_contiguous());
        let got = view.index_select(1, &t("index_select", "index"));
        assert_close(&got, &t("index_select", "out"), tol.0, tol.1, "index_select");

        let got = t("gather", "base").t().gather(1, &t("gather", "index"));
        assert_eq!(got.dtype(), DType::F64);
        assert_close(&got, &t("gather", "out"), 0.0, 0.0, "gather");

        let src = t("scatter_add", "src_base").narrow(1, 1, 4);
        let got = t("scatter_add", "base").t().scatter_add(0, &t("scatter_add", "index"), &src);
        assert_close(&got, &t("scatter_add", "out"), tol.0, tol.1, "scatter_add");

        let source = t("index_add", "src_base").permute([0, 2, 1]);
        let alpha = f.scalar("index_add", "alpha");
        let got = t("index_add", "base").index_add(1, &t("index_add", "index"), &source, alpha);
        assert_close(&got, &t("index_add", "out"), tol.0, tol.1, "index_add");

        let got = t("embedding", "ids").embedding(&t("embedding", "weight"));
        assert_close(&got, &t("embedding", "out"), 0.0, 0.0, "embedding");

        let got = t("one_hot", "ids").one_hot(f.scalar("one_hot", "num_classes") as usize);
        assert_eq!(got.dtype(), DType::I64);
        assert_close(&got, &t("one_hot", "out"), 0.0, 0.0, "one_hot");
    }
}

device_test! {
    fn index_select_every_dim_of_a_permuted_tensor(dev: Device) {
        for dtype in [DType::F32, DType::BF16, DType::I64] {
            let x = randn_like(&[3, 4, 5], 1, DType::F64, dev).to_dtype(dtype).permute([2, 0, 1]); // [5, 3, 4]
            let xs = x.to_f64_vec();
            for dim in 0..3 {
                let ids = random_ids(&[7], x.dims()[dim], dim as u64, dev);
                let ids_v = ids.to_vec::<i64>();
                // u32 indices give the same result.
                let ids_u32 = Tensor::from_vec(ids_v.iter().map(|&i| i as u32).collect::<Vec<_>>(), 7, dev).unwrap();
                let got = x.index_select(dim as i64 - 3, &ids);
                let mut dims = x.dims().to_vec();
                dims[dim] = 7;
                let expected: Vec<f64> = (0..dims.iter().product())
                    .map(|i| {
                        let mut at = unravel(i, &dims);
                        at[dim] = ids_v[at[dim]] as usize;
                        xs[ravel(&at, x.dims())]
                    })
                    .collect();
                assert_eq!(got.dims(), &dims[..]);
                assert_eq!(got.dtype(), dtype);
                assert_eq!(got.to_f64_vec(), expected, "index_select dim {dim} {dtype}");
                assert_eq!(x.index_select(dim, &ids_u32).to_f64_vec(), expected);
            }
        }
    }
}

device_test! {
    fn index_select_and_gather_large_use_threads_and_match_loops(dev: Device) {
        let x = randn_like(&[300, 257], 2, DType::F32, dev).t(); // [257, 300], strided
        let ids = random_ids(&[400], 257, 3, dev);
        let got = x.index_select(0, &ids).to_f64_vec();
        let (xs, ids) = (x.to_f64_vec(), ids.to_vec::<i64>());
        for (r, &i) in ids.iter().enumerate() {
            assert_eq!(got[r * 300..(r + 1) * 300], xs[i as usize * 300..(i as usize + 1) * 300]);
        }
        let index = random_ids(&[257, 300], 300, 4, dev);
        let got = x.gather(1, &index).to_f64_vec();
        for (k, &i) in index.to_vec::<i64>().iter().enumerate() {
            assert_eq!(got[k], xs[(k / 300) * 300 + i as usize], "gather element {k}");
        }
    }
}

device_test! {
    fn gather_and_embedding_match_loops(dev: Device) {
        // [4, 6, 5] viewed from a [6, 5, 4] base; index shape smaller than input off `dim`.
        let x = randn_like(&[6, 5, 4], 4, DType::F64, dev).permute([2, 0, 1]);
        let xs = x.to_f64_vec();
        for dim in 0..3 {
            let shape = [3, 5, 2];
            let index = random_ids(&shape, x.dims()[dim], 10 + dim as u64, dev).transpose(0, 2);
            let iv = index.to_vec::<i64>();
            let got = x.gather(dim, &index);
            assert_eq!(got.dims(), index.dims());
            let expected: Vec<f64> = (0..iv.len())
                .map(|i| {
                    let mut at = unravel(i, index.dims());
                    at[dim] = iv[i] as usize;
                    xs[ravel(&at, x.dims())]
                })
                .collect();
            assert_eq!(got.to_f64_vec(), expected, "gather dim {dim}");
        }
        let weight = randn_like(&[11, 4], 5, DType::F16, dev);
        let ids = random_ids(&[2, 3, 5], 11, 6, dev);
        let got = ids.embedding(&weight);
        assert_eq!(got.dims(), &[2, 3, 5, 4]);
        let (ws, iv) = (weight.to_f64_vec(), ids.to_vec::<i64>());
        let expected: Vec<f64> = iv.iter().flat_map(|&i| ws[i as usize * 4..i as usize * 4 + 4].to_vec()).collect();
        assert_eq!(Tensor::embedding(&ids, &weight).to_f64_vec(), expected);
    }
}

/// The naive scatter-add: `out = self; out[index[p] at dim] += src[p]`, in f64.
fn scatter_add_loop(x: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Vec<f64> {
    let mut out = x.to_f64_vec();
    let (iv, sv) = (index.to_vec::<i64>(), src.to_f64_vec());
    for (i, &v) in iv.iter().enumerate() {
        let at = unravel(i, index.dims());
        let s = sv[ravel(&at, src.dims())];
        let mut to = at;
        to[dim] = v as usize;
        out[ravel(&to, x.dims())] += s;
    }
    out
}

device_test! {
    fn scatter_add_accumulates_repeats_in_every_dim(dev: Device) {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64] {
            let x = (randn_like(&[5, 4, 6], 7, DType::F64, dev) * 8.0).to_dtype(dtype).transpose(0, 2); // [6, 4, 5]
            let src = (randn_like(&[6, 5, 7], 8, DType::F64, dev) * 8.0).to_dtype(dtype).narrow(2, 1, 5).transpose(1, 2);
            for dim in 0..3 {
                // Few target slots, many entries: every slot gets several contributions.
                let index = random_ids(&[5, 4, 5], 2, 20 + dim as u64, dev);
                let got = x.scatter_add(dim, &index, &src);
                let expected = Tensor::from_vec(scatter_add_loop(&x, dim, &index, &src), x.dims(), dev).unwrap();
                let (rtol, atol) = match dtype {
                    DType::BF16 => (2e-2, 0.2),
                    DType::F32 => (1e-5, 1e-5),
                    _ => (1e-12, 1e-12),
                };
                assert_close(&got, &expected, rtol, atol, &format!("scatter_add dim {dim} {dtype}"));
            }
        }
    }
}

device_test! {
    fn scatter_add_large_is_deterministic_and_exact(dev: Device) {
        // Above the threading threshold; integer-valued f32 sums are exact, so the multithreaded
        // result must equal the loop bit for bit, and two runs must agree.
        let x = (randn_like(&[64, 40, 30], 9, DType::F64, dev) * 4.0).round().to_dtype(DType::F32);
        let src = (randn_like(&[64, 400, 30], 10, DType::F64, dev) * 4.0).round().to_dtype(DType::F32);
        for dim in [0, 1] {
            let index = random_ids(&[64, 400, 30], x.dims()[dim], 30 + dim as u64, dev);
            let index = if dim == 0 { index.narrow(1, 0, 40) } else { index };
            let src = if dim == 0 { src.narrow(1, 0, 40) } else { src.clone() };
            let got = x.scatter_add(dim, &index, &src);
            assert_eq!(got.to_f64_vec(), scatter_add_loop(&x, dim, &index, &src), "dim {dim}");
            assert_eq!(got.to_vec::<f32>(), x.scatter_add(dim, &index, &src).to_vec::<f32>());
        }
    }
}

/// The naive index-add: `out = self; out.select(dim, index[i]) += alpha * source.select(dim, i)`.
fn index_add_loop(x: &Tensor, dim: usize, index: &Tensor, source: &Tensor, alpha: f64) -> Vec<f64> {
    let mut out = x.to_f64_vec();
    let (iv, sv) = (index.to_vec::<i64>(), source.to_f64_vec());
    for (i, &s) in sv.iter().enumerate() {
        let mut at = unravel(i, source.dims());
        at[dim] = iv[at[dim]] as usize;
        out[ravel(&at, x.dims())] += alpha * s;
    }
    out
}

device_test! {
    fn index_add_accumulates_repeats(dev: Device) {
        for dtype in [DType::F32, DType::F16, DType::I64, DType::U32] {
            let x = (randn_like(&[4, 6, 5], 11, DType::F64, dev) * 8.0 + 20.0).to_dtype(dtype);
            let alpha = if dtype.is_float() { -1.5 } else { 3.0 };
            for dim in 0..3 {
                let mut sdims = vec![4, 6, 5];
                sdims[dim] = 9;
                sdims.reverse();
                let source = (randn_like(&sdims, 12, DType::F64, dev) * 8.0 + 10.0).to_dtype(dtype).permute([2, 1, 0]);
                let index = random_ids(&[9], x.dims()[dim], 40 + dim as u64, dev);
                let got = x.index_add(dim, &index, &source, alpha);
                let expected = Tensor::from_vec(index_add_loop(&x, dim, &index, &source, alpha), x.dims(), dev).unwrap();
                // Integer sums wrap, as in PyTorch: cast the exact f64 sums the same way.
                let expected = if dtype.is_float() { expected } else { expected.to_dtype(dtype) };
                let (rtol, atol) = if dtype == DType::F16 { (4e-3, 0.1) } else { (1e-6, 1e-5) };
                assert_close(&got, &expected, rtol, atol, &format!("index_add dim {dim} {dtype}"));
            }
        }
    }
}

device_test! {
    fn index_add_large_rows_like_an_embedding_backward(dev: Device) {
        // dim 0 of a [vocab, dim] table with many repeated ids: the multithreaded path.
        let table = Tensor::zeros([50, 128], DType::F64, dev).unwrap();
        let grads = randn_like(&[1000, 128], 13, DType::F64, dev);
        let ids = random_ids(&[1000], 50, 14, dev);
        let got = table.index_add(0, &ids, &grads, 1.0);
        let expected = Tensor::from_vec(index_add_loop(&table, 0, &ids, &grads, 1.0), [50, 128], dev).unwrap();
        assert_close(&got, &expected, 1e-12, 1e-12, "index_add dim 0");
        assert_eq!(got.to_vec::<f64>(), table.index_add(0, &ids, &grads, 1.0).to_vec::<f64>());
    }
}

device_test! {
    fn one_hot_of_u32_and_empty_shapes(dev: Device) {
        let ids = Tensor::from_vec(vec![2u32, 0, 2], 3, dev).unwrap();
        let got = ids.one_hot(3);
        assert_eq!(got.dims(), &[3, 3]);
        let v = got.to_vec::<i64>();
        for (r, &c) in [2usize, 0, 2].iter().enumerate() {
            for k in 0..3 {
                assert_eq!(v[r * 3 + k], (k == c) as i64);
            }
        }
        let none = Tensor::zeros([0], DType::I64, dev).unwrap();
        assert_eq!(none.one_hot(4).dims(), &[0, 4]);
        let x = randn_like(&[3, 2], 1, DType::F32, dev);
        assert_eq!(x.index_select(0, &none).dims(), &[0, 2]);
    }
}

/// On the CPU the index is checked before the op (on CUDA the kernel checks it, below).
#[test]
#[should_panic(expected = "index_select: index 5 is out of range for dim 1 with size 5")]
fn index_select_out_of_range_panics() {
    let dev = Device::Cpu;
    let x = Tensor::zeros([2, 5], DType::F32, dev).unwrap();
    x.index_select(1, &Tensor::new([0i64, 5], dev).unwrap());
}

/// On the CPU the index is checked before the op (on CUDA the kernel checks it, below).
#[test]
#[should_panic(
    expected = "gather: index -1 is out of range for dim 0 with size 2 (tensor shape [2, 5]); negative indices are not supported"
)]
fn gather_negative_index_panics() {
    let dev = Device::Cpu;
    let x = Tensor::zeros([2, 5], DType::F32, dev).unwrap();
    x.gather(0, &Tensor::new([[0i64, -1]], dev).unwrap());
}

device_test! {
    #[should_panic(expected = "scatter_add: index 3 is out of range for dim 1 with size 3")]
    fn scatter_add_out_of_range_panics(dev: Device) {
        let x = Tensor::zeros([2, 3], DType::F32, dev).unwrap();
        x.scatter_add(1, &Tensor::new([[3i64]], dev).unwrap(), &x);
    }
}

device_test! {
    #[should_panic(expected = "scatter_add: the index of shape [3, 1] is larger than src of shape [2, 3] in dim 0")]
    fn scatter_add_index_larger_than_src_panics(dev: Device) {
        let x = Tensor::zeros([4, 3], DType::F32, dev).unwrap();
        let src = Tensor::zeros([2, 3], DType::F32, dev).unwrap();
        x.scatter_add(0, &Tensor::zeros([3, 1], DType::I64, dev).unwrap(), &src);
    }
}

device_test! {
    #[should_panic(expected = "index_add: source of shape [2, 3] must have shape [1, 3]")]
    fn index_add_source_shape_panics(dev: Device) {
        let x = Tensor::zeros([4, 3], DType::F32, dev).unwrap();
        x.index_add(0, &Tensor::new([1i64], dev).unwrap(), &Tensor::zeros([2, 3], DType::F32, dev).unwrap(), 1.0);
    }
}

/// On the CPU the index is checked before the op (on CUDA the kernel checks it, below).
#[test]
#[should_panic(expected = "embedding: index 10 is out of range for dim 0 with size 10")]
fn embedding_out_of_range_panics() {
    let dev = Device::Cpu;
    let w = Tensor::zeros([10, 2], DType::F32, dev).unwrap();
    Tensor::new([[10i64]], dev).unwrap().embedding(&w);
}

device_test! {
    #[should_panic(expected = "one_hot: class -2 is out of range for num_classes 4")]
    fn one_hot_negative_panics(dev: Device) {
        Tensor::new([1i64, -2], dev).unwrap().one_hot(4);
    }
}

device_test! {
    #[should_panic(expected = "gather: the index must be an int64 or uint32 tensor, got float32")]
    fn float_index_panics(dev: Device) {
        let x = Tensor::zeros([2, 5], DType::F32, dev).unwrap();
        x.gather(0, &x);
    }
}

device_test! {
    fn embedding_one_hot_and_index_select_read_strided_ids(dev: Device) {
        // Transposed ids and a transposed table: the gathers read both through their layouts.
        let ids = random_ids(&[4, 3], 7, 50, dev).t(); // [3, 4]
        let weight = randn_like(&[5, 7], 51, DType::F32, dev).t(); // [7, 5]
        assert!(!ids.is_contiguous() && !weight.is_contiguous());
        let (iv, ws) = (ids.to_vec::<i64>(), weight.to_f64_vec());
        let got = ids.embedding(&weight);
        assert_eq!(got.dims(), &[3, 4, 5]);
        let expected: Vec<f64> = iv.iter().flat_map(|&i| ws[i as usize * 5..i as usize * 5 + 5].to_vec()).collect();
        assert_eq!(got.to_f64_vec(), expected);

        let hot = ids.one_hot(7).to_vec::<i64>();
        let expected: Vec<i64> = iv.iter().flat_map(|&c| (0..7).map(move |k| (k == c) as i64)).collect();
        assert_eq!(hot, expected);

        // A 0-D index keeps the dim with size 1; a strided 1-D index (every other entry).
        let scalar = Tensor::new(4i64, dev).unwrap();
        let got = weight.index_select(1, &scalar);
        assert_eq!(got.dims(), &[7, 1]);
        assert_eq!(got.to_f64_vec(), (0..7).map(|r| ws[r * 5 + 4]).collect::<Vec<_>>());
        let every_other = random_ids(&[6], 7, 52, dev).slice(0, 0, 6, 2);
        let ev = every_other.to_vec::<i64>();
        let got = weight.index_select(0, &every_other).to_f64_vec();
        let expected: Vec<f64> = ev.iter().flat_map(|&i| ws[i as usize * 5..i as usize * 5 + 5].to_vec()).collect();
        assert_eq!(got, expected);
    }
}

device_test! {
    fn u8_index_add_and_scatter_add_wrap(dev: Device) {
        let (xv, iv, sv) = (vec![250u8, 7, 128], [0usize, 2, 0, 2], vec![3u8, 200, 4, 100]);
        let x = Tensor::from_vec(xv.clone(), 3, dev).unwrap();
        let index = Tensor::new(iv.map(|i| i as i64), dev).unwrap();
        let source = Tensor::from_vec(sv.clone(), 4, dev).unwrap();
        let (mut added, mut scattered) = (xv.clone(), xv);
        for (k, &i) in iv.iter().enumerate() {
            added[i] = added[i].wrapping_add(sv[k].wrapping_mul(3));
            if k < 3 {
                scattered[i] = scattered[i].wrapping_add(sv[k]);
            }
        }
        assert!(added.iter().zip(&scattered).any(|(a, s)| a != s) && added[0] < 250, "sums must wrap");
        assert_eq!(x.index_add(0, &index, &source, 3.0).to_vec::<u8>(), added);
        assert_eq!(x.scatter_add(0, &index.narrow(0, 0, 3), &source).to_vec::<u8>(), scattered);
    }
}

device_test! {
    #[should_panic(expected = "index_add: not defined for bool tensors")]
    fn index_add_of_bool_panics(dev: Device) {
        let x = Tensor::zeros([3], DType::Bool, dev).unwrap();
        x.index_add(0, &Tensor::new([1i64], dev).unwrap(), &Tensor::zeros([1], DType::Bool, dev).unwrap(), 1.0);
    }
}

device_test! {
    fn embedding_backward_sums_the_rows_of_each_id(dev: Device) {
        // ids [2, 3] with repeats (3 twice, 0 twice); table of 5 rows of 4; row 1 and 4 unused.
        let ids = Tensor::new([[3i64, 0, 2], [3, 0, 0]], dev).unwrap();
        let g: Vec<f64> = (0..24).map(|i| i as f64 * 0.5 - 3.0).collect();
        let mut want = vec![0.0; 20];
        for (pos, &id) in [3usize, 0, 2, 3, 0, 0].iter().enumerate() {
            for k in 0..4 {
                want[id * 4 + k] += g[pos * 4 + k];
            }
        }
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let grad = Tensor::from_vec(g.clone(), [2, 3, 4], dev).unwrap().to_dtype(dtype);
            let got = grad.embedding_backward(&ids, 5);
            assert_eq!((got.dims(), got.dtype()), (&[5usize, 4][..], dtype));
            let (rtol, atol) = tolerance(dtype);
            let want = Tensor::from_vec(want.clone(), [5, 4], dev).unwrap().to_dtype(dtype);
            assert_close(&got, &want, rtol, atol, &format!("embedding_backward {dtype}"));
            // A strided gradient reads the same rows.
            let strided = grad.transpose(0, 1).contiguous().transpose(0, 1);
            assert_close(&strided.embedding_backward(&ids, 5), &want, rtol, atol, "strided gradient");
        }
    }
}

/// On CUDA the gathers and embedding's backward check their indices in the kernel: a bad one
/// is reported, naming the value, the bound and the op, at this thread's next wait for the
/// device; the record is cleared after, so the next op runs clean.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_bad_indices_are_reported_at_the_next_wait() {
    let dev = Device::Cuda(0);
    let x = Tensor::zeros([2, 5], DType::F32, dev).unwrap();
    let w = Tensor::zeros([10, 2], DType::F32, dev).unwrap();
    type Op<'a> = Box<dyn Fn() -> Tensor + 'a>;
    let cases: Vec<(&str, Op)> = vec![
        (
            "index 5 is out of range for a dimension of size 5",
            Box::new(|| x.index_select(1, &Tensor::new([0i64, 5], dev).unwrap())),
        ),
        (
            "index -1 is out of range for a dimension of size 2",
            Box::new(|| x.gather(0, &Tensor::new([[0i64, -1]], dev).unwrap())),
        ),
        (
            "index 10 is out of range for a dimension of size 10",
            Box::new(|| Tensor::new([[10i64]], dev).unwrap().embedding(&w)),
        ),
        (
            "embedding_backward: id 12 is out of range for 10 embeddings",
            Box::new(|| {
                Tensor::zeros([3, 2], DType::F32, dev)
                    .unwrap()
                    .embedding_backward(&Tensor::new([1i64, 12, 3], dev).unwrap(), 10)
            }),
        ),
    ];
    for (want, op) in &cases {
        let queued = op(); // no wait yet: the kernel only queued
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| queued.to_f64_vec())).unwrap_err();
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(want), "expected `{want}` in: {msg}");
        // Cleared: a good op after it reads back without a report.
        assert_eq!(x.index_select(1, &Tensor::new([4i64], dev).unwrap()).to_f64_vec(), vec![0.0; 2]);
    }
}

/// The device sort behind embedding's backward gives the CPU's bits: every id's rows summed in
/// position order. Tables whose size needs 1, 2 and 3 radix passes; ids in more than one sort
/// tile; heavy repeats (one id in a third of the positions); a strided gradient; one id.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_embedding_backward_equals_the_cpu_bit_for_bit() {
    let dev = Device::Cuda(0);
    for (num, n, dim) in [(7usize, 1usize, 3usize), (200, 5000, 33), (50257, 16384, 64), (70000, 4097, 5)] {
        let mut ids = random_ids(&[n], num, num as u64, Device::Cpu).to_vec::<i64>();
        ids.iter_mut().step_by(3).for_each(|i| *i = (num / 2) as i64);
        let ids_cpu = Tensor::from_vec(ids, [n], Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            let grad_cpu = randn_like(&[n, dim], 7, dtype, Device::Cpu);
            let want = grad_cpu.embedding_backward(&ids_cpu, num).to_f64_vec();
            let (grad, ids) = (grad_cpu.to_device(dev).unwrap(), ids_cpu.to_device(dev).unwrap());
            let got = grad.embedding_backward(&ids, num).to_f64_vec();
            let what = format!("embedding_backward num {num} n {n} dim {dim} {dtype}");
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}");
            // The same rows seen through a transposed layout (a copy made contiguous first).
            let strided = grad.reshape([n, dim]).t().contiguous().t();
            assert_eq!(strided.embedding_backward(&ids, num).to_f64_vec(), want, "{what}: strided gradient");
            // uint32 ids, and ids of another shape ([1, n]) name the same positions.
            let ids32 = ids_cpu.to_dtype(DType::U32).reshape([1, n]).to_device(dev).unwrap();
            let grad3 = grad.reshape([1, n, dim]);
            assert_eq!(grad3.embedding_backward(&ids32, num).to_f64_vec(), want, "{what}: u32 ids");
        }
    }
}
