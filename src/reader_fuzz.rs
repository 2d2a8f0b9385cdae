//! Property tests of every reader of untrusted input: the YAML config and its flags, the
//! token file, Megatron's indexed dataset, pipetrain checkpoints and Hugging Face directories. Whatever the bytes, a
//! reader returns a value or one user-error line, never panics, and never allocates more
//! than a small multiple of its input (a header's claim is checked against the bytes before
//! anything is sized from it). The case counts keep each target to a few seconds.

use crate::checkpoint::{read_checkpoint, save_checkpoint};
use crate::config;
use crate::data::{test_dir, TokenData, TokenFile};
use crate::error::is_user_error;
use proptest::prelude::*;
use proptest::sample::select;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

/// The system allocator, counting each thread's live and peak heap bytes.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + n);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

fn shrank(n: usize) {
    // A block freed here may have been counted on another thread.
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
}

// SAFETY: every call goes to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes a reader may hold at its peak: a multiple of its input, plus a floor for
/// fixed costs (the YAML and JSON parsers' tables, error strings).
fn allowed(input_bytes: usize) -> usize {
    16 * input_bytes + (1 << 20)
}

/// Runs `read`, and checks what a reader of untrusted bytes owes: a value or one user-error
/// line, and a peak of this thread's heap within [`allowed`].
fn check<T>(
    input_bytes: usize,
    read: impl FnOnce() -> anyhow::Result<T>,
) -> Result<Option<T>, TestCaseError> {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let result = read();
    let peak = PEAK.with(Cell::get) - base;
    prop_assert!(peak <= allowed(input_bytes), "{peak} bytes at the peak for {input_bytes} of input");
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            let line = format!("{e:#}");
            prop_assert!(!line.contains('\n'), "more than one line: {line}");
            prop_assert!(is_user_error(&e), "not a user error: {line}");
            Ok(None)
        }
    }
}

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

/// A YAML scalar, list or mapping, or text.
fn yaml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        (0u64..64).prop_map(|v| v.to_string()),
        select(vec!["true", "false", "null", "~", "[4, 4]", "[core_attn, mlp]", "{a: 1}", "\"\"", "1f1b"])
            .prop_map(String::from),
        "[ -~]{0,16}",
    ]
}

fn config_key() -> impl Strategy<Value = String> {
    let mut keys = config::known_keys();
    keys.extend(["checkpoint_activations", "recompute_activations"].map(String::from));
    prop_oneof![select(keys), "[a-z_]{1,12}"]
}

proptest! {
    #![proptest_config(cases(300))]

    /// `config::load` over a file of arbitrary bytes or of keys and values, and arbitrary
    /// `--flag value` overrides; and the split of a command line into overrides.
    #[test]
    fn config_and_flags(
        raw in proptest::collection::vec(any::<u8>(), 0..256),
        entries in proptest::collection::vec((config_key(), yaml_value()), 0..10),
        use_raw in any::<bool>(),
        flags in proptest::collection::vec((config_key(), yaml_value()), 0..4),
        args in proptest::collection::vec(prop_oneof!["[ -~]{0,10}", config_key().prop_map(|k| config::key_to_flag(&k))], 0..6),
    ) {
        let dir = test_dir("fuzz_config");
        let path = dir.join("c.yaml");
        let text: Vec<u8> = match use_raw {
            true => raw,
            false => entries.iter().map(|(k, v)| format!("{k}: {v}\n")).collect::<String>().into_bytes(),
        };
        std::fs::write(&path, &text).unwrap();
        let overrides: Vec<(String, String)> =
            flags.into_iter().map(|(k, v)| (config::key_to_flag(&k), v)).collect();
        let size = text.len() + overrides.iter().map(|(f, v)| f.len() + v.len()).sum::<usize>();
        check(size, || config::load(&path, &overrides))?;
        let size = args.iter().map(String::len).sum();
        check(size, || config::split_overrides(&args))?;
    }
}

