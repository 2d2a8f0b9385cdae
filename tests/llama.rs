//! The Llama family through Megatron's flags (Qwen2's `add_qkv_bias`, Qwen3's
//! `qk_layernorm`, Nemotron's `apply_layernorm_1p`, `squared_relu` and `rotary_percent`,
//! Gemma's `geglu` and `embedding_multiplier`, OLMo 2's `norm_placement` and
//! `qk_norm_span`, and OLMo 3's `window_size` and `window_attn_skip_freq` among them):
//! each flag alone
//! and all together train, bitwise equal across every schedule, stage count and recompute
//! policy, with the activation memory the model predicts; impossible combinations are one
//! line and exit 2.

mod common;
use common::*;

fn llama(extra: &[(&str, String)]) -> Vec<String> {
    let mut all = llama_flags();
    all.extend(extra.iter().cloned());
    flags(&all)
}

#[test]
fn every_schedule_stage_count_and_recompute_policy_matches_one_stage_bitwise() {
    let dir = temp_dir("llama-bitwise");
    let gb = ("global-batch-size", "8".to_string());
    let base = run_small(&dir, "p1", &llama(std::slice::from_ref(&gb)));
    let policies = [
        vec![],
        full_recompute("uniform", "2"),
        full_recompute("block", "1"),
        selective_recompute("core_attn"),
        selective_recompute("mlp"),
        selective_recompute("core_attn,mlp,layernorm"),
    ];
    for (i, policy) in policies.iter().enumerate() {
        for (schedule, p) in
            [("1f1b", 2), ("gpipe", 4), ("zb-h1", 3), ("interleaved-1f1b", 2), ("zb-v", 2), ("dualpipe-v", 2)]
        {
            let mut f = vec![
                gb.clone(),
                ("pipeline-schedule", schedule.to_string()),
                ("pipeline-model-parallel-size", p.to_string()),
            ];
            if schedule == "interleaved-1f1b" {
                f.push(("virtual-pipeline-model-parallel-size", "2".into()));
            }
            f.extend(policy.iter().cloned());
            let name = format!("{schedule}-p{p}-policy{i}");
            let r = run_small(&dir, &name, &llama(&f));
            assert_one_stages_bits_and_predicted_memory(&r, &base, &name);
        }
    }
}

/// Run `r` has run `base`'s losses and final weights to the bit, and every stage's measured
/// activation peak is the memory model's prediction to the byte.
fn assert_one_stages_bits_and_predicted_memory(r: &std::path::Path, base: &std::path::Path, name: &str) {
    assert_eq!(losses(r), losses(base), "{name}: losses differ from p=1");
    assert!(weights(r) == weights(base), "{name}: final weights differ from p=1");
    for (stage, s) in report(r)["stages"].as_array().unwrap().iter().enumerate() {
        let measured = s["peak_bytes_by_category"]["activations"].as_u64().unwrap();
        let predicted = s["predicted_activation_peak_bytes"].as_u64().unwrap();
        assert_eq!(measured, predicted, "{name} stage {stage}: activation bytes");
    }
}

/// Qwen3 (the Llama with QK-norm) under every schedule, with full recompute (its QK-norm
/// rerun before each backward) or selective (its input and statistics kept): bitwise p = 1's,
/// with the activation memory the model predicts.
#[test]
fn qwen3_matches_one_stage_bitwise_under_every_schedule() {
    matches_one_stage_bitwise_under_every_schedule("qwen3", &[("qk-layernorm", "true")]);
}

/// Nemotron (LayerNorm scaling by 1 + weight, squared ReLU, rope on half of each head), as
/// Qwen3 above.
#[test]
fn nemotron_matches_one_stage_bitwise_under_every_schedule() {
    let nemotron = [
        ("normalization", "LayerNorm"),
        ("apply-layernorm-1p", "true"),
        ("swiglu", "false"),
        ("squared-relu", "true"),
        ("rotary-percent", "0.5"),
    ];
    matches_one_stage_bitwise_under_every_schedule("nemotron", &nemotron);
}

