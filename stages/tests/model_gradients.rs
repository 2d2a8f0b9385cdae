//! The whole model's gradients against central differences of its loss: the embedding, the
//! blocks and the head composed, with dropout on (its masks are keyed, so the loss is a
//! fixed function of the weights), including the tied embedding's two gradients and the
//! head's backward, which runs in forward; and again with heads wider than the width over
//! the heads (`head_dim`, as Mistral Nemo's), the output projection [C, NH * hs]; and for a
//! Qwen3 (QK-norm before rope, grouped-query attention, SwiGLU); for a Nemotron (LayerNorm
//! scaling by 1 + weight, squared ReLU, rope on half of each head); and for a Gemma (RMSNorm
//! scaling by 1 + weight, GeGLU, the embeddings multiplied).

use kernels::cpu::CpuDevice;
use kernels::{AttentionSaves, Category, DType, Device};
use stages::dist::TensorGroup;
use stages::tensor_parallel::Shard;
use stages::{ChunkLayout, DropoutProbs, Microbatch, ModelChunk, ModelShape, Parameters, RecomputePolicy};

const SHAPE: ModelShape = ModelShape {
    arch: stages::Architecture::GPT2,
    num_layers: 2,
    hidden: 16,
    heads: 2,
    kv_heads: 2,
    head_dim: None,
    ffn: 64,
    seq_len: 8,
    max_positions: 8,
    vocab: 13,
    micro_batch: 2,
    attention_dropout: true,
    attention: AttentionSaves::Probabilities,
    activations: DType::F32,
};
const TOKENS: usize = SHAPE.micro_batch * SHAPE.seq_len;

fn model(dev: &CpuDevice, s: ModelShape) -> ModelChunk {
    let layout = ChunkLayout { blocks: 0..s.num_layers, embedding: true, head: true };
    let params = Parameters::init(dev, &s, &layout, 7, Shard::WHOLE, stages::OptimizerShard::WHOLE);
    let dropout = DropoutProbs { hidden: 0.1, attention: 0.1 };
    ModelChunk::new(s, layout, Shard::WHOLE, params, RecomputePolicy::None, dropout, 3)
}

fn microbatch<'a>(tokens: &'a [u32], targets: &'a [u32]) -> Microbatch<'a> {
    Microbatch {
        step: 1,
        index: 0,
        tokens,
        targets,
        mode: stages::Mode::Train { grad_scale: 1.0 / TOKENS as f32 },
    }
}

/// The mean loss of a training forward (dropout on), in f64.
fn loss(chunk: &mut ModelChunk, dev: &CpuDevice, mb: &Microbatch) -> f64 {
    let losses = chunk
        .forward(dev, mb, None, &mut TensorGroup::whole())
        .losses
        .expect("the whole model holds the head");
    dev.to_host(&losses).iter().map(|&l| l as f64).sum::<f64>() / TOKENS as f64
}

#[test]
fn gradients_match_central_differences() {
    check_gradients(SHAPE);
}

#[test]
fn gradients_match_central_differences_with_wider_heads() {
    let wide = ModelShape { head_dim: Some(12), ..SHAPE };
    assert_eq!(wide.attention_width(), 24);
    check_gradients(wide);
}

#[test]
fn gradients_match_central_differences_with_qk_norm() {
    // Tied, as the harness adds the head's embedding gradient (Qwen3 0.6B ties it too).
    let llama = stages::Architecture::llama(1e4, 1e-5);
    let arch = stages::Architecture { qk_norm: true, tied_output: true, ..llama };
    let qwen3 = ModelShape { arch, kv_heads: 1, head_dim: Some(12), ..SHAPE };
    check_gradients(qwen3);
}

#[test]
fn gradients_match_central_differences_for_nemotron() {
    let half = kernels::RopeFrequencies { rotary_dims: Some(6), ..kernels::RopeFrequencies::plain(1e4) };
    let arch = stages::Architecture {
        norm: stages::Norm::LayerNorm,
        zero_centered_gamma: true,
        positions: stages::Positions::Rotary(half),
        activation: stages::Activation::SquaredRelu,
        tied_output: true,
        ..stages::Architecture::llama(1e4, 1e-5)
    };
    check_gradients(ModelShape { arch, kv_heads: 1, head_dim: Some(12), ..SHAPE });
}

#[test]
fn gradients_match_central_differences_for_gemma() {
    let arch = stages::Architecture {
        zero_centered_gamma: true,
        activation: stages::Activation::GeGlu,
        tied_output: true,
        embedding_multiplier: Some(4.0),
        ..stages::Architecture::llama(1e4, 1e-6)
    };
    check_gradients(ModelShape { arch, kv_heads: 1, head_dim: Some(12), ..SHAPE });
}

