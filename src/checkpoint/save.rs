//! Atomic checkpoint saves.
//!
//! A checkpoint is written whole into `run/checkpoints/.step_NNNNNN.tmp`, each file synced,
//! the manifest of their sha256s last, then the directory is renamed to `step_NNNNNN` and the `latest` pointer file is replaced
//! (temp file + rename). A crash at any point leaves the previous checkpoint and `latest`
//! as they were; a save's leftover temp directory is removed by the next save of that step.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::manifest::{self, sha256_hex, MANIFEST_FILE};
use super::shapes::{check_shapes, expected_shapes, specs, stack_fused};
use super::state::check_optimizer;
use super::tensors::write_safetensors;
use super::{ModelConfig, NamedTensor, TrainerState};
use serde_json::Value;

pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const LATEST_FILE: &str = "latest";
pub const CONFIG_FILE: &str = "config.json";
pub const MODEL_FILE: &str = "model.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "trainer_state.safetensors";
/// A Hugging Face directory's tokenizer, beside the weights (an export's too).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Its settings for transformers' `AutoTokenizer`, beside it.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// An export's tokenizer: the tokenizer.json and the tokenizer_config.json beside it.
pub struct TokenizerFiles {
    pub json: String,
    pub config: String,
}

/// config.json's `bos_token_id` and `eos_token_id`, the text's first and last tokens: an
/// id, a list of ids (Llama 3.1's several ends), or null. transformers' generate stops at
/// the eos. They are the tokenizer's, so only an export that knows it names them; config.json
/// otherwise names GPT-2's for GPT-2 and none for the other classes.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecialTokens {
    pub bos: Value,
    pub eos: Value,
}

impl SpecialTokens {
    /// One token that ends a document and so begins the next: tiktoken's `<|endoftext|>`,
    /// or the end-of-text token a run's data was made with.
    pub fn end_of_text(id: u32) -> SpecialTokens {
        SpecialTokens { bos: Value::from(id), eos: Value::from(id) }
    }
}

impl TokenizerFiles {
    /// A tokenizer.json with the settings that have `AutoTokenizer` take it as it is
    /// (`PreTrainedTokenizerFast`): the class the model's type names would rebuild it (GPT-2's
    /// and Qwen's would split the text by their own pattern).
    pub fn as_is(json: String) -> TokenizerFiles {
        TokenizerFiles { json, config: "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"}\n".into() }
    }
}

/// `step_000100`: zero-padded so a directory listing sorts by step.
pub fn checkpoint_name(step: u64) -> String {
    format!("step_{step:06}")
}

/// Saves the checkpoint of `state.step` under `run_dir/checkpoints/` and points `latest` at
/// it; returns its directory. `optimizer` holds `exp_avg.<param>` and `exp_avg_sq.<param>`
/// for every parameter of `model`.
pub fn save_checkpoint(
    run_dir: &Path,
    config: &ModelConfig,
    model: &[NamedTensor],
    state: &TrainerState,
    optimizer: &[NamedTensor],
) -> anyhow::Result<PathBuf> {
    save_with_hook(run_dir, config, model, state, optimizer, &mut |_| Ok(()))
}

