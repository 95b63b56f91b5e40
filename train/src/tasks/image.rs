//! Image classification: a torchvision ResNet on an ImageFolder (ImageNet's layout, or the
//! built-in drawn shapes written as one), cross-entropy with optional label smoothing, top-1
//! and top-5 accuracy.

use super::finetune::{freeze, replace_head, NewHead};
use super::{finish_eval, Evaluation, Placement, Task, TaskResult};
use crate::config::{BadFiles, Config, DataKind, Decode, ModelName};
use crate::runtime::{Strategy, TrainError};
use oxtrain_autograd::{no_grad, Var};
use oxtrain_datasets::gpu_decode::{resolve_decode, DecodeOn, MIN_CPU_CORES_PER_GPU};
use oxtrain_datasets::image_folder::{find_classes, make_dataset, IMG_EXTENSIONS};
use oxtrain_datasets::{
    BadFilePolicy, Batch, DataLoader, DeviceInput, DistributedSampler, ImageFolder, ImageTransform,
    LoaderConfig, ToDevice,
};
use oxtrain_models::{ResNet, ResNetConfig};
use oxtrain_nn::loss::{cross_entropy_with, CrossEntropyOptions};
use oxtrain_nn::Module;
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub struct ImageClassification {
    config: Config,
    place: Placement,
    train: DataLoader<ImageFolder>,
    val: Option<DataLoader<ImageFolder>>,
    classes: Vec<String>,
    autocast: Option<DType>,
    /// On a GPU the loader hands over raw bytes and the GPU flips and normalises them.
    device_input: Option<DeviceInput>,
}

/// (train folder, val folder or none) for the config's data.
fn folders(config: &Config) -> TaskResult<(PathBuf, Option<PathBuf>)> {
    let d = &config.data;
    if d.kind == DataKind::SyntheticShapes {
        let root = crate::builtin::ensure_shapes_folder(config)?;
        return Ok((root.join("train"), Some(root.join("val"))));
    }
    let val = (!d.val.is_empty()).then(|| PathBuf::from(&d.val));
    Ok((PathBuf::from(&d.train), val))
}

fn data_error(key: &str, path: &Path, e: impl Into<crate::Error>) -> TrainError {
    TrainError::data(format!("{key} = {:?}", path.display().to_string()), e)
}

/// The image folder at `path` with its labels numbered by `classes` (the training class list)
/// rather than by its own sorted folders, which differ whenever a split lacks a class; a
/// folder of a class the model does not know is an error naming it.
fn open_labelled(
    path: &Path,
    transform: ImageTransform,
    key: &str,
    classes: &[String],
) -> TaskResult<ImageFolder> {
    let (own, _) = find_classes(path).map_err(|e| data_error(key, path, e))?;
    let index: BTreeMap<&str, usize> = classes.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
    let unknown: Vec<&str> = own.iter().map(String::as_str).filter(|c| !index.contains_key(c)).collect();
    if !unknown.is_empty() {
        return Err(TrainError::UnknownClasses {
            key: key.to_string(),
            path: path.to_path_buf(),
            unknown: unknown.into_iter().map(String::from).collect(),
            classes: classes.to_vec(),
        });
    }
    let labels: BTreeMap<String, usize> = own.iter().map(|c| (c.clone(), index[c.as_str()])).collect();
    let samples = make_dataset(path, &labels, &IMG_EXTENSIONS).map_err(|e| data_error(key, path, e))?;
    Ok(ImageFolder {
        root: path.to_path_buf(),
        classes: classes.to_vec(),
        class_to_idx: classes.iter().enumerate().map(|(i, c)| (c.clone(), i)).collect(),
        samples,
        transform,
        limits: Default::default(),
        gpu: None,
    })
}

