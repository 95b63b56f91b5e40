//! Activation memory of one GPT-2 training step (forward and backward, dropout 0.1 as Hugging
//! Face's default, one thread), with and without activation checkpointing per block, against
//! transformers' GPT2LMHeadModel with `activation_checkpointing_enable` (use_reentrant=False).
//!
//! Each figure comes from a fresh process. The activation memory of a step is its process's
//! peak RSS less that of a baseline process holding the same model and a gradient for every
//! parameter but running no step (what the step itself needed beyond the weights and their
//! gradients), on each side alike. oxtrain also reports its tensor allocator's peak: the bytes
//! of tensors made during the first step (activations, and the gradients made so far).

use crate::{peak_rss_kb, Runner, Section};
use oxtrain_bench::{median, Benchmark};
use oxtrain_models::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_nn::Module;
use oxtrain_tensor::{cpu_memory_stats, manual_seed, reset_cpu_peak, Device, Generator, Tensor};
use serde_json::{json, Map, Value};
use std::time::Instant;

/// A GPT-2 shape and the batch of its step.
struct Case {
    name: &'static str,
    layers: usize,
    width: usize,
    heads: usize,
    batch: usize,
    seq: usize,
}

const CASES: &[Case] = &[
    Case { name: "gpt2_l4_d256", layers: 4, width: 256, heads: 4, batch: 2, seq: 512 },
    Case { name: "gpt2_124m", layers: 12, width: 768, heads: 12, batch: 1, seq: 512 },
];

/// Each measurement's mode: the first three on both sides, the chunked loss (oxtrain's
/// `set_chunked_loss`, which transformers has no counterpart of) on oxtrain's only.
const MODES: [&str; 5] = ["baseline", "none", "blocks", "none_chunked", "blocks_chunked"];
const PEER_MODES: usize = 3;

/// The goal: a checkpointed GPT-2 step needs at most this fraction of the activation
/// memory of a step without.
const GOAL: f64 = 0.6;

fn steps() -> usize {
    std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2)
}

/// `memory_cpu child activation LAYERS WIDTH HEADS BATCH SEQ MODE STEPS`: the JSON line of one
/// measurement, as `bench/peers/memory_cpu.py` prints it.
pub fn child(args: &[String]) -> Result<Value, Box<dyn std::error::Error>> {
    let usage = "activation LAYERS WIDTH HEADS BATCH SEQ MODE STEPS";
    let [layers, width, heads, batch, seq, mode, steps] = args else {
        return Err(format!("memory_cpu child: expected {usage}, got {args:?}").into());
    };
    let num = |s: &String| s.parse::<usize>().map_err(|e| format!("{s:?} in {usage}: {e}"));
    let (batch, seq, steps) = (num(batch)?, num(seq)?, num(steps)?);
    manual_seed(0);
    let mut config = Gpt2Config::gpt2();
    (config.n_layer, config.n_embd, config.n_head) = (num(layers)?, num(width)?, num(heads)?);
    let mut model = Gpt2LMHeadModel::new(&config, Device::Cpu)?;
    model.train(true);
    let ids = Tensor::randint_with(&mut Generator::new(1), 0, 50257, [batch, seq], Device::Cpu)?;
    let mut out = json!({ "mode": mode });
    match mode.as_str() {
        // A copy, not zeros: untouched zero pages would not count in the RSS.
        "baseline" => model.parameters().iter().for_each(|p| p.set_grad(Some(p.tensor().copy()))),
        "none" | "blocks" | "none_chunked" | "blocks_chunked" => {
            model.transformer.set_activation_checkpointing(mode.starts_with("blocks"));
            model.set_chunked_loss(mode.ends_with("_chunked"));
            let mut times = Vec::new();
            for i in 0..steps {
                let start = Instant::now();
                model.zero_grad();
                let before = cpu_memory_stats().allocated;
                reset_cpu_peak();
                let loss = model.forward_loss(&ids, &ids, None);
                let saved = cpu_memory_stats().allocated - before;
                loss.backward();
                times.push(start.elapsed().as_secs_f64());
                if i == 0 {
                    out["allocator_peak_bytes"] = json!(cpu_memory_stats().peak_allocated - before);
                    out["allocator_saved_bytes"] = json!(saved);
                }
            }
            out["step_seconds"] = json!(if times.len() > 1 { median(&times[1..]) } else { times[0] });
        }
        other => return Err(format!("memory_cpu child: mode {other:?}, expected one of {MODES:?}").into()),
    }
    out["peak_rss_kb"] = json!(peak_rss_kb());
    Ok(out)
}

