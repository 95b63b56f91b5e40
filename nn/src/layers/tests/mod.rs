//! Parity of every layer with PyTorch: weights, inputs, outputs and gradients from
//! `fixtures.py` (torch on the CPU, f32). Weights go in through `load_state_dict` (strict),
//! which also checks that the names match torch's.

mod attention;
mod layers;
mod norm;

use crate::{Forward, Module};
use oxtrain_autograd::Var;
use oxtrain_tensor::testing::{assert_close, Fixtures};
use oxtrain_tensor::{Device, Tensor};
use std::collections::HashMap;
use std::sync::OnceLock;

const JSON: &str = include_str!("../fixtures.json");

pub(crate) fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| Fixtures::parse(JSON, "nn/src/layers/fixtures.json"))
}

fn raw() -> &'static serde_json::Value {
    static R: OnceLock<serde_json::Value> = OnceLock::new();
    R.get_or_init(|| serde_json::from_str(JSON).expect("fixture JSON"))
}

/// A list of strings of a case (state-dict names in torch's order).
pub(crate) fn names(case: &str, key: &str) -> Vec<String> {
    serde_json::from_value(raw()[case][key].clone())
        .unwrap_or_else(|_| panic!("{case}.{key}: not a list of names"))
}

/// The entries of `case` whose names start with `prefix`, without it.
pub(crate) fn entries(case: &str, prefix: &str, device: Device) -> HashMap<String, Tensor> {
    let obj = raw()[case].as_object().unwrap_or_else(|| panic!("no case {case}"));
    obj.keys()
        .filter_map(|k| k.strip_prefix(prefix).map(|n| (n.to_string(), fixtures().tensor(case, k, device))))
        .collect()
}

pub(crate) fn t(case: &str, name: &str, device: Device) -> Tensor {
    fixtures().tensor(case, name, device)
}

/// f32 against torch: 1e-5 on the CPU; the GPU sums in other orders (cuDNN, cuBLAS), so 1e-4.
pub(crate) fn tol(device: Device) -> f64 {
    if device.is_cpu() {
        1e-5
    } else {
        1e-4
    }
}

#[track_caller]
pub(crate) fn close(actual: &Tensor, case: &str, name: &str, device: Device) {
    let tol = tol(device);
    assert_close(actual, &t(case, name, device), tol, tol, &format!("{case}: {name}"));
}

/// Loads the case's state dict strictly and checks the module's names and order are torch's.
pub(crate) fn load(module: &impl Module, case: &str, device: Device) {
    module.load_state_dict(&entries(case, "p.", device), true).unwrap_or_else(|e| panic!("{case}: {e}"));
    let ours: Vec<String> = module.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(ours, names(case, "names"), "{case}: state dict names or order differ from torch's");
}

/// Forward on `x`, backward with `grad_out`; checks the output, the input's gradient (when
/// the case has one) and every parameter's gradient.
pub(crate) fn check_forward_backward(module: &impl Forward, case: &str, device: Device) {
    let x = t(case, "x", device);
    let x = if x.dtype().is_float() { Var::parameter(x) } else { Var::constant(x) };
    let out = module.forward(&x);
    close(out.tensor(), case, "out", device);
    out.backward_with(t(case, "grad_out", device), false);
    if x.requires_grad() {
        close(&x.grad().expect("input gradient"), case, "grad_x", device);
    }
    for (name, p) in module.named_parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{case}: {name} got no gradient"));
        close(&g, case, &format!("g.{name}"), device);
    }
}

/// `load` then `check_forward_backward`.
pub(crate) fn parity(module: &impl Forward, case: &str, device: Device) {
    load(module, case, device);
    check_forward_backward(module, case, device);
}
