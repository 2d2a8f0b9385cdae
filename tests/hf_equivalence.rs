//! pipetrain's models compute the same function as Hugging Face's `GPT2LMHeadModel`,
//! `LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM`,
//! `Phi3ForCausalLM`, `NemotronForCausalLM`, `StableLmForCausalLM`, `GemmaForCausalLM`,
//! `Olmo2ForCausalLM` and `Olmo3ForCausalLM`.
//!
//! `tests/fixtures/hf_tiny` is a tiny GPT-2 and `hf_llama_tiny` a tiny Llama (grouped-query
//! attention, untied output layer, sharded safetensors; `hf_llama_tiny_rope500k` the same
//! weights at rotary base 500000, in one file; `hf_llama_tiny_rope_llama3` Llama 3.2 in
//! miniature, with Llama 3.1's rope scaling, a tied output layer and 128 positions;
//! `hf_qwen2_tiny` a tiny Qwen2, biases on q, k and v alone; `hf_mistral_tiny` a tiny
//! Mistral without its sliding window, `hf_mistral_nemo_tiny` one whose heads are wider
//! than the width over the heads, as Mistral Nemo's, `hf_mistral_v01_tiny` one with a
//! sliding window of 5 keys at 16 positions; `hf_qwen3_tiny` a tiny Qwen3, QK-norm
//! on heads wider than the width over the heads; `hf_phi3_tiny` a tiny Phi-3, its q, k, v and
//! gate, up fused in the file, and `hf_phi3_partial_tiny` one turning 6 of each head's 8
//! channels with a tied output layer (Phi-4 mini's share, without its longrope); `hf_nemotron_tiny` a tiny Nemotron, LayerNorm1P, squared ReLU
//! and a rotary embedding on half of each head; `hf_stablelm_tiny` a tiny StableLM 2,
//! LayerNorms, biases on q, k and v and a rotary embedding on a quarter of each head;
//! `hf_gemma_tiny` a tiny Gemma, RMSNorm scaling by 1 + weight, GeGLU, embeddings multiplied
//! by sqrt(hidden_size), multi-query attention; `hf_olmo2_tiny` a tiny OLMo 2, its norms on
//! the attention's and MLP's outputs and its QK-norm over the whole projections;
//! `hf_olmo3_tiny` a tiny OLMo 3, OLMo 2 with a window of 5 keys on three layers in four),
//! each saved by transformers' `save_pretrained` with random
//! weights (every bias and norm weight random too) together with the per-token losses
//! transformers computed with it; `tests/hf/make_fixture.py`, `make_llama_fixture.py`,
//! `make_qwen2_mistral_fixtures.py`, `make_qwen3_fixture.py`, `make_phi3_fixture.py`,
//! `make_nemotron_fixture.py`, `make_stablelm_fixture.py`, `make_gemma_fixture.py`,
//! `make_olmo2_fixture.py` and `make_olmo3_fixture.py`
//! regenerate them (torch and transformers needed there, not here).
//! The tests read each fixture as transformers wrote it and compare pipetrain's losses with
//! transformers', through the model chunk and through `pipetrain eval`.

mod common;

use std::path::{Path, PathBuf};

use kernels::cpu::CpuDevice;
use kernels::{AttentionSaves, Category, DType, Device, RopeFrequencies, Tensor};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use stages::params::{chunk_param_specs, model_param_specs, ParamSpec};
use stages::{
    Activation, Architecture, ChunkLayout, DropoutProbs, LinearBiases, Microbatch, ModelChunk, ModelShape,
    Norm, NormPlacement, Parameters, Positions, QkNormSpan, RecomputePolicy, Shard, SlidingWindow,
    TensorGroup,
};

/// Relative tolerance on each per-token loss (fp32 forwards, losses near 3..8).
const REL_TOL: f64 = 1e-5;

