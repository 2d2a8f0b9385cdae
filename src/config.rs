//! The run config: one flat YAML mapping whose keys are Megatron-LM argument names in
//! snake_case, each overridable on the command line as `--kebab-case VALUE` (CLI beats YAML).
//!
//! Errors name where the value came from (the file or the flag), the key and the value, in
//! one line, as a [`UserError`](crate::error::UserError).
//!
//! Older or common spellings of the recompute settings are accepted and resolved to the
//! canonical keys (aliases.rs); the config remembers which were used.

mod aliases;
mod data_path;
mod named;
mod offload_keys;
mod origin;
#[cfg(test)]
mod reference_doc;
mod refused;

use crate::error::user_error;
pub use aliases::{help as alias_help, AliasUse};
pub use data_path::DataPath;
use kernels::rope_frequencies::rotary_dims_of;
use kernels::RopeFrequencies;
pub use named::{
    DeviceKind, LrDecayStyle, Named, PositionEmbeddingType, Precision, RecomputeGranularity, RecomputeMethod,
    RecomputeModule,
};
use origin::Origin;
pub use origin::Origins;
use schedules::ScheduleKind;
use serde::{Deserialize, Serialize};
use serde_norway::{Mapping, Value};
use stages::{
    Activation, Architecture, LinearBiases, Norm, NormPlacement, OffloadModule, Positions, QkNormSpan,
    SlidingWindow,
};
use std::path::{Path, PathBuf};

/// `rope_scaling_factor` where `use_rope_scaling` is set without it, as in Megatron-LM (Llama 3.1's).
const MEGATRON_ROPE_SCALING_FACTOR: f32 = 8.0;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    // ---- model ----
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    /// The head size, where it is not hidden_size / num_attention_heads (Hugging Face's
    /// `head_dim`).
    pub kv_channels: Option<usize>,
    /// Defaults to 4 * hidden_size.
    pub ffn_hidden_size: Option<usize>,
    pub seq_length: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub hidden_dropout: f32,
    pub attention_dropout: f32,
    /// The std of the weights' normal init (the residual projections' scaled by
    /// 1/sqrt(2 * num_layers)).
    pub init_method_std: f32,

    // ---- model family (the Llama family through Megatron's flags) ----
    #[serde(with = "named")]
    pub normalization: Norm,
    pub norm_epsilon: f32,
    /// Every norm but QK-norm scales by 1 + weight, its weight zero-centred (Nemotron's).
    pub apply_layernorm_1p: bool,
    /// `input`: each block normalises its attention's and MLP's inputs (pre-norm); `output`:
    /// their outputs, before each joins the residual stream (OLMo 2's).
    #[serde(with = "named")]
    pub norm_placement: NormPlacement,
    #[serde(with = "named")]
    pub position_embedding_type: PositionEmbeddingType,
    /// The rotary embedding's base (Llama 2: 10000, Llama 3: 500000).
    pub rotary_base: f32,
    /// Llama 3.1's scaling of the rotary frequencies (config.json's rope_type "llama3").
    pub use_rope_scaling: bool,
    /// Its factor (Megatron's default 8; Llama 3.2 1B and 3B: 32).
    pub rope_scaling_factor: Option<f32>,
    /// The share of each head the rotary embedding turns, its leading `int(head size x
    /// percent)` channels (Megatron's name; Nemotron's 0.5, GPT-NeoX's 0.25).
    pub rotary_percent: f64,
    pub swiglu: bool,
    /// The MLP's activation is relu(x)^2 (Nemotron's) instead of GELU.
    pub squared_relu: bool,
    /// A gated MLP with the tanh GELU (GeGLU, Gemma's) instead of GELU.
    pub geglu: bool,
    pub group_query_attention: bool,
    /// Key/value heads with group_query_attention.
    pub num_query_groups: Option<usize>,
    pub untie_embeddings_and_output_weights: bool,
    /// The token embedding's output is multiplied by this (Gemma's sqrt(hidden_size)).
    pub embedding_multiplier: Option<f32>,
    pub disable_bias_linear: bool,
    /// A bias on the q, k and v projections whatever `disable_bias_linear` says (Qwen2).
    pub add_qkv_bias: bool,
    /// QK-norm: each query and key head normalised before the rotary embedding (Qwen3).
    pub qk_layernorm: bool,
    /// What QK-norm spans: `head` (Qwen3's) or `projection`, the whole q and k (OLMo 2's).
    #[serde(with = "named")]
    pub qk_norm_span: QkNormSpan,
    /// A sliding window, Megatron's (left, right): each query sees the `left` keys before it
    /// and itself (Hugging Face's `sliding_window` is left + 1); right is 0, the attention
    /// being causal.
    pub window_size: Option<[usize; 2]>,
    /// With `window_size`, every Nth layer counting from 1 sees every key (OLMo 3's 4).
    pub window_attn_skip_freq: Option<usize>,

    // ---- pipeline ----
    pub pipeline_model_parallel_size: usize,
    pub virtual_pipeline_model_parallel_size: Option<usize>,
    #[serde(with = "named")]
    pub pipeline_schedule: ScheduleKind,
    /// Explicit number of transformer blocks per pipeline stage (ours); balanced by cost
    /// when unset.
    pub num_layers_per_stage: Option<Vec<usize>>,
    /// t: ranks that split every layer, Megatron-style.
    pub tensor_model_parallel_size: usize,
    /// With t > 1, the norms, dropout and residual split along the sequence.
    pub sequence_parallel: bool,
    /// With full recompute and t > 1, each tensor-parallel rank keeps 1/t of every
    /// recomputed group's input (Megatron's name; DeepSpeed's `partition_activations`).
    pub distribute_saved_activations: bool,
    /// Data-parallel replicas of the whole pipeline. Under MPI it is derived as
    /// world / pipeline_model_parallel_size (as in Megatron) and, when given, must agree.
    pub data_parallel_size: Option<usize>,
    /// Megatron's distributed optimizer (ZeRO stage 1): each data-parallel replica keeps the
    /// AdamW moments of, and steps, its own 1/dp part of every parameter
    /// (`stages::optimizer_shard`).
    pub use_distributed_optimizer: bool,

    // ---- recompute ----
    /// Unset or `none`: no recompute.
    #[serde(with = "named::option")]
    pub recompute_granularity: Option<RecomputeGranularity>,
    #[serde(with = "named::option")]
    pub recompute_method: Option<RecomputeMethod>,
    pub recompute_num_layers: Option<usize>,
    #[serde(with = "named::list")]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// Per-stage recompute_num_layers (ours): under 1F1B early stages hold more microbatches.
    pub recompute_num_layers_per_stage: Option<Vec<usize>>,

    // ---- activation offload (offload_keys.rs) ----
    /// Megatron's switch: the kept tensors of `offload_modules` wait in host memory.
    pub fine_grained_activation_offloading: bool,
    #[serde(with = "named::list")]
    pub offload_modules: Option<Vec<OffloadModule>>,
    /// Full recompute's kept inputs wait in host memory (DeepSpeed's `cpu_checkpointing`).
    pub cpu_offloading_activations: bool,
    /// Per stage, how many of each chunk's blocks (from its first) offload (ours); all where
    /// unset.
    pub offload_num_layers_per_stage: Option<Vec<usize>>,

    // ---- training ----
    pub micro_batch_size: usize,
    pub global_batch_size: usize,
    pub train_iters: usize,
    pub lr: f32,
    pub min_lr: f32,
    pub lr_warmup_iters: usize,
    #[serde(with = "named")]
    pub lr_decay_style: LrDecayStyle,
    /// Defaults to train_iters.
    pub lr_decay_iters: Option<usize>,
    pub weight_decay: f32,
    pub adam_beta1: f32,
    pub adam_beta2: f32,
    pub adam_eps: f32,
    /// Global gradient-norm clipping threshold; 0 disables.
    pub clip_grad: f32,
    /// Stop the run, before its update, at a step whose loss or global grad norm is NaN or
    /// infinite (Megatron's default).
    pub check_for_nan_in_loss_and_grad: bool,
    pub seed: u64,
    pub eval_interval: usize,
    pub eval_iters: usize,
    /// 0 saves only at the end.
    pub save_interval: usize,
    pub log_interval: usize,

    // ---- data, device, checkpoints ----
    /// A file, shards or a blend (data_path.rs).
    pub train_data_path: Option<DataPath>,
    pub valid_data_path: Option<DataPath>,
    #[serde(with = "named")]
    pub device: DeviceKind,
    #[serde(with = "named")]
    pub precision: Precision,
    /// On CUDA, the bias added and GELU's backward computed in the matmuls' cuBLASLt
    /// epilogues (Megatron's name for its bias-GELU fusion); false runs them as kernels of
    /// their own, to measure the fusion. The CPU always runs them apart.
    pub bias_gelu_fusion: bool,
    /// Start from these weights: a checkpoint dir, a run dir or a Hugging Face GPT-2 or Llama dir.
    pub load: Option<PathBuf>,

    // ---- distributed ----
    /// The longest a rank waits on a peer (a transfer, a collective) before it ends the run.
    /// Megatron's name; minutes, here any positive number (fractions included).
    pub distributed_timeout_minutes: f64,

    /// The aliases the config was written with (not a key: set by [`load`]).
    #[serde(skip)]
    pub aliases: Vec<AliasUse>,
    /// Where each key's value came from (not a key: set by [`load`]).
    #[serde(skip)]
    pub origins: Origins,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            num_layers: 12,
            hidden_size: 768,
            num_attention_heads: 12,
            kv_channels: None,
            ffn_hidden_size: None,
            seq_length: 1024,
            max_position_embeddings: 1024,
            vocab_size: 50257,
            hidden_dropout: 0.1,
            attention_dropout: 0.1,
            init_method_std: 0.02,
            normalization: Norm::LayerNorm,
            norm_epsilon: 1e-5,
            apply_layernorm_1p: false,
            norm_placement: NormPlacement::Input,
            position_embedding_type: PositionEmbeddingType::LearnedAbsolute,
            rotary_base: 10000.0,
            use_rope_scaling: false,
            rope_scaling_factor: None,
            rotary_percent: 1.0,
            swiglu: false,
            squared_relu: false,
            geglu: false,
            group_query_attention: false,
            num_query_groups: None,
            untie_embeddings_and_output_weights: false,
            embedding_multiplier: None,
            disable_bias_linear: false,
            add_qkv_bias: false,
            qk_layernorm: false,
            qk_norm_span: QkNormSpan::Head,
            window_size: None,
            window_attn_skip_freq: None,
            pipeline_model_parallel_size: 1,
            virtual_pipeline_model_parallel_size: None,
            pipeline_schedule: ScheduleKind::OneFOneB,
            num_layers_per_stage: None,
            tensor_model_parallel_size: 1,
            sequence_parallel: false,
            distribute_saved_activations: false,
            data_parallel_size: None,
            use_distributed_optimizer: false,
            recompute_granularity: None,
            recompute_method: None,
            recompute_num_layers: None,
            recompute_modules: None,
            recompute_num_layers_per_stage: None,
            fine_grained_activation_offloading: false,
            offload_modules: None,
            cpu_offloading_activations: false,
            offload_num_layers_per_stage: None,
            micro_batch_size: 1,
            global_batch_size: 1,
            train_iters: 100,
            lr: 6e-4,
            min_lr: 6e-5,
            lr_warmup_iters: 0,
            lr_decay_style: LrDecayStyle::Cosine,
            lr_decay_iters: None,
            weight_decay: 0.1,
            adam_beta1: 0.9,
            adam_beta2: 0.95,
            adam_eps: 1e-8,
            clip_grad: 1.0,
            check_for_nan_in_loss_and_grad: true,
            seed: 1234,
            eval_interval: 100,
            eval_iters: 10,
            save_interval: 0,
            log_interval: 1,
            train_data_path: None,
            valid_data_path: None,
            device: DeviceKind::Cpu,
            precision: Precision::Fp32,
            bias_gelu_fusion: true,
            load: None,
            distributed_timeout_minutes: 10.0,
            aliases: Vec::new(),
            origins: Origins::default(),
        }
    }
}