/// Where the JPEGs are decoded: `data.decode` resolved for this node (for "auto": the GPU when
/// there are fewer than 20 CPU cores per GPU, said on one line); Some(ordinal) for the GPU.
fn decode_device(config: &Config, place: &Placement) -> TaskResult<Option<usize>> {
    let choice = match config.data.decode {
        Decode::Auto => DecodeOn::Auto,
        Decode::Cpu => DecodeOn::Cpu,
        Decode::Gpu => DecodeOn::Gpu,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gpus = match place.device {
        // The GPUs this node trains on: one per local process.
        Device::Cuda(_) => std::env::var("LOCAL_WORLD_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(1),
        Device::Cpu => 0,
    };
    let nvjpeg = match (choice, place.device) {
        (DecodeOn::Cpu, _) | (_, Device::Cpu) => Err("not looked for".to_string()),
        _ => oxtrain_datasets::gpu_decode::nvjpeg::available(),
    };
    let on = resolve_decode(choice, cores, gpus, nvjpeg)
        .map_err(|why| TrainError::data("", oxtrain_datasets::Error::Config(why)))?;
    let Device::Cuda(ordinal) = place.device else { return Ok(None) };
    if on == DecodeOn::Gpu && choice == DecodeOn::Auto && place.rank == 0 {
        println!(
            "data.decode = auto: decoding JPEGs on the GPU ({cores} CPU cores for {gpus} GPU(s), fewer than {MIN_CPU_CORES_PER_GPU} per GPU)"
        );
    }
    Ok((on == DecodeOn::Gpu).then_some(ordinal))
}

/// `set` decoded on GPU `ordinal` when `on_gpu` says so.
fn maybe_on_gpu(set: ImageFolder, on_gpu: Option<usize>, key: &str) -> TaskResult<ImageFolder> {
    match on_gpu {
        Some(ordinal) => set.decode_on_gpu(ordinal).map_err(|e| TrainError::data(key, e)),
        None => Ok(set),
    }
}

/// The class of each label: `data.class_names`, or the class folders of the training data; a
/// classifier needs two at least.
fn class_list(config: &Config, train_dir: &Path) -> TaskResult<Vec<String>> {
    if !config.data.class_names.is_empty() {
        return Ok(config.data.class_names.clone());
    }
    let (classes, _) = find_classes(train_dir).map_err(|e| data_error("data.train", train_dir, e))?;
    if classes.len() < 2 {
        return Err(TrainError::OneClass { path: train_dir.to_path_buf(), classes });
    }
    Ok(classes)
}

impl ImageClassification {
    pub fn new(config: &Config, place: Placement) -> TaskResult<Self> {
        let d = &config.data;
        let (train_dir, val_dir) = folders(config)?;
        let size = d.image_size;
        let mut train_tf = ImageTransform::imagenet_train(size);
        if let oxtrain_datasets::Crop::RandomResized { scale, .. } = &mut train_tf.crop {
            scale.0 = d.min_scale;
        }
        train_tf.hflip = d.hflip;
        let resize = match (d.eval_resize, d.kind) {
            (0, DataKind::SyntheticShapes) => size,
            (0, _) => size * 8 / 7,
            (r, _) => r,
        };
        let mut eval_tf = ImageTransform::imagenet_eval(resize, size);
        let device_input = place.device.is_cuda().then_some(DeviceInput::IMAGENET_F32);
        if device_input.is_some() {
            train_tf = train_tf.for_device_normalize();
            eval_tf = eval_tf.for_device_normalize();
        }
        let classes = class_list(config, &train_dir)?;
        let on_gpu = decode_device(config, &place)?;
        let train_set =
            maybe_on_gpu(open_labelled(&train_dir, train_tf, "data.train", &classes)?, on_gpu, "data.train")?;
        let global_batch = d.batch_size * place.world_size;
        if train_set.len() < global_batch {
            return Err(TrainError::TooFewImages {
                dir: train_dir.clone(),
                images: train_set.len(),
                batch_size: d.batch_size,
                world_size: place.world_size,
            });
        }
        let bad_files = match d.bad_files {
            BadFiles::Replace => BadFilePolicy::Replace,
            BadFiles::Skip if place.world_size > 1 => {
                return Err(TrainError::SkipUnderDdp { world_size: place.world_size })
            }
            BadFiles::Skip => BadFilePolicy::Skip,
            BadFiles::Fail => BadFilePolicy::Fail,
        };
        let loader =
            |set: ImageFolder, shuffle: bool, drop_last: bool| -> TaskResult<DataLoader<ImageFolder>> {
                let sampler = DistributedSampler::new(set.len(), place.world_size, place.rank)
                    .map_err(|e| TrainError::data("", e))?
                    .shuffle(shuffle)
                    .seed(config.train.seed);
                let lc = LoaderConfig {
                    batch_size: d.batch_size,
                    num_workers: d.workers,
                    seed: config.train.seed,
                    drop_last,
                    bad_files,
                    // The evaluation set is read at one epoch only: nothing to load ahead.
                    prefetch_next_epoch: shuffle,
                    ..LoaderConfig::default()
                };
                DataLoader::new(set, sampler, lc).map_err(|e| TrainError::data("", e))
            };
        let val = match val_dir {
            Some(v) => {
                let set =
                    maybe_on_gpu(open_labelled(&v, eval_tf, "data.val", &classes)?, on_gpu, "data.val")?;
                Some(loader(set, false, false)?)
            }
            None => None,
        };
        let mut config = config.clone();
        // Saved with every checkpoint and model folder: evaluation labels by the same list.
        config.data.class_names = classes.clone();
        Ok(ImageClassification {
            autocast: crate::runtime::autocast_dtype(&config),
            config,
            place,
            train: loader(train_set, true, true)?,
            val,
            classes,
            device_input,
        })
    }

    /// `batches` as the network's input on the task's device, the next batch's copy queued
    /// while the current step runs.
    fn on_device<'a>(
        &self,
        batches: impl Iterator<Item = oxtrain_datasets::Result<Batch>> + 'a,
    ) -> Box<dyn Iterator<Item = TaskResult<(Tensor, Tensor)>> + 'a> {
        match ToDevice::new(batches, self.place.device, self.device_input) {
            Ok(it) => Box::new(it.map(|r| r.map_err(|e| TrainError::data("", e)))),
            Err(e) => Box::new(std::iter::once(Err(TrainError::data("a copy stream for the batches", e)))),
        }
    }

    pub fn num_classes(&self) -> usize {
        match self.config.model.num_classes {
            0 => self.classes.len(),
            n => n,
        }
    }
}

