//! Gradient of `conv2d` (kernels in the tensor crate's `ops/conv`): the input and weight
//! gradients are the tensor crate's backward convolutions, the bias gradient a sum.

use crate::Var;
use oxtrain_tensor::Tensor;

impl Var {
    /// 2-D convolution of `[N, C, H, W]` with a weight `[O, C/groups, KH, KW]` and an optional
    /// bias `[O]`, as `F.conv2d`.
    pub fn conv2d(
        &self,
        weight: &Var,
        bias: Option<&Var>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Var {
        if crate::autocast_dtype().is_some() {
            let (x, w, b) = (self.autocast_lower(), weight.autocast_lower(), bias.map(Var::autocast_lower));
            return crate::autocast_disabled(|| x.conv2d(&w, b.as_ref(), stride, padding, dilation, groups));
        }
        let out =
            self.tensor().conv2d(weight.tensor(), bias.map(Var::tensor), stride, padding, dilation, groups);
        let (x, w) = (self.tensor().clone(), weight.tensor().clone());
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Var::from_op("conv2d", out, &inputs, move |g, needs| {
            let x_shape = [x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]];
            let w_shape = [w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]];
            let mut grads = vec![
                needs[0].then(|| {
                    Tensor::conv2d_backward_input(g, &w, x_shape, stride, padding, dilation, groups)
                }),
                needs[1].then(|| {
                    Tensor::conv2d_backward_weight(g, &x, w_shape, stride, padding, dilation, groups)
                }),
            ];
            if needs.len() == 3 {
                grads.push(needs[2].then(|| g.sum([0, 2, 3], false)));
            }
            grads
        })
    }
}
