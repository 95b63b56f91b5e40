//! Values the types allow but a run cannot use, each refused with what is allowed.

use super::error::ConfigError;
use super::{Config, DataKind, Decode, ModelName};

fn at_least(key: &str, v: usize, min: usize, what: &str) -> Result<(), ConfigError> {
    if v < min {
        return Err(ConfigError::invalid(key, v, format!("{what}: use {min} or more")));
    }
    Ok(())
}

/// A finite number in `[lo, hi]` (open ends where `open_lo` / `open_hi`).
fn in_range(
    key: &str,
    v: f64,
    lo: f64,
    hi: f64,
    open_lo: bool,
    open_hi: bool,
    what: &str,
) -> Result<(), ConfigError> {
    let ok =
        v.is_finite() && (if open_lo { v > lo } else { v >= lo }) && (if open_hi { v < hi } else { v <= hi });
    if !ok {
        let (l, h) = (if open_lo { "(" } else { "[" }, if open_hi { ")" } else { "]" });
        return Err(ConfigError::invalid(
            key,
            v,
            format!("{what} must be a finite number in {l}{lo}, {hi}{h}"),
        ));
    }
    Ok(())
}

/// "cpu", "cuda", "cuda:N" or "auto".
pub fn parse_device(s: &str) -> Option<Option<oxtrain_tensor::Device>> {
    use oxtrain_tensor::Device;
    match s {
        "auto" => Some(None),
        "cpu" => Some(Some(Device::Cpu)),
        "cuda" => Some(Some(Device::Cuda(0))),
        other => other.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(|n| Some(Device::Cuda(n))),
    }
}

pub fn check(c: &Config) -> Result<(), ConfigError> {
    check_data(c)?;
    check_model(c)?;
    check_optim_and_schedule(c)?;
    check_run(c)
}

fn check_data(c: &Config) -> Result<(), ConfigError> {
    let d = &c.data;
    at_least("data.batch_size", d.batch_size, 1, "a batch needs at least one sample")?;
    if d.workers > 256 {
        return Err(ConfigError::invalid("data.workers", d.workers, "use at most 256 loader threads"));
    }
    at_least("data.image_size", d.image_size as usize, 16, "a ResNet halves the image 5 times")?;
    let images = matches!(d.kind, DataKind::ImageFolder | DataKind::SyntheticShapes);
    if d.decode == Decode::Gpu && !images {
        return Err(ConfigError::invalid(
            "data.decode",
            "gpu",
            format!(
                "only images are decoded, and data.kind = {:?}: leave data.decode at \"auto\"",
                enum_name(&d.kind)
            ),
        ));
    }
    if d.eval_resize != 0 && d.eval_resize < d.image_size {
        return Err(ConfigError::invalid(
            "data.eval_resize",
            d.eval_resize,
            format!(
                "the evaluation crop (data.image_size = {}) must fit: use 0 or at least {}",
                d.image_size, d.image_size
            ),
        ));
    }
    in_range("data.min_scale", d.min_scale, 0.0, 1.0, true, false, "the crop's area fraction")?;
    in_range("data.hflip", d.hflip, 0.0, 1.0, false, false, "a probability")?;
    at_least("data.block_size", d.block_size, 1, "a language-model sample needs tokens")?;
    at_least("data.max_length", d.max_length, 1, "a text needs tokens")?;
    if d.kind == DataKind::SyntheticShapes {
        if !(1..=oxtrain_datasets::synthetic::SHAPES.len()).contains(&d.classes) || d.classes < 2 {
            return Err(ConfigError::invalid(
                "data.classes",
                d.classes,
                format!("synthetic_shapes draws 2 to {} classes", oxtrain_datasets::synthetic::SHAPES.len()),
            ));
        }
        at_least("data.per_class", d.per_class, 2, "pictures per class")?;
    } else if d.train.is_empty() {
        return Err(ConfigError::invalid(
            "data.train",
            "\"\"",
            format!("data.kind = \"{}\" needs data.train: the training data's path", kind_name(d.kind)),
        ));
    }
    Ok(())
}

/// The model and its data kind go together; the dropout is a probability.
fn check_model(c: &Config) -> Result<(), ConfigError> {
    let d = &c.data;
    let fits = match c.model.name {
        ModelName::Gpt2 => matches!(d.kind, DataKind::TextLm | DataKind::TokenShards),
        ModelName::Bert => d.kind == DataKind::JsonlClassification,
        _ => matches!(d.kind, DataKind::ImageFolder | DataKind::SyntheticShapes),
    };
    if !fits {
        let wants = match c.model.name {
            ModelName::Gpt2 => "\"text_lm\" or \"token_shards\"",
            ModelName::Bert => "\"jsonl_classification\"",
            _ => "\"image_folder\" or \"synthetic_shapes\"",
        };
        return Err(ConfigError::invalid(
            "data.kind",
            format!("\"{}\"", kind_name(d.kind)),
            format!("model.name = \"{}\" trains on data.kind = {wants}", model_name(c.model.name)),
        ));
    }
    check_lora(c)?;
    if c.train.chunked_loss && c.model.name != ModelName::Gpt2 {
        return Err(ConfigError::invalid(
            "train.chunked_loss",
            true,
            format!(
                "the chunked loss is GPT-2's LM head and loss, and model.name = \"{}\": set it to false",
                model_name(c.model.name)
            ),
        ));
    }
    if c.model.dropout >= 1.0 || c.model.dropout.is_nan() {
        return Err(ConfigError::invalid(
            "model.dropout",
            c.model.dropout,
            "a probability below 1, or negative for the preset's",
        ));
    }
    Ok(())
}

