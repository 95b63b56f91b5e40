//! Tests of views: random sequences of view ops against a dense reference model, storage
//! sharing against a brute-force search for strides, and the panics' messages.

use crate::*;
use proptest::prelude::*;

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f64).collect::<Vec<_>>(), shape, Device::Cpu).unwrap()
}

/// The reference: a shape and its elements in row-major order, rebuilt by every op.
#[derive(Clone, Debug)]
struct Dense {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn row_major(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Every multi-index of `shape` in row-major order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0; shape.len()];
    for _ in 0..n {
        out.push(index.clone());
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

impl Dense {
    /// A new dense tensor of `shape` whose element at `i` is this one's at `source(i)`.
    fn gather(&self, shape: Vec<usize>, source: impl Fn(&[usize]) -> Vec<usize>) -> Dense {
        let data = indices(&shape).iter().map(|i| self.data[row_major(&source(i), &self.shape)]).collect();
        Dense { shape, data }
    }
}

/// Storage offsets of a layout's elements, by plain multi-index arithmetic.
fn naive_offsets(l: &Layout) -> Vec<usize> {
    indices(l.dims())
        .iter()
        .map(|i| l.offset() + i.iter().zip(l.strides()).map(|(a, s)| a * s).sum::<usize>())
        .collect()
}

/// Whether some strides view `l`'s elements, in order, with `shape`: what `torch.view` allows.
fn view_exists(l: &Layout, shape: &[usize]) -> bool {
    let offs = naive_offsets(l);
    if offs.is_empty() {
        return true;
    }
    let mut strides = vec![0i64; shape.len()];
    for k in 0..shape.len() {
        if shape[k] > 1 {
            let mut unit = vec![0; shape.len()];
            unit[k] = 1;
            strides[k] = offs[row_major(&unit, shape)] as i64 - offs[0] as i64;
            if strides[k] < 0 {
                return false;
            }
        }
    }
    indices(shape).iter().enumerate().all(|(flat, i)| {
        offs[flat] as i64 == offs[0] as i64 + i.iter().zip(&strides).map(|(&a, s)| a as i64 * s).sum::<i64>()
    })
}

/// Applies one randomly parameterised view op to the tensor and the model alike.
/// `kind` picks the op; `a`, `b`, `c` are reduced modulo whatever range the op needs.
fn apply(t: &Tensor, m: &Dense, (kind, a, b, c): (u8, usize, usize, usize)) -> (Tensor, Dense) {
    let r = m.shape.len();
    let size = |d: usize| m.shape[d];
    match kind % 9 {
        0 if r > 0 => {
            // A permutation from `a`: repeated swaps.
            let mut order: Vec<usize> = (0..r).collect();
            let mut s = a;
            for i in (1..r).rev() {
                order.swap(i, s % (i + 1));
                s /= i + 1;
            }
            let shape = order.iter().map(|&o| size(o)).collect();
            let m2 = m.gather(shape, |i| {
                let mut src = vec![0; r];
                for (k, &o) in order.iter().enumerate() {
                    src[o] = i[k];
                }
                src
            });
            (t.permute(&order), m2)
        }
        1 if r > 0 => {
            let (d0, d1) = (a % r, b % r);
            let mut shape = m.shape.clone();
            shape.swap(d0, d1);
            let m2 = m.gather(shape, |i| {
                let mut src = i.to_vec();
                src.swap(d0, d1);
                src
            });
            // Negative dims count from the back.
            let t2 =
                if c % 2 == 0 { t.transpose(d0, d1) } else { t.transpose(d0 as i64 - r as i64, d1 as i64) };
            (t2, m2)
        }
        2 if r > 0 => {
            let d = a % r;
            let start = b % (size(d) + 1);
            let len = c % (size(d) - start + 1);
            let mut shape = m.shape.clone();
            shape[d] = len;
            let m2 = m.gather(shape, |i| {
                let mut src = i.to_vec();
                src[d] += start;
                src
            });
            (t.narrow(d, start, len), m2)
        }
        3 if r > 0 => {
            let d = a % r;
            let (start, step) = (b % (size(d) + 1), 1 + c % 3);
            let end = start + (c / 3) % (size(d) + 2); // may run past the end: clamped
            let kept: Vec<usize> = (start..end.min(size(d))).step_by(step).collect();
            let mut shape = m.shape.clone();
            shape[d] = kept.len();
            let m2 = m.gather(shape, |i| {
                let mut src = i.to_vec();
                src[d] = kept[i[d]];
                src
            });
            (t.slice(d, start, end, step), m2)
        }
        4 if r < 6 => {
            let d = a % (r + 1);
            let mut shape = m.shape.clone();
            shape.insert(d, 1);
            let m2 = m.gather(shape, |i| [&i[..d], &i[d + 1..]].concat());
            let t2 = if b % 2 == 0 { t.unsqueeze(d) } else { t.unsqueeze(d as i64 - r as i64 - 1) };
            (t2, m2)
        }
        5 if r > 0 => {
            let d = a % r;
            if size(d) != 1 {
                return (t.squeeze(d), m.clone()); // PyTorch leaves other sizes alone
            }
            let mut shape = m.shape.clone();
            shape.remove(d);
            let m2 = m.gather(shape, |i| [&i[..d], &[0], &i[d..]].concat());
            (t.squeeze(d), m2)
        }
        6 if m.data.len() <= 200 => {
            // Grow every size-1 dim to 1 + b % 3, and maybe add a leading dim.
            let grow = 1 + b % 3;
            let mut target: Vec<i64> =
                m.shape.iter().map(|&s| if s == 1 { grow as i64 } else { -1 }).collect();
            let lead = c % 2;
            if lead == 1 {
                target.insert(0, 2);
            }
            let shape: Vec<usize> = [
                if lead == 1 { vec![2] } else { vec![] },
                m.shape.iter().map(|&s| if s == 1 { grow } else { s }).collect(),
            ]
            .concat();
            let m2 = m.gather(shape, |i| {
                i[lead..].iter().zip(&m.shape).map(|(&x, &s)| if s == 1 { 0 } else { x }).collect()
            });
            (t.expand(target), m2)
        }
        7 => {
            // Merge two neighbours, split one dim, flatten, or infer a dim with -1.
            let mut shape = m.shape.clone();
            match b % 4 {
                0 if r >= 2 => {
                    let d = a % (r - 1);
                    let merged = shape[d] * shape[d + 1];
                    shape.splice(d..d + 2, [merged]);
                }
                1 if r > 0 && r < 6 => {
                    let d = a % r;
                    let f = (2..=shape[d]).find(|&f| shape[d].is_multiple_of(f)).unwrap_or(1);
                    shape.splice(d..d + 1, [f, shape[d] / f]);
                }
                2 => shape = vec![m.data.len()],
                _ => {}
            }
            let should_share = view_exists(t.layout(), &shape);
            let t2 = if b % 4 == 3 && !shape.is_empty() && !m.data.is_empty() {
                let mut signed: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
                signed[a % shape.len()] = -1;
                t.reshape(signed)
            } else {
                t.reshape(shape.clone())
            };
            assert_eq!(
                t2.same_storage(t),
                should_share,
                "reshape {:?} {:?} -> {shape:?}",
                t.dims(),
                t.strides()
            );
            (t2, Dense { shape, data: m.data.clone() })
        }
        8 if r > 0 && size(a % r) > 0 => {
            let d = a % r;
            let idx = b % size(d);
            let mut shape = m.shape.clone();
            shape.remove(d);
            let m2 = m.gather(shape, |i| [&i[..d], &[idx], &i[d..]].concat());
            (t.select(d, idx), m2)
        }
        _ => (t.clone(), m.clone()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn view_sequences_match_a_dense_model(
        shape in prop::collection::vec(0usize..5, 1..5),
        ops in prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>(), any::<usize>()), 1..8),
    ) {
        let t0 = iota(&shape);
        let mut t = t0.clone();
        let mut m = Dense { shape: shape.clone(), data: t0.to_vec::<f64>() };
        for op in ops {
            let (t2, m2) = apply(&t, &m, op);
            prop_assert_eq!(t2.dims(), &m2.shape[..], "after op {:?}", op);
            prop_assert_eq!(t2.to_vec::<f64>(), m2.data.clone(), "after op {:?} on {:?}", op, t.layout());
            prop_assert_eq!(strided::offsets(t2.layout()), naive_offsets(t2.layout()));
            let offs = naive_offsets(t2.layout());
            let gap_free = offs.windows(2).all(|w| w[1] == w[0] + 1);
            prop_assert_eq!(t2.is_contiguous(), gap_free, "{:?}", t2.layout());
            // contiguous() copies exactly when the elements are not the whole storage, in order
            // (an empty view keeps its offset, so kernels could not slice at it: it is copied).
            let whole = offs.iter().copied().eq(0..t2.storage().len()) && (!offs.is_empty() || t2.layout().offset() == 0);
            let c = t2.contiguous();
            prop_assert_eq!(c.same_storage(&t2), whole);
            prop_assert!(c.is_contiguous());
            prop_assert_eq!(c.to_vec::<f64>(), m2.data.clone());
            t = t2;
            m = m2;
        }
    }
}

#[test]
fn permute_matches_naive_index_arithmetic() {
    let t = iota(&[2, 3, 4]);
    let p = t.permute([2, 0, 1]);
    assert_eq!(p.dims(), &[4, 2, 3]);
    assert!(p.same_storage(&t));
    let v = p.to_vec::<f64>();
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(v[k * 6 + i * 3 + j], (i * 12 + j * 4 + k) as f64);
            }
        }
    }
}

