//! The config's sections. Every field has a default, so a file names only what it changes;
//! 0 or "" means "not set" where a key is optional (TOML has no null), as each comment says.

use serde::{Deserialize, Serialize};

/// Which network to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelName {
    Resnet18,
    Resnet34,
    Resnet50,
    Resnet101,
    Resnet152,
    /// GPT-2 with its language-model head.
    Gpt2,
    /// BERT for sequence classification.
    Bert,
}

impl ModelName {
    pub fn is_resnet(self) -> bool {
        !matches!(self, ModelName::Gpt2 | ModelName::Bert)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub name: ModelName,
    /// Output classes; 0: as many as the data has.
    pub num_classes: usize,
    /// Weights to start from: a safetensors file or a Hugging Face-style folder
    /// (config.json + model.safetensors); "": random initialisation.
    pub init_from: String,
    /// ResNet: start every block's last batch norm at 0 (torchvision's `zero_init_residual`).
    pub zero_init_residual: bool,
    /// Transformers: the size keys below replace the preset's (gpt2: 12 layers, 768 wide,
    /// 12 heads; bert: BERT-base); 0 keeps the preset's or `init_from`'s value.
    pub layers: usize,
    pub hidden_size: usize,
    pub heads: usize,
    pub intermediate_size: usize,
    pub max_positions: usize,
    /// 0: the tokenizer's vocabulary size.
    pub vocab_size: usize,
    /// Dropout of the transformer's hidden layers; negative keeps the preset's.
    pub dropout: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            name: ModelName::Resnet18,
            num_classes: 0,
            init_from: String::new(),
            zero_init_residual: false,
            layers: 0,
            hidden_size: 0,
            heads: 0,
            intermediate_size: 0,
            max_positions: 0,
            vocab_size: 0,
            dropout: -1.0,
        }
    }
}

/// Where batches come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// torchvision's ImageFolder: `train/<class>/*.jpg` and `val/<class>/*.jpg`.
    ImageFolder,
    /// Text files (.txt, or .jsonl with a "text" field) packed into blocks of tokens.
    TextLm,
    /// llm.c token shards (`oxtrain tokenize` writes them) read by mmap: data.train and
    /// data.val name a folder of `.bin` files, a glob pattern or one file.
    TokenShards,
    /// Lines of `{"text": ..., "label": ...}`.
    JsonlClassification,
    /// The built-in example's drawn shapes, written once as an ImageFolder into `data.cache`.
    SyntheticShapes,
}

/// Images: what the loader does with a file it cannot decode (each is counted in the
/// metrics' `bad_files` and named on stderr; a folder of bad files only is an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadFiles {
    /// Another sample takes its place: batches stay full and equal on every rank.
    Replace,
    /// The batch comes out one sample short (one process only: under DDP ranks would differ).
    Skip,
    /// The run stops with an error naming the file.
    Fail,
}