/// OLMo 2's block order, the norms on the attention's and MLP's outputs, with QK-norm over
/// each head and over the whole projections (its own), and
/// GPT-2's LayerNorms and biases the same way. The weights are drawn at std 0.5: at 0.02
/// the projections' outputs are about 1e-3, so that a norm of them bends within the
/// differences' step of a bias (measured: the biases' differences then off by up to 50 times,
/// the same analytic gradients within 2e-3 of them at 0.5).
#[test]
fn gradients_match_central_differences_with_the_norms_on_the_outputs() {
    let output = stages::NormPlacement::Output;
    let olmo = stages::Architecture {
        norm_placement: output,
        qk_norm: true,
        tied_output: true,
        init_std: 0.5,
        ..stages::Architecture::llama(5e5, 1e-6)
    };
    check_gradients(ModelShape { arch: olmo, kv_heads: 1, head_dim: Some(12), ..SHAPE });
    // OLMo 2's own QK-norm, over the whole projections, as wide as each other and (OLMo 2
    // 32B's grouped-query attention) a query projection twice the key projection.
    let projection = stages::Architecture { qk_norm_span: stages::QkNormSpan::Projection, ..olmo };
    check_gradients(ModelShape { arch: projection, head_dim: Some(12), ..SHAPE });
    check_gradients(ModelShape { arch: projection, kv_heads: 1, head_dim: Some(12), ..SHAPE });
    let gpt2 = stages::Architecture { norm_placement: output, init_std: 0.5, ..SHAPE.arch };
    check_gradients(ModelShape { arch: gpt2, ..SHAPE });
}

/// A sliding window of 3 keys over 8 positions, on both layers and on the first alone (a
/// full layer every second: OLMo 3's pattern at its period of 2).
#[test]
fn gradients_match_central_differences_under_a_sliding_window() {
    for full_every in [None, Some(2)] {
        let sliding_window = Some(stages::SlidingWindow { keys: 3, full_every });
        let arch = stages::Architecture {
            sliding_window,
            tied_output: true,
            ..stages::Architecture::llama(1e4, 1e-6)
        };
        check_gradients(ModelShape { arch, kv_heads: 1, ..SHAPE });
    }
}

fn check_gradients(s: ModelShape) {
    let dev = CpuDevice::new(2);
    let tokens: Vec<u32> = (0..TOKENS as u32).map(|i| (i * 5 + 1) % SHAPE.vocab as u32).collect();
    let targets: Vec<u32> = (0..TOKENS as u32).map(|i| (i * 7 + 3) % SHAPE.vocab as u32).collect();
    let mb = microbatch(&tokens, &targets);

    let mut chunk = model(&dev, s);
    let out = chunk.forward(&dev, &mb, None, &mut TensorGroup::whole());
    chunk.backward(&dev, out.stash.expect("training keeps a stash"), None, false, &mut TensorGroup::whole());
    let p = &chunk.params;
    let mut analytic: Vec<Vec<f32>> = p.grads.iter().map(|g| dev.to_host(g)).collect();
    // wte's gradient is the embedding's plus the LM head's.
    let head = dev.to_host(p.head_wte_grad.as_ref().expect("one chunk holds both ends"));
    analytic[0].iter_mut().zip(&head).for_each(|(g, h)| *g += h);
    assert!(head.iter().any(|&h| h != 0.0) && analytic.iter().all(|g| g.iter().all(|x| x.is_finite())));

    let mut worst = (0.0f64, String::new());
    for (i, grad) in analytic.iter().enumerate() {
        let name = chunk.params.specs[i].name.clone();
        let shape = chunk.params.specs[i].shape.clone();
        let host = dev.to_host(&chunk.params.values[i]);
        // Three elements of every tensor: first, middle, last.
        for j in [0, host.len() / 2, host.len() - 1] {
            let mut at = |x: f32| {
                let mut h = host.clone();
                h[j] = x;
                chunk.params.values[i] = dev.from_host(&h, &shape, Category::Parameters);
                loss(&mut chunk, &dev, &mb)
            };
            let mut central = |eps: f32| (at(host[j] + eps) - at(host[j] - eps)) / (2.0 * eps as f64);
            // Richardson: the O(eps^2) terms of the two central differences cancel. (The
            // residual stream is small at init, so ln_f bends sharply: plain differences at
            // an eps above f32's noise are off by several percent.)
            let fd = (4.0 * central(5e-3) - central(1e-2)) / 3.0;
            chunk.params.values[i] = dev.from_host(&host, &shape, Category::Parameters);
            let got = grad[j] as f64;
            // Tolerance: 2e-3 relative, plus 5e-5 for the noise of f32 losses differenced
            // over 1e-2 (measured: at most 2e-5 absolute, 7e-4 relative where |g| > 1e-2).
            let err = (got - fd).abs() / (5e-5 + 2e-3 * fd.abs());
            if err > worst.0 {
                worst = (err, format!("{name}[{j}]: analytic {got:e}, central difference {fd:e}"));
            }
        }
    }
    assert!(worst.0 <= 1.0, "{:.2} x the tolerance at {}", worst.0, worst.1);
}
