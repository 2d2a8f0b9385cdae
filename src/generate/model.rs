//! GPT-2 inference, layer by layer, with a KV cache: each position's keys and values are
//! computed once and kept, so a new token costs one position's forward, attending to the
//! cached ones. The matmuls, LayerNorms, GELU and residual adds are the device's training
//! kernels; the attention of one new query over the cache is computed here, on the host,
//! as the training kernel works on whole [T,T] blocks.
//!
//! Shapes: C channels, NH heads of HS = C / NH, F MLP width, V vocabulary.

use crate::checkpoint::{HfGpt2Config, NamedTensor};
use kernels::cpu::math::{dot, exp, max, sum};
use kernels::cpu::CpuDevice;
use kernels::{Category, Device, Tensor, WeightLayout};

/// One transformer block's parameters, in Hugging Face's names and layout.
struct Block {
    ln_1: (Tensor, Tensor),      // [C], [C]
    c_attn: (Tensor, Tensor),    // [C,3C], [3C]
    attn_proj: (Tensor, Tensor), // [C,C], [C]
    ln_2: (Tensor, Tensor),      // [C], [C]
    c_fc: (Tensor, Tensor),      // [C,F], [F]
    mlp_proj: (Tensor, Tensor),  // [F,C], [C]
}

/// The keys and values of every position seen so far, per layer.
pub struct KvCache {
    /// [positions, C] per layer: each, K and V.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    positions: usize,
}

pub struct Gpt2 {
    dev: CpuDevice,
    pub config: HfGpt2Config,
    /// Host copies of the embeddings: a new position's row is gathered at its own index.
    wte_host: Vec<f32>, // [V,C]
    wpe_host: Vec<f32>, // [maxT,C]
    wte: Tensor,        // [V,C], the tied LM head
    blocks: Vec<Block>,
    ln_f: (Tensor, Tensor), // [C], [C]
}