/// Images: where JPEGs are decoded (`data.decode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decode {
    /// On the GPU (nvJPEG) when the node has fewer than 20 CPU cores per GPU and nvJPEG is
    /// there, else on the loader's CPU cores.
    Auto,
    Cpu,
    /// nvJPEG decodes, the GPU crops and resizes; files it refuses go to the CPU, counted.
    Gpu,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    pub kind: DataKind,
    /// Training data: a folder of class folders (image_folder), a .txt / .jsonl file
    /// (text_lm), or shards (token_shards: a folder, a pattern such as "data/x_train_*.bin").
    pub train: String,
    /// Evaluation data, of the same kind; "": no evaluation.
    pub val: String,
    /// Samples per batch on each rank (the global batch is this x world size x grad_accum).
    pub batch_size: usize,
    /// Loader threads; 0 loads on the training thread.
    pub workers: usize,
    /// Images: the side of the training crop (RandomResizedCrop) and of the evaluation crop.
    pub image_size: u32,
    /// Images: evaluation resizes the shorter side to this, then center-crops `image_size`;
    /// 0: image_size * 8 / 7 (256 for 224, torchvision's ratio).
    pub eval_resize: u32,
    /// Images: RandomResizedCrop's smallest area fraction (torchvision: 0.08; the built-in
    /// example: 1, whole pictures, flipped only).
    pub min_scale: f64,
    /// Images: probability of a horizontal flip.
    pub hflip: f64,
    /// Text: a Hugging Face tokenizer.json; "": bytes as tokens (257 ids) when `init_from`
    /// has no tokenizer.json beside it.
    pub tokenizer: String,
    /// text_lm, token_shards: tokens per sample.
    pub block_size: usize,
    /// jsonl_classification: longer texts are cut to this many tokens.
    pub max_length: usize,
    /// synthetic_shapes: the folder the pictures are written into once and reused from;
    /// "": the user's cache folder ($XDG_CACHE_HOME or ~/.cache)/oxtrain.
    pub cache: String,
    /// synthetic_shapes: classes (up to 6), pictures per class for training, their side.
    pub classes: usize,
    pub per_class: usize,
    /// Images: "replace" (default), "skip" or "fail" for files that do not decode.
    pub bad_files: BadFiles,
    /// Images: "auto" (default), "cpu" or "gpu": where JPEGs are decoded.
    pub decode: Decode,
    /// Images: the class of each label index; []: the class folders of data.train, sorted.
    /// Training fills it in, so the config saved with a checkpoint or model folder labels
    /// evaluation data (data.val, `oxtrain eval --data`) the way the model was trained.
    pub class_names: Vec<String>,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            kind: DataKind::SyntheticShapes,
            train: String::new(),
            val: String::new(),
            batch_size: 64,
            workers: 2,
            image_size: 32,
            eval_resize: 0,
            min_scale: 1.0,
            hflip: 0.5,
            tokenizer: String::new(),
            block_size: 128,
            max_length: 128,
            cache: String::new(),
            classes: 4,
            per_class: 600,
            bad_files: BadFiles::Replace,
            decode: Decode::Auto,
            class_names: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimName {
    Sgd,
    Adamw,
    Lars,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    pub name: OptimName,
    /// The learning rate (at `lr_reference_batch` when that is set).
    pub lr: f64,
    /// When > 0, lr is scaled by (global batch / this): the "0.1 x batch / 256" rule.
    pub lr_reference_batch: usize,
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    /// Biases and norm parameters get no weight decay (and no LARS trust ratio).
    pub no_decay_bias_and_norm: bool,
    /// AdamW.
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// LARS's eta.
    pub trust_coefficient: f64,
    /// Parameters to freeze, as globs on state_dict names (`["layer1.*", "conv1.*"]`): they
    /// keep their loaded values and stay out of the optimizer and DDP; a pattern that matches
    /// nothing is an error.
    pub freeze: Vec<String>,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            name: OptimName::Adamw,
            lr: 4e-3,
            lr_reference_batch: 0,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 1e-4,
            no_decay_bias_and_norm: true,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            trust_coefficient: 0.001,
            freeze: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleName {
    Constant,
    Cosine,
    /// Multiply by `gamma` every `step_epochs` epochs.
    Step,
    Poly,
}

/// Warmup, then the decay; the learning rate changes after every optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleConfig {
    pub name: ScheduleName,
    /// Linear warmup from `warmup_start_factor` x lr, in epochs (may be fractional).
    pub warmup_epochs: f64,
    pub warmup_start_factor: f64,
    /// cosine: the floor of the learning rate.
    pub min_lr: f64,
    /// step: period in epochs and factor.
    pub step_epochs: usize,
    pub gamma: f64,
    /// poly: the power.
    pub power: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            name: ScheduleName::Cosine,
            warmup_epochs: 0.5,
            warmup_start_factor: 0.1,
            min_lr: 0.0,
            step_epochs: 30,
            gamma: 0.1,
            power: 2.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionDtype {
    F32,
    /// bf16 autocast, f32 master weights.
    Bf16,
    /// f16 autocast with dynamic loss scaling.
    F16,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrecisionConfig {
    pub dtype: PrecisionDtype,
    /// f16: the loss scaler's first factor and how many clean steps double it.
    pub init_scale: f64,
    pub growth_interval: u32,
}

impl Default for PrecisionConfig {
    fn default() -> Self {
        PrecisionConfig { dtype: PrecisionDtype::F32, init_scale: 65536.0, growth_interval: 2000 }
    }
}

/// Which activations a training step recomputes in backward instead of keeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationCheckpointing {
    /// Keep every activation backward needs.
    None,
    /// Checkpoint each transformer block / ResNet stage (`torch.utils.checkpoint` per block).
    Blocks,
}

impl ActivationCheckpointing {
    pub fn is_on(self) -> bool {
        self == ActivationCheckpointing::Blocks
    }
}

/// What to do when the loss is NaN or infinite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NonFinite {
    /// End the run with an error naming the step.
    Stop,
    /// Leave that batch's update out, say so, and go on (stops after `max_skipped`).
    Skip,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub epochs: usize,
    /// Optimizer steps to run; 0: `epochs` full epochs.
    pub steps: usize,
    /// Batches whose gradients add up before each optimizer step.
    pub grad_accum: usize,
    /// Clip the gradients' global L2 norm to this; 0: no clipping.
    pub clip_grad_norm: f64,
    /// Evaluate every this many optimizer steps; 0: after every epoch.
    pub eval_every: usize,
    pub seed: u64,
    /// ResNet: NHWC activations (faster with cuDNN; only costs time on the CPU).
    pub channels_last: bool,
    /// "auto" (cuda:LOCAL_RANK when there is a GPU, else cpu), "cpu", "cuda", "cuda:N".
    pub device: String,
    /// Cross-entropy label smoothing in [0, 1).
    pub label_smoothing: f64,
    pub on_nonfinite: NonFinite,
    /// With on_nonfinite = "skip": stop after this many skipped steps.
    pub max_skipped: usize,
    /// "blocks": each transformer block (GPT-2, BERT) or ResNet stage keeps only its input
    /// and recomputes its activations in backward (less memory, about one more forward).
    pub activation_checkpointing: ActivationCheckpointing,
    /// GPT-2: the LM head and the cross-entropy computed together in chunks of tokens, the
    /// logits made again in backward (Liger's fused linear cross-entropy, torchtune's chunked
    /// output loss): the `[batch, seq, vocab]` logits and their gradient are never held whole.
    pub chunked_loss: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 4,
            steps: 0,
            grad_accum: 1,
            clip_grad_norm: 0.0,
            eval_every: 0,
            seed: 0,
            channels_last: false,
            device: "auto".into(),
            label_smoothing: 0.0,
            on_nonfinite: NonFinite::Stop,
            max_skipped: 10,
            activation_checkpointing: ActivationCheckpointing::None,
            chunked_loss: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DdpBackend {
    /// nccl for CUDA devices, shm for CPU processes of one host, mpi across hosts.
    Auto,
    Nccl,
    Nvshmem,
    Shm,
    Mpi,
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradCompression {
    None,
    Bf16,
}

/// Data parallelism; used when the launcher started more than one process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DdpSection {
    pub backend: DdpBackend,
    pub bucket_cap_mb: f64,
    pub first_bucket_cap_mb: f64,
    pub compression: GradCompression,
    pub find_unused_parameters: bool,
    /// Batch-norm statistics over all ranks (SyncBatchNorm).
    pub sync_batchnorm: bool,
    /// ZeRO-1: gradients reduce-scattered, each rank keeps 1/N of the optimizer state (SGD,
    /// AdamW; not LARS, not with bf16 compression).
    pub shard_optimizer: bool,
}

impl Default for DdpSection {
    fn default() -> Self {
        DdpSection {
            backend: DdpBackend::Auto,
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            compression: GradCompression::None,
            find_unused_parameters: false,
            sync_batchnorm: false,
            shard_optimizer: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Where checkpoints go; "": `<log.dir>/checkpoints`.
    pub dir: String,
    /// Save every this many optimizer steps; 0: never by count.
    pub every_steps: usize,
    /// Save every this many minutes; 0: never by time.
    pub every_minutes: f64,
    /// Save when training ends: a checkpoint (unless the last step just saved one) and the
    /// `final` model folder. SIGTERM and SIGINT always save, then end the run with status 0.
    pub at_end: bool,
    /// Checkpoints kept: the last `keep_last`, plus every `keep_every`-th (0: none extra).
    pub keep_last: usize,
    pub keep_every: usize,
    /// "": start fresh; "latest": the newest valid checkpoint in `dir` (none yet: start fresh);
    /// or a step directory, or a checkpoints folder (its newest valid one). `--resume` sets it.
    pub resume: String,
    /// Under DDP every rank, not only rank 0, writes its final model (`final-rank<N>`), to
    /// compare the replicas.
    pub all_ranks: bool,
    /// When a checkpoint cannot be written (a full disk, a failing device): "stop" ends the
    /// run with the error, "continue" warns and trains on. Either way the last complete
    /// checkpoint stays intact.
    pub on_save_error: OnSaveError,
}

/// What a failed checkpoint write does to the run (`checkpoint.on_save_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnSaveError {
    Stop,
    Continue,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            dir: String::new(),
            every_steps: 0,
            every_minutes: 0.0,
            at_end: true,
            keep_last: 3,
            keep_every: 0,
            resume: String::new(),
            all_ranks: false,
            on_save_error: OnSaveError::Stop,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressMode {
    /// A bar when stderr is a terminal (rank 0 only), else plain log lines.
    Auto,
    Bar,
    Lines,
    Off,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// The run's folder: metrics.jsonl, the plots and (by default) the checkpoints.
    pub dir: String,
    /// Log the loss every this many optimizer steps.
    pub every_steps: usize,
    pub progress: ProgressMode,
    /// Write loss / accuracy / lr plots (PNG) beside the metrics after every evaluation.
    pub plots: bool,
    /// Write a TensorBoard event file (events.out.tfevents.oxtrain) beside the metrics:
    /// `tensorboard --logdir <log.dir>`.
    pub tensorboard: bool,
    /// Write log.csv (a row per logged step) and eval.csv (a row per evaluation).
    pub csv: bool,
    /// Start afresh in a `dir` that holds a run (its metrics and checkpoints are deleted);
    /// without it such a start is refused (`oxtrain train --overwrite` sets it).
    pub overwrite: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            dir: "runs/oxtrain".into(),
            every_steps: 10,
            progress: ProgressMode::Auto,
            plots: true,
            tensorboard: true,
            csv: true,
            overwrite: false,
        }
    }
}

/// `[lora]`: low-rank adapters (PEFT's LoRA) on a pretrained GPT-2 or BERT (`model.init_from`).
/// The base stays frozen; only the adapters (and BERT's classifier) train and are saved, under
/// PEFT's names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSection {
    /// The adapters' rank (PEFT's `r`); 0 trains the whole model (no LoRA).
    pub rank: usize,
    /// The update is scaled by alpha / rank (PEFT's `lora_alpha`).
    pub alpha: f64,
    /// Dropout on the adapters' input while training (PEFT's `lora_dropout`).
    pub dropout: f64,
    /// Module names to adapt (PEFT's `target_modules`); empty: PEFT's default for the model
    /// (`c_attn` for GPT-2, `query` and `value` for BERT).
    pub targets: Vec<String>,
}

impl Default for LoraSection {
    fn default() -> Self {
        LoraSection { rank: 0, alpha: 8.0, dropout: 0.0, targets: Vec::new() }
    }
}