/// One setting: a canonical key and its value, and how it was written.
#[derive(Clone, Debug)]
struct Entry {
    key: String,
    value: Value,
    origin: Origin,
    /// The key and value as written: `key` and `value` themselves, or the alias they came
    /// from and its value.
    written: String,
    written_value: Value,
    /// An alias's default, which yields to any value given for the key.
    default_only: bool,
}

impl Entry {
    fn new(key: String, value: Value, origin: Origin) -> Entry {
        Entry { written: key.clone(), written_value: value.clone(), key, value, origin, default_only: false }
    }

    fn is_alias_setting(&self) -> bool {
        self.written != self.key
    }

    /// Where and how it was written, e.g. ``c.yaml: `checkpoint_activations: true` ``.
    fn said(&self) -> String {
        match &self.origin {
            Origin::File(p) => format!("{}: `{}: {}`", p.display(), self.written, show(&self.written_value)),
            Origin::Flag(flag) => format!("command line: {flag}"),
        }
    }
}

/// Keys whose values are lists, so `--key 4,3,1` on the command line means `[4, 3, 1]`.
const LIST_KEYS: [&str; 6] = [
    "num_layers_per_stage",
    "window_size",
    "recompute_modules",
    "recompute_num_layers_per_stage",
    "offload_modules",
    "offload_num_layers_per_stage",
];

/// Every config key, in declaration order (the serialised default's keys).
pub fn known_keys() -> Vec<String> {
    match serde_norway::to_value(Config::default()) {
        Ok(Value::Mapping(m)) => m.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect(),
        _ => unreachable!("Config serialises to a mapping"),
    }
}

/// `hidden_size` -> `--hidden-size`: the flag that sets a config key.
pub fn key_to_flag(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// `--hidden-size` -> `hidden_size`, if that is a config key or an alias of one.
pub fn flag_to_key(flag: &str) -> Option<String> {
    let key = flag.strip_prefix("--")?.replace('-', "_");
    (known_keys().contains(&key) || aliases::is_alias(&key) || refused::reason(&key).is_some()).then_some(key)
}

/// Config keys set on the command line: (flag as given, value).
pub type Overrides = Vec<(String, String)>;

/// Splits command-line arguments into config overrides (`--kebab-key VALUE` for any config
/// key) and the rest, which belong to the subcommand's own flags. A switch may stand alone:
/// `--recompute-activations` is `--recompute-activations true`.
pub fn split_overrides(args: &[String]) -> anyhow::Result<(Overrides, Vec<String>)> {
    let mut overrides = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if let Some(key) = flag_to_key(&flag) {
            let next_is_bool = matches!(args.get(i + 1).map(String::as_str), Some("true" | "false"));
            let value = match inline {
                Some(v) => v,
                None if (aliases::is_switch(&key) || refused::reason(&key).is_some()) && !next_is_bool => {
                    "true".into()
                }
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| user_error(format!("command line: {flag} needs a value")))?
                }
            };
            overrides.push((flag, value));
        } else {
            rest.push(arg.clone());
        }
        i += 1;
    }
    Ok((overrides, rest))
}