crate::device_test! {
    fn flatten_and_friends_keep_row_major_order(dev: Device) {
        let t = Tensor::from_vec((0..24).map(|i| i as f32).collect::<Vec<_>>(), [2, 3, 4], dev).unwrap();
        let all = t.to_vec::<f32>();
        assert_eq!(t.flatten(1, -1).dims(), &[2, 12]);
        assert_eq!(t.flatten(0, 1).dims(), &[6, 4]);
        assert_eq!(t.flatten_all().to_vec::<f32>(), all);
        assert_eq!(t.reshape([-1, 4]).dims(), &[6, 4]);
        assert_eq!(t.view([4i64, -1]).dims(), &[4, 6]);
        assert_eq!(t.unsqueeze(0).unsqueeze(-1).squeeze_all().dims(), &[2, 3, 4]);
        assert_eq!(Tensor::scalar(1f32, dev).unwrap().flatten(0, 0).dims(), &[1]);
        assert_eq!(t.dim(-1), 4);
        let tt = t.select(0, 1).t();
        assert_eq!(tt.dims(), &[4, 3]);
        assert_eq!(tt.to_vec::<f32>(), (0..12).map(|i| all[12 + (i % 3) * 4 + i / 3]).collect::<Vec<_>>());
        assert_eq!(t.broadcast_as([2, 2, 3, 4]).to_vec::<f32>(), [all.clone(), all].concat());
    }
}

