//! Gradients of views and joins: reshape, permute, transpose, narrow, slice, select, expand,
//! broadcast, (un)squeeze, flatten, `cat`, `stack`, the split family, `contiguous`, `to_dtype`.

use crate::Var;
use oxtrain_tensor::{DType, Dim, Shape, ShapeArg, Tensor};

/// The gradient of a view that covers `start..start + len` of `dim` in an input of shape
/// `input`: `g` padded with zeros along `dim`.
fn pad_along(g: &Tensor, dim: usize, start: usize, input: &[usize]) -> Tensor {
    let len = g.dims()[dim];
    let size = input[dim];
    if start == 0 && len == size {
        return g.clone();
    }
    let zeros = |n: usize| {
        let mut shape = g.dims().to_vec();
        shape[dim] = n;
        Tensor::zeros(shape, g.dtype(), g.device()).expect("zeros on the gradient's device")
    };
    let mut parts = Vec::with_capacity(3);
    if start > 0 {
        parts.push(zeros(start));
    }
    parts.push(g.clone());
    if start + len < size {
        parts.push(zeros(size - start - len));
    }
    Tensor::cat(&parts, dim)
}

impl Var {
    /// An op whose gradient is the output gradient reshaped back to the input's shape.
    fn regroup(&self, name: &'static str, out: Tensor) -> Var {
        let input = self.dims().to_vec();
        Var::from_op(name, out, &[self], move |g, _| vec![Some(g.reshape(input.as_slice()))])
    }

    pub fn reshape(&self, shape: impl ShapeArg) -> Var {
        self.regroup("reshape", self.tensor().reshape(shape))
    }

    /// As [`Var::reshape`], but panics when a copy would be needed (`torch.Tensor.view`).
    pub fn view(&self, shape: impl ShapeArg) -> Var {
        self.regroup("view", self.tensor().view(shape))
    }

    pub fn flatten<D0: Dim, D1: Dim>(&self, start: D0, end: D1) -> Var {
        self.regroup("flatten", self.tensor().flatten(start, end))
    }

    pub fn flatten_all(&self) -> Var {
        self.regroup("flatten", self.tensor().flatten_all())
    }

    /// Removes `dim` when it has size 1.
    pub fn squeeze<D: Dim>(&self, dim: D) -> Var {
        self.regroup("squeeze", self.tensor().squeeze(dim))
    }

    pub fn squeeze_all(&self) -> Var {
        self.regroup("squeeze", self.tensor().squeeze_all())
    }

    pub fn unsqueeze<D: Dim>(&self, dim: D) -> Var {
        self.regroup("unsqueeze", self.tensor().unsqueeze(dim))
    }

    /// A row-major copy when needed; the gradient passes through.
    pub fn contiguous(&self) -> Var {
        Var::from_op("contiguous", self.tensor().contiguous(), &[self], |g, _| vec![Some(g.clone())])
    }

    /// This value as `dtype`; the gradient comes back in the input's dtype (bf16 autocast).
    pub fn to_dtype(&self, dtype: DType) -> Var {
        let from = self.dtype();
        Var::from_op("to_dtype", self.tensor().to_dtype(dtype), &[self], move |g, _| {
            vec![Some(g.to_dtype(from))]
        })
    }

    /// [`to_dtype`](Var::to_dtype) through the casts kept of a parameter's storage
    /// (`Tensor::to_dtype_cached`): the same values and gradient, without a new cast while
    /// the parameter is unchanged.
    pub fn to_dtype_cached(&self, dtype: DType) -> Var {
        let from = self.dtype();
        Var::from_op("to_dtype", self.tensor().to_dtype_cached(dtype), &[self], move |g, _| {
            vec![Some(g.to_dtype(from))]
        })
    }

    pub fn permute<D: Dim>(&self, order: impl AsRef<[D]>) -> Var {
        let rank = self.rank();
        let order: Vec<usize> = order.as_ref().iter().map(|d| d.to_index(rank, "permute")).collect();
        let out = self.tensor().permute(&order);
        let mut inverse = vec![0; order.len()];
        for (i, &d) in order.iter().enumerate() {
            inverse[d] = i;
        }
        Var::from_op("permute", out, &[self], move |g, _| vec![Some(g.permute(&inverse))])
    }

    pub fn transpose<D0: Dim, D1: Dim>(&self, d0: D0, d1: D1) -> Var {
        let (a, b) = (d0.to_index(self.rank(), "transpose"), d1.to_index(self.rank(), "transpose"));
        Var::from_op("transpose", self.tensor().transpose(a, b), &[self], move |g, _| {
            vec![Some(g.transpose(a, b))]
        })
    }

    /// Transpose of a rank-2 value.
    pub fn t(&self) -> Var {
        assert_eq!(self.rank(), 2, "t: expects a rank-2 tensor, got shape {:?}", self.dims());
        self.transpose(0, 1)
    }

    /// Elements `start..start + len` along `dim`.
    pub fn narrow<D: Dim>(&self, dim: D, start: usize, len: usize) -> Var {
        let d = dim.to_index(self.rank(), "narrow");
        let input = self.dims().to_vec();
        Var::from_op("narrow", self.tensor().narrow(d, start, len), &[self], move |g, _| {
            vec![Some(pad_along(g, d, start, &input))]
        })
    }