/// Gemma (RMSNorm scaling by 1 + weight, GeGLU, the embeddings multiplied by sqrt(32) and
/// tied, one key/value head), as Qwen3 above.
#[test]
fn gemma_matches_one_stage_bitwise_under_every_schedule() {
    let gemma = [
        ("apply-layernorm-1p", "true"),
        ("swiglu", "false"),
        ("geglu", "true"),
        ("embedding-multiplier", "5.656854"),
        ("untie-embeddings-and-output-weights", "false"),
        ("num-query-groups", "1"),
    ];
    matches_one_stage_bitwise_under_every_schedule("gemma", &gemma);
}

/// OLMo 2: the norms on the attention's and MLP's outputs, QK-norm over the whole
/// projections (as many key/value heads as query heads), as Qwen3 above; and selective
/// recompute of the norms, which there keep no output to drop.
#[test]
fn olmo2_matches_one_stage_bitwise_under_every_schedule() {
    let olmo = [
        ("norm-placement", "output"),
        ("qk-layernorm", "true"),
        ("qk-norm-span", "projection"),
        ("num-query-groups", "4"),
        ("rotary-base", "500000"),
    ];
    matches_one_stage_bitwise_under_every_schedule("olmo2", &olmo);
    let dir = temp_dir("olmo2-layernorm-recompute");
    let mut model = vec![("global-batch-size", "8".to_string())];
    model.extend(olmo.iter().map(|(k, v)| (*k, v.to_string())));
    let base = run_small(&dir, "p1", &llama(&model));
    model.extend(schedule_flags("1f1b", 2).into_iter().filter(|(k, _)| *k != "global-batch-size"));
    model.extend(selective_recompute("layernorm"));
    let r = run_small(&dir, "layernorm", &llama(&model));
    assert_one_stages_bits_and_predicted_memory(&r, &base, "olmo2 layernorm");
}

/// OLMo 3: OLMo 2 with a sliding window of 5 keys, every second layer seeing every key, as
/// OLMo 2 above, on 2 key/value heads for 4 (OLMo 3 32B's grouped-query attention), so the q
/// and k norms are of different widths.
#[test]
fn olmo3_matches_one_stage_bitwise_under_every_schedule() {
    let olmo3 = [
        ("norm-placement", "output"),
        ("qk-layernorm", "true"),
        ("qk-norm-span", "projection"),
        ("rotary-base", "500000"),
        ("window-size", "4,0"),
        ("window-attn-skip-freq", "2"),
    ];
    matches_one_stage_bitwise_under_every_schedule("olmo3", &olmo3);
}