crate::device_test! {
    #[should_panic(expected = "reshape: shape [4, 2] is invalid for input of shape [2, 3] (6 elements)")]
    fn bad_reshape_names_both_shapes(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().reshape([4, 2]);
    }
}

crate::device_test! {
    #[should_panic(expected = "reshape: shape [-1, 4] is invalid for input of shape [2, 3] (6 elements)")]
    fn bad_inferred_reshape_names_both_shapes(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().reshape([-1, 4]);
    }
}

crate::device_test! {
    #[should_panic(expected = "view: a tensor of shape [3, 2] with strides [1, 3] cannot be viewed as [6] without a copy")]
    fn view_of_a_transpose_needs_reshape(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().t().view([6]);
    }
}

crate::device_test! {
    #[should_panic(expected = "narrow: start 2 + length 2 exceeds size 3 of dim 1 (shape [2, 3])")]
    fn bad_narrow_names_dim_and_shape(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().narrow(1, 2, 2);
    }
}

crate::device_test! {
    #[should_panic(expected = "transpose: dim 2 is out of range for a tensor of rank 2")]
    fn dim_out_of_range_names_the_op(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().transpose(0, 2);
    }
}

crate::device_test! {
    #[should_panic(expected = "narrow: dim -3 is out of range for a tensor of rank 2 (expected -2 to 1)")]
    fn negative_dim_out_of_range_names_the_op(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().narrow(-3, 0, 1);
    }
}

crate::device_test! {
    #[should_panic(expected = "select: index 3 is out of range for dim 1 of size 3 (shape [2, 3])")]
    fn select_out_of_range_names_the_op(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().select(1, 3);
    }
}

crate::device_test! {
    #[should_panic(expected = "broadcast_as: shape [2, 3] cannot be broadcast to [2, 4]")]
    fn bad_expand_names_both_shapes(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().expand([2, 4]);
    }
}

crate::device_test! {
    #[should_panic(expected = "permute: dim 0 repeats in [0, 0]")]
    fn permute_needs_each_dim_once(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().permute([0, 0]);
    }
}

crate::device_test! {
    #[should_panic(expected = "to_vec::<F64>: the tensor has dtype float32")]
    fn reading_with_the_wrong_type_names_the_dtype(dev: Device) {
        Tensor::zeros([2], DType::F32, dev).unwrap().to_vec::<f64>();
    }
}
