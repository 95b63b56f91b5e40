//! Tests of cat, stack and the split family: PyTorch fixtures (`fixtures.py`) for results on
//! strided views and for the piece sizes of split/chunk, naive loops for more dtypes and dims.

use crate::testing::{assert_close, Fixtures};
use crate::{device_test, DType, Device, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "join/fixtures.json")
}

fn iota(shape: &[usize], dtype: DType, dev: Device) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f64).collect::<Vec<_>>(), shape, dev).unwrap().to_dtype(dtype)
}

/// The naive concatenation of `parts` along `dim`, element by element, in f64.
fn cat_loop(parts: &[&Tensor], dim: usize) -> (Vec<usize>, Vec<f64>) {
    let mut shape = parts[0].dims().to_vec();
    shape[dim] = parts.iter().map(|t| t.dims()[dim]).sum();
    let outer: usize = shape[..dim].iter().product();
    let mut out = vec![];
    for o in 0..outer {
        for t in parts {
            let row: usize = t.dims()[dim..].iter().product();
            out.extend_from_slice(&t.to_f64_vec()[o * row..(o + 1) * row]);
        }
    }
    (shape, out)
}

device_test! {
    fn cat_and_stack_match_torch_on_strided_views(dev: Device) {
        let f = fixtures();
        let t = |case: &str, name: &str| f.tensor(case, name, dev);
        let (a, b, c) = (t("cat", "a").transpose(0, 1), t("cat", "b"), t("cat", "c_base").slice(1, 0, 2, 2));
        let got = Tensor::cat(&[&a, &b, &c], 1);
        assert_close(&got, &t("cat", "out"), 0.0, 0.0, "cat");
        let got = Tensor::stack(&[t("stack", "x").t(), t("stack", "y")], -1);
        assert_eq!(got.dtype(), DType::F64);
        assert_close(&got, &t("stack", "out"), 0.0, 0.0, "stack");
    }
}

device_test! {
    fn split_and_chunk_piece_sizes_match_torch(dev: Device) {
        let f = fixtures();
        let mut checked = 0;
        for case in f.case_names().filter(|c| c.starts_with("chunk_") || c.starts_with("split_")) {
            let parts: Vec<usize> = case.split('_').skip(1).map(|p| p.parse().unwrap()).collect();
            let expected: Vec<usize> = f.ints(case, "sizes").into_iter().map(|s| s as usize).collect();
            let (pieces, dim) = if case.starts_with("chunk_") {
                (iota(&[2, parts[0]], DType::F32, dev).chunk(parts[1], -1), 1)
            } else {
                (iota(&[parts[0], 2], DType::F32, dev).split(parts[1], 0), 0)
            };
            let sizes: Vec<usize> = pieces.iter().map(|p| p.dims()[dim]).collect();
            assert_eq!(sizes, expected, "{case}");
            checked += 1;
        }
        assert!(checked > 80, "only {checked} split/chunk cases");
    }
}

device_test! {
    fn split_pieces_are_views_that_cat_back(dev: Device) {
        let x = iota(&[4, 7, 3], DType::F32, dev).permute([1, 0, 2]); // [7, 4, 3]
        let pieces = x.split(3, 0);
        assert!(pieces.iter().all(|p| p.same_storage(&x)));
        assert_eq!(Tensor::cat(&pieces, 0).to_f64_vec(), x.to_f64_vec());
        let pieces = x.split_sizes(&[1, 0, 3], 1);
        assert_eq!(pieces.iter().map(|p| p.dims()[1]).collect::<Vec<_>>(), vec![1, 0, 3]);
        assert_eq!(pieces[2].to_f64_vec(), x.narrow(1, 1, 3).to_f64_vec());
        assert_eq!(Tensor::cat(&pieces, -2).to_f64_vec(), x.to_f64_vec());
        let chunks = x.chunk(2, 2);
        assert_eq!(chunks[1].to_f64_vec(), x.narrow(2, 2, 1).to_f64_vec());
    }
}