/// `save_checkpoint`, calling `after_file` after each file is written: the seam through
/// which tests make a save fail halfway.
fn save_with_hook(
    run_dir: &Path,
    config: &ModelConfig,
    model: &[NamedTensor],
    state: &TrainerState,
    optimizer: &[NamedTensor],
    after_file: &mut dyn FnMut(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    let dir = run_dir.join(CHECKPOINTS_DIR);
    let name = checkpoint_name(state.step);
    let target = dir.join(&name);
    check_shapes(&target.join(MODEL_FILE), &expected_shapes(config), model)?;
    check_optimizer(&target.join(OPTIMIZER_FILE), model, optimizer)?;

    let tmp = dir.join(format!(".{name}.tmp"));
    let context = || format!("saving checkpoint {}", target.display());
    let written = (|| {
        fs::create_dir_all(&dir)?;
        remove_dir_if_present(&tmp)?;
        fs::create_dir(&tmp)?;
        let mut files = write_model_files(&tmp, (config, None), model, after_file)?;
        files.push((OPTIMIZER_FILE.into(), write_safetensors(&tmp.join(OPTIMIZER_FILE), optimizer)?));
        after_file(&tmp.join(OPTIMIZER_FILE))?;
        let state = serde_json::to_string_pretty(state)? + "\n";
        write_synced(&tmp.join(STATE_FILE), &state)?;
        files.push((STATE_FILE.into(), sha256_hex(state.as_bytes())));
        after_file(&tmp.join(STATE_FILE))?;
        write_synced(&tmp.join(MANIFEST_FILE), &manifest::text(&files))?;
        after_file(&tmp.join(MANIFEST_FILE))?;
        sync_dir(&tmp)
    })();
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e.context(context()));
    }
    (|| {
        replace_dir(&tmp, &target)?;
        sync_dir(&dir)?;
        write_atomic(&dir.join(LATEST_FILE), &format!("{name}\n"))
    })()
    .with_context(context)?;
    Ok(target)
}

/// `config.json` and `model.safetensors`: a directory `transformers` can load, the tensors
/// under the names its class reads (Phi-3's fused), config.json naming the tokenizer's
/// `special` tokens where they are known. Returns each file's name and sha256, for the
/// manifest.
pub fn write_model_files(
    dir: &Path,
    (config, special): (&ModelConfig, Option<&SpecialTokens>),
    model: &[NamedTensor],
    after_file: &mut dyn FnMut(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut value = config.to_json();
    if let Some(t) = special {
        value["bos_token_id"] = t.bos.clone();
        value["eos_token_id"] = t.eos.clone();
    }
    let json = serde_json::to_string_pretty(&value)? + "\n";
    write_atomic(&dir.join(CONFIG_FILE), &json)?;
    after_file(&dir.join(CONFIG_FILE))?;
    let fused;
    let model = match config {
        ModelConfig::Llama(l) if l.hf_class().is_some_and(|c| c.fused_files) => {
            fused = stack_fused(&specs(config), model);
            &fused
        }
        _ => model,
    };
    let model_sha = write_safetensors(&dir.join(MODEL_FILE), model)?;
    after_file(&dir.join(MODEL_FILE))?;
    Ok(vec![(CONFIG_FILE.into(), sha256_hex(json.as_bytes())), (MODEL_FILE.into(), model_sha)])
}

/// Replaces `path` with `text` through a synced temp file and a rename.
pub fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let name = path.file_name().expect("a file path").to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    write_synced(&tmp, text)?;
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().expect("a file path has a parent"))
}

