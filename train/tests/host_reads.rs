//! A steady training step reads nothing back to the host: the loss stays on the device until
//! the logging interval, and the NaN/inf guard ("stop", the default) works from a device-side
//! flag read at the same time, and the gradient norm is kept on the device until then too.
//! Counted with `oxtrain_tensor::host_reads` (this thread's reads of tensor values; on a GPU
//! each would wait for the queued work): four more steps of the same run cost exactly the two
//! reads of the window they are logged in (its losses and flag, its last gradient norm).

use oxtrain::config::Config;

/// Host reads of a CPU run of `steps` steps of the built-in example, logged every 4 steps.
fn reads_of_a_run(dir: &std::path::Path, steps: usize, extra: &[&str]) -> u64 {
    let cache = format!("data.cache={}", dir.join("cache").display());
    let log = format!("log.dir={}", dir.join(format!("run-{steps}-{}", extra.len())).display());
    let steps = format!("train.steps={steps}");
    let mut args = vec![
        cache.as_str(),
        log.as_str(),
        steps.as_str(),
        "data.classes=2",
        "data.per_class=16",
        "data.image_size=16",
        "data.batch_size=4",
        "data.workers=0",
        "train.device=cpu",
        "train.eval_every=1000",
        "log.every_steps=4",
        "log.progress=off",
        "log.plots=false",
        "checkpoint.at_end=false",
    ];
    args.extend(extra);
    let config = Config::load(None, &args).unwrap();
    let before = oxtrain_tensor::host_reads();
    oxtrain::trainer::train(&config).unwrap();
    oxtrain_tensor::host_reads() - before
}

#[test]
fn steady_steps_read_nothing_between_log_intervals() {
    std::env::remove_var("RANK");
    std::env::remove_var("WORLD_SIZE");
    let dir = tempfile::tempdir().unwrap();
    let (short, long) = (reads_of_a_run(dir.path(), 4, &[]), reads_of_a_run(dir.path(), 8, &[]));
    assert_eq!(
        long - short,
        2,
        "steps 5 to 8 read {} times; the two reads of their window expected",
        long - short
    );

    // "skip" decides before every update: a read of the loss and of the gradient flag per step,
    // the cost its documentation names.
    let skip = ["train.on_nonfinite=skip"];
    let (short, long) = (reads_of_a_run(dir.path(), 4, &skip), reads_of_a_run(dir.path(), 8, &skip));
    assert_eq!(long - short, 2 + 4 * 2, "with on_nonfinite = skip");
}
