//! oxtrain-datasets: not built yet; see the workspace README for the plan.