fn write_synced(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// Syncs a directory's entries (the names of files created or renamed in it).
fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

fn remove_dir_if_present(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Renames `tmp` to `target`. An existing `target` (the same step saved again, say after
/// resuming from an earlier checkpoint) is moved aside first and removed after.
fn replace_dir(tmp: &Path, target: &Path) -> anyhow::Result<()> {
    if !target.exists() {
        fs::rename(tmp, target)?;
        return Ok(());
    }
    let name = target.file_name().expect("a directory path").to_string_lossy();
    let old = target.with_file_name(format!(".{name}.old"));
    remove_dir_if_present(&old)?;
    fs::rename(target, &old)?;
    fs::rename(tmp, target)?;
    fs::remove_dir_all(&old)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{load_checkpoint, testing::*};
    use super::*;
    use crate::data::test_dir;

    #[test]
    fn layout_on_disk() {
        let run = test_dir("ck_layout");
        let (cfg, model, opt) = (config(), model(&config(), 1.0), optimizer(&model(&config(), 1.0)));
        let dir = save_checkpoint(&run, &cfg, &model, &state(100), &opt).unwrap();
        assert_eq!(dir, run.join("checkpoints/step_000100"));
        assert_eq!(fs::read_to_string(run.join("checkpoints/latest")).unwrap(), "step_000100\n");
        let mut files: Vec<String> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        assert_eq!(files, [CONFIG_FILE, MANIFEST_FILE, MODEL_FILE, STATE_FILE, OPTIMIZER_FILE]);
        // `sha256sum -c manifest.sha256` checks it: each file in the order written, last the
        // manifest itself, which lists no other.
        let manifest = fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
        let listed: Vec<(&str, &str)> = manifest.lines().map(|l| l.split_once("  ").unwrap()).collect();
        let names: Vec<&str> = listed.iter().map(|l| l.1).collect();
        assert_eq!(names, [CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE]);
        for (sha, name) in listed {
            assert_eq!(sha, sha256_hex(&fs::read(dir.join(name)).unwrap()), "{name}");
        }
        let leftovers: Vec<_> =
            fs::read_dir(run.join("checkpoints")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 2, "{leftovers:?}");
    }

    #[test]
    fn a_failed_save_leaves_the_previous_checkpoint() {
        let run = test_dir("ck_atomic");
        let cfg = config();
        let (m1, m2) = (model(&cfg, 1.0), model(&cfg, 2.0));
        save_checkpoint(&run, &cfg, &m1, &state(1), &optimizer(&m1)).unwrap();

        // Fail after the first file of step 2 is on disk.
        let mut fail = |p: &Path| -> anyhow::Result<()> { anyhow::bail!("disk full after {}", p.display()) };
        let err = save_with_hook(&run, &cfg, &m2, &state(2), &optimizer(&m2), &mut fail).unwrap_err();
        assert!(format!("{err:#}").contains("disk full after"), "{err:#}");
        let ck = run.join("checkpoints");
        assert!(!ck.join("step_000002").exists() && !ck.join(".step_000002.tmp").exists());
        assert_eq!(fs::read_to_string(ck.join("latest")).unwrap(), "step_000001\n");
        let loaded = load_checkpoint(&run).unwrap();
        assert_eq!(loaded.trainer.unwrap().state, state(1));
        assert_bitwise_eq(&loaded.model, &m1);

        // A killed save leaves its temp directory half written; loading ignores it and the
        // next save of that step replaces it.
        fs::create_dir(ck.join(".step_000002.tmp")).unwrap();
        fs::write(ck.join(".step_000002.tmp").join(MODEL_FILE), b"\x10\x00").unwrap();
        assert_eq!(load_checkpoint(&run).unwrap().trainer.unwrap().state.step, 1);
        save_checkpoint(&run, &cfg, &m2, &state(2), &optimizer(&m2)).unwrap();
        assert!(!ck.join(".step_000002.tmp").exists());
        assert_bitwise_eq(&load_checkpoint(&run).unwrap().model, &m2);
    }

    #[test]
    fn saving_a_step_again_replaces_it() {
        let run = test_dir("ck_replace");
        let cfg = config();
        let (m1, m2) = (model(&cfg, 1.0), model(&cfg, 2.0));
        save_checkpoint(&run, &cfg, &m1, &state(5), &optimizer(&m1)).unwrap();
        save_checkpoint(&run, &cfg, &m2, &state(5), &optimizer(&m2)).unwrap();
        assert_bitwise_eq(&load_checkpoint(&run).unwrap().model, &m2);
        assert!(!run.join("checkpoints/.step_000005.old").exists());
    }

    #[test]
    fn refuses_a_model_that_does_not_match_its_config() {
        let run = test_dir("ck_bad_model");
        let cfg = config();
        let mut m = model(&cfg, 1.0);
        m.pop();
        let err = save_checkpoint(&run, &cfg, &m, &state(1), &optimizer(&m)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: missing ln_f.bias, which the config needs",
                run.join("checkpoints/step_000001/model.safetensors").display()
            )
        );
        assert!(!run.join("checkpoints").exists());
    }
}