/// LoRA adapts a pretrained transformer: GPT-2 or BERT, from `model.init_from`.
fn check_lora(c: &Config) -> Result<(), ConfigError> {
    let l = &c.lora;
    if l.rank == 0 {
        return Ok(());
    }
    if !matches!(c.model.name, ModelName::Gpt2 | ModelName::Bert) {
        return Err(ConfigError::invalid(
            "lora.rank",
            l.rank,
            format!("LoRA adapts gpt2 and bert, not {}; set lora.rank = 0", model_name(c.model.name)),
        ));
    }
    if c.model.init_from.is_empty() {
        return Err(ConfigError::invalid(
            "lora.rank",
            l.rank,
            "LoRA trains adapters on a pretrained model, whose frozen weights come from model.init_from \
             (a Hugging Face folder or .safetensors file): set it, or lora.rank = 0 to train from scratch",
        ));
    }
    in_range("lora.alpha", l.alpha, 0.0, f64::INFINITY, true, true, "the scaling numerator")?;
    in_range("lora.dropout", l.dropout, 0.0, 1.0, false, true, "a probability")
}

fn check_optim_and_schedule(c: &Config) -> Result<(), ConfigError> {
    let o = &c.optim;
    // Above 10 every optimizer here diverges at once; NaN and negative rates are typos.
    in_range("optim.lr", o.lr, 0.0, 10.0, true, false, "the learning rate")?;
    in_range("optim.momentum", o.momentum, 0.0, 1.0, false, true, "momentum")?;
    in_range("optim.weight_decay", o.weight_decay, 0.0, 1.0, false, true, "weight decay")?;
    in_range("optim.beta1", o.beta1, 0.0, 1.0, false, true, "AdamW's beta1")?;
    in_range("optim.beta2", o.beta2, 0.0, 1.0, false, true, "AdamW's beta2")?;
    in_range("optim.eps", o.eps, 0.0, 1.0, true, false, "eps")?;
    in_range("optim.trust_coefficient", o.trust_coefficient, 0.0, 1.0, true, false, "LARS's eta")?;

    let s = &c.schedule;
    in_range("schedule.warmup_epochs", s.warmup_epochs, 0.0, 1e6, false, false, "warmup in epochs")?;
    in_range(
        "schedule.warmup_start_factor",
        s.warmup_start_factor,
        0.0,
        1.0,
        true,
        false,
        "the warmup's first factor",
    )?;
    if !(s.min_lr.is_finite() && s.min_lr >= 0.0 && s.min_lr < o.lr) {
        return Err(ConfigError::invalid(
            "schedule.min_lr",
            s.min_lr,
            format!("the cosine floor must be at least 0 and below optim.lr = {}", o.lr),
        ));
    }
    at_least("schedule.step_epochs", s.step_epochs, 1, "the step schedule's period in epochs")?;
    in_range("schedule.gamma", s.gamma, 0.0, 1.0, true, false, "the step factor")?;
    in_range("schedule.power", s.power, 0.0, 100.0, true, false, "the polynomial's power")?;
    Ok(())
}

/// Precision, train, ddp, checkpoint and log.
fn check_run(c: &Config) -> Result<(), ConfigError> {
    in_range("precision.init_scale", c.precision.init_scale, 0.0, f64::MAX, true, false, "the loss scale")?;
    at_least(
        "precision.growth_interval",
        c.precision.growth_interval as usize,
        1,
        "steps between scale doublings",
    )?;

    let t = &c.train;
    if t.steps == 0 {
        at_least("train.epochs", t.epochs, 1, "with train.steps = 0 the run is counted in epochs")?;
    }
    at_least("train.grad_accum", t.grad_accum, 1, "batches per optimizer step")?;
    in_range(
        "train.clip_grad_norm",
        t.clip_grad_norm,
        0.0,
        f64::MAX,
        false,
        false,
        "the gradient-norm limit (0: off)",
    )?;
    in_range("train.label_smoothing", t.label_smoothing, 0.0, 1.0, false, true, "label smoothing")?;
    if parse_device(&t.device).is_none() {
        return Err(ConfigError::invalid(
            "train.device",
            format!("{:?}", t.device),
            "use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"",
        ));
    }

    in_range("ddp.bucket_cap_mb", c.ddp.bucket_cap_mb, 0.0, 1e5, true, false, "the bucket size in MB")?;
    in_range(
        "ddp.first_bucket_cap_mb",
        c.ddp.first_bucket_cap_mb,
        0.0,
        1e5,
        true,
        false,
        "the first bucket's size in MB",
    )?;
    in_range(
        "checkpoint.every_minutes",
        c.checkpoint.every_minutes,
        0.0,
        1e9,
        false,
        false,
        "minutes between saves (0: off)",
    )?;
    at_least("checkpoint.keep_last", c.checkpoint.keep_last, 1, "checkpoints kept")?;
    at_least("log.every_steps", c.log.every_steps, 1, "steps between log lines")?;
    if c.log.dir.is_empty() {
        return Err(ConfigError::invalid("log.dir", "\"\"", "the run needs a folder for its metrics"));
    }
    Ok(())
}

fn kind_name(k: DataKind) -> String {
    enum_name(&k)
}

fn model_name(m: ModelName) -> String {
    enum_name(&m)
}

/// The name serde gives a unit variant (`"image_folder"`).
pub fn enum_name<T: serde::Serialize>(v: &T) -> String {
    match toml::Value::try_from(v) {
        Ok(toml::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}
