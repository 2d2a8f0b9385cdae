//! Inference, one position at a time, with a KV cache: each position's keys and values are
//! computed once and kept, so a new token costs one position's forward, attending to the
//! cached ones. The blocks are the training blocks (`stages::layers::block`, their decode
//! pieces), on a CPU device; the attention of one new query over the cache is computed
//! here, on the host, as the training kernel works on whole [T,T] blocks.
//!
//! Shapes: C channels, NH query heads and KV key/value heads of HS = C / NH, QKV = (NH +
//! 2 KV) HS, V vocabulary.

use crate::checkpoint::{ModelConfig, NamedTensor};
use crate::plan::{gather, shape};
use kernels::cpu::math::{dot, exp, max, sum};
use kernels::cpu::CpuDevice;
use kernels::{Category, Device, Tensor, WeightLayout};
use stages::layers::block::Block;
use stages::params::{model_param_specs, BlockIndices, Role};
use stages::{ModelShape, Shard};

/// The keys and values of every position seen so far, per layer: only the KV heads, not
/// the query heads they serve.
pub struct KvCache {
    /// [positions, KV*HS] per layer: each, K and V.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    positions: usize,
}

pub struct Decoder {
    dev: CpuDevice,
    shape: ModelShape,
    /// The parameters in the model's order, on the device.
    values: Vec<Tensor>,
    /// Host copies of the embeddings: a new position's row is gathered at its own index.
    wte_host: Vec<f32>, // [V,C]
    wpe_host: Option<Vec<f32>>, // [maxT,C] where positions are learned
    blocks: Vec<BlockIndices>,
    output: usize,
    final_norm: (usize, Option<usize>),
}

impl Decoder {
    /// The model from checkpoint tensors (names and shapes already checked against `config`).
    pub fn new(config: &ModelConfig, weights: &[NamedTensor]) -> Decoder {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let dev = CpuDevice::new(threads);
        let s = shape(&config.run_config(config.max_positions(), 1));
        let specs = model_param_specs(&s);
        let host: Vec<Vec<f32>> =
            specs.iter().map(|p| gather(p, weights, str::to_string).expect("checked tensors")).collect();
        let index = |role| specs.iter().position(|p| p.role == role);
        let wte = index(Role::TokenEmbedding).expect("a model has a token embedding");
        let blocks = (0..s.num_layers).map(|layer| BlockIndices::find(&s, &specs, layer)).collect();
        let values = specs
            .iter()
            .zip(&host)
            .map(|(p, data)| dev.from_host(data, &p.shape, Category::Parameters))
            .collect();
        Decoder {
            wte_host: host[wte].clone(),
            wpe_host: index(Role::PositionEmbedding).map(|i| host[i].clone()),
            output: index(Role::OutputLayer).unwrap_or(wte),
            final_norm: (index(Role::FinalNormWeight).expect("a final norm"), index(Role::FinalNormBias)),
            blocks,
            values,
            shape: s,
            dev,
        }
    }

    pub fn vocab(&self) -> usize {
        self.shape.vocab
    }

    pub fn max_positions(&self) -> usize {
        self.shape.max_positions
    }

    pub fn empty_cache(&self) -> KvCache {
        KvCache { layers: vec![(Vec::new(), Vec::new()); self.shape.num_layers], positions: 0 }
    }

    /// Runs `tokens` at the positions after the cached ones, adds their keys and values to
    /// `cache`, and returns the logits [V] that follow the last of them. The caller keeps
    /// the positions within `max_positions`.
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
        let (dev, s) = (&self.dev, &self.shape);
        let (c, pos) = (s.hidden, cache.positions);
        assert!(pos < s.max_positions, "position {pos} past the model's");
        let tok = token as usize * c;
        let x_host: Vec<f32> = match &self.wpe_host {
            Some(wpe) => (0..c).map(|d| self.wte_host[tok + d] + wpe[pos * c + d]).collect(),
            None => self.wte_host[tok..tok + c].to_vec(),
        };
        let mut x = dev.from_host(&x_host, &[1, c], Category::Workspace); // [1,C]
        if let Some(m) = s.arch.embedding_multiplier {
            dev.scale(&mut x, m);
        }
        let (a, kv) = (s.attention_width(), s.kv_heads * s.head_size());
        for (layer, (at, (keys, values))) in self.blocks.iter().zip(&mut cache.layers).enumerate() {
            let block = Block { s, layer, w: &self.values, at: *at, shard: Shard::WHOLE };
            let qkv = dev.to_host(&block.decode_qkv(dev, &x, pos)); // [QKV]
            keys.extend_from_slice(&qkv[a..a + kv]);
            values.extend_from_slice(&qkv[a + kv..]);
            // A windowed layer's query sees the keys from its window's first on.
            let first = s.arch.attention_mask(layer).first_key(pos) * kv;
            let att = attend(&qkv[..a], &keys[first..], &values[first..], s.heads, s.kv_heads); // [A]
            let att = dev.from_host(&att, &[1, a], Category::Workspace); // [1,A]
            x = block.decode_rest(dev, &x, &att);
        }
        cache.positions += 1;
        x
    }

    /// The final norm and the output layer: logits [V] from a block stack's output [1,C].
    fn logits(&self, x: &Tensor) -> Vec<f32> {
        let (dev, s) = (&self.dev, &self.shape);
        let (w, b) = self.final_norm;
        let norm = s.arch.norm_layer(&self.values[w], b.map(|b| &self.values[b]));
        let mut normed = dev.empty(&[1, s.hidden], Category::Workspace); // [1,C]
        norm.forward(dev, &mut normed, x, Category::Workspace);
        let mut logits = dev.empty(&[1, s.vocab], Category::Workspace); // [1,V]
        dev.matmul_forward(&mut logits, &normed, &self.values[self.output], WeightLayout::OutIn, None);
        dev.to_host(&logits)
    }
}

/// Causal attention of the newest position's query q [NH*HS] over the keys and values it
/// sees, [positions, KV*HS] of the cache (its own included), per query head h, which reads
/// key/value head h / (NH/KV): softmax(q k^T / sqrt(HS)) v. Returns [NH*HS].
fn attend(q: &[f32], keys: &[f32], values: &[f32], n_head: usize, n_kv: usize) -> Vec<f32> {
    let hs = q.len() / n_head;
    let (width, group) = (n_kv * hs, n_head / n_kv);
    let seen = keys.len() / width;
    let scale = 1.0 / (hs as f32).sqrt();
    let mut out = vec![0.0f32; q.len()];
    for h in 0..n_head {
        let g = h / group;
        let kv = |j: usize| j * width + g * hs..j * width + (g + 1) * hs; // position j's head g
        let q = &q[h * hs..(h + 1) * hs];
        let scores: Vec<f32> = (0..seen).map(|j| dot(q, &keys[kv(j)]) * scale).collect();
        let top = max(&scores);
        let weights: Vec<f32> = scores.iter().map(|&s| exp(s - top)).collect();
        let norm = 1.0 / sum(&weights);
        let o = &mut out[h * hs..(h + 1) * hs];
        for (j, w) in weights.iter().enumerate() {
            for (o, &v) in o.iter_mut().zip(&values[kv(j)]) {
                *o += w * norm * v;
            }
        }
    }
    out
}
