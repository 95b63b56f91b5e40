use crate::*;
use half::{bf16, f16};
use ndarray::{s, Array, Array2, Array3, ArrayD, Axis, IxDyn, ShapeBuilder};

/// `f(i, j, k)` for every index of `dims`, row-major: the reference order, by plain loops.
fn by_index<T>(dims: [usize; 3], f: impl Fn(usize, usize, usize) -> T) -> Vec<T> {
    let mut out = Vec::new();
    for i in 0..dims[0] {
        for j in 0..dims[1] {
            for k in 0..dims[2] {
                out.push(f(i, j, k));
            }
        }
    }
    out
}

/// Where element `(i, j, k)` of a case comes from in the source array.
type IndexFn = dyn Fn(usize, usize, usize) -> f32;
/// Name, array, its shape, and where its elements come from.
type Case = (&'static str, ArrayD<f32>, [usize; 3], Box<IndexFn>);

fn value(i: usize, j: usize, k: usize) -> f32 {
    (i * 100 + j * 10 + k) as f32 - 0.5
}

device_test! {
    fn from_ndarray_reads_every_layout_in_logical_order(dev: Device) {
        let a: Array3<f32> = Array::from_shape_fn((3, 4, 5), |(i, j, k)| value(i, j, k));
        let cases: Vec<Case> = vec![
            ("standard", a.clone().into_dyn(), [3, 4, 5], Box::new(value)),
            ("permuted", a.view().permuted_axes([2, 0, 1]).to_owned().into_dyn(), [5, 3, 4], Box::new(|i, j, k| value(j, k, i))),
            ("reversed", a.slice(s![..;-1, .., 1..;2]).to_owned().into_dyn(), [3, 4, 2], Box::new(|i, j, k| value(2 - i, j, 1 + 2 * k))),
        ];
        for (name, arr, dims, f) in &cases {
            let t = Tensor::from_ndarray(arr.clone(), dev).unwrap();
            assert_eq!(t.dims(), dims, "{name}");
            assert_eq!(t.to_vec::<f32>(), by_index(*dims, f), "{name}");
        }

        // Views and owned arrays that are not in standard layout.
        let transposed_view = Tensor::from_ndarray(a.view().reversed_axes(), dev).unwrap();
        assert_eq!(transposed_view.to_vec::<f32>(), by_index([5, 4, 3], |i, j, k| value(k, j, i)));
        let fortran: Array3<f32> = Array::from_shape_fn((3, 4, 5).f(), |(i, j, k)| value(i, j, k));
        assert!(!fortran.is_standard_layout());
        assert_eq!(Tensor::from_ndarray(fortran, dev).unwrap().to_vec::<f32>(), by_index([3, 4, 5], value));
        let negative = Tensor::from_ndarray(a.slice(s![.., ..;-2, 3]), dev).unwrap();
        assert_eq!(negative.dims(), &[3, 2]);
        assert_eq!(negative.to_vec::<f32>(), by_index([3, 2, 1], |i, j, _| value(i, 3 - 2 * j, 3)));
        // An owned array that starts part-way into its buffer.
        let mut collapsed = a.clone();
        collapsed.slice_collapse(s![1.., .., ..]);
        assert!(collapsed.is_standard_layout());
        assert_eq!(
            Tensor::from_ndarray(collapsed, dev).unwrap().to_vec::<f32>(),
            by_index([2, 4, 5], |i, j, k| value(i + 1, j, k))
        );
    }
}

device_test! {
    fn from_ndarray_takes_every_dtype_and_rank(dev: Device) {
        let scalar = Tensor::from_ndarray(ndarray::arr0(7i64), dev).unwrap();
        assert_eq!((scalar.dims(), scalar.to_scalar::<i64>()), (&[][..], 7));
        let empty = Tensor::from_ndarray(Array2::<f64>::zeros((0, 3)), dev).unwrap();
        assert_eq!(empty.dims(), &[0, 3]);
        let bools = Tensor::from_ndarray(ndarray::arr1(&[true, false, true]), dev).unwrap();
        assert_eq!(bools.to_vec::<bool>(), vec![true, false, true]);
        let bytes = Tensor::from_ndarray(ndarray::arr2(&[[1u8, 2], [3, 255]]).reversed_axes(), dev).unwrap();
        assert_eq!(bytes.to_vec::<u8>(), vec![1, 3, 2, 255]);
        let words = Tensor::from_ndarray(ndarray::arr1(&[u32::MAX, 0]), dev).unwrap();
        assert_eq!(words.dtype(), DType::U32);
        let h = Tensor::from_ndarray(ndarray::arr1(&[f16::from_f32(0.5), f16::MAX]), dev).unwrap();
        assert_eq!(h.to_vec::<f16>(), vec![f16::from_f32(0.5), f16::MAX]);
        let b = Tensor::from_ndarray(ArrayD::from_elem(IxDyn(&[2, 1, 2]), bf16::from_f32(-1.5)), dev).unwrap();
        assert_eq!((b.dims(), b.dtype()), (&[2, 1, 2][..], DType::BF16));
        assert!(b.to_vec::<bf16>().iter().all(|&x| x == bf16::from_f32(-1.5)));
    }
}

device_test! {
    fn to_ndarray_follows_strided_views(dev: Device) {
        let base = Tensor::from_vec(by_index([3, 4, 5], value), [3, 4, 5], dev).unwrap();
        let arr = base.to_ndarray::<f32>();
        assert_eq!(arr.shape(), &[3, 4, 5]);
        for ((i, j, k), &x) in arr.view().into_dimensionality::<ndarray::Ix3>().unwrap().indexed_iter() {
            assert_eq!(x, value(i, j, k));
        }
        let permuted = base.permute([2, 0, 1]).to_ndarray::<f32>();
        assert_eq!(permuted.shape(), &[5, 3, 4]);
        assert_eq!(permuted[[4, 2, 1]], value(2, 1, 4));
        let narrowed = base.narrow(1, 1, 2).slice(2, 0, 5, 2).to_ndarray::<f32>();
        assert_eq!(narrowed.shape(), &[3, 2, 3]);
        assert_eq!(narrowed[[2, 1, 2]], value(2, 2, 4));
        let expanded = base.select(0, 1).select(0, 3).unsqueeze(0).expand([2, 5]).to_ndarray::<f32>();
        assert_eq!(expanded.index_axis(Axis(0), 1).iter().copied().collect::<Vec<_>>(), (0..5).map(|k| value(1, 3, k)).collect::<Vec<_>>());
        // And back: a round trip through ndarray is the identity, bf16 included.
        let half = base.to_dtype(DType::BF16).transpose(0, 1);
        let back = Tensor::from_ndarray(half.to_ndarray::<bf16>(), dev).unwrap();
        assert_eq!(back.dims(), half.dims());
        assert_eq!(back.to_vec::<bf16>(), half.to_vec::<bf16>());
    }
}

device_test! {
    #[should_panic(expected = "to_ndarray")]
    fn to_ndarray_of_the_wrong_type_panics(dev: Device) {
        Tensor::zeros([2], DType::F32, dev).unwrap().to_ndarray::<f64>();
    }
}

#[test]
fn from_ndarray_on_a_missing_device_is_an_error() {
    let err = Tensor::from_ndarray(ndarray::arr1(&[1f32]), Device::Cuda(3)).unwrap_err();
    assert!(matches!(err, Error::CudaUnavailable { ordinal: 3, .. }));
}
