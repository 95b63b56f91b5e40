//! Property tests: random shapes (rank 0-4, sizes 0-5), made non-contiguous by narrowing,
//! expanding and permuting, reduced over random dim sets, against the naive loops of `tests`.
use super::tests::{check_all_ops, naive_groups, naive_max, values};
use crate::*;
use proptest::prelude::*;

/// How to build a view: its shape, the permutation that produces it, an optional narrowing
/// (dim, extra elements before, after) and an optional expanded dim, of the unpermuted tensor.
#[derive(Debug, Clone)]
pub(crate) struct ViewSpec {
    shape: Vec<usize>,
    perm: Vec<usize>,
    narrow: Option<(usize, usize, usize)>,
    expand: Option<usize>,
    seed: u64,
    ties: bool,
}

pub(crate) fn view_spec() -> impl Strategy<Value = ViewSpec> {
    (0usize..=4)
        .prop_flat_map(|rank| {
            let dim = 0..rank.max(1);
            (
                prop::collection::vec(0usize..=5, rank),
                Just((0..rank).collect::<Vec<_>>()).prop_shuffle(),
                prop::option::of((dim.clone(), 0usize..3, 0usize..3)),
                prop::option::of(dim),
                any::<u64>(),
                any::<bool>(),
            )
        })
        .prop_map(|(shape, perm, narrow, expand, seed, ties)| ViewSpec {
            shape,
            perm,
            narrow,
            expand,
            seed,
            ties,
        })
}

impl ViewSpec {
    pub(crate) fn build(&self, dtype: DType) -> Tensor {
        let rank = self.shape.len();
        let mut unpermuted = vec![0; rank];
        for (i, &p) in self.perm.iter().enumerate() {
            unpermuted[p] = self.shape[i];
        }
        let narrow = self.narrow.filter(|_| rank > 0);
        let expand = self.expand.filter(|&e| rank > 0 && narrow.map(|n| n.0) != Some(e));
        let mut stored = unpermuted.clone();
        if let Some((d, before, after)) = narrow {
            stored[d] += before + after;
        }
        if let Some(e) = expand {
            stored[e] = 1;
        }
        let n = stored.iter().product();
        let mut t =
            Tensor::from_vec(values(n, self.seed, self.ties), stored, Device::Cpu).unwrap().to_dtype(dtype);
        if let Some((d, before, _)) = narrow {
            t = t.narrow(d, before, unpermuted[d]);
        }
        if expand.is_some() {
            t = t.expand(unpermuted.iter().map(|&d| d as i64).collect::<Vec<_>>());
        }
        t.permute(&self.perm)
    }
}

/// A dim set from a bit mask, written with negative dims when `negative`.
fn dims_of(mask: u8, rank: usize, negative: bool) -> Vec<i64> {
    (0..rank.max(1) as i64)
        .filter(|&d| mask & (1 << d) != 0)
        .map(|d| if negative && rank > 0 { d - rank as i64 } else { d })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn value_reductions_match_naive(spec in view_spec(), mask: u8, negative: bool, keepdim: bool) {
        for dtype in [DType::F32, DType::F64] {
            let t = spec.build(dtype);
            let dims = dims_of(mask, t.rank(), negative);
            check_all_ops(&t, &dims, keepdim, &format!("{spec:?} {dtype}"));
        }
    }

    #[test]
    fn integer_sums_are_exact(spec in view_spec(), mask: u8, keepdim: bool) {
        let t = spec.build(DType::F64).affine(10.0, 0.0).to_dtype(DType::I64);
        let dims = dims_of(mask, t.rank(), false);
        let (shape, groups) = naive_groups(&t, &super::tests::normalize(&dims, t.rank()), keepdim);
        let got = t.sum(&dims, keepdim);
        prop_assert_eq!(got.dims(), &shape[..]);
        let exp: Vec<i64> = groups.iter().map(|g| g.iter().sum::<f64>() as i64).collect();
        prop_assert_eq!(got.to_vec::<i64>(), exp);
    }

    #[test]
    fn arg_reductions_match_naive(spec in view_spec(), dim in 0usize..4, keepdim: bool) {
        let t = spec.build(DType::F32);
        prop_assume!(t.rank() == 0 || t.dims()[dim % t.rank()] > 0);
        let d = if t.rank() == 0 { 0 } else { dim % t.rank() };
        let reduced: Vec<usize> = if t.rank() == 0 { vec![] } else { vec![d] };
        let (shape, groups) = naive_groups(&t, &reduced, keepdim);
        for largest in [true, false] {
            let got = if largest { t.argmax(d, keepdim) } else { t.argmin(d, keepdim) };
            prop_assert_eq!(got.dims(), &shape[..]);
            let exp: Vec<i64> = groups.iter().map(|g| naive_max(g, largest).1 as i64).collect();
            prop_assert_eq!(got.to_vec::<i64>(), exp);
        }
    }

    #[test]
    fn topk_matches_a_full_sort(spec in view_spec(), dim in 0usize..4, k_frac in 0.0f64..=1.0, largest: bool) {
        let t = spec.build(DType::F32);
        prop_assume!(t.rank() > 0);
        let d = dim % t.rank();
        let n = t.dims()[d];
        let k = (k_frac * n as f64).round() as usize;
        let (values, indices) = t.topk(k, d, largest, true);
        let mut out_shape = t.dims().to_vec();
        out_shape[d] = k;
        prop_assert_eq!(values.dims(), &out_shape[..]);
        // Each lane, fully sorted best first (ties by index), cut to k.
        let (_, lanes) = naive_groups(&t, &[d], false);
        let sorted: Vec<Vec<(f64, usize)>> = lanes.iter().map(|lane| {
            let mut l: Vec<(f64, usize)> = lane.iter().copied().zip(0..).collect();
            l.sort_by(|a, b| {
                let ord = a.0.partial_cmp(&b.0).unwrap();
                (if largest { ord.reverse() } else { ord }).then(a.1.cmp(&b.1))
            });
            l
        }).collect();
        let (got_v, got_i) = (values.to_f64_vec(), indices.to_vec::<i64>());
        for (o, (&v, &i)) in got_v.iter().zip(&got_i).enumerate() {
            // Unravel the output index; the lane is the kept coordinates, the rank is along `d`.
            let mut rest = o;
            let mut coord = vec![0; out_shape.len()];
            for a in (0..out_shape.len()).rev() {
                coord[a] = rest % out_shape[a];
                rest /= out_shape[a];
            }
            let lane = (0..out_shape.len()).filter(|&a| a != d).fold(0, |acc, a| acc * out_shape[a] + coord[a]);
            let (ev, ei) = sorted[lane][coord[d]];
            prop_assert_eq!((v, i), (ev, ei as i64));
        }
        let (_, unsorted) = t.topk(k, d, largest, false);
        let (_, idx_lanes) = naive_groups(&unsorted.to_dtype(DType::F64), &[d], false);
        for lane in idx_lanes {
            prop_assert!(lane.windows(2).all(|w| w[0] < w[1]), "unsorted topk out of input order: {:?}", lane);
        }
    }
}
