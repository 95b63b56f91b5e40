//! MultiheadSelfAttention (with causal and key-padding masks) and the functional
//! scaled_dot_product_attention against torch.

use super::{check_forward_backward, close, load, t};
use crate::functional::scaled_dot_product_attention;
use crate::*;
use oxtrain_autograd::Var;
use oxtrain_tensor::{device_test, Device};

/// The module with a given mask choice as a one-input `Forward`, for the shared checks.
struct Masked<'a> {
    mha: &'a MultiheadSelfAttention,
    padding: Option<oxtrain_tensor::Tensor>,
    causal: bool,
}

impl Module for Masked<'_> {
    fn visit(&self, v: &mut dyn Visitor) {
        self.mha.visit(v)
    }
}

impl Forward for Masked<'_> {
    fn forward(&self, x: &Var) -> Var {
        self.mha.forward_masked(x, None, self.padding.as_ref(), self.causal)
    }
}

device_test!(
    fn multihead_self_attention_matches_torch(device: Device) {
        let mha = MultiheadSelfAttention::new(8, 2, device).unwrap();
        for (case, causal, padded) in [
            ("mha", false, false),
            ("mha_causal", true, false),
            ("mha_padding", false, true),
            ("mha_causal_padding", true, true),
        ] {
            load(&mha, case, device);
            mha.zero_grad();
            let padding = padded.then(|| t(case, "key_padding_mask", device));
            check_forward_backward(&Masked { mha: &mha, padding, causal }, case, device);
        }
    }
);

device_test!(
    fn multihead_self_attention_takes_masks_as_tensors_too(device: Device) {
        // The causal mask given as a bool attn_mask (true = masked), as torch users pass it.
        let mha = MultiheadSelfAttention::new(8, 2, device).unwrap();
        load(&mha, "mha_causal", device);
        let mask = crate::functional::causal_mask(5, 5, device);
        let out = mha.forward_masked(&Var::constant(t("mha_causal", "x", device)), Some(&mask), None, false);
        close(out.tensor(), "mha_causal", "out", device);
    }
);

device_test!(
    fn scaled_dot_product_attention_matches_torch(device: Device) {
        for (case, has_mask, causal) in
            [("sdpa_mask", true, false), ("sdpa_float_mask", true, false), ("sdpa_causal", false, true)]
        {
            let [q, k, v] = ["q", "k", "v"].map(|n| Var::parameter(t(case, n, device)));
            let mask = has_mask.then(|| t(case, "mask", device));
            let out = scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), causal);
            close(out.tensor(), case, "out", device);
            out.backward_with(t(case, "grad_out", device), false);
            for (name, var) in [("grad_q", &q), ("grad_k", &k), ("grad_v", &v)] {
                close(&var.grad().unwrap(), case, name, device);
            }
        }
    }
);

#[test]
fn multihead_self_attention_is_initialised_as_torch() {
    let mha = MultiheadSelfAttention::new(16, 4, Device::Cpu).unwrap();
    let names: Vec<String> = mha.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
    assert_eq!(mha.in_proj_weight.dims(), [48, 16]);
    // Xavier uniform over fan_in 16, fan_out 48; biases zero.
    let bound = (6.0f64 / 64.0).sqrt();
    let w = mha.in_proj_weight.tensor().to_f64_vec();
    assert!(w.iter().all(|v| v.abs() <= bound) && w.iter().any(|v| v.abs() > 0.8 * bound));
    assert_eq!(mha.in_proj_bias.as_ref().unwrap().tensor().abs().sum_all().item(), 0.0);
    assert_eq!(mha.out_proj.bias.as_ref().unwrap().tensor().abs().sum_all().item(), 0.0);
}