/// Every case, each mode on both sides, interleaved (oxtrain then PyTorch), per round.
pub fn measure(runner: &Runner) -> Result<Section, String> {
    let mut section = Section { rows: Vec::new(), extras: Vec::new(), notes: String::new() };
    let mut peer_error = None;
    for case in CASES {
        // [side][mode] -> one JSON per round; side 0 is oxtrain, 1 the peer.
        let mut runs: [[Vec<Value>; MODES.len()]; 2] = Default::default();
        for round in 0..runner.rounds {
            for (m, mode) in MODES.iter().enumerate() {
                let args: Vec<String> = ["activation".to_string()]
                    .into_iter()
                    .chain([case.layers, case.width, case.heads, case.batch, case.seq].map(|n| n.to_string()))
                    .chain([mode.to_string(), steps().to_string()])
                    .collect();
                runs[0][m].push(runner.oxtrain(&args)?);
                if peer_error.is_none() && m < PEER_MODES {
                    match runner.peer(&args) {
                        Ok(v) => runs[1][m].push(v),
                        Err(e) => peer_error = Some(e),
                    }
                }
                eprintln!(
                    "{} round {round} {mode}: oxtrain {} torch {:?}",
                    case.name,
                    runs[0][m].last().unwrap(),
                    runs[1][m].last()
                );
            }
        }
        add_rows(&mut section, case, &runs);
    }
    section.notes = format!(
        "Activation section: one GPT-2 training step (forward and backward; no optimizer) of transformers' \
         GPT2LMHeadModel layout (vocabulary 50257, dropout 0.1, tied embeddings) on random ids, 1 thread, \
         each figure from a fresh process; activation memory = the step process's peak RSS (getrusage \
         ru_maxrss) less a baseline process's holding the model and a gradient per parameter; checkpointed: \
         oxtrain's set_activation_checkpointing (per block), torch's activation_checkpointing_enable (transformers 5's name for \
         gradient_checkpointing_enable) with use_reentrant=False (torch.utils.checkpoint per GPT2Block); step time the median of the steps after the first of \
         {} per process; fraction = checkpointed over plain activation memory (goal for oxtrain: at most {GOAL}); \
         ratio = PyTorch's figure over oxtrain's (memory and time: lower is better, so higher ratio is better); \
         oxtrain_allocator_* are the bytes of oxtrain's live CPU tensors at their peak during the first step \
         beyond those alive before it (activations and the gradients made so far), oxtrain_saved_for_backward_* \
         those alive when the loss is computed (what the graph keeps for backward). Rows ending \
         _chunked_loss: oxtrain with set_chunked_loss (the LM head and the cross-entropy in chunks of \
         tokens, the logits made again in backward) in both its runs, against the peer's plain-head \
         figures (transformers has no chunked loss); *_chunked_loss_activation_fraction: oxtrain's \
         chunked loss over its plain head, both without checkpointing.{}",
        steps(),
        peer_error.map(|e| format!(" The peer did not run: {e}")).unwrap_or_default()
    );
    Ok(section)
}

fn field(runs: &[Value], key: &str) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
    (!v.is_empty()).then(|| median(&v))
}

/// A figure where lower is better: ratio = peer / oxtrain.
fn lower_is_better(name: String, unit: &str, oxtrain: f64, peer: Option<f64>, peer_name: &str) -> Benchmark {
    Benchmark {
        name,
        unit: unit.into(),
        oxtrain,
        peer,
        peer_name: peer_name.into(),
        ratio: peer.map(|p| p / oxtrain),
        goal: None,
    }
}