device_test! {
    fn cat_matches_loop_for_dtypes_and_dims(dev: Device) {
        for dtype in [DType::F32, DType::BF16, DType::I64, DType::U8, DType::Bool] {
            let a = iota(&[2, 3, 4], dtype, dev);
            let b = iota(&[4, 3, 5], dtype, dev).permute([2, 1, 0]).narrow(2, 1, 2).permute([2, 1, 0]); // [2, 3, 5]
            let c = iota(&[2, 1, 4], dtype, dev).expand([2, 3, 4]);
            let cases: [(Vec<&Tensor>, usize); 3] = [
                (vec![&a, &c, &a], 0),
                (vec![&a, &c], 1),
                (vec![&a, &b, &c], 2),
            ];
            for (parts, dim) in cases {
                let got = Tensor::cat(&parts, dim as i64 - 3);
                let (shape, expected) = cat_loop(&parts, dim);
                assert_eq!((got.dims(), got.dtype()), (&shape[..], dtype));
                assert_eq!(got.to_f64_vec(), expected, "cat dim {dim} {dtype}");
            }
        }
    }
}

device_test! {
    fn cat_large_inputs_on_both_threaded_paths(dev: Device) {
        // Few long rows (dim 0) and many rows (dim 1), above the threading threshold.
        let a = iota(&[300, 200], DType::F32, dev).t(); // [200, 300]
        let b = iota(&[100, 300], DType::F32, dev);
        let (shape, expected) = cat_loop(&[&a, &b], 0);
        let got = Tensor::cat(&[&a, &b], 0);
        assert_eq!((got.dims(), got.to_f64_vec()), (&shape[..], expected));
        let c = iota(&[200, 50], DType::F32, dev);
        let (shape, expected) = cat_loop(&[&a, &c, &a], 1);
        let got = Tensor::cat(&[&a, &c, &a], 1);
        assert_eq!((got.dims(), got.to_f64_vec()), (&shape[..], expected));
    }
}

device_test! {
    fn stack_inserts_a_dim_anywhere(dev: Device) {
        let a = iota(&[2, 3], DType::F64, dev);
        let b = iota(&[3, 2], DType::F64, dev).t();
        let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
        for dim in 0..3 {
            let got = Tensor::stack(&[&a, &b], dim);
            let mut shape = vec![2, 3];
            shape.insert(dim, 2);
            assert_eq!(got.dims(), &shape[..]);
            let gv = got.to_f64_vec();
            for i in 0..2 {
                for j in 0..3 {
                    for (k, src) in [&av, &bv].iter().enumerate() {
                        let mut at = vec![i, j];
                        at.insert(dim, k);
                        let pos = at.iter().zip(&shape).fold(0, |acc, (&x, &d)| acc * d + x);
                        assert_eq!(gv[pos], src[i * 3 + j], "stack dim {dim}");
                    }
                }
            }
        }
    }
}

device_test! {
    fn cat_skips_legacy_empty_vectors(dev: Device) {
        let a = iota(&[2, 3], DType::F32, dev);
        let empty = Tensor::zeros([0], DType::F32, dev).unwrap();
        let got = Tensor::cat(&[&empty, &a, &empty], 0);
        assert_eq!(got.dims(), &[2, 3]);
        assert!(!got.same_storage(&a));
        assert_eq!(Tensor::cat(&[&empty, &empty], 0).dims(), &[0]);
    }
}

device_test! {
    #[should_panic(expected = "cat: tensors must have the same shape except in dim 0; got [2, 3] and [2, 4] (tensor 1)")]
    fn cat_shape_mismatch_panics(dev: Device) {
        let (a, b) = (iota(&[2, 3], DType::F32, dev), iota(&[2, 4], DType::F32, dev));
        Tensor::cat(&[a, b], 0);
    }
}

device_test! {
    #[should_panic(expected = "cat: tensors must have the same dtype; tensor 0 is float32 with shape [2, 3], tensor 1 is bfloat16 with shape [2, 3]")]
    fn cat_dtype_mismatch_panics(dev: Device) {
        let (a, b) = (iota(&[2, 3], DType::F32, dev), iota(&[2, 3], DType::BF16, dev));
        Tensor::cat(&[a, b], 1);
    }
}

device_test! {
    #[should_panic(expected = "stack: expects each tensor to be of equal shape, but got [2, 3] at entry 0 and [3, 2] at entry 1")]
    fn stack_shape_mismatch_panics(dev: Device) {
        let (a, b) = (iota(&[2, 3], DType::F32, dev), iota(&[3, 2], DType::F32, dev));
        Tensor::stack(&[a, b], 0);
    }
}

device_test! {
    #[should_panic(expected = "split_sizes: sizes [1, 1] add up to 2, but dim 1 has size 3 (shape [2, 3])")]
    fn split_sizes_must_cover_the_dim(dev: Device) {
        iota(&[2, 3], DType::F32, dev).split_sizes(&[1, 1], 1);
    }
}
