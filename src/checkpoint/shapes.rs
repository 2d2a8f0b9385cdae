//! The tensors a model config implies, and the check that a file holds exactly those, with
//! errors in the user's terms (Megatron config keys).

use std::path::Path;

use super::{ModelConfig, NamedTensor};
use crate::error::user_error;
use stages::params::{model_param_specs, ParamSpec};

/// Names and shapes of the model's parameters in Hugging Face layout and order (GPT-2's
/// Conv1D weights are [in, out], Llama's Linear ones [out, in]; pipetrain's fused q, k, v
/// and gate, up as their Hugging Face parts; a tied output layer not listed): the model's
/// own list.
pub fn expected_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    hf_shapes(&specs(cfg))
}

/// The Hugging Face tensors of `specs`, each with its shape, in order.
pub(super) fn hf_shapes(specs: &[ParamSpec]) -> Vec<(String, Vec<usize>)> {
    specs.iter().flat_map(|p| p.hf_shapes().collect::<Vec<_>>()).collect()
}

/// The model's parameters.
pub(super) fn specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    model_param_specs(&crate::plan::shape(&cfg.run_config(cfg.max_positions(), 1)))
}

/// `tensors`, the model's Hugging Face parts, with each fused parameter's parts stacked by
/// rows into the one tensor under its name, as Phi-3's files hold them: the inverse of
/// [`split_fused`].
pub fn stack_fused(specs: &[ParamSpec], tensors: &[NamedTensor]) -> Vec<NamedTensor> {
    let fused: Vec<&ParamSpec> = specs.iter().filter(|p| p.hf.len() > 1).collect();
    let is_part = |t: &NamedTensor| fused.iter().any(|p| p.hf.iter().any(|part| part.name == t.name));
    let mut out: Vec<NamedTensor> = tensors.iter().filter(|t| !is_part(t)).cloned().collect();
    for p in fused {
        let part = |name: &str| tensors.iter().find(|t| t.name == name).expect("a model holds every part");
        let data = p.hf.iter().flat_map(|h| part(&h.name).data.iter().copied()).collect();
        out.push(NamedTensor { name: p.name.clone(), shape: p.shape.clone(), data });
    }
    out
}

/// `tensors` with each fused tensor a file holds in place of its Hugging Face parts split
/// into them by rows: Phi-3's `self_attn.qkv_proj` and `mlp.gate_up_proj`, which are
/// pipetrain's own fused parameters under pipetrain's names, q, k, v and gate, up stacked in
/// the order the model lists them (`specs`, the model's parameters). Errors, naming `file`,
/// where one has another shape.
pub fn split_fused(
    file: &Path,
    specs: &[ParamSpec],
    tensors: Vec<NamedTensor>,
) -> anyhow::Result<Vec<NamedTensor>> {
    let fused: Vec<&ParamSpec> = specs.iter().filter(|p| p.hf.len() > 1).collect();
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let Some(spec) = fused.iter().find(|p| p.name == t.name) else {
            out.push(t);
            continue;
        };
        if t.shape != spec.shape {
            return Err(user_error(format!(
                "{}: {} has shape {:?}, the config needs {:?} (its parts stacked)",
                file.display(),
                t.name,
                t.shape,
                spec.shape
            )));
        }
        out.extend(spec.to_hf(&t.data).map(|(name, shape, data)| NamedTensor {
            name: name.to_string(),
            shape,
            data: data.to_vec(),
        }));
    }
    Ok(out)
}

/// Errors, naming `file`, unless `found` holds exactly the `expected` tensors with their
/// shapes. The first problem is reported: a layer-count mismatch, else a missing tensor, a
/// wrong shape, or a tensor the config has no place for.
pub fn check_shapes(
    file: &Path,
    expected: &[(String, Vec<usize>)],
    found: &[NamedTensor],
) -> anyhow::Result<()> {
    let bad = |what: String| Err(user_error(format!("{}: {what}", file.display())));
    check_layer_count(file, layer_count(expected.iter().map(|e| e.0.as_str())), found)?;
    for (name, shape) in expected {
        match found.iter().find(|t| &t.name == name) {
            None => return bad(format!("missing {name}, which the config needs")),
            Some(t) if &t.shape != shape => {
                return bad(format!(
                    "{name} has shape {:?}, the config needs {shape:?}{}",
                    t.shape,
                    hint(name, &t.shape, shape)
                ))
            }
            Some(_) => {}
        }
    }
    match found.iter().find(|t| !expected.iter().any(|e| e.0 == t.name)) {
        Some(t) => bad(format!("unexpected tensor {}, which the config has no place for", t.name)),
        None => Ok(()),
    }
}

