//! Activation checkpointing in the models (GPT-2 and BERT blocks, ResNet stages): a training
//! step with dropout on gives every parameter the same gradient bit for bit as without it,
//! leaves batch norm's running statistics as a step without it does, and holds fewer tensor
//! bytes after the forward pass (what backward would otherwise keep).
//!
//! Dropout and initialisation draw from the process-wide generator, and the byte counts are
//! process-wide, so the tests of this file take turns.

use oxtrain_autograd::Var;
use oxtrain_models::{
    BertConfig, BertForSequenceClassification, Gpt2Config, Gpt2LMHeadModel, ResNet, ResNetConfig,
};
use oxtrain_nn::Module;
use oxtrain_tensor::{
    cpu_memory_stats, set_default_generator_state, DType, Device, Distribution, Generator, GeneratorState,
    Tensor,
};
use std::sync::{Mutex, MutexGuard};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one training step left: each parameter's gradient as bits, by name, and the tensor
/// bytes alive between forward and backward beyond those alive before the step.
struct Step {
    grads: Vec<(String, Vec<u32>)>,
    saved_bytes: usize,
}

/// Runs `loss` forward and backward from generator state `rng` with fresh gradients.
fn step(model: &dyn Module, rng: GeneratorState, loss: impl FnOnce() -> Var) -> Step {
    model.zero_grad();
    set_default_generator_state(rng);
    let before = cpu_memory_stats().allocated;
    let loss = loss();
    let saved_bytes = cpu_memory_stats().allocated.saturating_sub(before);
    loss.backward();
    let grads = model
        .named_parameters()
        .into_iter()
        .map(|(name, p)| {
            let g = p.grad().unwrap_or_else(|| panic!("{name} got no gradient"));
            (
                name,
                g.to_dtype(DType::F32).flatten_all().to_vec1::<f32>().iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect();
    Step { grads, saved_bytes }
}

/// Both runs gave the same gradients, bit for bit, and the checkpointed one kept less.
fn assert_same_and_smaller(model: &str, plain: &Step, ckpt: &Step) {
    assert_eq!(plain.grads.len(), ckpt.grads.len());
    for ((name, a), (_, b)) in plain.grads.iter().zip(&ckpt.grads) {
        let differing = a.iter().zip(b).filter(|(x, y)| x != y).count();
        assert_eq!(differing, 0, "{model}: {differing} of {} gradient values of {name} differ", a.len());
    }
    assert!(
        ckpt.saved_bytes < plain.saved_bytes,
        "{model}: {} bytes kept for backward with checkpointing, {} without",
        ckpt.saved_bytes,
        plain.saved_bytes
    );
    eprintln!(
        "{model}: {} bytes kept for backward with checkpointing, {} without",
        ckpt.saved_bytes, plain.saved_bytes
    );
}

fn ids(shape: [usize; 2], vocab: i64, seed: u64) -> Tensor {
    Tensor::randint_with(&mut Generator::new(seed), 0, vocab, shape, Device::Cpu).unwrap()
}

const RNG: GeneratorState = GeneratorState { seed: 11, offset: 5 };

/// With the plain head and with the chunked loss (`set_chunked_loss`, chunked both times): the
/// chunked loss's gradients are its own, so each is compared with itself without checkpointing. The
/// chunked loss keeps less for backward than the plain head, the logits above all.
#[test]
fn gpt2_blocks() {
    let _turn = turn();
    oxtrain_tensor::manual_seed(1);
    let mut config = Gpt2Config::gpt2();
    (config.vocab_size, config.n_positions, config.n_embd, config.n_layer, config.n_head) =
        (61, 16, 16, 3, 2);
    let mut model = Gpt2LMHeadModel::new(&config, Device::Cpu).unwrap();
    model.train(true);
    let (input, mask) = (ids([2, 12], 61, 2), Tensor::ones([2, 12], DType::I64, Device::Cpu).unwrap());
    for attention_mask in [None, Some(&mask)] {
        let mut kept = Vec::new();
        for chunked in [false, true] {
            model.set_chunked_loss(chunked);
            let run = |model: &Gpt2LMHeadModel| {
                step(model, RNG, || model.forward_loss(&input, &input, attention_mask))
            };
            let plain = run(&model);
            model.transformer.set_activation_checkpointing(true);
            let ckpt = run(&model);
            model.transformer.set_activation_checkpointing(false);
            assert_same_and_smaller(if chunked { "GPT-2, chunked loss" } else { "GPT-2" }, &plain, &ckpt);
            kept.push(ckpt.saved_bytes);
        }
        assert!(
            kept[1] < kept[0],
            "the chunked loss kept {} bytes for backward, the plain head {}",
            kept[1],
            kept[0]
        );
    }
}

#[test]
fn bert_layers() {
    let _turn = turn();
    oxtrain_tensor::manual_seed(3);
    let mut config = BertConfig::bert_base();
    (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads) =
        (53, 16, 3, 2);
    (config.intermediate_size, config.max_position_embeddings) = (32, 16);
    let mut model = BertForSequenceClassification::new(&config, Device::Cpu).unwrap();
    model.train(true);
    let input = ids([3, 10], 53, 4);
    let labels = Tensor::new([0i64, 1, 1], Device::Cpu).unwrap();
    let run = |model: &BertForSequenceClassification| {
        step(model, RNG, || BertForSequenceClassification::loss(&model.forward(&input, None, None), &labels))
    };
    let plain = run(&model);
    model.bert.set_activation_checkpointing(true);
    let ckpt = run(&model);
    assert_same_and_smaller("BERT", &plain, &ckpt);
}

#[test]
fn resnet_stages() {
    let _turn = turn();
    oxtrain_tensor::manual_seed(5);
    let mut config = ResNetConfig::resnet18();
    (config.layers, config.num_classes) = ([1, 1, 1, 1], 3);
    let mut model = ResNet::new(&config, Device::Cpu).unwrap();
    model.train(true);
    let images = Distribution::STANDARD_NORMAL
        .sample_with(&mut Generator::new(6), [2, 3, 32, 32], DType::F32, Device::Cpu)
        .unwrap();
    let labels = Tensor::new([2i64, 0], Device::Cpu).unwrap();
    let buffers =
        |m: &ResNet| -> Vec<Vec<f64>> { m.named_buffers().iter().map(|(_, t)| t.to_f64_vec()).collect() };
    let start = buffers(&model);
    let restore = |m: &ResNet| {
        for ((_, t), values) in m.named_buffers().iter().zip(&start) {
            t.copy_(
                &Tensor::new(values.as_slice(), Device::Cpu).unwrap().to_dtype(t.dtype()).reshape(t.dims()),
            );
        }
    };
    let run = |model: &ResNet| {
        step(model, RNG, || oxtrain_models::loss::cross_entropy(&model.forward(&images), &labels))
    };
    let plain = run(&model);
    let after_plain = buffers(&model);
    restore(&model);
    model.set_activation_checkpointing(true);
    let ckpt = run(&model);
    assert_same_and_smaller("ResNet", &plain, &ckpt);
    // Running statistics updated once per step, not again when a stage is rerun.
    assert_eq!(buffers(&model), after_plain, "batch norm buffers after a checkpointed step");
}
