//! `copy_` and friends against naive index loops, on views, with broadcasting and casts.

use crate::{device_test, DType, Device, Tensor};

fn arange(n: usize, shape: &[usize], dtype: DType, dev: Device) -> Tensor {
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    Tensor::from_vec(v, shape, Device::Cpu).unwrap().to_dtype(dtype).to_device(dev).unwrap()
}

device_test! {
    fn copy_into_a_transposed_view_writes_the_storage_clones_share(dev: Device) {
        let base = Tensor::zeros((3, 4), DType::F32, dev).unwrap();
        let alias = base.clone();
        let src = arange(12, &[4, 3], DType::F32, dev);
        base.t().copy_(&src);
        // base[i][j] = src[j][i]
        let got = alias.to_vec2::<f32>();
        for (i, row) in got.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                assert_eq!(x, (j * 3 + i) as f32, "at [{i}][{j}]");
            }
        }
    }
}

device_test! {
    fn copy_into_a_column_broadcasts_and_casts_the_source(dev: Device) {
        let base = Tensor::zeros((4, 3), DType::BF16, dev).unwrap();
        let src = Tensor::from_vec(vec![1.5f64, -2.0, 3.25, 8.0], (4, 1), dev).unwrap();
        base.narrow(1, 1, 1).copy_(&src);
        let got = base.to_dtype(DType::F32).to_vec2::<f32>();
        let expect = [1.5f32, -2.0, 3.25, 8.0];
        for i in 0..4 {
            assert_eq!(got[i], vec![0.0, expect[i], 0.0], "row {i}");
        }
    }
}

device_test! {
    fn copy_from_an_overlapping_view_of_itself_reads_the_old_values(dev: Device) {
        let x = arange(9, &[3, 3], DType::F32, dev);
        let before = x.to_vec2::<f32>();
        x.copy_(&x.t());
        let after = x.to_vec2::<f32>();
        for i in 0..3 {
            for j in 0..3 {
                assert_eq!(after[i][j], before[j][i]);
            }
        }
    }
}

device_test! {
    fn arithmetic_forms_update_in_place(dev: Device) {
        let x = arange(6, &[2, 3], DType::F32, dev);
        let y = x.clone();
        let row = Tensor::from_vec(vec![10f32, 20.0, 30.0], 3, dev).unwrap();
        x.add_(&row).mul_scalar_(2.0).add_scalar_(-1.0);
        let got = y.to_vec::<f32>();
        for (i, g) in got.iter().enumerate() {
            let want = ((i as f32) + [10.0, 20.0, 30.0][i % 3]) * 2.0 - 1.0;
            assert_eq!(*g, want, "element {i}");
        }
        x.zero_();
        assert!(y.to_vec::<f32>().iter().all(|&v| v == 0.0));
        x.narrow(0, 1, 1).fill_(7.0);
        assert_eq!(y.to_vec2::<f32>(), vec![vec![0.0; 3], vec![7.0; 3]]);
    }
}

#[test]
#[should_panic(expected = "copy_: the destination of shape [2, 3]")]
fn copy_into_an_expanded_view_panics() {
    let x = Tensor::zeros((1, 3), DType::F32, Device::Cpu).unwrap();
    x.broadcast_as((2, 3)).copy_(&Tensor::zeros((2, 3), DType::F32, Device::Cpu).unwrap());
}

device_test! {
    fn arithmetic_in_place_equals_out_of_place_and_writes_the_shared_storage(dev: Device) {
        // 1003 elements: whole 16-byte vectors and a tail; an offset view (narrow) as the
        // destination takes the vector path only when aligned, else the copy path: same bits.
        let rand = |seed: u64, n: usize, dtype: DType| {
            let v: Vec<f64> = (0..n).map(|i| (((i as u64 * 2654435761 + seed) % 1000) as f64 - 500.0) / 97.0).collect();
            Tensor::from_vec(v, [n], dev).unwrap().to_dtype(dtype)
        };
        for dtype in [DType::F32, DType::BF16, DType::F64, DType::F16] {
            for offset in [0usize, 3, 8] {
                let (a0, b) = (rand(1, 1011, dtype).narrow(0, offset, 1003), rand(2, 1003, dtype));
                type Op = fn(&Tensor, &Tensor) -> Tensor;
                type OpInPlace = for<'a> fn(&'a Tensor, &Tensor) -> &'a Tensor;
                let ops: [(&str, Op, OpInPlace); 4] = [
                    ("add_", |a, b| a.add(b), |a, b| a.add_(b)),
                    ("sub_", |a, b| a.sub(b), |a, b| a.sub_(b)),
                    ("mul_", |a, b| a.mul(b), |a, b| a.mul_(b)),
                    ("div_", |a, b| a.div(b), |a, b| a.div_(b)),
                ];
                for (name, out_of_place, in_place) in ops {
                    let a = a0.copy();
                    let want = out_of_place(&a, &b).to_f64_vec();
                    let alias = a.clone();
                    in_place(&a, &b);
                    let what = format!("{name} {dtype} offset {offset}");
                    assert!(
                        alias.to_f64_vec().iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}"
                    );
                }
            }
        }
    }
}