const FIXTURES: [&str; 16] = [
    "hf_tiny",
    "hf_llama_tiny",
    "hf_llama_tiny_rope500k",
    "hf_llama_tiny_rope_llama3",
    "hf_qwen2_tiny",
    "hf_mistral_tiny",
    "hf_mistral_nemo_tiny",
    "hf_mistral_v01_tiny",
    "hf_qwen3_tiny",
    "hf_phi3_tiny",
    "hf_phi3_partial_tiny",
    "hf_nemotron_tiny",
    "hf_stablelm_tiny",
    "hf_gemma_tiny",
    "hf_olmo2_tiny",
    "hf_olmo3_tiny",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn read_json(dir: &str, name: &str) -> Value {
    let path = fixture(dir).join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The model's shape from transformers' config.json, read here from transformers' own keys
/// (not through pipetrain's reader, which the eval test covers).
fn shape(dir: &str, micro_batch: usize, seq_len: usize) -> ModelShape {
    let c = read_json(dir, "config.json");
    let get = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("config.json: {k}")) as usize;
    let base = ModelShape {
        micro_batch,
        seq_len,
        attention_dropout: false,
        attention: AttentionSaves::Probabilities,
        activations: DType::F32,
        ..ModelShape::GPT2_SMALL
    };
    if c["model_type"] == "gpt2" {
        assert_eq!(c["activation_function"], "gelu_new");
        assert_eq!(c["layer_norm_epsilon"].as_f64(), Some(1e-5));
        let hidden = get("n_embd");
        return ModelShape {
            arch: Architecture::GPT2,
            num_layers: get("n_layer"),
            hidden,
            heads: get("n_head"),
            kv_heads: get("n_head"),
            ffn: c["n_inner"].as_u64().map_or(4 * hidden, |n| n as usize),
            max_positions: get("n_positions"),
            vocab: get("vocab_size"),
            ..base
        };
    }
    let (nemotron, stablelm) = (c["model_type"] == "nemotron", c["model_type"] == "stablelm");
    let gemma = c["model_type"] == "gemma";
    // OLMo 3 is OLMo 2 with a sliding window.
    let olmo2 = c["model_type"] == "olmo2" || c["model_type"] == "olmo3";
    let hidden_act = match c["model_type"].as_str().unwrap() {
        "nemotron" => "relu2",
        "gemma" => "gelu_pytorch_tanh",
        _ => "silu",
    };
    assert_eq!(c["hidden_act"], hidden_act);
    // Qwen2ForCausalLM fixes its biases: on q, k and v, nowhere else.
    let biases = match c["model_type"].as_str().unwrap() {
        "qwen2" => LinearBiases::QkvOnly,
        "llama" | "nemotron" if c["attention_bias"] == true => LinearBiases::All,
        "stablelm" if c["use_qkv_bias"] == true => LinearBiases::QkvOnly,
        "llama" | "mistral" | "qwen3" | "phi3" | "nemotron" | "stablelm" | "gemma" | "olmo2" | "olmo3" => {
            LinearBiases::NoBiases
        }
        other => panic!("model_type {other}"),
    };
    // OLMo 3 holds one set for its windowed layers and one for the rest, alike here.
    let rope = match &c["rope_parameters"] {
        nested if c["model_type"] == "olmo3" => {
            assert_eq!(nested["full_attention"], nested["sliding_attention"]);
            &nested["full_attention"]
        }
        rope => rope,
    };
    let llama3_factor = match rope["rope_type"].as_str().unwrap() {
        "default" => None,
        "llama3" => {
            let fixed = [
                &rope["low_freq_factor"],
                &rope["high_freq_factor"],
                &rope["original_max_position_embeddings"],
            ];
            assert_eq!(
                fixed.map(|v| v.as_f64().unwrap()),
                [1.0, 4.0, 8192.0],
                "the fixed factors of Llama 3.1"
            );
            Some(rope["factor"].as_f64().unwrap() as f32)
        }
        other => panic!("rope_type {other}"),
    };
    // Nemotron, StableLM and Phi-4 mini turn the leading channels of each head,
    // partial_rotary_factor of them.
    let head_dim =
        c["head_dim"].as_u64().map_or(get("hidden_size") / get("num_attention_heads"), |d| d as usize);
    let rotated = rope["partial_rotary_factor"].as_f64().map(|f| (head_dim as f64 * f) as usize);
    let arch = Architecture {
        norm: if nemotron || stablelm { Norm::LayerNorm } else { Norm::RmsNorm },
        norm_eps: c[match c["model_type"].as_str().unwrap() {
            "nemotron" => "norm_eps",
            "stablelm" => "layer_norm_eps",
            _ => "rms_norm_eps",
        }]
        .as_f64()
        .unwrap() as f32,
        // OLMo 2's norms sit on the branches' outputs, its QK-norm over the whole projections.
        norm_placement: if olmo2 { NormPlacement::Output } else { NormPlacement::Input },
        zero_centered_gamma: nemotron || gemma,
        positions: Positions::Rotary(RopeFrequencies {
            base: rope["rope_theta"].as_f64().unwrap() as f32,
            llama3_factor,
            rotary_dims: rotated.filter(|&r| r != head_dim),
        }),
        activation: match c["model_type"].as_str().unwrap() {
            "nemotron" => Activation::SquaredRelu,
            "gemma" => Activation::GeGlu,
            _ => Activation::SwiGlu,
        },
        biases,
        qk_norm: c["model_type"] == "qwen3" || olmo2,
        qk_norm_span: if olmo2 { QkNormSpan::Projection } else { QkNormSpan::Head },
        // Mistral's window covers every layer, OLMo 3's those layer_types names, the first
        // "full_attention" among them the period's end.
        sliding_window: match c["model_type"].as_str().unwrap() {
            "mistral" | "olmo3" => c["sliding_window"].as_u64().map(|keys| SlidingWindow {
                keys: keys as usize,
                full_every: c["layer_types"]
                    .as_array()
                    .and_then(|types| types.iter().position(|t| t == "full_attention"))
                    .map(|i| i + 1),
            }),
            _ => None,
        },
        tied_output: c["tie_word_embeddings"].as_bool().unwrap(),
        // GemmaModel's normalizer: sqrt(hidden_size) as an f32 tensor.
        embedding_multiplier: gemma.then(|| (get("hidden_size") as f64).sqrt() as f32),
        init_std: 0.02,
    };
    ModelShape {
        arch,
        num_layers: get("num_hidden_layers"),
        hidden: get("hidden_size"),
        heads: get("num_attention_heads"),
        kv_heads: get("num_key_value_heads"),
        head_dim: c["head_dim"].as_u64().map(|d| d as usize),
        ffn: get("intermediate_size"),
        max_positions: get("max_position_embeddings"),
        vocab: get("vocab_size"),
        ..base
    }
}

/// Every tensor of the fixture as transformers saved it (one file, or the shards its index
/// lists), with pipetrain's names (`transformer.` stripped) and f32 values. A tied
/// `lm_head.weight` (GPT-2's always), if saved, must equal `wte.weight`; the attention-mask
/// buffers are dropped.
fn hf_weights(dir: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let root = fixture(dir);
    let config = read_json(dir, "config.json");
    let tied = config["model_type"] == "gpt2" || config["tie_word_embeddings"] == true;
    let files: Vec<String> = match std::fs::read_to_string(root.join("model.safetensors.index.json")) {
        Ok(text) => {
            let index: Value = serde_json::from_str(&text).unwrap();
            let mut files: Vec<String> = index["weight_map"]
                .as_object()
                .unwrap()
                .values()
                .map(|f| f.as_str().unwrap().to_string())
                .collect();
            files.sort();
            files.dedup();
            files
        }
        Err(_) => vec!["model.safetensors".into()],
    };
    let mut out = Vec::new();
    let mut lm_head = None;
    for file in files {
        let bytes = std::fs::read(root.join(file)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let data: Vec<f32> =
                view.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            let name = name.strip_prefix("transformer.").unwrap_or(&name).to_string();
            if name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
                continue;
            }
            if name == "lm_head.weight" && tied {
                lm_head = Some(data);
                continue;
            }
            out.push((name, view.shape().to_vec(), data));
        }
    }
    if let Some(head) = lm_head {
        let wte = out.iter().find(|t| t.0 == "wte.weight").expect("wte.weight");
        assert!(head == wte.2, "lm_head.weight is saved but differs from wte.weight: not tied");
    }
    out
}