/// Reads `path`, applies `overrides` (flag, value) on top, and validates the result.
pub fn load(path: &Path, overrides: &[(String, String)]) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| user_error(format!("{}: cannot read config: {e}", path.display())))?;
    let doc: Value = serde_norway::from_str(&text).map_err(|e| {
        user_error(format!("{}: malformed YAML: {}", path.display(), one_line(&e.to_string())))
    })?;
    let mut entries: Vec<Entry> = Vec::new();
    match doc {
        Value::Mapping(m) => {
            for (k, v) in m {
                let key = k.as_str().ok_or_else(|| {
                    user_error(format!("{}: key {} is not a string", path.display(), show(&k)))
                })?;
                entries.push(Entry::new(key.to_string(), v, Origin::File(path.to_path_buf())));
            }
        }
        Value::Null => {}
        other => {
            return Err(user_error(format!(
                "{}: a config is one flat mapping of keys to values, found {}",
                path.display(),
                show(&other)
            )))
        }
    }
    for (flag, raw) in overrides {
        let key =
            flag_to_key(flag).ok_or_else(|| user_error(format!("command line: unknown flag {flag}")))?;
        let value = parse_flag_value(&key, raw)
            .map_err(|e| user_error(format!("command line: {flag} {raw}: {}", one_line(&e.to_string()))))?;
        entries.retain(|e| e.key != key);
        entries.push(Entry::new(key, value, Origin::Flag(format!("{flag} {raw}"))));
    }
    let (entries, used) = aliases::resolve(entries)?;
    Ok(Config { aliases: used, ..from_entries(path, &entries)? })
}

fn parse_flag_value(key: &str, raw: &str) -> Result<Value, serde_norway::Error> {
    if LIST_KEYS.contains(&key) && !raw.trim_start().starts_with('[') {
        serde_norway::from_str(&format!("[{raw}]"))
    } else {
        serde_norway::from_str(raw)
    }
}

fn from_entries(path: &Path, entries: &[Entry]) -> anyhow::Result<Config> {
    let known = known_keys();
    let mut map = Mapping::new();
    for Entry { key, value, origin, written, .. } in entries {
        if let Some(why) = refused::reason(key) {
            // `false` asks for what every run does.
            if *value == Value::Bool(false) {
                continue;
            }
            return Err(user_error(format!("{}: {} {why}", origin.describe(key), show(value))));
        }
        if !known.contains(key) {
            let hint = closest(key, &known).map(|k| format!(" (did you mean `{k}`?)")).unwrap_or_default();
            return Err(user_error(format!("{}: unknown key{hint}", origin.describe(key))));
        }
        // Deserialise each key alone first, so a type error names exactly its key and value.
        let mut single = Mapping::new();
        single.insert(Value::String(key.clone()), value.clone());
        if let Err(e) = serde_norway::from_value::<Config>(Value::Mapping(single)) {
            let msg = one_line(&e.to_string());
            // A name outside a key's set already quotes the value and lists the names, and
            // a flag's origin is the flag with its value.
            let bad_value = if msg.contains(" is not one of ") || matches!(origin, Origin::Flag(_)) {
                String::new()
            } else {
                format!("bad value {}: ", show(value))
            };
            return Err(user_error(format!("{}: {bad_value}{msg}", origin.describe(written))));
        }
        map.insert(Value::String(key.clone()), value.clone());
    }
    let config: Config = serde_norway::from_value(Value::Mapping(map))
        .map_err(|e| user_error(format!("config: {}", one_line(&e.to_string()))))?;
    let mut origins = Origins::file(path);
    for e in entries {
        origins.set(&e.key, &e.origin, &e.written);
    }
    let config = Config { origins, ..config };
    config.validate().map_err(|(key, msg)| config.key_error(key, msg))?;
    Ok(config)
}

/// The first key whose value differs between two configs written as YAML, as
/// "key `k`: a vs b" (for telling ranks that read different configs apart).
#[cfg(any(feature = "mpi", test))]
pub fn first_difference(a: &str, b: &str) -> String {
    let parse = |t: &str| match serde_norway::from_str::<Value>(t) {
        Ok(Value::Mapping(m)) => m,
        _ => Mapping::new(),
    };
    let (a, b) = (parse(a), parse(b));
    for key in known_keys() {
        let k = Value::String(key.clone());
        let (x, y) = (a.get(&k).unwrap_or(&Value::Null), b.get(&k).unwrap_or(&Value::Null));
        if x != y {
            return format!("key `{key}`: {} vs {}", show(x), show(y));
        }
    }
    "the configs differ".into()
}