proptest! {
    #![proptest_config(cases(300))]

    /// `TokenFile::open` over headers with any magic, version and count (up to i32::MAX tokens
    /// claimed) and bodies of any length; then the windows the loader cuts from a file it
    /// accepted.
    #[test]
    fn token_files(
        magic in prop_oneof![Just(20240520i32), Just(20240801i32), any::<i32>()],
        version in prop_oneof![Just(1i32), Just(7i32), any::<i32>()],
        count in prop_oneof![0i32..700, any::<i32>(), Just(i32::MAX)],
        header_len in prop_oneof![Just(1024usize), 0usize..1024],
        body_len in prop_oneof![0usize..1400, (0usize..700).prop_map(|n| 2 * n)],
        fill in any::<u8>(),
        seq_len in 0usize..40,
        batch in 0usize..4,
        index in 0usize..1000,
    ) {
        let mut bytes = vec![0u8; 1024];
        for (i, v) in [magic, version, count].into_iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        bytes.truncate(header_len);
        bytes.extend(std::iter::repeat_n(fill, if header_len == 1024 { body_len } else { 0 }));
        let path = test_dir("fuzz_tokens").join("t.bin");
        std::fs::write(&path, &bytes).unwrap();
        if let Some(file) = check(bytes.len(), || TokenFile::open(&path))? {
            let width = if magic == 20240801 { 4 } else { 2 };
            prop_assert_eq!(bytes.len(), 1024 + width * file.len());
            check(bytes.len(), || file.check_vocab(50257))?;
        }
        if let Some(data) = check(bytes.len(), || TokenData::open_file(&path, 1, 50257))? {
            check(bytes.len() + 8 * batch * seq_len, || data.eval_batch(index, batch, seq_len))?;
            check(bytes.len() + 8 * batch * seq_len, || data.train_batch(7, 3, 1, batch, seq_len))?;
        }
    }
}

proptest! {
    #![proptest_config(cases(300))]

    /// A Megatron dataset (`.idx` + `.bin`) opened as training data: the committed fixture's
    /// index with any version, dtype code and counts (up to u64::MAX claimed), bytes flipped
    /// and a length cut, beside a `.bin` of any length; then the windows of one accepted.
    #[test]
    fn megatron_datasets(
        version in prop_oneof![3 => Just(1u64), 1 => any::<u64>()],
        code in prop_oneof![3 => Just(4u8), 1 => 0u8..10, 1 => any::<u8>()],
        sequences in prop_oneof![3 => Just(3u64), 1 => 0u64..8, 1 => any::<u64>()],
        documents in prop_oneof![3 => Just(4u64), 1 => 0u64..8, 1 => any::<u64>()],
        flips in prop_oneof![
            2 => Just(vec![]),
            1 => proptest::collection::vec((34usize..102, any::<u8>()), 1..3),
        ],
        idx_len in prop_oneof![3 => Just(102usize), 1 => 0usize..110],
        bin_len in prop_oneof![3 => Just(1600usize), 1 => 0usize..1700],
        seq_len in 0usize..40,
        index in 0usize..1000,
    ) {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron/tiny_text_document");
        let mut idx = std::fs::read(fixture.with_extension("idx")).unwrap();
        let mut bin = std::fs::read(fixture.with_extension("bin")).unwrap();
        idx[9..17].copy_from_slice(&version.to_le_bytes());
        idx[17] = code;
        idx[18..26].copy_from_slice(&sequences.to_le_bytes());
        idx[26..34].copy_from_slice(&documents.to_le_bytes());
        for (at, xor) in flips {
            idx[at] ^= xor;
        }
        idx.truncate(idx_len);
        bin.resize(bin_len, 0x5a);
        let prefix = test_dir("fuzz_megatron").join("ds");
        std::fs::write(prefix.with_extension("idx"), &idx).unwrap();
        std::fs::write(prefix.with_extension("bin"), &bin).unwrap();
        let size = idx.len() + bin.len();
        if let Some(data) = check(size, || TokenData::open_file(&prefix, 1, 1 << 20))? {
            check(size + 8 * 2 * seq_len, || data.eval_batch(index, 2, seq_len))?;
            check(size + 8 * 2 * seq_len, || data.train_batch(7, 3, 1, 2, seq_len))?;
        }
    }
}