/// The Hugging Face tensors that hold parameter `spec` in a file of `names`: the fused tensor
/// itself where the file has it (Phi-3's), else its parts.
fn held_as(spec: &ParamSpec, names: &[&str]) -> Vec<(String, Vec<usize>)> {
    match names.contains(&spec.name.as_str()) {
        true => vec![(spec.name.clone(), spec.shape.clone())],
        false => spec.hf_shapes().collect(),
    }
}

/// The whole model as one chunk on the CPU, holding the fixture's weights (pipetrain's fused
/// parameters stacked from their Hugging Face parts, or fused in the file); every tensor of
/// the files is used exactly once.
fn whole_model(dev: &CpuDevice, dir: &str, s: ModelShape) -> ModelChunk {
    let layout = ChunkLayout { blocks: 0..s.num_layers, embedding: true, head: true };
    let specs = chunk_param_specs(&s, &layout);
    let weights = hf_weights(dir);
    let mut names: Vec<&str> = weights.iter().map(|t| t.0.as_str()).collect();
    let mut wanted: Vec<String> =
        specs.iter().flat_map(|p| held_as(p, &names)).map(|(name, _)| name).collect();
    names.sort_unstable();
    wanted.sort_unstable();
    assert_eq!(names, wanted, "{dir}: the file's tensors are not the model's");
    let values: Vec<Tensor> = specs
        .iter()
        .map(|spec| {
            let mut data = Vec::new();
            for (name, shape) in held_as(spec, &names) {
                let (_, found, part) = weights.iter().find(|t| t.0 == name).unwrap();
                assert_eq!(found, &shape, "{name}");
                data.extend_from_slice(part);
            }
            dev.from_host(&data, &spec.shape, Category::Parameters)
        })
        .collect();
    let params = Parameters::with_values(dev, &s, &layout, specs, values, stages::OptimizerShard::WHOLE);
    ModelChunk::new(s, layout, Shard::WHOLE, params, RecomputePolicy::None, DropoutProbs::default(), 0)
}

