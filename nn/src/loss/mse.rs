//! `mse_loss`.

use super::Reduction;
use oxtrain_autograd::Var;

/// `F.mse_loss(input, target, reduction=)`: the squared difference, reduced. `target` may
/// require grad too (wrap a plain tensor with `Var::constant`); shapes broadcast.
pub fn mse_loss(input: &Var, target: &Var, reduction: Reduction) -> Var {
    let sq = input.sub(target).square();
    match reduction {
        Reduction::Mean => sq.mean_all(),
        Reduction::Sum => sq.sum_all(),
        Reduction::None => sq,
    }
}