    /// Python's `t[..., start:end:step, ...]` along `dim`.
    pub fn slice<D: Dim>(&self, dim: D, start: usize, end: usize, step: usize) -> Var {
        let d = dim.to_index(self.rank(), "slice");
        let out = self.tensor().slice(d, start, end, step);
        if step == 1 {
            let start = start.min(end.min(self.dims()[d]));
            return self.narrow(d, start, out.dims()[d]);
        }
        let input = self.dims().to_vec();
        let start = start.min(self.dims()[d]);
        let picked: Vec<i64> = (0..out.dims()[d]).map(|i| (start + i * step) as i64).collect();
        Var::from_op("slice", out, &[self], move |g, _| {
            let index = Tensor::from_vec(picked.clone(), picked.len(), g.device())
                .expect("index on the gradient's device");
            let zeros = Tensor::zeros(input.as_slice(), g.dtype(), g.device())
                .expect("zeros on the gradient's device");
            vec![Some(zeros.index_add(d, &index, g, 1.0))]
        })
    }

    /// One index along `dim`, dropping that dim.
    pub fn select<D: Dim>(&self, dim: D, index: usize) -> Var {
        let d = dim.to_index(self.rank(), "select");
        self.narrow(d, index, 1).squeeze(d)
    }

    /// A broadcast view (`torch.broadcast_to`); the gradient sums over the repeated dims.
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Var {
        Var::from_op("broadcast_as", self.tensor().broadcast_as(shape), &[self], |g, _| vec![Some(g.clone())])
    }

    /// `torch.Tensor.expand`: `-1` keeps a dim's size.
    pub fn expand(&self, shape: impl AsRef<[i64]>) -> Var {
        Var::from_op("expand", self.tensor().expand(shape), &[self], |g, _| vec![Some(g.clone())])
    }

    /// The values joined along `dim`, as `torch.cat`.
    pub fn cat<D: Dim>(vars: &[Var], dim: D) -> Var {
        assert!(!vars.is_empty(), "cat: expected a non-empty list of tensors");
        let tensors: Vec<&Tensor> = vars.iter().map(Var::tensor).collect();
        let out = Tensor::cat(&tensors, dim);
        let d = dim.to_index(out.rank(), "cat");
        // PyTorch's cat skips 1-D empty tensors; they get an empty gradient.
        let sizes: Vec<Option<usize>> =
            vars.iter().map(|v| if v.dims() == [0] { None } else { Some(v.dims()[d]) }).collect();
        let inputs: Vec<&Var> = vars.iter().collect();
        Var::from_op("cat", out, &inputs, move |g, needs| {
            let mut start = 0;
            sizes
                .iter()
                .zip(needs)
                .map(|(size, &need)| match size {
                    None => need.then(|| Tensor::zeros(0, g.dtype(), g.device()).expect("gradient's device")),
                    Some(len) => {
                        start += len;
                        need.then(|| g.narrow(d, start - len, *len))
                    }
                })
                .collect()
        })
    }

    /// Values of one shape joined along a new dim, as `torch.stack`.
    pub fn stack<D: Dim>(vars: &[Var], dim: D) -> Var {
        assert!(!vars.is_empty(), "stack: expected a non-empty list of tensors");
        let d = dim.to_index(vars[0].rank() + 1, "stack");
        let unsqueezed: Vec<Var> = vars.iter().map(|v| v.unsqueeze(d)).collect();
        Var::cat(&unsqueezed, d)
    }

    /// Pieces of `split_size` along `dim`, as `torch.split`.
    pub fn split<D: Dim>(&self, split_size: usize, dim: D) -> Vec<Var> {
        let d = dim.to_index(self.rank(), "split");
        let pieces = self.tensor().split(split_size, d);
        self.pieces(d, pieces.iter().map(|p| p.dims()[d]))
    }

    /// Pieces with the given sizes along `dim`.
    pub fn split_sizes<D: Dim>(&self, sizes: &[usize], dim: D) -> Vec<Var> {
        let d = dim.to_index(self.rank(), "split_sizes");
        let total: usize = sizes.iter().sum();
        assert_eq!(
            total,
            self.dims()[d],
            "split_sizes: sizes {sizes:?} do not add up to dim {d} of {:?}",
            self.dims()
        );
        self.pieces(d, sizes.iter().copied())
    }

    /// `chunks` pieces of (nearly) equal size along `dim`, as `torch.chunk`.
    pub fn chunk<D: Dim>(&self, chunks: usize, dim: D) -> Vec<Var> {
        let d = dim.to_index(self.rank(), "chunk");
        let pieces = self.tensor().chunk(chunks, d);
        self.pieces(d, pieces.iter().map(|p| p.dims()[d]))
    }

    fn pieces(&self, d: usize, sizes: impl Iterator<Item = usize>) -> Vec<Var> {
        let mut start = 0;
        sizes
            .map(|len| {
                start += len;
                self.narrow(d, start - len, len)
            })
            .collect()
    }
}