/// A change to one file of a checkpoint directory.
#[derive(Clone, Debug)]
enum Mutation {
    /// XOR one byte (its offset taken modulo the file's length).
    Flip {
        file: usize,
        at: usize,
        xor: u8,
    },
    Truncate {
        file: usize,
        at: usize,
    },
    Replace {
        file: usize,
        bytes: Vec<u8>,
    },
    /// Sets a key of a JSON file to a value.
    SetJson {
        file: usize,
        key: String,
        value: serde_json::Value,
    },
    /// Replaces a safetensors file with one tensor of the given dtype, shape and offsets.
    Tensor {
        file: usize,
        dtype: String,
        shape: Vec<u64>,
        offsets: (u64, u64),
        data: usize,
    },
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        any::<u64>().prop_map(|v| json!(v)),
        (0u64..8).prop_map(|v| json!(v)),
        any::<i64>().prop_map(|v| json!(v)),
        any::<f64>().prop_filter("JSON numbers are finite", |v| v.is_finite()).prop_map(|v| json!(v)),
        Just(json!(null)),
        Just(json!("gpt2")),
        select(vec![
            "llama",
            "qwen2",
            "qwen3",
            "mistral",
            "phi3",
            "nemotron",
            "stablelm",
            "gemma",
            "olmo2",
            "olmo3",
            "pipetrain",
            "full_attention",
            "sliding_attention",
            "output",
            "projection"
        ])
        .prop_map(|v| json!(v)),
        Just(json!(["full_attention", "sliding_attention"])),
        Just(json!(["sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
        Just(json!([4095, 0])),
        Just(json!({"full_attention": {"rope_type": "default", "rope_theta": 5e5},
            "sliding_attention": {"rope_type": "yarn", "rope_theta": 5e5}})),
        Just(json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192})),
        Just(json!({"rope_type": "yarn", "rope_theta": 1e6})),
        Just(json!([1, 2])),
        Just(json!({"a": 1})),
    ]
}

/// The JSON keys a mutation sets: GPT2Config's and the trainer state's.
const GPT2_KEYS: &[&str] = &[
    "n_layer",
    "n_embd",
    "n_head",
    "n_positions",
    "vocab_size",
    "n_inner",
    "model_type",
    "resid_pdrop",
    "step",
    "seed",
    "train_losses",
    "config_yaml",
    "tokenizer",
];

/// LlamaConfig's, Qwen2Config's, Qwen3Config's, MistralConfig's and Phi3Config's keys that
/// pipetrain reads.
const LLAMA_KEYS: &[&str] = &[
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rms_norm_eps",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "use_sliding_window",
    "sliding_window",
    "layer_types",
    "window_size",
    "window_attn_skip_freq",
    "hidden_act",
    "normalization",
    "norm_placement",
    "add_qkv_bias",
    "qk_layernorm",
    "qk_norm_span",
    "partial_rotary_factor",
    "norm_eps",
    "layer_norm_eps",
    "use_qkv_bias",
    "use_parallel_residual",
    "embedding_multiplier",
    "geglu",
];

fn mutation(files: usize, keys: &'static [&'static str]) -> impl Strategy<Value = Mutation> {
    let file = 0..files;
    let keys = select(keys);
    let dim = prop_oneof![0u64..20, any::<u64>(), Just(1u64 << 40)];
    prop_oneof![
        (file.clone(), any::<usize>(), 1u8..=255).prop_map(|(file, at, xor)| Mutation::Flip {
            file,
            at,
            xor
        }),
        (file.clone(), any::<usize>()).prop_map(|(file, at)| Mutation::Truncate { file, at }),
        (file.clone(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(file, bytes)| Mutation::Replace { file, bytes }),
        (file.clone(), keys, json_value()).prop_map(|(file, key, value)| Mutation::SetJson {
            file,
            key: key.to_string(),
            value
        }),
        (
            file,
            select(vec!["F32", "F16", "I64", "BOOL", "F64"]),
            proptest::collection::vec(dim, 0..4),
            (prop_oneof![0u64..64, any::<u64>()], prop_oneof![0u64..64, any::<u64>()]),
            0usize..256,
        )
            .prop_map(|(file, dtype, shape, offsets, data)| Mutation::Tensor {
                file,
                dtype: dtype.to_string(),
                shape,
                offsets,
                data,
            }),
    ]
}

/// Applies `m` to `dir`'s `files`.
fn apply(dir: &Path, files: &[&str], m: &Mutation) {
    let path = |file: usize| dir.join(files[file]);
    let bytes = |file: usize| std::fs::read(path(file)).unwrap_or_default();
    let (file, new) = match m {
        Mutation::Flip { file, at, xor } => {
            let mut b = bytes(*file);
            if !b.is_empty() {
                let i = at % b.len();
                b[i] ^= xor;
            }
            (*file, b)
        }
        Mutation::Truncate { file, at } => {
            let mut b = bytes(*file);
            b.truncate(at % (b.len() + 1));
            (*file, b)
        }
        Mutation::Replace { file, bytes } => (*file, bytes.clone()),
        Mutation::SetJson { file, key, value } => {
            let mut v: serde_json::Value = serde_json::from_slice(&bytes(*file)).unwrap_or_default();
            if let Some(obj) = v.as_object_mut() {
                obj.insert(key.clone(), value.clone());
            }
            (*file, serde_json::to_vec(&v).unwrap())
        }
        Mutation::Tensor { file, dtype, shape, offsets, data } => {
            let header = serde_json::json!({
                "h.0.ln_1.weight": { "dtype": dtype, "shape": shape, "data_offsets": [offsets.0, offsets.1] }
            });
            let header = serde_json::to_vec(&header).unwrap();
            let mut b = (header.len() as u64).to_le_bytes().to_vec();
            b.extend(header);
            b.resize(b.len() + data, 0x3f);
            (*file, b)
        }
    };
    std::fs::write(path(file), new).unwrap();
}

/// The files of `dir`'s checkpoint and their total size.
fn input_bytes(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len() as usize).sum()
}

