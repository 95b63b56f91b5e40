//! Shapes, dimension arguments (negative dims count from the end, as in PyTorch) and
//! numpy broadcasting.

/// The extent of each dimension, outermost first.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar, 0 when any dim is 0).
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major (C-contiguous) strides, in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![0; self.0.len()];
        let mut acc = 1;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc *= d.max(1);
        }
        strides
    }

    pub fn into_vec(self) -> Vec<usize> {
        self.0
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::ops::Deref for Shape {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.0
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Shape {
        Shape(v)
    }
}
impl From<&Vec<usize>> for Shape {
    fn from(v: &Vec<usize>) -> Shape {
        Shape(v.clone())
    }
}
impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Shape {
        Shape(v.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Shape {
        Shape(v.to_vec())
    }
}
impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(v: &[usize; N]) -> Shape {
        Shape(v.to_vec())
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Shape {
        s.clone()
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Shape {
        Shape(vec![])
    }
}
impl From<usize> for Shape {
    fn from(d: usize) -> Shape {
        Shape(vec![d])
    }
}
impl From<(usize, usize)> for Shape {
    fn from((a, b): (usize, usize)) -> Shape {
        Shape(vec![a, b])
    }
}
impl From<(usize, usize, usize)> for Shape {
    fn from((a, b, c): (usize, usize, usize)) -> Shape {
        Shape(vec![a, b, c])
    }
}
impl From<(usize, usize, usize, usize)> for Shape {
    fn from((a, b, c, d): (usize, usize, usize, usize)) -> Shape {
        Shape(vec![a, b, c, d])
    }
}

/// One dimension index. `usize` counts from the front; signed integers may be negative and
/// count from the back (`-1` is the last dim), as in PyTorch. An unsuffixed literal is `i32`.
pub trait Dim: Copy {
    /// The dimension as an index into a shape of rank `rank`; panics naming `op` when out of range.
    fn to_index(self, rank: usize, op: &str) -> usize;
}

impl Dim for usize {
    fn to_index(self, rank: usize, op: &str) -> usize {
        assert!(self < rank, "{op}: dim {self} is out of range for a tensor of rank {rank}");
        self
    }
}

macro_rules! signed_dim {
    ($t:ty) => {
        impl Dim for $t {
            fn to_index(self, rank: usize, op: &str) -> usize {
                let r = rank as i64;
                let d = self as i64;
                let idx = if d < 0 { d + r } else { d };
                assert!(
                    (0..r).contains(&idx),
                    "{op}: dim {d} is out of range for a tensor of rank {rank} (expected {} to {})",
                    -r,
                    r - 1
                );
                idx as usize
            }
        }
    };
}
signed_dim!(i32);
signed_dim!(i64);
signed_dim!(isize);

/// A set of dimensions: one dim, an array, a slice or a vector of them.
pub trait Dims {
    /// Sorted, de-duplicated indices; panics naming `op` on an out-of-range or repeated dim.
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize>;
}

fn check_dims(mut dims: Vec<usize>, op: &str) -> Vec<usize> {
    let n = dims.len();
    dims.sort_unstable();
    dims.dedup();
    assert!(dims.len() == n, "{op}: a dim appears more than once in {dims:?}");
    dims
}

impl<D: Dim> Dims for D {
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize> {
        vec![self.to_index(rank, op)]
    }
}
impl<D: Dim> Dims for [D] {
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize> {
        check_dims(self.iter().map(|d| d.to_index(rank, op)).collect(), op)
    }
}
impl<D: Dim, const N: usize> Dims for [D; N] {
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize> {
        self[..].to_indexes(rank, op)
    }
}
impl<D: Dim> Dims for Vec<D> {
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize> {
        self[..].to_indexes(rank, op)
    }
}
impl<D: Dim> Dims for &[D] {
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize> {
        (**self).to_indexes(rank, op)
    }
}
impl<D: Dim> Dims for &Vec<D> {
    fn to_indexes(&self, rank: usize, op: &str) -> Vec<usize> {
        self[..].to_indexes(rank, op)
    }
}

/// The numpy broadcast of two shapes; panics naming `op` and both shapes when they do not broadcast.
pub fn broadcast_shapes(lhs: &[usize], rhs: &[usize], op: &str) -> Shape {
    let rank = lhs.len().max(rhs.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let l = if i < rank - lhs.len() { 1 } else { lhs[i - (rank - lhs.len())] };
        let r = if i < rank - rhs.len() { 1 } else { rhs[i - (rank - rhs.len())] };
        out[i] = if l == r || r == 1 {
            l
        } else if l == 1 {
            r
        } else {
            panic!("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together (dim {i}: {l} vs {r})")
        };
    }
    Shape(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_dims_count_from_the_back() {
        assert_eq!((-1).to_index(3, "t"), 2);
        assert_eq!((-3).to_index(3, "t"), 0);
        assert_eq!(1usize.to_index(3, "t"), 1);
        assert_eq!([-1, 0].to_indexes(3, "t"), vec![0, 2]);
    }

    #[test]
    #[should_panic(expected = "sum: dim 3 is out of range for a tensor of rank 3")]
    fn out_of_range_dim_names_the_op() {
        3.to_index(3, "sum");
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[3, 1, 5], &[4, 1], "add").dims(), &[3, 4, 5]);
        assert_eq!(broadcast_shapes(&[], &[2, 2], "add").dims(), &[2, 2]);
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 7], "add").dims(), &[0, 7]);
    }

    #[test]
    #[should_panic(expected = "add: shapes [2, 3] and [4] cannot be broadcast together")]
    fn broadcast_mismatch_names_both_shapes() {
        broadcast_shapes(&[2, 3], &[4], "add");
    }
}