impl Gpt2 {
    /// The model from checkpoint tensors (names and shapes already checked against `config`).
    pub fn new(config: &HfGpt2Config, weights: &[NamedTensor]) -> Gpt2 {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let dev = CpuDevice::new(threads);
        let host = |name: &str| {
            &weights.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("checked tensor {name}")).data
        };
        let on_dev = |name: &str| {
            let t =
                weights.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("checked tensor {name}"));
            dev.from_host(&t.data, &t.shape, Category::Parameters)
        };
        let pair = |prefix: String| (on_dev(&format!("{prefix}.weight")), on_dev(&format!("{prefix}.bias")));
        let blocks = (0..config.n_layer)
            .map(|i| Block {
                ln_1: pair(format!("h.{i}.ln_1")),
                c_attn: pair(format!("h.{i}.attn.c_attn")),
                attn_proj: pair(format!("h.{i}.attn.c_proj")),
                ln_2: pair(format!("h.{i}.ln_2")),
                c_fc: pair(format!("h.{i}.mlp.c_fc")),
                mlp_proj: pair(format!("h.{i}.mlp.c_proj")),
            })
            .collect();
        Gpt2 {
            wte_host: host("wte.weight").clone(),
            wpe_host: host("wpe.weight").clone(),
            wte: on_dev("wte.weight"),
            ln_f: pair("ln_f".into()),
            blocks,
            config: config.clone(),
            dev,
        }
    }

    pub fn empty_cache(&self) -> KvCache {
        KvCache { layers: vec![(Vec::new(), Vec::new()); self.config.n_layer], positions: 0 }
    }

    /// Runs `tokens` at the positions after the cached ones, adds their keys and values to
    /// `cache`, and returns the logits [V] that follow the last of them. The caller keeps
    /// the positions within `n_positions`.
    ///
    /// Positions run one at a time, even a prompt's: gemm takes another path for a single
    /// row than for several, so a row's numbers would otherwise depend on how many rows ran
    /// with it, and a cached step would not match a full forward to the bit.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Vec<f32> {
        let mut last = None;
        for &token in tokens {
            last = Some(self.position(token, cache));
        }
        self.logits(&last.expect("at least one token"))
    }

    /// The blocks' output [1,C] for `token` at the next position, its keys and values added
    /// to the cache.
    fn position(&self, token: u32, cache: &mut KvCache) -> Tensor {
        let dev = &self.dev;
        let (c, pos) = (self.config.n_embd, cache.positions);
        assert!(pos < self.config.n_positions, "position {pos} past the model's");
        let new = |width: usize| dev.empty(&[1, width], Category::Workspace);
        let (tok, at) = (token as usize * c, pos * c);
        let x_host: Vec<f32> = (0..c).map(|d| self.wte_host[tok + d] + self.wpe_host[at + d]).collect();
        let mut x = dev.from_host(&x_host, &[1, c], Category::Workspace); // [1,C]
        let mut ln = new(c); // [1,C]
        let (mut mean, mut rstd) = (new(1), new(1)); // [1] each
        for (block, (keys, values)) in self.blocks.iter().zip(&mut cache.layers) {
            dev.layernorm_forward(&mut ln, &mut mean, &mut rstd, &x, &block.ln_1.0, &block.ln_1.1, 1e-5);
            let mut qkv = new(3 * c); // [1,3C]
            dev.matmul_forward(&mut qkv, &ln, &block.c_attn.0, WeightLayout::InOut, Some(&block.c_attn.1));
            let qkv = dev.to_host(&qkv);
            keys.extend_from_slice(&qkv[c..2 * c]);
            values.extend_from_slice(&qkv[2 * c..]);
            let att = attend(&qkv[..c], keys, values, self.config.n_head); // [C]
            let att = dev.from_host(&att, &[1, c], Category::Workspace); // [1,C]
            let mut proj = new(c); // [1,C]
            dev.matmul_forward(
                &mut proj,
                &att,
                &block.attn_proj.0,
                WeightLayout::InOut,
                Some(&block.attn_proj.1),
            );
            let mut x1 = new(c); // [1,C]
            dev.add(&mut x1, &x, &proj);
            dev.layernorm_forward(&mut ln, &mut mean, &mut rstd, &x1, &block.ln_2.0, &block.ln_2.1, 1e-5);
            let f = self.config.ffn_size();
            let (mut fc, mut gelu) = (new(f), new(f)); // [1,F] each
            dev.matmul_forward(&mut fc, &ln, &block.c_fc.0, WeightLayout::InOut, Some(&block.c_fc.1));
            dev.gelu_forward(&mut gelu, &fc);
            dev.matmul_forward(
                &mut proj,
                &gelu,
                &block.mlp_proj.0,
                WeightLayout::InOut,
                Some(&block.mlp_proj.1),
            );
            dev.add(&mut x, &x1, &proj);
        }
        cache.positions += 1;
        x
    }

    /// ln_f and the tied LM head: logits [V] from a block stack's output [1,C].
    fn logits(&self, x: &Tensor) -> Vec<f32> {
        let dev = &self.dev;
        let mut ln = dev.empty(&[1, self.config.n_embd], Category::Workspace); // [1,C]
        let (mut mean, mut rstd) =
            (dev.empty(&[1], Category::Workspace), dev.empty(&[1], Category::Workspace));
        dev.layernorm_forward(&mut ln, &mut mean, &mut rstd, x, &self.ln_f.0, &self.ln_f.1, 1e-5);
        let mut logits = dev.empty(&[1, self.config.vocab_size], Category::Workspace); // [1,V]
        dev.matmul_forward(&mut logits, &ln, &self.wte, WeightLayout::OutIn, None);
        dev.to_host(&logits)
    }
}

/// Causal attention of the newest position's query q [C] over the cached keys and values
/// [positions, C] (its own included), per head: softmax(q k^T / sqrt(HS)) v. Returns [C].
fn attend(q: &[f32], keys: &[f32], values: &[f32], n_head: usize) -> Vec<f32> {
    let c = q.len();
    let (hs, seen) = (c / n_head, keys.len() / c);
    let scale = 1.0 / (hs as f32).sqrt();
    let mut out = vec![0.0f32; c];
    for h in 0..n_head {
        let head = |j: usize| j * c + h * hs..j * c + (h + 1) * hs; // position j's head h in [.., C]
        let q = &q[head(0)];
        let scores: Vec<f32> = (0..seen).map(|j| dot(q, &keys[head(j)]) * scale).collect();
        let top = max(&scores);
        let weights: Vec<f32> = scores.iter().map(|&s| exp(s - top)).collect();
        let norm = 1.0 / sum(&weights);
        let o = &mut out[h * hs..(h + 1) * hs];
        for (j, w) in weights.iter().enumerate() {
            for (o, &v) in o.iter_mut().zip(&values[head(j)]) {
                *o += w * norm * v;
            }
        }
    }
    out
}