/// The torchvision preset of `name` with the config's classes and options.
pub fn resnet_config(config: &Config, num_classes: usize) -> ResNetConfig {
    let base = match config.model.name {
        ModelName::Resnet18 => ResNetConfig::resnet18(),
        ModelName::Resnet34 => ResNetConfig::resnet34(),
        ModelName::Resnet50 => ResNetConfig::resnet50(),
        ModelName::Resnet101 => ResNetConfig::resnet101(),
        ModelName::Resnet152 => ResNetConfig::resnet152(),
        other => unreachable!("the config check keeps {other:?} off image data"),
    };
    let mut c = base.with_num_classes(num_classes);
    c.zero_init_residual = config.model.zero_init_residual;
    c.channels_last = config.train.channels_last;
    c
}

/// Loads `init_from` (a safetensors file, or a folder with model.safetensors) into `model`,
/// strictly but for a classifier `fc` of another number of classes, which keeps its fresh
/// initialisation and is returned (the caller says so).
pub fn load_init<M: Module>(model: &M, init_from: &str) -> TaskResult<Option<NewHead>> {
    if init_from.is_empty() {
        return Ok(None);
    }
    let mut path = PathBuf::from(init_from);
    if path.is_dir() {
        path = path.join("model.safetensors");
    }
    let context = format!("model.init_from = {init_from:?}");
    let mut state: HashMap<String, Tensor> = oxtrain_tensor::safetensors::load_all(&path)
        .map_err(|e| TrainError::model(context.clone(), e))?
        .into_iter()
        .collect();
    let new_head = replace_head(model, &mut state, "fc");
    model.load_state_dict(&state, true).map_err(|e| TrainError::model(context, e))?;
    Ok(new_head)
}

impl Task for ImageClassification {
    type Model = ResNet;
    type Batch = (Tensor, Tensor);

    fn config(&self) -> &Config {
        &self.config
    }

