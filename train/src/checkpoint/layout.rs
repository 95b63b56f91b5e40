//! Every name in a run's checkpoint folder, in one place: the folders (`checkpoints/`, a
//! step's `step-000100`, a rank's `step-000100.rank-1`, the final model's `final`), the files
//! of a part, and the hidden names of unfinished writes. Readers (resume, eval, export,
//! discovery, retention, the run-folder guard) and writers use these, so a name changes here
//! or nowhere.

/// The folder of a run that holds its checkpoints, under `log.dir`.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// The model folder a run ends with (rank 0's), beside the step folders.
pub const FINAL_DIR: &str = "final";
/// The model's state_dict, PyTorch's names.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer's state tensors; its param_groups JSON in the metadata.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Step, epoch, LR schedule, grad scaler, the trainer's extra state.
pub const TRAINER_FILE: &str = "trainer.json";
/// The resolved config.
pub const CONFIG_FILE: &str = "config.toml";
/// Every file's size and checksum, written last: a part without it is unfinished.
pub const MANIFEST: &str = "manifest.json";

/// Rank `rank`'s own state (RNG, sampler position): `rank-1.json`.
pub fn rank_file(rank: usize) -> String {
    format!("rank-{rank}.json")
}

/// The name of step `step`'s directory (rank 0's part): `step-000100`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// The name of rank `rank`'s part of step `step`: rank 0's is the step directory itself,
/// the others sit beside it (`step-000100.rank-1`), each committed on its own.
pub fn part_name(step: u64, rank: usize) -> String {
    match rank {
        0 => step_dir_name(step),
        r => format!("{}.rank-{r}", step_dir_name(step)),
    }
}

/// The final model folder of rank `rank` (`final`; under `checkpoint.all_ranks` the others'
/// are `final-rank1`, ...).
pub fn final_dir_name(rank: usize) -> String {
    match rank {
        0 => FINAL_DIR.to_string(),
        r => format!("{FINAL_DIR}-rank{r}"),
    }
}

/// Whether `name` is a folder a run writes into its checkpoint folder (a step's part or a
/// final model), the names that make a folder "a run's".
pub fn is_run_output(name: &str) -> bool {
    name.starts_with("step-") || name.starts_with(FINAL_DIR)
}

/// Parses `step-000100` (a committed step) or `.step-000100.tmp-...` (an unfinished write):
/// the step and whether the write is unfinished.
pub fn parse_step_dir(name: &str) -> Option<(u64, bool)> {
    if let Some(digits) = name.strip_prefix("step-") {
        return digits.parse().ok().map(|s| (s, false));
    }
    let rest = name.strip_prefix(".step-")?;
    let (digits, tail) = rest.split_once('.')?;
    if tail.starts_with("tmp-") {
        return digits.parse().ok().map(|s| (s, true));
    }
    None
}

/// The prefix of `name`'s temporary directories (hidden, so tools listing checkpoints skip them).
pub(crate) fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// Where an older copy of `name` waits while its replacement is renamed into place.
pub(crate) fn replaced_name(name: &str) -> String {
    format!(".{name}.replaced-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_parse_back() {
        for step in [0, 7, 100, 999_999, 1_234_567] {
            assert_eq!(parse_step_dir(&step_dir_name(step)), Some((step, false)));
            let temp = format!("{}42-0", temp_prefix(&step_dir_name(step)));
            assert_eq!(parse_step_dir(&temp), Some((step, true)));
        }
        assert_eq!(parse_step_dir("final"), None);
        assert_eq!(parse_step_dir(".step-000100.replaced-9"), None);
        assert_eq!(part_name(5, 2), "step-000005.rank-2");
        assert_eq!(final_dir_name(0), "final");
        assert_eq!(final_dir_name(3), "final-rank3");
        assert!(is_run_output(&final_dir_name(3)) && is_run_output(&part_name(5, 1)));
    }
}