/// A value in one line as a user writes it, a list in flow style: `[0.5, a.bin, 0.5, b.bin]`.
fn show(v: &Value) -> String {
    match v {
        Value::Sequence(items) => format!("[{}]", items.iter().map(show).collect::<Vec<_>>().join(", ")),
        _ => serde_norway::to_string(v).map(|s| one_line(s.trim())).unwrap_or_else(|_| format!("{v:?}")),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The flag of every config key, which train, simulate and bench take beside their own.
pub fn key_flags() -> Vec<String> {
    known_keys().iter().map(|k| key_to_flag(k)).collect()
}

/// The known key nearest to `key` by edit distance, if it is near enough to be a typo.
pub fn closest<'a>(key: &str, known: &'a [String]) -> Option<&'a String> {
    known.iter().map(|k| (edit_distance(key, k), k)).filter(|(d, _)| *d <= 3).min().map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The most microbatches a step may take. The schedule lists each one's passes on every
/// stage, and the simulator and the trainer walk that list: 16,384 is over 10 times GPT-3
/// 175B's published batch of 1,536 sequences taken one at a time on one replica (simulated
/// at 1T's p = 64 interleaved in about 1 GB), where a typo's 10^11 filled the memory
/// building it.
const MAX_MICROBATCHES: usize = 1 << 14;

fn positive(key: &'static str, v: usize) -> Result<(), (&'static str, String)> {
    if v == 0 {
        return Err((key, "must be at least 1, got 0".into()));
    }
    Ok(())
}

#[cfg(feature = "cuda")]
impl Precision {
    /// The CUDA device's mode for this precision: bf16 stores activations in bf16 and
    /// multiplies bf16 operands into fp32, over fp32 master weights.
    pub fn matmul(self) -> kernels::cuda::MatmulPrecision {
        match self {
            Precision::Fp32 => kernels::cuda::MatmulPrecision::Fp32,
            Precision::Bf16 => kernels::cuda::MatmulPrecision::Bf16,
        }
    }
}

impl Config {
    /// A user mistake in `key` found after loading, in one line that names where its value
    /// came from (the flag or the file) as the loader's own errors do.
    pub fn key_error(&self, key: &str, msg: impl std::fmt::Display) -> anyhow::Error {
        user_error(format!("{}: {msg}", self.origins.of(key)))
    }

    /// The key that asks for activation offload, which an error about what offload keeps
    /// in host memory names.
    pub fn offload_key(&self) -> &'static str {
        match self.fine_grained_activation_offloading {
            true => "fine_grained_activation_offloading",
            false => "cpu_offloading_activations",
        }
    }

    /// The config as YAML in canonical keys, headed by a comment for each alias it was
    /// written with: what a run dir keeps.
    pub fn to_yaml(&self) -> anyhow::Result<String> {
        let mut text: String = self.aliases.iter().map(|a| format!("# {}\n", a.describe())).collect();
        text.push_str(&serde_norway::to_string(self)?);
        Ok(text)
    }

    pub fn ffn_size(&self) -> usize {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    /// Microbatches per replica and step, as in Megatron: global / (micro x dp).
    pub fn num_microbatches(&self) -> usize {
        self.global_batch_size / (self.micro_batch_size * self.data_parallel())
    }

    /// Data-parallel replicas (1 when unset).
    pub fn data_parallel(&self) -> usize {
        self.data_parallel_size.unwrap_or(1)
    }

    /// The longest a rank waits on a peer (`distributed_timeout_minutes`; checked by
    /// [`Config::validate`]).
    pub fn distributed_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.distributed_timeout_minutes * 60.0)
    }

    /// The tensor-parallel layout every layer is simulated with.
    pub fn tensor_parallel(&self) -> stages::TensorParallel {
        stages::TensorParallel {
            size: self.tensor_model_parallel_size,
            sequence: self.sequence_parallel,
            distribute_saved: self.distribute_saved_activations,
        }
    }

    /// Model chunks per stage: `virtual_pipeline_model_parallel_size`, else what the schedule
    /// implies (2 for the V schedules, 1 for the others).
    pub fn virtual_stages(&self) -> usize {
        self.virtual_pipeline_model_parallel_size.unwrap_or_else(|| self.pipeline_schedule.default_chunks())
    }

    /// `recompute_granularity`, `none` where unset.
    pub fn granularity(&self) -> RecomputeGranularity {
        self.recompute_granularity.unwrap_or(RecomputeGranularity::None)
    }

    /// Checks values that are well-typed but impossible. Errors are (key, message).
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        positive("num_layers", self.num_layers)?;
        positive("hidden_size", self.hidden_size)?;
        positive("num_attention_heads", self.num_attention_heads)?;
        positive("seq_length", self.seq_length)?;
        positive("vocab_size", self.vocab_size)?;
        positive("micro_batch_size", self.micro_batch_size)?;
        positive("global_batch_size", self.global_batch_size)?;
        positive("pipeline_model_parallel_size", self.pipeline_model_parallel_size)?;
        if self.kv_channels == Some(0) {
            return Err(("kv_channels", "must be at least 1, got 0".into()));
        }
        if self.kv_channels.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err((
                "hidden_size",
                format!(
                    "{} is not a multiple of num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            ));
        }
        if self.ffn_hidden_size == Some(0) {
            return Err(("ffn_hidden_size", "must be at least 1, got 0".into()));
        }
        if self.seq_length > self.max_position_embeddings {
            return Err((
                "seq_length",
                format!(
                    "{} exceeds max_position_embeddings {}",
                    self.seq_length, self.max_position_embeddings
                ),
            ));
        }
        self.validate_family()?;
        if let Some(dp) = self.data_parallel_size {
            positive("data_parallel_size", dp)?;
        }
        self.validate_tensor_parallel()?;
        if !self.global_batch_size.is_multiple_of(self.micro_batch_size) {
            return Err((
                "global_batch_size",
                format!(
                    "{} is not a multiple of micro_batch_size {}",
                    self.global_batch_size, self.micro_batch_size
                ),
            ));
        }
        let dp = self.data_parallel();
        if self.micro_batch_size.checked_mul(dp).is_none_or(|n| !self.global_batch_size.is_multiple_of(n)) {
            return Err((
                "global_batch_size",
                format!(
                    "{} is not a multiple of micro_batch_size {} x data_parallel_size {dp}",
                    self.global_batch_size, self.micro_batch_size
                ),
            ));
        }
        if self.num_microbatches() > MAX_MICROBATCHES {
            return Err((
                "global_batch_size",
                format!(
                    "{} / (micro_batch_size {} x data_parallel_size {dp}) is {} microbatches a step; a schedule \
                     holds every pass of each, at most {MAX_MICROBATCHES} microbatches",
                    self.global_batch_size,
                    self.micro_batch_size,
                    self.num_microbatches()
                ),
            ));
        }
        for (key, p) in
            [("hidden_dropout", self.hidden_dropout), ("attention_dropout", self.attention_dropout)]
        {
            if !(0.0..1.0).contains(&p) {
                return Err((key, format!("{p} is not a probability in [0, 1)")));
            }
        }
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(("lr", format!("{} must be a finite number >= 0", self.lr)));
        }
        if !(self.min_lr.is_finite() && self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return Err(("min_lr", format!("{} must be between 0 and lr {}", self.min_lr, self.lr)));
        }
        for (key, b) in [("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err((key, format!("{b} must be in [0, 1)")));
            }
        }
        if self.adam_eps.is_nan() || self.adam_eps <= 0.0 {
            return Err(("adam_eps", format!("{} must be > 0", self.adam_eps)));
        }
        if self.clip_grad.is_nan() || self.clip_grad < 0.0 {
            return Err(("clip_grad", format!("{} must be >= 0 (0 disables clipping)", self.clip_grad)));
        }
        let minutes = self.distributed_timeout_minutes;
        if !(minutes > 0.0 && std::time::Duration::try_from_secs_f64(minutes * 60.0).is_ok()) {
            return Err((
                "distributed_timeout_minutes",
                format!("{minutes} must be a number of minutes > 0"),
            ));
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return Err(("weight_decay", format!("{} must be >= 0", self.weight_decay)));
        }
        if self.precision == Precision::Bf16 && self.device == DeviceKind::Cpu {
            return Err(("precision", "bf16 needs device: cuda; the CPU backend computes in fp32".into()));
        }
        let kind = self.pipeline_schedule;
        if let Some(v) = self.virtual_pipeline_model_parallel_size {
            positive("virtual_pipeline_model_parallel_size", v)?;
            let key = "virtual_pipeline_model_parallel_size";
            if kind.is_v() && v != 2 {
                return Err((
                    key,
                    format!(
                        "{v} does not fit pipeline_schedule: {kind}, which places 2 chunks per stage in a V \
                         (leave it unset or 2)"
                    ),
                ));
            }
            if !kind.is_v() && v > 1 && kind != ScheduleKind::Interleaved1F1B {
                return Err((key, format!("{v} needs pipeline_schedule: interleaved-1f1b, got `{kind}`")));
            }
        }
        self.validate_recompute()?;
        self.validate_offload()
    }

    /// The model family's flags: each alone and together as Megatron allows them, and on
    /// the devices whose kernels exist.
    fn validate_family(&self) -> Result<(), (&'static str, String)> {
        for (key, x) in [("norm_epsilon", self.norm_epsilon), ("init_method_std", self.init_method_std)] {
            if !(x.is_finite() && x > 0.0) {
                return Err((key, format!("{x} must be a finite number > 0")));
            }
        }
        let heads = self.num_attention_heads;
        match (self.group_query_attention, self.num_query_groups) {
            (false, Some(g)) => {
                return Err(("num_query_groups", format!("{g} needs group_query_attention: true")));
            }
            (true, None) => {
                return Err((
                    "group_query_attention",
                    "true needs num_query_groups, the key/value heads".into(),
                ));
            }
            (true, Some(g)) if g == 0 || !heads.is_multiple_of(g) => {
                return Err(("num_query_groups", format!("{g} does not divide num_attention_heads {heads}")));
            }
            _ => {}
        }
        let activations =
            [("swiglu", self.swiglu), ("squared_relu", self.squared_relu), ("geglu", self.geglu)];
        if let [first, second, ..] =
            activations.iter().filter(|(_, on)| *on).map(|(key, _)| *key).collect::<Vec<_>>()[..]
        {
            return Err((second, format!("true and {first}: true are two activations for one MLP; set one")));
        }
        if let Some(m) = self.embedding_multiplier.filter(|m| !(m.is_finite() && *m > 0.0)) {
            return Err(("embedding_multiplier", format!("{m} must be a finite number > 0")));
        }
        if self.qk_layernorm && self.apply_layernorm_1p {
            return Err((
                "qk_layernorm",
                "true beside apply_layernorm_1p: pipetrain's QK-norm weights are plain, not zero-centred"
                    .into(),
            ));
        }
        if self.qk_layernorm && self.normalization != Norm::RmsNorm {
            return Err((
                "qk_layernorm",
                format!(
                    "true needs normalization: RMSNorm (QK-norm here is RMSNorm's), not {}",
                    self.normalization
                ),
            ));
        }
        if self.qk_norm_span == QkNormSpan::Projection && !self.qk_layernorm {
            return Err(("qk_norm_span", "projection needs qk_layernorm: true".into()));
        }
        self.validate_window()?;
        let rope = self.position_embedding_type == PositionEmbeddingType::Rope;
        if self.use_rope_scaling && !rope {
            return Err(("use_rope_scaling", "true needs position_embedding_type: rope".into()));
        }
        match (self.use_rope_scaling, self.rope_scaling_factor) {
            (false, Some(f)) => {
                return Err(("rope_scaling_factor", format!("{f} needs use_rope_scaling: true")))
            }
            (true, Some(f)) if !kernels::rope_frequencies::is_llama3_factor(f as f64) => {
                return Err(("rope_scaling_factor", format!("{f} must be a finite number >= 1")));
            }
            _ => {}
        }
        if self.rotary_percent != 1.0 {
            let p = self.rotary_percent;
            if !rope {
                return Err(("rotary_percent", format!("{p} needs position_embedding_type: rope")));
            }
            let rot = rotary_dims_of(p, self.head_size());
            if !(p > 0.0 && p < 1.0) || rot == 0 || !rot.is_multiple_of(2) {
                return Err((
                    "rotary_percent",
                    format!(
                        "{p} must be above 0 and below 1 and turn an even number of channels; it turns {rot} of \
                         a head of {}",
                        self.head_size()
                    ),
                ));
            }
        }
        if rope {
            if !(self.rotary_base.is_finite() && self.rotary_base > 1.0) {
                return Err(("rotary_base", format!("{} must be a finite number > 1", self.rotary_base)));
            }
            let head_size = self.head_size();
            if !head_size.is_multiple_of(2) {
                return Err((
                    "position_embedding_type",
                    format!(
                        "rope rotates pairs of channels and needs an even head size; {}",
                        self.head_size_said()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The sliding window's keys: causal, and a skip frequency only beside a window.
    fn validate_window(&self) -> Result<(), (&'static str, String)> {
        let Some([left, right]) = self.window_size else {
            return match self.window_attn_skip_freq {
                Some(n) => Err(("window_attn_skip_freq", format!("{n} needs window_size"))),
                None => Ok(()),
            };
        };
        if left >= i32::MAX as usize {
            return Err(("window_size", format!("[{left}, {right}]: left must be below {}", i32::MAX)));
        }
        if right != 0 {
            return Err((
                "window_size",
                format!("[{left}, {right}]: the attention is causal, so no query sees a key after it; right must be 0"),
            ));
        }
        if let Some(n) = self.window_attn_skip_freq.filter(|&n| n < 2) {
            return Err((
                "window_attn_skip_freq",
                format!("{n} must be at least 2: every Nth layer sees every key, and the others the window"),
            ));
        }
        Ok(())
    }

    /// The model's architecture, as the family flags describe it.
    pub fn architecture(&self) -> Architecture {
        Architecture {
            norm: self.normalization,
            norm_eps: self.norm_epsilon,
            norm_placement: self.norm_placement,
            zero_centered_gamma: self.apply_layernorm_1p,
            positions: match self.position_embedding_type {
                PositionEmbeddingType::LearnedAbsolute => Positions::Learned,
                PositionEmbeddingType::Rope => Positions::Rotary(RopeFrequencies {
                    base: self.rotary_base,
                    llama3_factor: self
                        .use_rope_scaling
                        .then(|| self.rope_scaling_factor.unwrap_or(MEGATRON_ROPE_SCALING_FACTOR)),
                    rotary_dims: (self.rotary_percent != 1.0)
                        .then(|| rotary_dims_of(self.rotary_percent, self.head_size())),
                }),
            },
            activation: match (self.swiglu, self.squared_relu, self.geglu) {
                (true, ..) => Activation::SwiGlu,
                (false, true, _) => Activation::SquaredRelu,
                (false, false, true) => Activation::GeGlu,
                (false, false, false) => Activation::Gelu,
            },
            biases: match (self.disable_bias_linear, self.add_qkv_bias) {
                (false, _) => LinearBiases::All,
                (true, true) => LinearBiases::QkvOnly,
                (true, false) => LinearBiases::NoBiases,
            },
            qk_norm: self.qk_layernorm,
            qk_norm_span: self.qk_norm_span,
            sliding_window: self
                .window_size
                .map(|[left, _]| SlidingWindow { keys: left + 1, full_every: self.window_attn_skip_freq }),
            tied_output: !self.untie_embeddings_and_output_weights,
            embedding_multiplier: self.embedding_multiplier,
            init_std: self.init_method_std,
        }
    }

    /// The head size: `kv_channels`, else hidden_size / num_attention_heads.
    pub fn head_size(&self) -> usize {
        self.kv_channels.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Where the head size comes from, and what it is, for a refusal.
    fn head_size_said(&self) -> String {
        match self.kv_channels {
            Some(k) => format!("kv_channels is {k}"),
            None => format!(
                "hidden_size {} / num_attention_heads {} is {}",
                self.hidden_size,
                self.num_attention_heads,
                self.head_size()
            ),
        }
    }

    /// The head size where the tensor-core attention kernels, the only ones for bf16
    /// activations on CUDA, take it; else what they need, worded to follow "need" in a
    /// refusal.
    pub fn tensor_core_head_size(&self) -> Result<usize, String> {
        let head_size = self.head_size();
        if kernels::attention_mma_fits(head_size) {
            return Ok(head_size);
        }
        let source = match self.kv_channels {
            Some(_) => "kv_channels",
            None => "hidden_size / num_attention_heads",
        };
        Err(format!(
            "a head size ({source}) that is a multiple of {} up to {}, got {head_size}",
            kernels::ATTENTION_MMA_K,
            kernels::ATTENTION_MMA_MAX_HEAD_SIZE
        ))
    }

    /// Key/value heads: num_query_groups with grouped-query attention, else the heads.
    pub fn kv_heads(&self) -> usize {
        self.num_query_groups.filter(|_| self.group_query_attention).unwrap_or(self.num_attention_heads)
    }

    /// Megatron's divisibility rules for t: heads and the MLP split across ranks, and with
    /// sequence parallelism the sequence too.
    fn validate_tensor_parallel(&self) -> Result<(), (&'static str, String)> {
        let t = self.tensor_model_parallel_size;
        positive("tensor_model_parallel_size", t)?;
        let splits = [
            ("num_attention_heads", self.num_attention_heads, true),
            ("num_query_groups", self.kv_heads(), self.group_query_attention),
            ("ffn_hidden_size", self.ffn_size(), true),
            ("seq_length", self.seq_length, self.sequence_parallel),
        ];
        for (what, n, applies) in splits {
            if applies && !n.is_multiple_of(t) {
                return Err(("tensor_model_parallel_size", format!("{t} does not divide {what} {n}")));
            }
        }
        // Megatron's rules: across the tensor-parallel group, of full recompute's inputs,
        // and not where sequence parallelism already splits them.
        let distribute = "distribute_saved_activations";
        match self.distribute_saved_activations {
            false => Ok(()),
            true if t == 1 => Err((
                distribute,
                "true needs tensor_model_parallel_size > 1: the saved inputs are split over its ranks".into(),
            )),
            true if self.granularity() != RecomputeGranularity::Full => Err((
                distribute,
                "true needs recompute_granularity: full: it splits the inputs full recompute keeps".into(),
            )),
            true if self.sequence_parallel => Err((
                distribute,
                "true is not allowed with sequence_parallel, which already splits those inputs".into(),
            )),
            true => Ok(()),
        }
    }

    /// A per-stage list (`key`) has an entry for each pipeline stage.
    fn one_per_stage(&self, key: &'static str, per_stage: &[usize]) -> Result<(), (&'static str, String)> {
        match per_stage.len() == self.pipeline_model_parallel_size {
            true => Ok(()),
            false => Err((
                key,
                format!(
                    "{per_stage:?} has {} entries, pipeline_model_parallel_size is {}",
                    per_stage.len(),
                    self.pipeline_model_parallel_size
                ),
            )),
        }
    }

    fn validate_recompute(&self) -> Result<(), (&'static str, String)> {
        match self.granularity() {
            RecomputeGranularity::None => {
                if let Some(m) = &self.recompute_method {
                    return Err(("recompute_method", format!("`{m}` needs recompute_granularity: full")));
                }
                if let Some(n) = self.recompute_num_layers {
                    return Err(("recompute_num_layers", format!("{n} needs recompute_granularity: full")));
                }
            }
            RecomputeGranularity::Full => {
                if self.recompute_method.is_none() {
                    return Err((
                        "recompute_method",
                        "recompute_granularity full needs recompute_method uniform or block".into(),
                    ));
                }
                match (self.recompute_num_layers, &self.recompute_num_layers_per_stage) {
                    (Some(0), _) => {
                        return Err(("recompute_num_layers", "must be at least 1, got 0".into()));
                    }
                    (None, None) => {
                        return Err((
                            "recompute_num_layers",
                            "recompute_granularity full needs recompute_num_layers N >= 1".into(),
                        ))
                    }
                    (Some(_), Some(_)) => {
                        return Err((
                            "recompute_num_layers_per_stage",
                            "set either recompute_num_layers or recompute_num_layers_per_stage, not both"
                                .into(),
                        ))
                    }
                    _ => {}
                }
                if let Some(per_stage) = &self.recompute_num_layers_per_stage {
                    self.one_per_stage("recompute_num_layers_per_stage", per_stage)?;
                }
                if self.recompute_modules.is_some() {
                    return Err((
                        "recompute_modules",
                        "applies to recompute_granularity: selective only".into(),
                    ));
                }
            }
            RecomputeGranularity::Selective => {
                if let Some(n) = self.recompute_num_layers {
                    return Err((
                        "recompute_num_layers",
                        format!("{n} must be unset with recompute_granularity: selective"),
                    ));
                }
                if self.recompute_num_layers_per_stage.is_some() {
                    return Err((
                        "recompute_num_layers_per_stage",
                        "must be unset with recompute_granularity: selective".into(),
                    ));
                }
                if let Some(m) = &self.recompute_method {
                    return Err((
                        "recompute_method",
                        format!("`{m}` must be unset with recompute_granularity: selective"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Loads `text` with `overrides`; errors with the file's path shown as `c.yaml`.
    fn load_text(text: &str, overrides: &[(&str, &str)]) -> Result<Config, String> {
        // One directory per call: the tests run in parallel.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pipetrain-config-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = write(&dir, "c.yaml", text);
        let ov: Vec<(String, String)> =
            overrides.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        load(&p, &ov).map_err(|e| {
            assert!(crate::error::is_user_error(&e));
            e.to_string().replace(&p.display().to_string(), "c.yaml")
        })
    }

    fn err_of(text: &str, overrides: &[(&str, &str)]) -> String {
        load_text(text, overrides).unwrap_err()
    }

    /// The settings alone, however they were spelled and wherever they came from.
    fn settings(cfg: Config) -> Config {
        Config { aliases: vec![], origins: Origins::default(), ..cfg }
    }

    /// A check made after loading (the schedule's shape, the split of the layers, the MPI
    /// world) names where the key's value came from as the loader does: the flag that set
    /// it, else the file's line as written (an alias's name included), else the key unset.
    #[test]
    fn a_later_error_names_the_flag_or_the_file_that_set_the_key() {
        let cfg = load_text(
            "pipeline_model_parallel_size: 4\nrecompute_granularity: full\nrecompute_method: block\n\
             checkpoint_num_layers: 2\npipeline_schedule: gpipe\n",
            &[("--pipeline-schedule", "zb-v")],
        )
        .unwrap();
        let line = |key| cfg.key_error(key, "why").to_string();
        assert_eq!(line("pipeline_schedule"), "command line: --pipeline-schedule zb-v: why");
        let file = cfg.origins.of("seed").replace(" key `seed` (unset)", "");
        assert!(file.ends_with("c.yaml:"), "{file}");
        assert_eq!(
            line("pipeline_model_parallel_size"),
            format!("{file} key `pipeline_model_parallel_size`: why")
        );
        assert_eq!(line("recompute_num_layers"), format!("{file} key `checkpoint_num_layers`: why"));
        assert_eq!(line("seed"), format!("{file} key `seed` (unset): why"));
        assert!(crate::error::is_user_error(&cfg.key_error("seed", "why")));
        // A config built in code has no file to name.
        assert_eq!(Config::default().key_error("seed", "why").to_string(), "key `seed`: why");
    }

    #[test]
    fn megatrons_document_switches_are_refused_unless_false() {
        let why = "is not supported: a window that spans a document boundary trains as one sequence (set it \
                   false or remove it)";
        assert_eq!(err_of("eod_mask_loss: true\n", &[]), format!("c.yaml: key `eod_mask_loss`: true {why}"));
        assert_eq!(
            err_of("", &[("--reset-position-ids", "true")]),
            format!("command line: --reset-position-ids true: true {why}")
        );
        assert_eq!(settings(load_text("reset_attention_mask: false\n", &[]).unwrap()), Config::default());
        let args = ["--reset-attention-mask", "--lr", "1"].map(String::from);
        let (overrides, rest) = split_overrides(&args).unwrap();
        assert_eq!(
            overrides,
            [("--reset-attention-mask".into(), "true".into()), ("--lr".into(), "1".into())]
        );
        assert!(rest.is_empty());
    }

    #[test]
    fn a_data_path_is_one_path_shards_or_a_blend() {
        let cfg =
            load_text("train_data_path: [0.7, a, 0.3, 'b_*.bin']\nvalid_data_path: v.bin\n", &[]).unwrap();
        assert_eq!(
            cfg.train_data_path,
            Some(DataPath::Blend(vec![(0.7, "a".into()), (0.3, "b_*.bin".into())]))
        );
        assert_eq!(cfg.valid_data_path, Some(DataPath::One("v.bin".into())));
        let cli = load_text("", &[("--train-data-path", "[s_000.bin, s_001.bin]")]).unwrap();
        assert_eq!(cli.train_data_path, Some(DataPath::Shards(vec!["s_000.bin".into(), "s_001.bin".into()])));
        // What a run dir keeps loads back to the same config.
        let again = load_text(&cfg.to_yaml().unwrap(), &[]).unwrap();
        assert_eq!(settings(again), settings(cfg));
        assert_eq!(
            err_of("train_data_path: [0.5, a, 0.5]\n", &[]),
            "c.yaml: key `train_data_path`: bad value [0.5, a, 0.5]: a blend is [weight, prefix, weight, prefix, \
             ...]; 3 entries do not pair up"
        );
    }

    #[test]
    fn aliases_resolve_to_their_canonical_spelling() {
        let full = |n: usize| {
            format!("recompute_granularity: full\nrecompute_method: uniform\nrecompute_num_layers: {n}\n")
        };
        let block2 = "recompute_granularity: full\nrecompute_method: block\n";
        type Overrides<'a> = &'a [(&'a str, &'a str)];
        let cases: [(&str, Overrides, String); 9] = [
            (
                "checkpoint_num_layers: 2\nrecompute_granularity: full\nrecompute_method: block\n",
                &[],
                format!("{block2}recompute_num_layers: 2\n"),
            ),
            ("checkpoint_activations: true\n", &[], full(1)),
            ("checkpoint_activations: true\ncheckpoint_num_layers: 3\n", &[], full(3)),
            ("checkpoint_activations: true\nrecompute_num_layers: 3\n", &[], full(3)),
            ("checkpoint_activations: false\n", &[], String::new()),
            ("recompute_activations: true\n", &[], "recompute_granularity: selective\n".into()),
            ("use_activation_checkpoint: true\n", &[], full(1)),
            ("", &[("--checkpoint-activations", "true"), ("--checkpoint-num-layers", "2")], full(2)),
            // The command line beats the file key by key, whatever the spelling.
            ("recompute_granularity: selective\n", &[("--use-activation-checkpoint", "true")], full(1)),
        ];
        for (aliased, overrides, canonical) in cases {
            let got = load_text(aliased, overrides).unwrap();
            assert!(!got.aliases.is_empty() || aliased.contains("false"), "{aliased}");
            assert_eq!(settings(got), settings(load_text(&canonical, &[]).unwrap()), "{aliased}");
        }
        let c = load_text("checkpoint_activations: true\ncheckpoint_num_layers: 2\n", &[]).unwrap();
        let describe: Vec<String> = c.aliases.iter().map(AliasUse::describe).collect();
        assert_eq!(
            describe,
            [
                "recompute_granularity: full, recompute_method: uniform (given as checkpoint_activations: true)",
                "recompute_num_layers: 2 (given as checkpoint_num_layers: 2)"
            ]
        );
        assert!(c.to_yaml().unwrap().starts_with(
            "# recompute_granularity: full, recompute_method: uniform (given as checkpoint_activations: true)\n\
             # recompute_num_layers: 2 (given as checkpoint_num_layers: 2)\nnum_layers: 12\n"
        ));
    }

    #[test]
    fn an_alias_and_its_canonical_key_must_agree() {
        assert_eq!(
            err_of("checkpoint_num_layers: 2\nrecompute_num_layers: 3\nrecompute_granularity: full\n", &[]),
            "c.yaml: `checkpoint_num_layers: 2` and c.yaml: `recompute_num_layers: 3` disagree on recompute_num_layers: 2 vs 3"
        );
        assert_eq!(
            err_of("checkpoint_activations: true\nrecompute_granularity: selective\n", &[]),
            "c.yaml: `checkpoint_activations: true` and c.yaml: `recompute_granularity: selective` disagree on recompute_granularity: full vs selective"
        );
        assert_eq!(
            err_of("recompute_activations: true\nuse_activation_checkpoint: true\n", &[]),
            "c.yaml: `recompute_activations: true` and c.yaml: `use_activation_checkpoint: true` disagree on recompute_granularity: selective vs full"
        );
        assert_eq!(
            err_of("use_activation_checkpoint: true\nrecompute_method: block\n", &[]),
            "c.yaml: `use_activation_checkpoint: true` and c.yaml: `recompute_method: block` disagree on recompute_method: uniform vs block"
        );
        assert_eq!(
            err_of("use_activation_checkpoint: true\ncheckpoint_num_layers: 2\n", &[]),
            "c.yaml: `use_activation_checkpoint: true` and c.yaml: `checkpoint_num_layers: 2` disagree on recompute_num_layers: 1 vs 2"
        );
        assert_eq!(
            err_of("", &[("--recompute-activations", "true"), ("--recompute-granularity", "full")]),
            "command line: --recompute-activations true and command line: --recompute-granularity full disagree on recompute_granularity: selective vs full"
        );
        assert_eq!(
            err_of("checkpoint_activations: yes\n", &[]),
            "c.yaml: key `checkpoint_activations`: bad value yes: expected true or false"
        );
        assert_eq!(
            err_of("checkpoint_num_layers: -1\n", &[]),
            "c.yaml: key `checkpoint_num_layers`: bad value -1: expected a number of layers"
        );
        // The canonical checks name the alias the value came from.
        assert_eq!(
            err_of("recompute_activations: true\nrecompute_num_layers: 2\n", &[]),
            "c.yaml: key `recompute_num_layers`: 2 must be unset with recompute_granularity: selective"
        );
        assert_eq!(
            err_of("checkpoint_num_layers: 2\n", &[]),
            "c.yaml: key `checkpoint_num_layers`: 2 needs recompute_granularity: full"
        );
    }

    #[test]
    fn cli_beats_yaml_and_lists_parse_from_commas() {
        let dir = std::env::temp_dir().join(format!("pipetrain-config-ok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = write(&dir, "c.yaml", "hidden_size: 64\nnum_attention_heads: 4\nseq_length: 32\n");
        let ov = vec![
            ("--hidden-size".to_string(), "128".to_string()),
            ("--recompute-granularity".into(), "selective".into()),
            ("--recompute-modules".into(), "core_attn,mlp".into()),
        ];
        let c = load(&p, &ov).unwrap();
        assert_eq!(c.hidden_size, 128);
        assert_eq!(c.seq_length, 32);
        assert_eq!(c.recompute_granularity, Some(RecomputeGranularity::Selective));
        assert_eq!(c.recompute_modules, Some(vec![RecomputeModule::CoreAttn, RecomputeModule::Mlp]));
    }

    /// Megatron's pair reads as the window of left + 1 keys, every Nth layer full where the
    /// frequency says so.
    #[test]
    fn window_size_is_megatrons_left_and_right() {
        let windowed = load_text("", &[("--window-size", "63,0"), ("--window-attn-skip-freq", "4")]).unwrap();
        let window = windowed.architecture().sliding_window;
        assert_eq!(window, Some(SlidingWindow { keys: 64, full_every: Some(4) }));
    }

    #[test]
    fn errors_name_file_key_and_value() {
        assert_eq!(
            err_of("hiden_size: 64\n", &[]),
            "c.yaml: key `hiden_size`: unknown key (did you mean `hidden_size`?)"
        );
        let wrong_type = err_of("hidden_size: abc\n", &[]);
        assert!(wrong_type.starts_with("c.yaml: key `hidden_size`: bad value abc: "), "{wrong_type}");
        assert_eq!(
            err_of("hidden_size: 100\nnum_attention_heads: 12\n", &[]),
            "c.yaml: key `hidden_size`: 100 is not a multiple of num_attention_heads 12"
        );
        assert_eq!(
            err_of("micro_batch_size: 3\nglobal_batch_size: 8\n", &[]),
            "c.yaml: key `global_batch_size`: 8 is not a multiple of micro_batch_size 3"
        );
        // A step of more microbatches than a schedule lists is refused before one is built;
        // the most it takes loads.
        assert_eq!(
            err_of("micro_batch_size: 2\nglobal_batch_size: 65538\n", &[]),
            "c.yaml: key `global_batch_size`: 65538 / (micro_batch_size 2 x data_parallel_size 1) is 32769 \
             microbatches a step; a schedule holds every pass of each, at most 16384 microbatches"
        );
        assert_eq!(
            load_text("global_batch_size: 16384\n", &[]).unwrap().num_microbatches(),
            MAX_MICROBATCHES
        );
        // micro_batch_size x data_parallel_size past usize divides nothing; it does not wrap.
        assert_eq!(
            err_of("micro_batch_size: 4294967296\ndata_parallel_size: 4294967296\nglobal_batch_size: 4294967296\n", &[]),
            "c.yaml: key `global_batch_size`: 4294967296 is not a multiple of micro_batch_size 4294967296 x \
             data_parallel_size 4294967296"
        );
        assert_eq!(
            err_of("seq_length: 2048\n", &[]),
            "c.yaml: key `seq_length`: 2048 exceeds max_position_embeddings 1024"
        );
        assert_eq!(
            err_of("seq_length: 64\n", &[("--seq-length", "4096")]),
            "command line: --seq-length 4096: 4096 exceeds max_position_embeddings 1024"
        );
        assert!(err_of("a: [1, 2\n", &[]).starts_with("c.yaml: malformed YAML: "));
        assert_eq!(
            err_of("- 1\n- 2\n", &[]),
            "c.yaml: a config is one flat mapping of keys to values, found [1, 2]"
        );
    }

    #[test]
    fn recompute_combinations_are_checked() {
        assert_eq!(
            err_of("recompute_granularity: selective\nrecompute_num_layers: 2\n", &[]),
            "c.yaml: key `recompute_num_layers`: 2 must be unset with recompute_granularity: selective"
        );
        assert_eq!(
            err_of("recompute_granularity: full\nrecompute_num_layers: 2\n", &[]),
            "c.yaml: key `recompute_method` (unset): recompute_granularity full needs recompute_method uniform or block"
        );
        assert_eq!(
            err_of("recompute_granularity: full\nrecompute_method: block\n", &[]),
            "c.yaml: key `recompute_num_layers` (unset): recompute_granularity full needs recompute_num_layers N >= 1"
        );
        assert_eq!(
            err_of("recompute_granularity: full\nrecompute_method: block\nrecompute_num_layers: 0\n", &[]),
            "c.yaml: key `recompute_num_layers`: must be at least 1, got 0"
        );
        assert_eq!(
            err_of("recompute_granularity: selective\nrecompute_modules: [attn]\n", &[]),
            "c.yaml: key `recompute_modules`: `attn` is not one of core_attn, mlp, layernorm"
        );
    }

    /// A key the parser accepts but nothing reads is a key that silently does nothing. Every
    /// key must be read as a field (`.key`) somewhere in the program's code outside the
    /// tests; a key read only to be validated or echoed does not count, so the scan skips
    /// `validate*` functions, the test modules and the `Default` impl.
    #[test]
    fn every_parsed_key_is_read() {
        let mut code = String::new();
        let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    code.push_str(&program_code(&std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        let unread: Vec<String> = known_keys()
            .into_iter()
            .filter(|key| {
                !code.match_indices(&format!(".{key}")).any(|(i, m)| {
                    let next = code[i + m.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            })
            .collect();
        assert!(unread.is_empty(), "parsed but never read: {unread:?}");
    }

    /// `text` without its test modules, its `validate*` functions and `Default` impls: the
    /// code that acts on a config. Items are cut from their header to the next line that
    /// closes a block at the header's indentation.
    fn program_code(text: &str) -> String {
        let cut = |line: &str| {
            let t = line.trim_start();
            t.starts_with("mod tests")
                || t.starts_with("impl Default for")
                || t.starts_with("fn validate")
                || t.starts_with("pub fn validate")
        };
        let mut out = String::new();
        let mut skipping: Option<usize> = None;
        for line in text.lines() {
            let indent = line.len() - line.trim_start().len();
            match skipping {
                Some(at) => {
                    if indent == at && line.trim_start().starts_with('}') {
                        skipping = None;
                    }
                }
                None if cut(line) => skipping = Some(indent),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }

    #[test]
    fn the_first_differing_key_is_named() {
        assert_eq!(first_difference("lr: 0.1\nseed: 3\n", "lr: 0.1\nseed: 4\n"), "key `seed`: 3 vs 4");
    }

    #[test]
    fn overrides_split_from_other_flags() {
        let args: Vec<String> = ["--config", "x.yaml", "--lr", "0.1", "--train-iters=5", "--trace", "t.json"]
            .map(String::from)
            .into();
        let (ov, rest) = split_overrides(&args).unwrap();
        assert_eq!(ov, vec![("--lr".into(), "0.1".into()), ("--train-iters".into(), "5".into())]);
        assert_eq!(rest, ["--config", "x.yaml", "--trace", "t.json"].map(String::from));
    }

    #[test]
    fn a_switch_needs_no_value() {
        let args: Vec<String> = [
            "--recompute-activations",
            "--config",
            "x.yaml",
            "--use-activation-checkpoint",
            "false",
            "--checkpoint-activations",
        ]
        .map(String::from)
        .into();
        let (ov, rest) = split_overrides(&args).unwrap();
        let want = [
            ("--recompute-activations", "true"),
            ("--use-activation-checkpoint", "false"),
            ("--checkpoint-activations", "true"),
        ];
        assert_eq!(ov, want.map(|(f, v)| (f.to_string(), v.to_string())));
        assert_eq!(rest, ["--config", "x.yaml"].map(String::from));
        let err = split_overrides(&["--checkpoint-num-layers".to_string()]).unwrap_err();
        assert_eq!(err.to_string(), "command line: --checkpoint-num-layers needs a value");
    }
}