/// Errors, naming `file`, unless `found` holds blocks 0 .. layers-1 (`h.{i}.*` or
/// `model.layers.{i}.*`): the
/// check a loader makes before it builds the config's list of tensors, whose length a
/// config's layer count alone would otherwise decide.
pub fn check_layer_count(file: &Path, layers: usize, found: &[NamedTensor]) -> anyhow::Result<()> {
    let have = layer_count(found.iter().map(|t| t.name.as_str()));
    if have != layers {
        return Err(user_error(format!(
            "{}: has {have} layers, the config needs num_layers {layers}",
            file.display()
        )));
    }
    Ok(())
}

/// Number of transformer blocks named `h.{i}.*` (GPT-2) or `model.layers.{i}.*` (Llama).
fn layer_count<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names
        .filter_map(|n| {
            n.strip_prefix("h.")
                .or_else(|| n.strip_prefix("model.layers."))?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|i| i + 1)
        .max()
        .unwrap_or(0)
}

/// " (key value)" for the config key behind the first dimension that differs.
fn hint(name: &str, found: &[usize], expected: &[usize]) -> String {
    let dims: &[(&str, usize)] = match name.split('.').collect::<Vec<_>>()[..] {
        ["wte", _] => &[("vocab_size", 1), ("hidden_size", 1)],
        ["wpe", _] => &[("max_position_embeddings", 1), ("hidden_size", 1)],
        [.., "c_attn", "weight"] => &[("hidden_size", 1), ("hidden_size", 3)],
        [.., "c_attn", "bias"] => &[("hidden_size", 3)],
        [.., "mlp", "c_fc", "weight"] => &[("hidden_size", 1), ("ffn_hidden_size", 1)],
        [.., "mlp", "c_fc", "bias"] => &[("ffn_hidden_size", 1)],
        [.., "mlp", "c_proj", "weight"] => &[("ffn_hidden_size", 1), ("hidden_size", 1)],
        ["model", "embed_tokens", _] | ["lm_head", _] => &[("vocab_size", 1), ("hidden_size", 1)],
        [.., "k_proj" | "v_proj", "weight"] => &[("num_query_groups", 1), ("hidden_size", 1)],
        [.., "gate_proj" | "up_proj", "weight"] => &[("ffn_hidden_size", 1), ("hidden_size", 1)],
        [.., "down_proj", "weight"] => &[("hidden_size", 1), ("ffn_hidden_size", 1)],
        _ => &[("hidden_size", 1), ("hidden_size", 1)],
    };
    if found.len() != expected.len() {
        return String::new();
    }
    let differing = (0..expected.len()).find(|&i| found[i] != expected[i]);
    match differing.and_then(|i| Some((dims.get(i)?, expected[i]))) {
        Some(((key, mult), size)) => format!(" ({key} {})", size / mult),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::HfGpt2Config;

    fn cfg(n_embd: usize, n_layer: usize) -> ModelConfig {
        ModelConfig::Gpt2(gpt2(n_embd, n_layer))
    }

    fn gpt2(n_embd: usize, n_layer: usize) -> HfGpt2Config {
        HfGpt2Config {
            vocab_size: 100,
            n_positions: 16,
            n_embd,
            n_layer,
            n_head: 2,
            n_inner: None,
            resid_pdrop: 0.0,
            embd_pdrop: 0.0,
            attn_pdrop: 0.0,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
        }
    }

    fn tensors(cfg: &ModelConfig) -> Vec<NamedTensor> {
        expected_shapes(cfg)
            .into_iter()
            .map(|(name, shape)| NamedTensor { data: vec![0.0; shape.iter().product()], name, shape })
            .collect()
    }

    fn err(expected: &ModelConfig, found: &[NamedTensor]) -> String {
        check_shapes(Path::new("ckpt/model.safetensors"), &expected_shapes(expected), found)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn gpt2_small_has_its_parameter_count() {
        let small = ModelConfig::Gpt2(HfGpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            ..gpt2(0, 0)
        });
        let n: usize = expected_shapes(&small).iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        assert_eq!(n, 124_439_808);
        assert_eq!(expected_shapes(&small).len(), 2 + 12 * 12 + 2);
    }

    #[test]
    fn matching_tensors_pass() {
        let c = cfg(8, 2);
        check_shapes(Path::new("x"), &expected_shapes(&c), &tensors(&c)).unwrap();
    }

    #[test]
    fn mismatches_name_the_tensor_and_the_config_key() {
        assert_eq!(
            err(&cfg(128, 2), &tensors(&cfg(64, 2))),
            "ckpt/model.safetensors: wte.weight has shape [100, 64], the config needs [100, 128] (hidden_size 128)"
        );
        let mut found = tensors(&cfg(128, 2));
        found[4].shape = vec![64, 192];
        assert_eq!(
            err(&cfg(128, 2), &found),
            "ckpt/model.safetensors: h.0.attn.c_attn.weight has shape [64, 192], \
             the config needs [128, 384] (hidden_size 128)"
        );
        let wider = ModelConfig::Gpt2(HfGpt2Config { n_inner: Some(40), ..gpt2(8, 2) });
        assert_eq!(
            err(&wider, &tensors(&cfg(8, 2))),
            "ckpt/model.safetensors: h.0.mlp.c_fc.weight has shape [8, 32], \
             the config needs [8, 40] (ffn_hidden_size 40)"
        );
        assert_eq!(
            err(&cfg(8, 3), &tensors(&cfg(8, 2))),
            "ckpt/model.safetensors: has 2 layers, the config needs num_layers 3"
        );
        let mut found = tensors(&cfg(8, 2));
        found.retain(|t| t.name != "ln_f.bias");
        assert_eq!(
            err(&cfg(8, 2), &found),
            "ckpt/model.safetensors: missing ln_f.bias, which the config needs"
        );
        let mut found = tensors(&cfg(8, 2));
        found.push(NamedTensor { name: "score.weight".into(), shape: vec![1], data: vec![0.0] });
        assert_eq!(
            err(&cfg(8, 2), &found),
            "ckpt/model.safetensors: unexpected tensor score.weight, which the config has no place for"
        );
    }

    /// A file that holds q, k, v and gate, up fused (Phi-3's) reads as the one holding their
    /// parts, bit for bit; a fused tensor of another shape is one line naming it.
    #[test]
    fn fused_tensors_split_into_their_parts() {
        use super::super::testing::{fused, llama, model};
        use stages::Architecture;
        let config = llama(Architecture::llama(1e4, 1e-5));
        let parts = model(&config, 1.0);
        // Per layer, q, k, v in one tensor and gate, up in another.
        let fused = fused(&config, &parts);
        assert_eq!(fused.len(), parts.len() - 2 * 3);
        let qkv = fused.iter().find(|t| t.name == "model.layers.1.self_attn.qkv_proj.weight").unwrap();
        assert_eq!(qkv.shape, [32, 16]);
        let file = Path::new("ckpt/model.safetensors");
        let mut split = split_fused(file, &specs(&config), fused.clone()).unwrap();
        split.sort_by(|a, b| a.name.cmp(&b.name));
        let mut want = parts.clone();
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert!(split == want, "the parts come back bit for bit");
        let mut short = fused;
        let t = short.iter_mut().find(|t| t.name == "model.layers.1.self_attn.qkv_proj.weight").unwrap();
        t.shape = vec![31, 16];
        t.data.truncate(31 * 16);
        assert_eq!(
            split_fused(file, &specs(&config), short).unwrap_err().to_string(),
            "ckpt/model.safetensors: model.layers.1.self_attn.qkv_proj.weight has shape [31, 16], the config \
             needs [32, 16] (its parts stacked)"
        );
    }
}