/// The Llama with `family`'s flags under all six schedules, full recompute and selective
/// alternately: p = 1's bits and the predicted activation peaks.
fn matches_one_stage_bitwise_under_every_schedule(name: &str, family: &[(&'static str, &str)]) {
    let dir = temp_dir(&format!("{name}-bitwise"));
    let mut model = vec![("global-batch-size", "8".to_string())];
    model.extend(family.iter().map(|(k, v)| (*k, v.to_string())));
    let base = run_small(&dir, "p1", &llama(&model));
    for (i, (schedule, p)) in
        [("1f1b", 2), ("gpipe", 4), ("zb-h1", 3), ("interleaved-1f1b", 2), ("zb-v", 2), ("dualpipe-v", 2)]
            .into_iter()
            .enumerate()
    {
        let mut f = model.clone();
        f.extend(schedule_flags(schedule, p).into_iter().filter(|(k, _)| *k != "global-batch-size"));
        f.extend(if i % 2 == 0 {
            full_recompute("uniform", "1")
        } else {
            selective_recompute("core_attn,mlp")
        });
        let name = format!("{name}-{schedule}-p{p}");
        let r = run_small(&dir, &name, &llama(&f));
        assert_one_stages_bits_and_predicted_memory(&r, &base, &name);
    }
}

/// A Llama turning half of each head is Phi-3's: its checkpoints say so and hold q, k, v and
/// gate, up fused, as Phi3ForCausalLM's files do, and a run resumed from one is the
/// uninterrupted run to the bit.
#[test]
fn a_llama_turning_part_of_each_head_saves_as_phi3_and_resumes_bitwise() {
    let dir = temp_dir("llama-phi3");
    let partial = [("rotary-percent", "0.5".to_string()), ("global-batch-size", "8".to_string())];
    let whole = run_small(&dir, "whole", &llama(&partial));
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(whole.join("checkpoints/step_000003/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (&config["model_type"], &config["architectures"][0], &config["partial_rotary_factor"]),
        (&serde_json::json!("phi3"), &serde_json::json!("Phi3ForCausalLM"), &serde_json::json!(0.5))
    );
    let bytes = weights(&whole);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let layers = config["num_hidden_layers"].as_u64().unwrap() as usize;
    for layer in 0..layers {
        for fused in ["self_attn.qkv_proj", "mlp.gate_up_proj"] {
            assert!(st.tensor(&format!("model.layers.{layer}.{fused}.weight")).is_ok(), "{fused}");
        }
        assert!(st.tensor(&format!("model.layers.{layer}.self_attn.q_proj.weight")).is_err());
    }
    // Embedding, output layer, final norm, and 6 a layer: two norms, qkv, o, gate_up, down.
    assert_eq!(st.len(), 3 + layers * 6);
    // The first part stops at step 2 on the whole run's learning-rate schedule.
    let first = [("train-iters", "2".to_string()), ("lr-decay-iters", "3".to_string())];
    run_small(&dir, "resumed", &llama(&[&partial[..], &first].concat()));
    let mut more = llama(&partial);
    more.push("--resume".into());
    let resumed = run_small(&dir, "resumed", &more);
    let training = |run| losses(run).into_iter().map(|(step, loss, _)| (step, loss)).collect::<Vec<_>>();
    assert_eq!(training(&resumed), training(&whole));
    assert!(weights(&resumed) == bytes, "the resumed run's weights differ");
}

#[test]
fn each_flag_alone_trains_and_pipelines_bitwise() {
    let dir = temp_dir("llama-each-flag");
    let gb = ("global-batch-size", "4".to_string());
    let alone: [&[(&str, &str)]; 19] = [
        &[("normalization", "RMSNorm")],
        &[("position-embedding-type", "rope")],
        &[("position-embedding-type", "rope"), ("use-rope-scaling", "true"), ("rope-scaling-factor", "32")],
        &[("swiglu", "true")],
        &[("group-query-attention", "true"), ("num-query-groups", "1")],
        &[("untie-embeddings-and-output-weights", "true")],
        &[("disable-bias-linear", "true")],
        &[("disable-bias-linear", "true"), ("add-qkv-bias", "true")],
        &[("kv-channels", "16")],
        &[("normalization", "RMSNorm"), ("qk-layernorm", "true")],
        &[("position-embedding-type", "rope"), ("rotary-percent", "0.5")],
        &[("squared-relu", "true")],
        &[("normalization", "RMSNorm"), ("apply-layernorm-1p", "true")],
        &[("geglu", "true")],
        &[("embedding-multiplier", "5.656854")],
        &[("norm-placement", "output")],
        &[("normalization", "RMSNorm"), ("qk-layernorm", "true"), ("qk-norm-span", "projection")],
        &[("window-size", "4,0")],
        &[("window-size", "4,0"), ("window-attn-skip-freq", "2")],
    ];
    let gpt2 = losses(&run_small(&dir, "gpt2", &flags(std::slice::from_ref(&gb))));
    let mut each = Vec::new();
    for (i, set) in alone.iter().enumerate() {
        let mut f: Vec<(&str, String)> = set.iter().map(|(k, v)| (*k, v.to_string())).collect();
        f.push(gb.clone());
        let one = run_small(&dir, &format!("flag{i}-p1"), &flags(&f));
        f.push(("pipeline-model-parallel-size", "2".into()));
        let two = run_small(&dir, &format!("flag{i}-p2"), &flags(&f));
        assert_eq!(losses(&one), losses(&two), "{set:?}: p=2 differs from p=1");
        assert!(weights(&one) == weights(&two), "{set:?}: weights differ");
        assert_ne!(losses(&one), gpt2, "{set:?} changed nothing");
        each.push(losses(&one));
    }
    // Llama 3.1's scaling slows the rotary embedding's long wavelengths (here the pair of
    // wavelength 6283 positions): another model than plain rope.
    assert_ne!(each[2], each[1], "use_rope_scaling changed nothing");
    // Qwen2's biases on q, k and v, without the others: neither GPT-2's biases nor none.
    assert_ne!(each[7], each[6], "add_qkv_bias changed nothing");
    // Qwen3's QK-norm, beside the RMSNorm it needs.
    assert_ne!(each[9], each[0], "qk_layernorm changed nothing");
    // OLMo 2's QK-norm over the whole projections: not the per-head norm.
    assert_ne!(each[16], each[9], "qk_norm_span changed nothing");
    // Nemotron's rotary embedding on half of each head: neither the whole head's nor none.
    assert_ne!(each[10], each[1], "rotary_percent changed nothing");
    // A zero-centred norm weight starts at 0 where a plain one starts at 1: the same
    // function, so the first step's loss is plain RMSNorm's to the bit; the updates then
    // round about 0 and not about 1.
    assert_eq!(each[12][0], each[0][0], "1 + 0 is not the plain norm's 1");
    assert_ne!(each[12][1..], each[0][1..], "apply_layernorm_1p changed nothing after the first step");
    // Gemma's GeGLU: neither SwiGLU nor GELU on one projection.
    assert_ne!(each[13], each[3], "geglu changed nothing");
    // A full layer every second: neither the window on every layer nor none.
    assert_ne!(each[18], each[17], "window_attn_skip_freq changed nothing");
}

#[test]
fn init_method_std_scales_the_initial_weights() {
    let dir = temp_dir("llama-init-std");
    let first_loss = |std: &str| {
        let f = [("init-method-std", std.to_string()), ("global-batch-size", "4".to_string())];
        let r = run_small(&dir, &format!("std{std}"), &llama(&f));
        losses(&r)[0].1
    };
    assert_ne!(first_loss("0.02"), first_loss("0.2"));
}

#[test]
fn impossible_combinations_are_one_line() {
    let dir = temp_dir("llama-bad");
    let data = synthetic_data(&dir);
    let cfg = write_config(
        &dir,
        "model.yaml",
        &format!("{MODEL}train_data_path: {}\nvalid_data_path: {}\n", data.display(), data.display()),
    );
    let run = |extra: &[&str]| train(&cfg, &dir.join("run"), extra);
    let cases: [(&[&str], &str); 28] = [
        (
            &["--window-size", "4,2"],
            "command line: --window-size 4,2: [4, 2]: the attention is causal, so no query sees a key after it; \
             right must be 0",
        ),
        (&["--window-size", "4"], "command line: --window-size 4: invalid length 1, expected an array of length 2"),
        (&["--window-attn-skip-freq", "4"], "command line: --window-attn-skip-freq 4: 4 needs window_size"),
        (
            &["--window-size", "2147483647,0"],
            "command line: --window-size 2147483647,0: [2147483647, 0]: left must be below 2147483647",
        ),
        (
            &["--window-size", "4,0", "--window-attn-skip-freq", "1"],
            "command line: --window-attn-skip-freq 1: 1 must be at least 2: every Nth layer sees every key, and \
             the others the window",
        ),
        (
            &["--group-query-attention", "true", "--num-query-groups", "3"],
            "command line: --num-query-groups 3: 3 does not divide num_attention_heads 4",
        ),
        (
            &["--group-query-attention", "true"],
            "command line: --group-query-attention true: true needs num_query_groups, the key/value heads",
        ),
        (&["--num-query-groups", "2"], "command line: --num-query-groups 2: 2 needs group_query_attention: true"),
        (
            &["--position-embedding-type", "rope", "--hidden-size", "36", "--num-attention-heads", "4"],
            "rope rotates pairs of channels and needs an even head size; hidden_size 36 / num_attention_heads 4 is 9",
        ),
        (
            &["--position-embedding-type", "rope", "--seq-length", "32", "--max-position-embeddings", "16"],
            "command line: --seq-length 32: 32 exceeds max_position_embeddings 16",
        ),
        (&["--normalization", "rmsnorm"], "`rmsnorm` is not one of LayerNorm, RMSNorm"),
        (
            &["--position-embedding-type", "alibi"],
            "command line: --position-embedding-type alibi: `alibi` is not one of learned_absolute, rope",
        ),
        (&["--norm-epsilon", "0"], "command line: --norm-epsilon 0: 0 must be a finite number > 0"),
        (
            &["--use-rope-scaling", "true"],
            "command line: --use-rope-scaling true: true needs position_embedding_type: rope",
        ),
        (
            &["--position-embedding-type", "rope", "--rope-scaling-factor", "32"],
            "command line: --rope-scaling-factor 32: 32 needs use_rope_scaling: true",
        ),
        (
            &["--position-embedding-type", "rope", "--use-rope-scaling", "true", "--rope-scaling-factor", "0.5"],
            "command line: --rope-scaling-factor 0.5: 0.5 must be a finite number >= 1",
        ),
        (&["--kv-channels", "0"], "command line: --kv-channels 0: must be at least 1, got 0"),
        (
            &["--qk-layernorm", "true"],
            "command line: --qk-layernorm true: true needs normalization: RMSNorm (QK-norm here is RMSNorm's), \
             not LayerNorm",
        ),
        (
            &["--position-embedding-type", "rope", "--kv-channels", "9"],
            "rope rotates pairs of channels and needs an even head size; kv_channels is 9",
        ),
        (
            &["--swiglu", "true", "--squared-relu", "true"],
            "command line: --squared-relu true: true and swiglu: true are two activations for one MLP; set one",
        ),
        (
            &["--normalization", "RMSNorm", "--qk-layernorm", "true", "--apply-layernorm-1p", "true"],
            "command line: --qk-layernorm true: true beside apply_layernorm_1p: pipetrain's QK-norm weights are \
             plain, not zero-centred",
        ),
        (
            &["--geglu", "true", "--squared-relu", "true"],
            "command line: --geglu true: true and squared_relu: true are two activations for one MLP; set one",
        ),
        (&["--embedding-multiplier", "0"], "command line: --embedding-multiplier 0: 0 must be a finite number > 0"),
        (&["--rotary-percent", "0.5"], "command line: --rotary-percent 0.5: 0.5 needs position_embedding_type: rope"),
        (
            &["--position-embedding-type", "rope", "--rotary-percent", "0.375"],
            "command line: --rotary-percent 0.375: 0.375 must be above 0 and below 1 and turn an even number of \
             channels; it turns 3 of a head of 8",
        ),
        (
            &["--position-embedding-type", "rope", "--rotary-percent", "1.5"],
            "command line: --rotary-percent 1.5: 1.5 must be above 0 and below 1 and turn an even number of \
             channels; it turns 12 of a head of 8",
        ),
        (&["--norm-placement", "after"], "command line: --norm-placement after: `after` is not one of input, output"),
        (
            &["--qk-norm-span", "projection"],
            "command line: --qk-norm-span projection: projection needs qk_layernorm: true",
        ),
    ];
    for (args, needle) in cases {
        let o = run(args);
        assert_user_error(&o, needle);
        assert!(!dir.join("run").exists(), "{args:?} made the run dir");
    }
}
