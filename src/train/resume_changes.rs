//! What a resumed run changes of the run it continues. `--resume` continues bit for bit
//! under the config the checkpoint was trained with, and under any other layout of the
//! same work; a key that changes what a step computes (the learning rate, the seed, the
//! batch) is the user's to change, as Megatron's users lower a learning rate after a loss
//! spike, but the run is then no longer the one it continues, and a note says so.

use serde_norway::{Mapping, Value};

/// Keys that leave every step's result as it was: how the work is laid out over stages
/// and in time (bitwise under any stage count, schedule, recompute, offload or sharding of
/// the optimizer), when the run logs, evaluates and saves, what it checks, and what only
/// a fresh run reads (its init).
const LAYOUT_AND_BOOKKEEPING: &[&str] = &[
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "pipeline_schedule",
    "num_layers_per_stage",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "recompute_num_layers_per_stage",
    "fine_grained_activation_offloading",
    "offload_modules",
    "cpu_offloading_activations",
    "offload_num_layers_per_stage",
    "use_distributed_optimizer",
    "eval_interval",
    "eval_iters",
    "save_interval",
    "log_interval",
    "valid_data_path",
    "check_for_nan_in_loss_and_grad",
    "distributed_timeout_minutes",
    "init_method_std",
];

/// One line per key whose value in `now` (the resumed run's config, as YAML) differs from
/// `trained` (the config the checkpoint's steps were trained with, as its trainer state
/// keeps it) and changes what a step computes. `train_iters` counts only where the
/// learning rate decays over it: `lr_decay_iters` unset, a style other than constant; a
/// new `load`, which a resume does not read, counts too. A key one of the two configs
/// lacks (a checkpoint from before it existed) is passed over, and so is a checkpoint that
/// kept no config.
pub fn changed_keys(trained: &str, now: &str) -> Vec<String> {
    let (Some(trained), Some(now)) = (mapping(trained), mapping(now)) else { return Vec::new() };
    let decay_over_train_iters = now.get("lr_decay_iters").is_none_or(Value::is_null)
        && now.get("lr_decay_style").and_then(Value::as_str) != Some("constant");
    now.iter()
        .filter_map(|(key, value)| {
            let key = key.as_str()?;
            let was = trained.get(key)?;
            let (counts, why) = match key {
                "train_iters" => {
                    (decay_over_train_iters, " (lr_decay_iters is unset: the lr decays over it)")
                }
                // Noted though it changes nothing: a user who set it may think it was read.
                "load" => (true, " (not read: a resume continues its own checkpoint)"),
                _ => (!LAYOUT_AND_BOOKKEEPING.contains(&key), ""),
            };
            (counts && was != value)
                .then(|| format!("{key} {}, where the run had {}{why}", shown(value), shown(was)))
        })
        .collect()
}

fn mapping(yaml: &str) -> Option<Mapping> {
    match serde_norway::from_str(yaml) {
        Ok(Value::Mapping(m)) => Some(m),
        _ => None,
    }
}

/// A value in one line: a string bare, an unset one as `none`, anything else as JSON.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "none".into(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_what_changes_a_step_and_passes_over_layout() {
        let trained = "# a comment\nlr: 0.01\nseed: 1\ntrain_iters: 4\nlr_decay_iters: null\n\
                       pipeline_model_parallel_size: 1\ntrain_data_path: a.bin\nretired_key: 3\nseq_length: null\n";
        let now = "lr: 0.5\nseed: 1\ntrain_iters: 8\nlr_decay_iters: null\n\
                   pipeline_model_parallel_size: 4\ntrain_data_path: [a.bin, b.bin]\nnew_key: 1\nseq_length: 64\n";
        assert_eq!(
            changed_keys(trained, now),
            [
                "lr 0.5, where the run had 0.01",
                "train_iters 8, where the run had 4 (lr_decay_iters is unset: the lr decays over it)",
                "train_data_path [\"a.bin\",\"b.bin\"], where the run had a.bin",
                "seq_length 64, where the run had none",
            ]
        );
        // With the decay's length set, more iterations only train longer on the same schedule.
        let load = |path: &str| format!("load: {path}\n");
        assert_eq!(
            changed_keys(&load("null"), &load("hf")),
            ["load hf, where the run had none (not read: a resume continues its own checkpoint)"]
        );
        let fixed = |iters: u32| format!("train_iters: {iters}\nlr_decay_iters: 6\n");
        assert!(changed_keys(&fixed(4), &fixed(8)).is_empty());
        let constant = |iters: u32| format!("train_iters: {iters}\nlr_decay_style: constant\n");
        assert!(changed_keys(&constant(4), &constant(8)).is_empty());
        // A checkpoint that kept no config is passed over.
        assert!(changed_keys("", now).is_empty());
    }
}
