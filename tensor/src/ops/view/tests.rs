use crate::*;

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), shape, Device::Cpu).unwrap()
}

#[test]
fn permute_matches_naive_index_arithmetic() {
    let t = iota(&[2, 3, 4]);
    let p = t.permute([2, 0, 1]);
    assert_eq!(p.dims(), &[4, 2, 3]);
    assert!(p.same_storage(&t));
    let v = p.to_vec::<f32>();
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(v[k * 6 + i * 3 + j], (i * 12 + j * 4 + k) as f32);
            }
        }
    }
}
