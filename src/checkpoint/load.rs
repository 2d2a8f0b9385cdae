//! Loading checkpoints (pipetrain's or Hugging Face directories, sharded ones included) and
//! exporting the Hugging Face part.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use super::manifest::{self, sha256_hex, Verified, MANIFEST_FILE};
use super::save::{
    write_atomic, write_model_files, CHECKPOINTS_DIR, CONFIG_FILE, LATEST_FILE, MODEL_FILE, OPTIMIZER_FILE,
    STATE_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use super::shapes::{check_layer_count, check_shapes, hf_shapes, specs, split_fused};
use super::state::{check_optimizer, exp_avg_name, exp_avg_sq_name};
use super::tensors::{check_finite, normalize_hf_names, read_safetensors};
use super::{ModelConfig, NamedTensor, SpecialTokens, TokenizerFiles, TrainerState};
use crate::error::user_error;

/// Hugging Face's list of a sharded model's files.
const MODEL_INDEX_FILE: &str = "model.safetensors.index.json";

/// A loaded checkpoint. `model` is in Hugging Face order (GPT-2: wte, wpe, h.0.*, ...,
/// ln_f.*; Llama: model.embed_tokens, model.layers.0.*, ..., model.norm, lm_head).
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The checkpoint directory that was read (after following `latest`).
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub model: Vec<NamedTensor>,
    /// None for a Hugging Face export, which holds weights only.
    pub trainer: Option<TrainerCheckpoint>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrainerCheckpoint {
    pub state: TrainerState,
    /// `exp_avg.<p>`, `exp_avg_sq.<p>` for each parameter p, in the model's order.
    pub optimizer: Vec<NamedTensor>,
}

/// Loads `path`: a checkpoint directory, a run directory (or its `checkpoints/`) whose
/// `latest` pointer is followed, that pointer itself, or a Hugging Face directory of a GPT-2,
/// Llama, Qwen2 or Mistral model (config.json + model.safetensors, or shards listed by
/// model.safetensors.index.json; `transformer.` prefixes and a tied `lm_head.weight`
/// accepted). A pipetrain checkpoint
/// from before manifests were written loads with a note that its files went unverified.
pub fn load_checkpoint(path: &Path) -> anyhow::Result<Checkpoint> {
    let (checkpoint, unverified) = read_checkpoint(path)?;
    if unverified {
        eprintln!(
            "note: {}: no {MANIFEST_FILE} (a checkpoint from before they were written); its files are not verified",
            checkpoint.dir.display()
        );
    }
    Ok(checkpoint)
}

/// [`load_checkpoint`] without its note: the checkpoint, and whether it is a pipetrain
/// checkpoint whose files went unverified for want of a manifest. It writes nothing, so
/// that the readers' fuzzer measures the reader's heap alone: the test harness keeps what
/// a test prints in a buffer that grows, on the printing thread.
pub(crate) fn read_checkpoint(path: &Path) -> anyhow::Result<(Checkpoint, bool)> {
    let dir = resolve(path)?;
    // A Hugging Face directory has no manifest by its nature; a pipetrain checkpoint (with
    // trainer state) without one predates them.
    let has_trainer_state = dir.join(STATE_FILE).exists() || dir.join(OPTIMIZER_FILE).exists();
    let verified = manifest::verify(&dir)?;
    let unverified = verified == Verified::NoManifest && has_trainer_state;
    let config_path = dir.join(CONFIG_FILE);
    verified.require(&config_path)?;
    let text = fs::read_to_string(&config_path)
        .map_err(|e| user_error(format!("{}: cannot read: {e}", config_path.display())))?;
    let config = ModelConfig::from_json(&config_path, &text)?;

    let (model_path, tensors) = read_model_files(&dir, &verified)?;
    let found = normalize_hf_names(&model_path, tensors, config.tied_embedding())?;
    // Before the config's list of parameters is built: its length is the config's to say.
    check_layer_count(&model_path, config.num_layers(), &found)?;
    let specs = specs(&config);
    let found = split_fused(&model_path, &specs, found)?;
    let expected = hf_shapes(&specs);
    check_shapes(&model_path, &expected, &found)?;
    let model = in_order(found, expected.iter().map(|(name, _)| name.clone()));
    check_finite(&model_path, &model)?;

    let (state_path, optimizer_path) = (dir.join(STATE_FILE), dir.join(OPTIMIZER_FILE));
    let trainer = match (state_path.exists(), optimizer_path.exists()) {
        (false, false) => None,
        (true, true) => {
            verified.require(&state_path)?;
            verified.require(&optimizer_path)?;
            let text = fs::read_to_string(&state_path)
                .map_err(|e| user_error(format!("{}: cannot read: {e}", state_path.display())))?;
            let state: TrainerState = serde_json::from_str(&text).map_err(|e| {
                user_error(format!("{}: not a valid trainer state: {e}", state_path.display()))
            })?;
            let optimizer = read_safetensors(&optimizer_path)?;
            check_optimizer(&optimizer_path, &model, &optimizer)?;
            let names = model.iter().flat_map(|p| [exp_avg_name(&p.name), exp_avg_sq_name(&p.name)]);
            let optimizer = in_order(optimizer, names);
            check_finite(&optimizer_path, &optimizer)?;
            Some(TrainerCheckpoint { state, optimizer })
        }
        (has_state, _) => {
            let (present, missing) =
                if has_state { (STATE_FILE, OPTIMIZER_FILE) } else { (OPTIMIZER_FILE, STATE_FILE) };
            return Err(user_error(format!(
                "{}: has {present} but not {missing}: incomplete checkpoint",
                dir.display()
            )));
        }
    };
    Ok((Checkpoint { dir, config, model, trainer }, unverified))
}

/// Writes `checkpoint`'s config.json and model.safetensors to `out_dir`, a directory that
/// `transformers.GPT2LMHeadModel.from_pretrained`, `LlamaForCausalLM.from_pretrained`,
/// (biases on q, k and v alone) `Qwen2ForCausalLM.from_pretrained` or (QK-norm)
/// `Qwen3ForCausalLM.from_pretrained` loads, `tokenizer` (tokenizer.json and
/// tokenizer_config.json) where given, and their manifest; returns the files' names. A model
/// none of those classes builds is refused. A non-empty `out_dir` is written into only with
/// `force`, and then only those files are replaced (a tokenizer, with none given, removed: it
/// would be another model's).
pub fn export_hf(
    checkpoint: &Checkpoint,
    out_dir: &Path,
    force: bool,
    (tokenizer, special): (Option<&TokenizerFiles>, Option<&SpecialTokens>),
) -> anyhow::Result<Vec<String>> {
    let shown = out_dir.display();
    if let Some(why) = checkpoint.config.missing_in_transformers() {
        let dir = checkpoint.dir.display();
        return Err(user_error(format!("{dir}: transformers has no class for this model ({why})")));
    }
    if out_dir.exists() {
        let entries = fs::read_dir(out_dir)
            .map_err(|e| user_error(format!("{shown}: exists and cannot be read as a directory: {e}")))?;
        if entries.count() > 0 && !force {
            return Err(user_error(format!("{shown}: exists and is not empty; pass --force to overwrite")));
        }
        // --force replaces an export's files; in a checkpoint it would leave trainer state its
        // new manifest does not list (a damaged checkpoint), in a run dir a model that
        // `--resume` would take for the run's latest checkpoint.
        let training = [STATE_FILE, OPTIMIZER_FILE, CHECKPOINTS_DIR, "metrics.jsonl"];
        if let Some(file) = training.into_iter().find(|f| out_dir.join(f).exists()) {
            return Err(user_error(format!(
                "{shown}: holds {file}: a training checkpoint or run, which an export never replaces; give another --hf"
            )));
        }
    }
    fs::create_dir_all(out_dir).map_err(|e| user_error(format!("{shown}: cannot create: {e}")))?;
    let mut files =
        write_model_files(out_dir, (&checkpoint.config, special), &checkpoint.model, &mut |_| Ok(()))?;
    let tokenizer_files = tokenizer.map(|t| [(TOKENIZER_FILE, &t.json), (TOKENIZER_CONFIG_FILE, &t.config)]);
    match tokenizer_files {
        Some(written) => {
            for (name, text) in written {
                write_atomic(&out_dir.join(name), text)?;
                files.push((name.into(), sha256_hex(text.as_bytes())));
            }
        }
        None => {
            for name in [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE] {
                let path = out_dir.join(name);
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(user_error(format!("{}: cannot remove: {e}", path.display())));
                    }
                    _ => {}
                }
            }
        }
    }
    write_atomic(&out_dir.join(MANIFEST_FILE), &manifest::text(&files))?;
    Ok(files.into_iter().map(|(name, _)| name).chain([MANIFEST_FILE.to_string()]).collect())
}