const CHECKPOINT_FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "trainer_state.safetensors",
    "trainer_state.json",
    "manifest.sha256",
];

proptest! {
    #![proptest_config(cases(200))]

    /// `read_checkpoint` (`load_checkpoint` without its note) over a saved checkpoint with
    /// one to three of its files changed, with its manifest (which must catch every change)
    /// or without (so the readers behind it see the bytes).
    #[test]
    fn checkpoints(mutations in proptest::collection::vec(mutation(CHECKPOINT_FILES.len(), GPT2_KEYS), 1..4), keep_manifest in any::<bool>()) {
        use crate::checkpoint::testing::{config, model, optimizer, state};
        let run = test_dir("fuzz_checkpoint");
        let m = model(&config(), 1.0);
        let dir = save_checkpoint(&run, &config(), &m, &state(2), &optimizer(&m)).unwrap();
        let pristine: Vec<Vec<u8>> = CHECKPOINT_FILES.iter().map(|f| std::fs::read(dir.join(f)).unwrap()).collect();
        for m in &mutations {
            apply(&dir, &CHECKPOINT_FILES, m);
        }
        if !keep_manifest {
            std::fs::remove_file(dir.join("manifest.sha256")).unwrap();
        }
        let changed = CHECKPOINT_FILES[..4].iter().zip(&pristine).any(|(f, p)| &std::fs::read(dir.join(f)).unwrap() != p);
        let loaded = check(input_bytes(&dir), || read_checkpoint(&dir).map(|(checkpoint, _)| checkpoint))?;
        if keep_manifest && changed {
            prop_assert!(loaded.is_none(), "a changed file passed its manifest");
        }
    }
}

const HF_FILES: [&str; 2] = ["config.json", "model.safetensors"];

proptest! {
    #![proptest_config(cases(200))]

    /// `read_checkpoint` over a Hugging Face directory (`transformer.` prefixes, a tied
    /// `lm_head.weight`) with one to three changes to its two files.
    #[test]
    fn hugging_face_directories(mutations in proptest::collection::vec(mutation(HF_FILES.len(), GPT2_KEYS), 1..4)) {
        use crate::checkpoint::testing::{config, model};
        use crate::checkpoint::NamedTensor;
        let dir = test_dir("fuzz_hf");
        let cfg = config();
        let m = model(&cfg, 1.0);
        let mut hf: Vec<NamedTensor> =
            m.iter().map(|t| NamedTensor { name: format!("transformer.{}", t.name), ..t.clone() }).collect();
        hf.push(NamedTensor { name: "lm_head.weight".into(), ..m[0].clone() });
        crate::checkpoint::write_safetensors(&dir.join("model.safetensors"), &hf).unwrap();
        std::fs::write(dir.join("config.json"), cfg.to_json().to_string()).unwrap();
        for m in &mutations {
            apply(&dir, &HF_FILES, m);
        }
        check(input_bytes(&dir), || read_checkpoint(&dir).map(|(checkpoint, _)| checkpoint))?;
    }
}