fn rel_err(got: f64, want: f64) -> f64 {
    (got - want).abs() / want.abs()
}

#[test]
fn forward_matches_transformers_per_token_losses() {
    for dir in FIXTURES {
        let expected = read_json(dir, "expected.json");
        let rows: Vec<Vec<usize>> = expected["tokens"].as_array().unwrap().iter().map(usizes).collect();
        let (batch, seq_len) = (rows.len(), rows[0].len());
        let flat = |key: &str| -> Vec<u32> {
            expected[key].as_array().unwrap().iter().flat_map(usizes).map(|t| t as u32).collect()
        };
        let (tokens, targets) = (flat("tokens"), flat("targets"));
        let want = f64s(&expected["losses"]);
        assert_eq!(
            (tokens.len(), targets.len(), want.len()),
            (batch * seq_len, batch * seq_len, batch * seq_len)
        );

        let dev = CpuDevice::new(2);
        // Both sequences in one microbatch, then each on its own: rows must not see each other.
        let mut worst = (0.0f64, 0usize);
        for micro_batch in [batch, 1] {
            let mut chunk = whole_model(&dev, dir, shape(dir, micro_batch, seq_len));
            for (i, rows) in (0..batch).collect::<Vec<_>>().chunks(micro_batch).enumerate() {
                let span = rows[0] * seq_len..(rows[rows.len() - 1] + 1) * seq_len;
                let mb = Microbatch {
                    step: 0,
                    index: i as u32,
                    tokens: &tokens[span.clone()],
                    targets: &targets[span.clone()],
                    mode: stages::Mode::Eval,
                };
                let got = chunk
                    .forward(&dev, &mb, None, &mut TensorGroup::whole())
                    .losses
                    .expect("the whole model holds the head");
                let got = dev.to_host(&got);
                assert_eq!(got.len(), span.len());
                for (k, (g, w)) in got.iter().zip(&want[span.clone()]).enumerate() {
                    let err = rel_err(*g as f64, *w);
                    assert!(
                        err <= REL_TOL,
                        "{dir}: micro_batch {micro_batch}: token {}: pipetrain {g} vs transformers {w} (rel err {err:.2e})",
                        span.start + k
                    );
                    if err > worst.0 {
                        worst = (err, span.start + k);
                    }
                }
            }
        }
        eprintln!("{dir}: max relative error vs transformers: {:.3e} (token {})", worst.0, worst.1);
    }
}

/// The fixture's token stream as an llm.c .bin file.
fn write_bin(path: &Path, tokens: &[usize]) {
    let mut bytes = Vec::with_capacity(1024 + 2 * tokens.len());
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[20240520, 1, tokens.len() as i32]);
    header.iter().for_each(|h| bytes.extend(h.to_le_bytes()));
    tokens.iter().for_each(|&t| bytes.extend(u16::try_from(t).unwrap().to_le_bytes()));
    std::fs::write(path, bytes).unwrap();
}