/// The model's weights in `dir`: model.safetensors, or the shards its index lists. Returns
/// the file to name in errors about the set (the index, for shards) and every tensor. Each
/// file read is one `verified` lists, where there is a manifest.
fn read_model_files(dir: &Path, verified: &Verified) -> anyhow::Result<(PathBuf, Vec<NamedTensor>)> {
    let single = dir.join(MODEL_FILE);
    if single.is_file() {
        verified.require(&single)?;
        return Ok((single.clone(), read_safetensors(&single)?));
    }
    let index = dir.join(MODEL_INDEX_FILE);
    let shown = index.display();
    verified.require(&index)?;
    let text = fs::read_to_string(&index).map_err(|e| user_error(format!("{shown}: cannot read: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| user_error(format!("{shown}: not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| user_error(format!("{shown}: no weight_map")))?;
    let mut shards: Vec<&str> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().filter(|f| !f.contains('/') && !f.is_empty()).ok_or_else(|| {
            user_error(format!("{shown}: weight_map gives {name} the file {file}, not a file beside it"))
        })?;
        if !shards.contains(&file) {
            shards.push(file);
        }
    }
    let mut tensors = Vec::new();
    for file in shards {
        let path = dir.join(file);
        verified.require(&path)?;
        for t in read_safetensors(&path)? {
            if map.get(&t.name).and_then(|f| f.as_str()) != Some(file) {
                return Err(user_error(format!(
                    "{}: holds {}, which {shown} does not place there",
                    path.display(),
                    t.name
                )));
            }
            tensors.push(t);
        }
    }
    Ok((index, tensors))
}

/// Whether `dir` holds a model's weights, whole or sharded.
fn has_model_files(dir: &Path) -> bool {
    dir.join(MODEL_FILE).is_file() || dir.join(MODEL_INDEX_FILE).is_file()
}

/// The checkpoint directory `path` names.
fn resolve(path: &Path) -> anyhow::Result<PathBuf> {
    if has_model_files(path) {
        return Ok(path.to_path_buf());
    }
    // The pointer itself (`run/checkpoints/latest`), or the one inside a run or its checkpoints.
    let named = path.file_name() == Some(OsStr::new(LATEST_FILE)) && path.is_file();
    let inside = [path.join(CHECKPOINTS_DIR).join(LATEST_FILE), path.join(LATEST_FILE)];
    for pointer in named.then(|| path.to_path_buf()).into_iter().chain(inside) {
        if let Ok(text) = fs::read_to_string(&pointer) {
            let name = text.trim();
            let dir = pointer.with_file_name(name);
            if name.is_empty() || name.contains('/') || !has_model_files(&dir) {
                return Err(user_error(format!(
                    "{}: points to {name:?}, which is not a checkpoint beside it",
                    pointer.display()
                )));
            }
            return Ok(dir);
        }
    }
    let shown = path.display();
    Err(user_error(if path.exists() {
        format!(
            "{shown}: not a checkpoint: no {MODEL_FILE}, and no {CHECKPOINTS_DIR}/{LATEST_FILE} to follow"
        )
    } else {
        format!("{shown}: no such checkpoint or run directory")
    }))
}

/// `tensors` reordered to `names`, which the caller has checked they match one to one.
fn in_order(mut tensors: Vec<NamedTensor>, names: impl Iterator<Item = String>) -> Vec<NamedTensor> {
    names
        .map(|name| {
            let i = tensors.iter().position(|t| t.name == name).expect("checked: every name is present");
            tensors.swap_remove(i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{save_checkpoint, tensors::write_safetensors};
    use super::*;
    use crate::data::test_dir;

    #[test]
    fn round_trip_is_bitwise_through_every_kind_of_path() {
        let run = test_dir("ld_round_trip");
        let cfg = config();
        let m = model(&cfg, 1.0);
        let opt = optimizer(&m);
        let dir = save_checkpoint(&run, &cfg, &m, &state(3), &opt).unwrap();
        for path in [run.clone(), run.join("checkpoints"), run.join("checkpoints/latest"), dir.clone()] {
            let ck = load_checkpoint(&path).unwrap();
            assert_eq!(ck.dir, dir);
            assert_eq!(ck.config, cfg);
            assert_bitwise_eq(&ck.model, &m);
            let trainer = ck.trainer.unwrap();
            assert_eq!(trainer.state, state(3));
            assert_bitwise_eq(&trainer.optimizer, &opt);
        }
    }

    #[test]
    fn export_loads_back_without_trainer_state_and_refuses_to_overwrite() {
        let run = test_dir("ld_export");
        let cfg = config();
        let m = model(&cfg, 1.0);
        save_checkpoint(&run, &cfg, &m, &state(3), &optimizer(&m)).unwrap();
        let ck = load_checkpoint(&run).unwrap();
        let out = run.join("hf");
        export_hf(&ck, &out, false, (None, None)).unwrap();
        let back = load_checkpoint(&out).unwrap();
        assert_eq!((back.trainer, &back.config), (None, &cfg));
        assert_bitwise_eq(&back.model, &m);

        let err = export_hf(&ck, &out, false, (None, None)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}: exists and is not empty; pass --force to overwrite", out.display())
        );
        export_hf(&ck, &out, true, (None, None)).unwrap();
        let empty = run.join("empty");
        fs::create_dir(&empty).unwrap();
        export_hf(&ck, &empty, false, (None, None)).unwrap();
        // Not even --force writes over a training checkpoint (the one exported included) or a
        // run dir: the one would lose its manifest's trainer state, the other its latest.
        for (target, holds) in [(&ck.dir, STATE_FILE), (&run, CHECKPOINTS_DIR)] {
            let before = fs::read(ck.dir.join(MANIFEST_FILE)).unwrap();
            let err = export_hf(&ck, target, true, (None, None)).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "{}: holds {holds}: a training checkpoint or run, which an export never replaces; give another --hf",
                    target.display()
                )
            );
            assert_eq!(fs::read(ck.dir.join(MANIFEST_FILE)).unwrap(), before);
            assert!(!run.join(MODEL_FILE).exists());
        }
        load_checkpoint(&run).unwrap();
    }

    /// A model no transformers class builds is refused, saying what the classes need.
    #[test]
    fn export_refuses_what_transformers_cannot_build() {
        use stages::{Activation, Architecture, LinearBiases, Norm};
        let base = Architecture::llama(1e4, 1e-5);
        for (arch, why) in [
            (
                Architecture { norm: Norm::LayerNorm, activation: Activation::Gelu, ..base },
                "LlamaForCausalLM needs normalization RMSNorm, position_embedding_type rope and swiglu together, \
                 StableLmForCausalLM LayerNorm, rope and swiglu, NemotronForCausalLM LayerNorm, apply_layernorm_1p, \
                 rope and squared_relu",
            ),
            (
                Architecture { qk_norm: true, biases: LinearBiases::QkvOnly, ..base },
                "Qwen3ForCausalLM's QK-norm comes without linear biases",
            ),
        ] {
            let run = test_dir("ld_export_refused");
            let cfg = llama(arch);
            let m = model(&cfg, 1.0);
            save_checkpoint(&run, &cfg, &m, &state(3), &optimizer(&m)).unwrap();
            let ck = load_checkpoint(&run).unwrap();
            let out = run.join("hf");
            let err = export_hf(&ck, &out, false, (None, None)).unwrap_err().to_string();
            assert_eq!(err, format!("{}: transformers has no class for this model ({why})", ck.dir.display()));
            assert!(!out.exists(), "nothing written");
        }
    }

    /// A tokenizer given to the export is written beside the weights and listed in the
    /// manifest, so a change to it is caught; exported again with none, over it, it goes.
    #[test]
    fn export_carries_the_tokenizer_in_its_manifest() {
        let run = test_dir("ld_export_tokenizer");
        let cfg = config();
        let m = model(&cfg, 1.0);
        save_checkpoint(&run, &cfg, &m, &state(3), &optimizer(&m)).unwrap();
        let ck = load_checkpoint(&run).unwrap();
        let out = run.join("hf");
        let tokenizer = TokenizerFiles::as_is(
            "{\"model\": {}}
"
            .into(),
        );
        let special = SpecialTokens::end_of_text(7);
        let files = export_hf(&ck, &out, false, (Some(&tokenizer), Some(&special))).unwrap();
        assert_eq!(files, [CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, MANIFEST_FILE]);
        assert_eq!(fs::read_to_string(out.join(TOKENIZER_FILE)).unwrap(), "{\"model\": {}}\n");
        assert_eq!(
            fs::read_to_string(out.join(TOKENIZER_CONFIG_FILE)).unwrap(),
            "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"}\n"
        );
        let config = || -> serde_json::Value {
            serde_json::from_str(&fs::read_to_string(out.join(CONFIG_FILE)).unwrap()).unwrap()
        };
        assert_eq!((&config()["bos_token_id"], &config()["eos_token_id"]), (&7.into(), &7.into()));
        load_checkpoint(&out).unwrap();
        fs::write(out.join(TOKENIZER_FILE), "{}\n").unwrap();
        let err = load_checkpoint(&out).unwrap_err().to_string();
        let shown = out.join(TOKENIZER_FILE).display().to_string();
        assert!(err.starts_with(&format!("{shown}: sha256 ")), "{err}");
        assert!(err.ends_with("in manifest.sha256: the file is damaged"), "{err}");
        let files = export_hf(&ck, &out, true, (None, None)).unwrap();
        assert_eq!(files, [CONFIG_FILE, MODEL_FILE, MANIFEST_FILE]);
        assert_eq!(config()["eos_token_id"], 50256, "GPT-2's own, without a tokenizer");
        assert!(!out.join(TOKENIZER_FILE).exists() && !out.join(TOKENIZER_CONFIG_FILE).exists());
        load_checkpoint(&out).unwrap();
    }

    #[test]
    fn imports_huggingface_prefixed_names_with_a_tied_head() {
        let dir = test_dir("ld_hf_prefix");
        let cfg = config();
        let m = model(&cfg, 1.0);
        let mut hf: Vec<NamedTensor> = m
            .iter()
            .rev()
            .map(|t| NamedTensor { name: format!("transformer.{}", t.name), ..t.clone() })
            .collect();
        hf.push(NamedTensor { name: "lm_head.weight".into(), ..m[0].clone() });
        hf.push(NamedTensor {
            name: "transformer.h.0.attn.bias".into(),
            shape: vec![1, 1, 2, 2],
            data: vec![1.0; 4],
        });
        write_safetensors(&dir.join(MODEL_FILE), &hf).unwrap();
        fs::write(dir.join(CONFIG_FILE), cfg.to_json().to_string()).unwrap();
        let ck = load_checkpoint(&dir).unwrap();
        assert_eq!(ck.trainer, None);
        assert_bitwise_eq(&ck.model, &m);
    }

    #[test]
    fn a_non_finite_weight_or_moment_is_refused_naming_file_and_tensor() {
        let run = test_dir("ld_non_finite");
        let cfg = config();
        let mut m = model(&cfg, 1.0);
        let opt = optimizer(&m);
        m[3].data[2] = f32::NAN;
        let dir = save_checkpoint(&run, &cfg, &m, &state(1), &opt).unwrap();
        let err = load_checkpoint(&run).unwrap_err();
        assert!(crate::error::is_user_error(&err));
        let n = m[3].data.len();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: {} holds a non-finite value (NaN at element 2 of {n})",
                dir.join(MODEL_FILE).display(),
                m[3].name
            )
        );
        let m = model(&cfg, 1.0);
        let mut opt = optimizer(&m);
        opt[1].data[0] = f32::NEG_INFINITY;
        save_checkpoint(&run, &cfg, &m, &state(1), &opt).unwrap();
        assert_eq!(
            load_checkpoint(&run).unwrap_err().to_string(),
            format!(
                "{}: exp_avg_sq.wte.weight holds a non-finite value (-inf at element 0 of {})",
                dir.join(OPTIMIZER_FILE).display(),
                opt[1].data.len()
            )
        );
    }

    /// The fuzzer's case: an emptied manifest beside a changed optimizer file, and a
    /// manifest cut by a line, each refuse the load rather than pass what they leave out.
    #[test]
    fn a_manifest_that_leaves_out_a_file_is_damaged() {
        let run = test_dir("ld_short_manifest");
        let cfg = config();
        let m = model(&cfg, 1.0);
        let dir = save_checkpoint(&run, &cfg, &m, &state(2), &optimizer(&m)).unwrap();
        let err = |p: &Path| load_checkpoint(p).unwrap_err().to_string();
        let whole = fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
        let not_listed = |file: &str| {
            format!("{}: not listed in manifest.sha256: the manifest is damaged", dir.join(file).display())
        };

        let without_optimizer: String =
            whole.lines().filter(|l| !l.ends_with(OPTIMIZER_FILE)).map(|l| l.to_string() + "\n").collect();
        assert_eq!(without_optimizer.lines().count(), whole.lines().count() - 1);
        fs::write(dir.join(MANIFEST_FILE), &without_optimizer).unwrap();
        assert_eq!(err(&dir), not_listed(OPTIMIZER_FILE));

        let mut optimizer_bytes = fs::read(dir.join(OPTIMIZER_FILE)).unwrap();
        let last = optimizer_bytes.len() - 1;
        optimizer_bytes[last] ^= 1;
        fs::write(dir.join(OPTIMIZER_FILE), optimizer_bytes).unwrap();
        fs::write(dir.join(MANIFEST_FILE), "").unwrap();
        assert_eq!(err(&dir), not_listed(CONFIG_FILE));
    }

    /// A config.json that claims more layers than its file holds is refused before the
    /// config's list of parameters is built (a hundred million layers would not fit), fused
    /// q, k, v (Phi-3's) or not.
    #[test]
    fn a_config_of_more_layers_than_the_file_is_one_line() {
        use super::super::testing::{fused, llama};
        use super::super::write_safetensors;
        let cfg = llama(stages::Architecture::llama(1e4, 1e-5));
        for (kind, tensors) in [("llama", model(&cfg, 1.0)), ("phi3", fused(&cfg, &model(&cfg, 1.0)))] {
            let dir = test_dir(&format!("ld_layers_{kind}"));
            write_safetensors(&dir.join(MODEL_FILE), &tensors).unwrap();
            let mut config = cfg.to_json();
            config["model_type"] = serde_json::json!(kind);
            config["num_hidden_layers"] = serde_json::json!(100_000_000);
            fs::write(dir.join(CONFIG_FILE), config.to_string()).unwrap();
            assert_eq!(
                load_checkpoint(&dir).unwrap_err().to_string(),
                format!(
                    "{}: has 2 layers, the config needs num_layers 100000000",
                    dir.join(MODEL_FILE).display()
                )
            );
        }
    }

    #[test]
    fn unreadable_checkpoints_are_user_errors() {
        let run = test_dir("ld_errors");
        let err = |p: &Path| load_checkpoint(p).unwrap_err().to_string();
        assert_eq!(
            err(&run.join("nope")),
            format!("{}: no such checkpoint or run directory", run.join("nope").display())
        );
        assert_eq!(
            err(&run),
            format!(
                "{}: not a checkpoint: no model.safetensors, and no checkpoints/latest to follow",
                run.display()
            )
        );

        let cfg = config();
        let m = model(&cfg, 1.0);
        let dir = save_checkpoint(&run, &cfg, &m, &state(1), &optimizer(&m)).unwrap();
        fs::write(run.join("checkpoints/latest"), "step_000009\n").unwrap();
        assert_eq!(
            err(&run),
            format!(
                "{}: points to \"step_000009\", which is not a checkpoint beside it",
                run.join("checkpoints/latest").display()
            )
        );

        fs::remove_file(dir.join(OPTIMIZER_FILE)).unwrap();
        assert_eq!(
            err(&dir),
            format!("{}: missing, but manifest.sha256 lists it", dir.join(OPTIMIZER_FILE).display())
        );
        // Without the manifest (a checkpoint from before they were written), the same
        // damage is found by the reader.
        fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
        assert_eq!(
            err(&dir),
            format!(
                "{}: has trainer_state.json but not trainer_state.safetensors: incomplete checkpoint",
                dir.display()
            )
        );

        let ModelConfig::Gpt2(gpt2) = cfg else { unreachable!("the test config is GPT-2's") };
        let wider = ModelConfig::Gpt2(super::super::HfGpt2Config { n_embd: 16, ..gpt2 });
        fs::write(dir.join(CONFIG_FILE), wider.to_json().to_string()).unwrap();
        assert_eq!(
            err(&dir),
            format!(
                "{}: wte.weight has shape [64, 8], the config needs [64, 16] (hidden_size 16)",
                dir.join(MODEL_FILE).display()
            )
        );
    }
}