    fn unit(&self) -> &'static str {
        "img/s"
    }

    fn describe(&self) -> String {
        format!(
            "{} on {} images of {} classes ({}), {}x{} pixels",
            crate::config::enum_name(&self.config.model.name),
            self.train.dataset().len(),
            self.classes.len(),
            self.classes.join(", "),
            self.config.data.image_size,
            self.config.data.image_size
        )
    }

    fn build_model(&self) -> TaskResult<ResNet> {
        let mut model = ResNet::new(&resnet_config(&self.config, self.num_classes()), self.place.device)
            .map_err(|e| TrainError::model("", e))?;
        model.set_activation_checkpointing(self.config.train.activation_checkpointing.is_on());
        if let Some(head) = load_init(&model, &self.config.model.init_from)? {
            if self.place.rank == 0 {
                println!("{head}");
            }
        }
        freeze(&model, &self.config)?;
        Ok(model)
    }

    fn batches_per_epoch(&self) -> usize {
        self.train.len()
    }

    fn batches(&self, epoch: u64) -> Box<dyn Iterator<Item = TaskResult<(Tensor, Tensor)>> + '_> {
        self.on_device(self.train.epoch(epoch))
    }

    fn prefetch(&self, epoch: u64) {
        self.train.prefetch_epoch(epoch);
    }

    fn data_state(&self) -> oxtrain_datasets::SamplerState {
        self.train.state_dict()
    }

    fn restore_data_state(&self, state: &oxtrain_datasets::SamplerState) -> TaskResult<usize> {
        super::restore_loader(&self.train, state)
    }

    fn units(&self, batch: &(Tensor, Tensor)) -> usize {
        batch.1.elem_count()
    }

    fn bad_files(&self) -> usize {
        self.train.bad_files() + self.val.as_ref().map_or(0, |v| v.bad_files())
    }

    fn gpu_decode_fallbacks(&self) -> Option<usize> {
        self.train.dataset().gpu.as_ref()?;
        Some(
            self.train.dataset().gpu_fallbacks()
                + self.val.as_ref().map_or(0, |v| v.dataset().gpu_fallbacks()),
        )
    }

    fn loss(&self, model: &ResNet, (images, labels): &(Tensor, Tensor)) -> Var {
        let opts =
            CrossEntropyOptions { label_smoothing: self.config.train.label_smoothing, ..Default::default() };
        cross_entropy_with(&model.forward(Var::constant(images.clone())), labels, &opts)
    }

    fn evaluate(&self, strategy: &Strategy<ResNet>) -> TaskResult<Option<Evaluation>> {
        let Some(val) = &self.val else { return Ok(None) };
        let model = strategy.module();
        model.eval();
        let (mut loss_sum, mut samples, mut top1, mut top5) = (0.0, 0usize, 0.0, 0.0);
        let k = self.num_classes().min(5);
        for b in self.on_device(val.epoch(0)) {
            let (images, labels) = b?;
            let logits = no_grad(|| {
                let x = Var::constant(images);
                match self.autocast {
                    Some(dt) => oxtrain_autograd::autocast(dt, || model.forward(&x)),
                    None => model.forward(&x),
                }
            });
            let logits = logits.tensor().to_dtype(DType::F32);
            let n = labels.elem_count();
            let loss = cross_entropy_with(&Var::constant(logits.clone()), &labels, &Default::default());
            loss_sum += loss.tensor().item() * n as f64;
            samples += n;
            top1 += logits.argmax(1, false).eq(&labels).to_dtype(DType::F32).sum_all().item();
            let (_, idx) = logits.topk(k, 1, true, false);
            top5 += idx.eq(&labels.unsqueeze(1)).to_dtype(DType::F32).sum_all().item();
        }
        model.train(true);
        let mut counts = vec![("accuracy", top1)];
        if k == 5 {
            counts.push(("top5", top5));
        }
        finish_eval(strategy, loss_sum, samples, &counts).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("oxtrain-image-task-{name}-{}", std::process::id()))
    }

    #[test]
    fn a_missing_folder_is_a_data_error_whose_source_is_the_datasets_error() {
        let missing = scratch("missing");
        let err = class_list(&Config::default(), &missing).unwrap_err();
        let TrainError::Data { context, source } = &err else { panic!("not a data error: {err:?}") };
        assert!(context.starts_with("data.train = "), "{context}");
        let crate::Error::Data(datasets_error) = &**source else { panic!("source: {source:?}") };
        assert_eq!(err.source().map(|s| s.to_string()), Some(datasets_error.to_string()));
        assert_eq!(err.to_string(), format!("data: {context}: {datasets_error}"));
    }

    #[test]
    fn one_class_folder_is_refused_with_its_own_variant() {
        let dir = scratch("one-class");
        std::fs::create_dir_all(dir.join("cat")).unwrap();
        let err = class_list(&Config::default(), &dir).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        let TrainError::OneClass { path, classes } = &err else { panic!("not OneClass: {err:?}") };
        assert_eq!((path, classes.as_slice()), (&dir, ["cat".to_string()].as_slice()));
        assert!(err.to_string().contains("a classifier needs at least two classes"), "{err}");
    }
}
