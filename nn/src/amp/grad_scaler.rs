//! `GradScaler`: dynamic loss scaling, as `torch.amp.GradScaler`.
//!
//! f16 gradients underflow for small values; scaling the loss by a large factor before
//! backward keeps them representable. The scaler unscales the gradients before the optimizer
//! step, skips the step when any gradient overflowed (inf/NaN), and adapts the factor: halve
//! it after an overflow, double it after `growth_interval` clean steps.
//!
//! The overflow check runs on the device: each gradient adds `sum(g * 0)` (NaN exactly when
//! `g` holds an inf or NaN) to one flag tensor, which is read once per step.

use crate::optim::Optimizer;
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Tensor};
use std::collections::BTreeMap;

/// Settings of [`GradScaler`], PyTorch's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u32,
    /// When false every method is a pass-through (`scale` returns the loss unchanged).
    pub enabled: bool,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// Dynamic loss scaler. Per iteration: `scaler.scale(&loss).backward()`, optionally
/// `scaler.unscale_(&mut opt)` (to clip the true gradients), `scaler.step(&mut opt)`,
/// `scaler.update()`.
#[derive(Debug, Clone)]
pub struct GradScaler {
    config: GradScalerConfig,
    /// The factor, an f32 as PyTorch keeps it.
    scale: f32,
    growth_tracker: u32,
    /// Accumulated `sum(g * 0)` of this iteration's gradients, on their device.
    found_inf: Option<Tensor>,
    /// Whether this iteration's gradients were read back and held an inf/NaN.
    found_inf_value: Option<bool>,
    unscaled: bool,
}

impl GradScaler {
    pub fn new(config: GradScalerConfig) -> GradScaler {
        assert!(
            config.growth_factor > 1.0,
            "GradScaler: growth_factor must be > 1, got {}",
            config.growth_factor
        );
        assert!(
            config.backoff_factor > 0.0 && config.backoff_factor < 1.0,
            "GradScaler: backoff_factor must be in (0, 1), got {}",
            config.backoff_factor
        );
        GradScaler {
            scale: config.init_scale as f32,
            config,
            growth_tracker: 0,
            found_inf: None,
            found_inf_value: None,
            unscaled: false,
        }
    }

    /// The current scale factor (`get_scale()`).
    pub fn get_scale(&self) -> f64 {
        if self.config.enabled {
            self.scale as f64
        } else {
            1.0
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.config.enabled
    }

    /// Clean steps since the last growth or backoff.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// `loss * scale` (multiplied in the loss's dtype, as PyTorch does).
    pub fn scale(&self, loss: &Var) -> Var {
        if !self.config.enabled {
            return loss.clone();
        }
        loss.mul_scalar(self.scale as f64)
    }

    /// Divides the optimizer's gradients by the scale in place and records, on the device,
    /// whether any is inf/NaN. Call it before clipping; [`GradScaler::step`] calls it if you
    /// did not. Panics when called twice in one iteration.
    pub fn unscale_(&mut self, opt: &mut dyn Optimizer) {
        if !self.config.enabled {
            return;
        }
        assert!(!self.unscaled, "unscale_: already called since the last update()");
        // PyTorch inverts in double and rounds to float.
        let inv = ((1.0 / self.scale as f64) as f32) as f64;
        for p in opt.params() {
            let Some(g) = p.grad() else { continue };
            let flag = g.mul_scalar(0.0).to_dtype(DType::F32).sum_all();
            self.found_inf = Some(match self.found_inf.take() {
                Some(acc) if acc.device() == flag.device() => acc.add(&flag),
                // Gradients on several devices: gather the flags on the first one's.
                Some(acc) => acc.add(&flag.to_device(acc.device()).expect("moving an overflow flag")),
                None => flag,
            });
            g.mul_scalar_(inv);
        }
        self.unscaled = true;
    }

    /// Unscales (unless done), then runs `opt.step()` unless a gradient overflowed. Returns
    /// whether the step ran. Reads the overflow flag back: one host sync per iteration.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> bool {
        if !self.config.enabled {
            opt.step();
            return true;
        }
        if !self.unscaled {
            self.unscale_(opt);
        }
        let found = self.found_inf.as_ref().is_some_and(|f| !f.item().is_finite());
        self.found_inf_value = Some(found);
        if !found {
            opt.step();
        }
        !found
    }

    /// Adapts the scale after a step: `scale *= backoff_factor` after an overflow, else
    /// `scale *= growth_factor` after `growth_interval` clean steps in a row (kept only when
    /// finite). Panics when no gradients were checked this iteration.
    pub fn update(&mut self) {
        if !self.config.enabled {
            return;
        }
        let found = match self.found_inf_value {
            Some(f) => f,
            None => {
                let flag = self
                    .found_inf
                    .as_ref()
                    .expect("update: no inf checks were recorded; call step() or unscale_() first");
                !flag.item().is_finite()
            }
        };
        if found {
            self.scale = (self.scale as f64 * self.config.backoff_factor) as f32;
            self.growth_tracker = 0;
        } else {
            let successful = self.growth_tracker + 1;
            if successful == self.config.growth_interval {
                let grown = (self.scale as f64 * self.config.growth_factor) as f32;
                if grown.is_finite() {
                    self.scale = grown;
                }
                self.growth_tracker = 0;
            } else {
                self.growth_tracker = successful;
            }
        }
        self.found_inf = None;
        self.found_inf_value = None;
        self.unscaled = false;
    }

    /// The scaler's state by PyTorch's `state_dict` names.
    pub fn state_dict(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([
            ("scale".into(), self.scale as f64),
            ("growth_factor".into(), self.config.growth_factor),
            ("backoff_factor".into(), self.config.backoff_factor),
            ("growth_interval".into(), self.config.growth_interval as f64),
            ("_growth_tracker".into(), self.growth_tracker as f64),
        ])
    }

    /// Restores [`GradScaler::state_dict`]; keys it lacks keep their values.
    pub fn load_state_dict(&mut self, state: &BTreeMap<String, f64>) {
        let get = |k: &str| state.get(k).copied();
        if let Some(s) = get("scale") {
            self.scale = s as f32;
        }
        if let Some(v) = get("growth_factor") {
            self.config.growth_factor = v;
        }
        if let Some(v) = get("backoff_factor") {
            self.config.backoff_factor = v;
        }
        if let Some(v) = get("growth_interval") {
            self.config.growth_interval = v as u32;
        }
        if let Some(v) = get("_growth_tracker") {
            self.growth_tracker = v as u32;
        }
    }
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new(GradScalerConfig::default())
    }
}
