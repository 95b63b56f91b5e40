//! Gradients of indexing by integer tensors: `index_select`, `gather`, `embedding`,
//! `scatter_add`, `index_add`. Gradients of picked elements are scattered back with
//! accumulation, so repeated indices add up.

use crate::Var;
use oxtrain_tensor::{Dim, Tensor};

impl Var {
    /// Slices along `dim` picked by a 0-D or 1-D index tensor, as `torch.index_select`.
    pub fn index_select<D: Dim>(&self, dim: D, indices: &Tensor) -> Var {
        let d = dim.to_index(self.rank(), "index_select");
        let out = self.tensor().index_select(d, indices);
        let (index, input) = (indices.flatten_all(), self.dims().to_vec());
        Var::from_op("index_select", out, &[self], move |g, _| {
            let zeros = Tensor::zeros(input.as_slice(), g.dtype(), g.device()).expect("gradient's device");
            // A 0-D index keeps `dim` with size 1 in the output, as index_add's source wants.
            vec![Some(zeros.index_add(d, &index, g, 1.0))]
        })
    }

    /// `out[i][j] = self[index[i][j]][j]` for `dim == 0` (and alike), as `torch.gather`.
    pub fn gather<D: Dim>(&self, dim: D, index: &Tensor) -> Var {
        let d = dim.to_index(self.rank(), "gather");
        let out = self.tensor().gather(d, index);
        let (index, input) = (index.clone(), self.dims().to_vec());
        Var::from_op("gather", out, &[self], move |g, _| {
            let zeros = Tensor::zeros(input.as_slice(), g.dtype(), g.device()).expect("gradient's device");
            vec![Some(zeros.scatter_add(d, &index, g))]
        })
    }

    /// Rows of the table `weight` (`[num_embeddings, dim]`) for each id in `ids`, as
    /// `F.embedding(ids, weight)`; the result has shape `ids.shape + [dim]`.
    pub fn embedding(ids: &Tensor, weight: &Var) -> Var {
        let out = ids.embedding(weight.tensor());
        let (ids, num_embeddings) = (ids.clone(), weight.dims()[0]);
        Var::from_op("embedding", out, &[weight], move |g, _| {
            vec![Some(g.embedding_backward(&ids, num_embeddings))]
        })
    }

    /// A copy of `self` with `src` added at the positions `index` names along `dim`, as
    /// `torch.scatter_add`.
    pub fn scatter_add<D: Dim>(&self, dim: D, index: &Tensor, src: &Var) -> Var {
        let d = dim.to_index(self.rank(), "scatter_add");
        let out = self.tensor().scatter_add(d, index, src.tensor());
        let index = index.clone();
        Var::from_op("scatter_add", out, &[self, src], move |g, needs| {
            vec![needs[0].then(|| g.clone()), needs[1].then(|| g.gather(d, &index))]
        })
    }

    /// A copy of `self` with `alpha * source` slices added at `index` along `dim`, as
    /// `torch.index_add`.
    pub fn index_add<D: Dim>(&self, dim: D, index: &Tensor, source: &Var, alpha: f64) -> Var {
        let d = dim.to_index(self.rank(), "index_add");
        let out = self.tensor().index_add(d, index, source.tensor(), alpha);
        let index = index.clone();
        Var::from_op("index_add", out, &[self, source], move |g, needs| {
            vec![needs[0].then(|| g.clone()), needs[1].then(|| g.index_select(d, &index).mul_scalar(alpha))]
        })
    }
}