/// The rows of one case: for the plain head and for the chunked loss (named `_chunked_loss`),
/// the activation memory without and with checkpointing, its fraction and its time cost; the
/// peer's figures are always its plain head's (transformers has no chunked loss).
fn add_rows(section: &mut Section, case: &Case, runs: &[[Vec<Value>; MODES.len()]; 2]) {
    let prefix = format!("{}_b{}_t{}", case.name, case.batch, case.seq);
    for (suffix, none, blocks) in [("", 1, 2), ("_chunked_loss", 3, 4)] {
        add_loss_rows(section, &format!("{prefix}{{}}{suffix}"), runs, (none, blocks));
    }
    if let (Some(chunked), Some(plain)) = (mb(runs, 0, 3), mb(runs, 0, 1)) {
        let name = format!("{prefix}_chunked_loss_activation_fraction");
        section.rows.push(lower_is_better(name, "fraction", chunked / plain, None, "none (oxtrain alone)"));
    }
}

/// Activation memory in MB of `side`'s `mode` runs: peak RSS less the baseline's.
fn mb(runs: &[[Vec<Value>; MODES.len()]; 2], side: usize, mode: usize) -> Option<f64> {
    Some((field(&runs[side][mode], "peak_rss_kb")? - field(&runs[side][0], "peak_rss_kb")?) / 1024.0)
}

/// The rows of one loss kind: `name` has a `{}` where the row's own words go; `none` and
/// `blocks` are oxtrain's modes without and with checkpointing.
fn add_loss_rows(
    section: &mut Section,
    name: &str,
    runs: &[[Vec<Value>; MODES.len()]; 2],
    (none, blocks): (usize, usize),
) {
    let named = |what: &str| name.replace("{}", what);
    let peer_name = "torch.utils.checkpoint (use_reentrant=False) via transformers GPT2LMHeadModel";
    let (Some(ox_none), Some(ox_blocks)) = (mb(runs, 0, none), mb(runs, 0, blocks)) else { return };
    let (pt_none, pt_blocks) = (mb(runs, 1, 1), mb(runs, 1, 2));
    let rows = &mut section.rows;
    rows.push(lower_is_better(named("_activation_mb"), "MB", ox_none, pt_none, peer_name));
    rows.push(lower_is_better(named("_activation_mb_checkpointed"), "MB", ox_blocks, pt_blocks, peer_name));
    let fraction_name = named("_checkpointed_activation_fraction");
    let pt_fraction = pt_none.zip(pt_blocks).map(|(n, b)| b / n);
    rows.push(lower_is_better(
        fraction_name.clone(),
        "fraction",
        ox_blocks / ox_none,
        pt_fraction,
        peer_name,
    ));
    let alloc = |mode: usize| field(&runs[0][mode], "allocator_peak_bytes").map(|b| b / (1 << 20) as f64);
    let saved = |mode: usize| field(&runs[0][mode], "allocator_saved_bytes").map(|b| b / (1 << 20) as f64);
    let mut more = Map::new();
    more.insert("oxtrain_goal_at_most".into(), json!(GOAL));
    more.insert("oxtrain_allocator_peak_mb".into(), json!(alloc(none)));
    more.insert("oxtrain_allocator_peak_mb_checkpointed".into(), json!(alloc(blocks)));
    more.insert(
        "oxtrain_allocator_fraction".into(),
        json!(alloc(blocks).zip(alloc(none)).map(|(b, n)| b / n)),
    );
    more.insert("oxtrain_saved_for_backward_mb".into(), json!(saved(none)));
    more.insert("oxtrain_saved_for_backward_mb_checkpointed".into(), json!(saved(blocks)));
    more.insert(
        "oxtrain_saved_for_backward_fraction".into(),
        json!(saved(blocks).zip(saved(none)).map(|(b, n)| b / n)),
    );
    section.extras.push((fraction_name, more));
    let time = |side: usize, mode: usize| field(&runs[side][mode], "step_seconds");
    if let (Some(on), Some(off)) = (time(0, blocks), time(0, none)) {
        let name = named("_checkpointing_time_cost");
        let peer = time(1, 2).zip(time(1, 1)).map(|(b, n)| b / n);
        section.rows.push(lower_is_better(name.clone(), "x", on / off, peer, peer_name));
        let mut more = Map::new();
        for (key, side, mode) in [
            ("oxtrain", 0, none),
            ("oxtrain_checkpointed", 0, blocks),
            ("peer", 1, 1),
            ("peer_checkpointed", 1, 2),
        ] {
            more.insert(format!("{key}_step_seconds"), json!(time(side, mode)));
        }
        section.extras.push((name, more));
    }
}