proptest! {
    #![proptest_config(cases(200))]

    /// `read_checkpoint` over a Qwen2 directory (grouped-query attention, biases on q, k and
    /// v, Llama 3.1's rope scaling) with one to three changes to its config's keys, its
    /// model_type among them, or to its bytes.
    #[test]
    fn llama_family_directories(mutations in proptest::collection::vec(mutation(HF_FILES.len(), LLAMA_KEYS), 1..4)) {
        use crate::checkpoint::testing::{llama, model};
        use kernels::RopeFrequencies;
        use stages::{Architecture, LinearBiases, Positions};
        let dir = test_dir("fuzz_llama");
        let scaled = RopeFrequencies { llama3_factor: Some(8.0), ..RopeFrequencies::plain(1e6) };
        let cfg = llama(Architecture {
                biases: LinearBiases::QkvOnly,
                positions: Positions::Rotary(scaled),
                ..Architecture::llama(1e6, 1e-6)
            });
        crate::checkpoint::write_safetensors(&dir.join("model.safetensors"), &model(&cfg, 1.0)).unwrap();
        std::fs::write(dir.join("config.json"), cfg.to_json().to_string()).unwrap();
        prop_assert_eq!(read_checkpoint(&dir).unwrap().0.config, cfg, "the unchanged directory reads back");
        for m in &mutations {
            apply(&dir, &HF_FILES, m);
        }
        check(input_bytes(&dir), || read_checkpoint(&dir).map(|(checkpoint, _)| checkpoint))?;
    }

    /// `read_checkpoint` over a Phi-3 directory (q, k, v and gate, up fused in the file,
    /// grouped-query attention) with one to three changes to its config's keys or its bytes.
    #[test]
    fn phi3_directories(mutations in proptest::collection::vec(mutation(HF_FILES.len(), LLAMA_KEYS), 1..4)) {
        use crate::checkpoint::testing::{fused, llama, model};
        use stages::Architecture;
        let dir = test_dir("fuzz_phi3");
        let cfg = llama(Architecture::llama(250000.0, 1e-5));
        let tensors = fused(&cfg, &model(&cfg, 1.0));
        crate::checkpoint::write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
        let mut config = cfg.to_json();
        config["model_type"] = serde_json::json!("phi3");
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        prop_assert_eq!(read_checkpoint(&dir).unwrap().0.config, cfg, "the unchanged directory reads back");
        for m in &mutations {
            apply(&dir, &HF_FILES, m);
        }
        check(input_bytes(&dir), || read_checkpoint(&dir).map(|(checkpoint, _)| checkpoint))?;
    }

    /// `read_checkpoint` over an OLMo 2 directory (the norms on the branches' outputs, QK-norm
    /// over the whole projections, 4 query heads on 2 key/value heads or on 4), or an OLMo 3
    /// one (a sliding window besides, a layer in two full), with one to three changes to its
    /// config's keys, its model_type among them, or to its bytes.
    #[test]
    fn olmo2_and_olmo3_directories(
        mutations in proptest::collection::vec(mutation(HF_FILES.len(), LLAMA_KEYS), 1..4),
        windowed in any::<bool>(),
        grouped in any::<bool>(),
    ) {
        use crate::checkpoint::testing::{llama, model};
        use crate::checkpoint::ModelConfig;
        use stages::{Architecture, NormPlacement, QkNormSpan, SlidingWindow};
        let dir = test_dir("fuzz_olmo2");
        let ModelConfig::Llama(mut olmo2) = llama(Architecture {
            norm_placement: NormPlacement::Output,
            qk_norm: true,
            qk_norm_span: QkNormSpan::Projection,
            sliding_window: windowed.then_some(SlidingWindow { keys: 4, full_every: Some(2) }),
            ..Architecture::llama(500000.0, 1e-6)
        }) else {
            unreachable!("a Llama-family config")
        };
        if !grouped {
            olmo2.num_key_value_heads = olmo2.num_attention_heads;
        }
        let cfg = ModelConfig::Llama(olmo2);
        crate::checkpoint::write_safetensors(&dir.join("model.safetensors"), &model(&cfg, 1.0)).unwrap();
        let config = cfg.to_json();
        prop_assert_eq!(&config["model_type"], if windowed { "olmo3" } else { "olmo2" });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        prop_assert_eq!(read_checkpoint(&dir).unwrap().0.config, cfg, "the unchanged directory reads back");
        for m in &mutations {
            apply(&dir, &HF_FILES, m);
        }
        check(input_bytes(&dir), || read_checkpoint(&dir).map(|(checkpoint, _)| checkpoint))?;
    }
}

/// The harness itself: an allocation past the bound, a second line and an internal error
/// each fail a case.
#[test]
fn the_checks_can_fail() {
    assert!(check(10, || Ok(vec![1u8; 2 << 20])).is_err());
    assert!(check(1 << 20, || Ok(vec![1u8; 2 << 20])).unwrap().is_some());
    assert!(check(0, || Err::<(), _>(crate::error::user_error("a\nb"))).is_err());
    assert!(check(0, || Err::<(), _>(anyhow::anyhow!("internal"))).is_err());
    assert!(check(0, || Err::<(), _>(crate::error::user_error("one line"))).unwrap().is_none());
}
