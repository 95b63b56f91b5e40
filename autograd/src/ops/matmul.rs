//! Gradients of `matmul` (all of `torch.matmul`'s cases: dot, matrix-vector, batched with
//! broadcast batch dims; the engine sums broadcast batch dims back) and `bmm`.

use crate::Var;
use oxtrain_tensor::Tensor;

/// How a product's output is computed from its operands (its layout may differ; its values
/// and so its gradients are `torch.matmul`'s).
type Product<'a> = &'a dyn Fn(&Tensor, &Tensor) -> Tensor;

impl Var {
    /// The matrix product with `torch.matmul` semantics.
    pub fn matmul(&self, rhs: &Var) -> Var {
        self.matmul_with(rhs, "matmul", &|a, b| a.matmul(b))
    }

    fn matmul_with(&self, rhs: &Var, name: &'static str, product: Product) -> Var {
        if crate::autocast_dtype().is_some() {
            let (a, b) = (self.autocast_lower(), rhs.autocast_lower());
            return crate::autocast_disabled(|| a.matmul_with(&b, name, product));
        }
        if self.dtype() != rhs.dtype() {
            let (a, b) = self.promote_pair(rhs);
            return a.matmul_with(&b, name, product);
        }
        let (a, b) = (self.tensor().clone(), rhs.tensor().clone());
        let out = product(&a, &b);
        let (a_vec, b_vec) = (a.rank() == 1, b.rank() == 1);
        // The output's shape before the dims added for 1-D operands were removed.
        let mut full = out.dims().to_vec();
        if b_vec {
            full.push(1);
        }
        if a_vec {
            let at = full.len() - 1;
            full.insert(at, 1);
        }
        let a2 = if a_vec { a.unsqueeze(0) } else { a };
        let b2 = if b_vec { b.unsqueeze(1) } else { b };
        Var::from_op(name, out, &[self, rhs], move |g, needs| {
            let g = g.reshape(full.as_slice());
            let ga = needs[0].then(|| {
                let ga = g.matmul(&b2.transpose(-2, -1));
                if a_vec {
                    ga.squeeze(-2)
                } else {
                    ga
                }
            });
            let gb = needs[1].then(|| {
                let gb = if b2.rank() == 2 && a2.rank() > 2 {
                    // `x [.., T, K] @ w [K, N]`: w's gradient is one tall product over every row
                    // of the batch, x^T [K, rows] @ g [rows, N], rather than a product per batch
                    // entry summed afterwards (a batch of outputs, each rounded to the dtype).
                    let (k, n) = (b2.dims()[0], b2.dims()[1]);
                    let rows = a2.elem_count() / k.max(1);
                    let (a, g) = (a2.reshape([rows, k]), g.reshape([rows, n]));
                    // A weight used transposed (`x @ w.t()`, a tied head: b2 a column-major
                    // view) gets its gradient in that layout, (g^T a)^T, so what reaches `w`
                    // through the transpose is contiguous rather than a strided view that
                    // every later sum and optimizer step reads across.
                    if b2.strides()[0] == 1 && b2.strides()[1] != 1 && k > 1 {
                        g.t().matmul(&a).t()
                    } else {
                        a.t().matmul(&g)
                    }
                } else {
                    a2.transpose(-2, -1).matmul(&g)
                };
                if b_vec {
                    gb.squeeze(-1)
                } else {
                    gb
                }
            });
            vec![ga, gb]
        })
    }

    /// Batched matrix product of two 3-D values with the same batch size, as `torch.bmm`.
    pub fn bmm(&self, rhs: &Var) -> Var {
        assert!(
            self.rank() == 3 && rhs.rank() == 3 && self.dims()[0] == rhs.dims()[0],
            "bmm: expected [b, m, k] and [b, k, n], got shapes {:?} and {:?}",
            self.dims(),
            rhs.dims()
        );
        self.matmul(rhs)
    }
}
