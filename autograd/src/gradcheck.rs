//! Gradient checking: analytic gradients against central finite differences, in f64.

use crate::{no_grad, Var};
use oxtrain_tensor::{DType, Distribution, Generator, Tensor};

/// Why a gradient check failed: the first element whose gradients disagree, or a gradient of
/// the wrong shape.
#[derive(Debug, thiserror::Error)]
pub enum GradcheckError {
    #[error("gradcheck: input {input} (shape {shape:?}), element {element}: analytic gradient {analytic}, numeric {numeric}")]
    Mismatch { input: usize, shape: Vec<usize>, element: usize, analytic: f64, numeric: f64 },
    #[error("gradcheck: input {input} has shape {shape:?} but its gradient has shape {gradient:?}")]
    GradientShape { input: usize, shape: Vec<usize>, gradient: Vec<usize> },
    /// Drawing the output's random weights failed (device memory).
    #[error("gradcheck: {0}")]
    Tensor(#[source] oxtrain_tensor::Error),
}

/// Checks the gradients `f` computes for each of `inputs` against central differences with
/// step `eps`, all in f64. A non-scalar output is reduced to `sum(f(x) * r)` with fixed random
/// weights `r`, so every output element counts. An element passes when
/// `|analytic - numeric| <= tol * (1 + |numeric|)`; the error names the first that does not.
///
/// Inputs that are already f64 are used as given for the analytic pass (a transposed or
/// narrowed input stays strided); `f` can also make views of its arguments itself.
pub fn gradcheck(
    f: impl Fn(&[Var]) -> Var,
    inputs: &[Tensor],
    eps: f64,
    tol: f64,
) -> Result<(), GradcheckError> {
    let inputs: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(DType::F64)).collect();
    let params: Vec<Var> = inputs.iter().cloned().map(Var::parameter).collect();
    let out = f(&params);
    let device = out.device();
    let weights = Distribution::Uniform { low: -1.0, high: 1.0 }
        .sample_with(&mut Generator::new(7), out.dims(), DType::F64, device)
        .map_err(GradcheckError::Tensor)?;
    if out.requires_grad() {
        out.backward_with(weights.to_dtype(out.dtype()), false);
    }
    let weighted =
        |vars: &[Var]| no_grad(|| f(vars).tensor().to_dtype(DType::F64).mul(&weights).sum_all().item());
    for (i, input) in inputs.iter().enumerate() {
        let analytic = match params[i].grad() {
            Some(g) => {
                if g.dims() != input.dims() {
                    return Err(GradcheckError::GradientShape {
                        input: i,
                        shape: input.dims().to_vec(),
                        gradient: g.dims().to_vec(),
                    });
                }
                g.to_f64_vec()
            }
            None => vec![0.0; input.elem_count()],
        };
        let base = input.to_f64_vec();
        for j in 0..base.len() {
            let at = |delta: f64| {
                let mut values = base.clone();
                values[j] += delta;
                let moved = Tensor::from_vec(values, input.dims(), input.device()).expect("input's device");
                let vars: Vec<Var> = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, t)| Var::constant(if k == i { moved.clone() } else { t.clone() }))
                    .collect();
                weighted(&vars)
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            let a = analytic[j];
            // Written so that a NaN on either side fails.
            let close = (a - numeric).abs() <= tol * (1.0 + numeric.abs());
            if !close {
                return Err(GradcheckError::Mismatch {
                    input: i,
                    shape: input.dims().to_vec(),
                    element: j,
                    analytic: a,
                    numeric,
                });
            }
        }
    }
    Ok(())
}
