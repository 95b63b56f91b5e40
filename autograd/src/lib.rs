//! oxtrain-autograd: not built yet; see the workspace README for the plan.