fn eval(checkpoint: &Path, data: &Path, windows: usize, seq_len: usize) -> f64 {
    let out = common::bin()
        .args(["eval", "--checkpoint"])
        .arg(checkpoint)
        .arg("--data")
        .arg(data)
        .args(["--windows", &windows.to_string(), "--seq-length", &seq_len.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "pipetrain eval failed: {}", common::stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.trim().parse().unwrap_or_else(|_| panic!("eval printed {stdout:?}, not one number"))
}

/// `pipetrain eval` of `checkpoint` prints the mean loss transformers computed with the
/// weights of fixture `dir`; `tag` names the temp dir (the tests run in parallel).
fn eval_matches(dir: &str, checkpoint: &Path, tag: &str) {
    let expected = read_json(dir, "expected.json");
    let stream = usizes(&expected["stream"]);
    let losses = f64s(&expected["losses"]);
    let seq_len = expected["tokens"][0].as_array().unwrap().len();
    assert_eq!(stream.len(), losses.len() + 1, "the stream holds every window and one more token");
    let tmp = common::temp_dir(&format!("hf_eval_{tag}_{dir}"));
    let data = tmp.join("stream.bin");
    write_bin(&data, &stream);

    // eval prints the mean with six decimals.
    let close = |got: f64, want: f64| (got - want).abs() <= REL_TOL * want.abs() + 5e-7;
    let want0 = expected["eval_window0_mean"].as_f64().unwrap();
    let mean0 = losses[..seq_len].iter().sum::<f64>() / seq_len as f64;
    assert!(close(mean0, want0), "{dir}: window 0's mean {mean0} vs {want0}");
    let got = eval(checkpoint, &data, 1, seq_len);
    assert!(close(got, want0), "{dir}: eval --windows 1 printed {got}, transformers {want0}");
    let want_all = losses.iter().sum::<f64>() / losses.len() as f64;
    let got = eval(checkpoint, &data, 2, seq_len);
    assert!(close(got, want_all), "{dir}: eval --windows 2 printed {got}, transformers {want_all}");
    let _ = std::fs::remove_dir_all(tmp);
}

#[test]
fn eval_of_the_huggingface_directory_prints_transformers_mean_loss() {
    for dir in FIXTURES {
        eval_matches(dir, &fixture(dir), "fixture");
    }
}

/// `export --hf` writes what it read: the export of each fixture evaluates to the same
/// losses, and for the sharded Llama its tensors come back whole in one file, each with
/// transformers' name, shape and bits (`tests/hf/check_export.py` loads such a directory
/// in transformers); Phi-3's fused tensors come back as the Llama parts that stack to them,
/// or fused as they were where the model turns part of each head (no Llama class builds it).
#[test]
fn export_round_trips_through_huggingface_names() {
    for dir in FIXTURES {
        let out = common::temp_dir(&format!("hf_export_{dir}")).join("hf");
        let o = common::bin()
            .args(["export", "--checkpoint"])
            .arg(fixture(dir))
            .arg("--hf")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{dir}: export failed: {}", common::stderr(&o));
        eval_matches(dir, &out, "export");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        // A Mistral without its sliding window, or a Phi-3 that rotates all of each head, is
        // written as the Llama it is; a Mistral with one as itself, and a Phi-3 that rotates
        // part of each as itself, fused.
        let read = read_json(dir, "config.json");
        let want = match read["model_type"].as_str().unwrap() {
            "phi3" if read["rope_parameters"]["partial_rotary_factor"].as_f64() != Some(1.0) => "phi3",
            "mistral" if read["sliding_window"].is_u64() => "mistral",
            "mistral" | "phi3" => "llama",
            other => other,
        };
        assert_eq!(config["model_type"], want, "{dir}");
        let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let original = hf_weights(dir);
        let specs = model_param_specs(&shape(dir, 1, 1));
        let mut exported = 0;
        for (name, shape, data) in original {
            let parts: Vec<String> = match specs.iter().find(|p| p.name == name && p.hf.len() > 1) {
                Some(fused) if want != "phi3" => fused.hf.iter().map(|part| part.name.clone()).collect(),
                _ => vec![name.clone()],
            };
            let (mut rows, mut bits) = (0, Vec::new());
            for part in &parts {
                let view = st.tensor(part).unwrap_or_else(|_| panic!("{dir}: {part} not exported"));
                assert_eq!(view.shape()[1..], shape[1..], "{part}");
                rows += view.shape()[0];
                bits.extend(view.data().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())));
            }
            assert_eq!(rows, shape[0], "{name}");
            assert!(bits == data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{dir}: {name} differs");
            exported += parts.len();
        }
        assert_eq!(st.len(), exported, "{dir}: tensors exported");
    }
}
