//! The device abstraction: every op of a GPT-2 or Llama training step, as one trait that the
//! CPU backend implements now and the CUDA backend (feature `cuda`) implements beside it (the
//! GPT-2 ops, RMSNorm, RoPE and SwiGLU: its fused attention is multi-head).
//!
//! Conventions, shared by every backend:
//! - All tensors are row-major. Parameters, their gradients, optimizer moments, LayerNorm
//!   statistics and losses are f32; activations and their gradients are stored in the
//!   device's [`Device::activation_dtype`]: bf16 on a CUDA device under `precision: bf16`,
//!   f32 everywhere else. Every op computes in f32 and rounds once when it stores bf16.
//! - Shapes in comments: B batch, T sequence, C channels, NH query heads, KV key/value heads,
//!   hs head size, V vocabulary, N = B*T rows, IC/OC matmul in/out channels, F the SwiGLU
//!   hidden width.
//! - Row-wise ops (layernorm, rmsnorm, glu, matmul, classifier, bias) take the last
//!   dimension as the row width and treat every leading dimension as rows: a [B,T,C] tensor
//!   is N = B*T rows.
//! - Attention and RoPE read B and T from `qkv`'s shape [B,T,(NH+2*KV)*hs], NH from `n_head`
//!   and KV from `n_kv_head`. Each token's row holds the NH query heads, then the KV key
//!   heads, then the KV value heads, hs contiguous values each: with KV == NH exactly GPT-2's
//!   c_attn output [B,T,3C].
//! - An op that produces an **input gradient overwrites** its output; an op that produces a
//!   **parameter gradient accumulates** into it (`+=`), so microbatches accumulate by calling
//!   the op once each, in microbatch order.
//! - Every op is deterministic: the same inputs give bitwise the same outputs whatever the
//!   number of threads, so recompute, any stage count and any schedule agree to the bit.

use crate::attention::{AttentionSaved, AttentionSaves, CausalMask};
use crate::backend::{
    AdamW, Attention, Buffers, Classifier, Dropout, Elementwise, Embedding, Gelu, Glu, LayerNorm, Matmul,
    Readouts, RmsNorm, Rope, SquaredRelu,
};
use crate::counters::DeviceCounters;
use crate::dropout::DropoutSpec;
use crate::gate::Gate;
use crate::memory::{Category, MemoryLedger};
use crate::op_args::{AdamWStep, AdamWTensor, ClassifierGrad, WeightLayout};
use crate::qk_norm::QkNormHeads;
use crate::readout::Readout;
use crate::rope_frequencies::RopeFrequencies;
use crate::shapes::{
    assert_same_len, classifier_rows, embedding_dims, matmul_dims, qk_norm_backward_dims, qk_norm_dims,
    qk_norm_rows, qkv_dims, residual_rows, rope_dims, vocab_shard_members, vocab_shard_rows,
};
use crate::tensor::{rows_cols, DType, Detached, Fence, Tensor};
use crate::timing::Clock;
use std::ops::Range;
use std::sync::Arc;

/// The CUDA backend pads each row of logits to a multiple of this many columns: every row
/// starts 512-byte aligned, and the GEMMs' leading dimensions are multiples of 128.
pub const VOCAB_PADDING: usize = 128;

/// The columns of a padded logits row for a vocabulary of `vocab` (GPT-2's 50257: 50304).
pub fn padded_vocab(vocab: usize) -> usize {
    vocab.next_multiple_of(VOCAB_PADDING)
}

/// Whether CUDA runs [`Device::matmul_backward_input_gelu`] at input width `width` as one
/// product, with no [N, width] gradient between the product and the GELU: cuBLASLt's
/// GELU-derivative epilogue needs its aux matrix's leading dimension a multiple of 8.
pub fn cuda_fuses_gelu_backward(width: usize) -> bool {
    width.is_multiple_of(8)
}

/// The elements of the bf16 copy a device storing bf16 activations keeps beside every
/// parameter of `shape`, for its matmuls to read: a matrix's rows padded with zeros to a
/// multiple of [`VOCAB_PADDING`] (so the LM head's GEMMs read wte's as [Vp, C]); a vector's
/// elements as they are. cuBLASLt adds a bias in its epilogue only in the product's type
/// (13.1 refuses an fp32 bias beside a bf16 product); the norms' copies go unread, their
/// kernels reading the f32 masters, for one rule at 2 bytes an element of the vectors.
pub fn bf16_copy_len(shape: &[usize]) -> usize {
    match *shape {
        [rows, cols] => padded_vocab(rows) * cols,
        _ => shape.iter().product(),
    }
}

/// Each op method checks the shapes of its arguments, for every backend alike, then runs the
/// backend's implementation: the method of the same name with `_impl` of the kernel
/// family's trait in [`crate::backend`].
pub trait Device:
    Send
    + Sync
    + Buffers
    + Elementwise
    + Readouts
    + Embedding
    + LayerNorm
    + RmsNorm
    + Matmul
    + Attention
    + Rope
    + Gelu
    + SquaredRelu
    + Glu
    + Dropout
    + Classifier
    + AdamW
    + Clock
{
    /// Human-readable name, e.g. "cpu (4 threads)".
    fn name(&self) -> String;
    /// The accounting of every buffer this device has handed out.
    fn ledger(&self) -> &Arc<MemoryLedger>;
    /// The accounting of the host memory this device's offloaded tensors hold
    /// ([`Device::offload`]).
    fn host_ledger(&self) -> &Arc<MemoryLedger>;
    /// Host syncs and backing-allocator calls so far (see [`crate::counters`]).
    fn counters(&self) -> DeviceCounters;

    // ---- buffers -------------------------------------------------------------------
    /// The element type of the activations (and their gradients) this device stores: the
    /// layers allocate them with it.
    fn activation_dtype(&self) -> DType {
        DType::F32
    }
    /// A zero-filled tensor of `dtype`, counted in the ledger under `category` until
    /// dropped: for a tensor that is added to, never for an op's output that it overwrites
    /// (`empty_of`). A dtype the device does not store (bf16 on the CPU) is a bug in the caller.
    fn zeros_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor;
    /// A tensor of `dtype` for an op that writes every element: its contents until then are
    /// unspecified (a reused buffer's old values; NaN in the CPU's debug builds and on the
    /// CUDA stand-in, so that an element left unwritten shows), which saves the zero fill.
    /// Counted in the ledger as `zeros_of`.
    fn empty_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor;
    /// A tensor of `dtype` holding a copy of `data`, rounded to bf16 for a bf16 tensor.
    /// (A device method, not a conversion of `self`.)
    #[allow(clippy::wrong_self_convention)]
    fn from_host_of(&self, dtype: DType, data: &[f32], shape: &[usize], category: Category) -> Tensor {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "from_host: {} values for {shape:?}",
            data.len()
        );
        self.from_host_of_impl(dtype, data, shape, category)
    }
    /// A copy of the elements on the host, in f32 whatever the tensor stores: a host sync.
    fn to_host(&self, t: &Tensor) -> Vec<f32>;
    /// An f32 [`Device::zeros_of`].
    fn zeros(&self, shape: &[usize], category: Category) -> Tensor {
        self.zeros_of(DType::F32, shape, category)
    }
    /// An f32 [`Device::empty_of`].
    fn empty(&self, shape: &[usize], category: Category) -> Tensor {
        self.empty_of(DType::F32, shape, category)
    }
    /// An f32 [`Device::from_host_of`].
    #[allow(clippy::wrong_self_convention)]
    fn from_host(&self, data: &[f32], shape: &[usize], category: Category) -> Tensor {
        self.from_host_of(DType::F32, data, shape, category)
    }
    /// Takes over a tensor another device of this process detached, counting it here: the
    /// same storage where this device can use it as it is, a copy only where it cannot. Its
    /// use here is ordered after the producer's `t.ready`.
    fn adopt(&self, t: Detached, category: Category) -> Tensor;
    /// A fence after every op issued on this device so far, for a tensor leaving it:
    /// whoever uses the tensor elsewhere waits on it, not on the producer's later work.
    fn fence(&self) -> Fence;
    /// Orders this device's later work after `fence` (another device's or stream's).
    fn wait_for(&self, fence: &Fence);
    /// dst = src (same number of elements and dtype).
    fn copy(&self, dst: &mut Tensor, src: &Tensor) {
        assert_same_len(dst, src);
        self.copy_impl(dst, 0, src, 0..src.len());
    }
    /// dst[at..at + part.len()] = src[part], of one dtype, on the device: a part of a tensor
    /// into its place in the whole, or out of it (a sequence-parallel rank's rows).
    fn copy_part(&self, dst: &mut Tensor, at: usize, src: &Tensor, part: Range<usize>) {
        assert!(
            dst.dtype() == src.dtype() && part.end <= src.len() && at + part.len() <= dst.len(),
            "copy_part: {src:?}[{part:?}] into {dst:?} at {at}"
        );
        self.copy_impl(dst, at, src, part);
    }
    /// t[from..from + data.len()] = data, uploaded in place (t f32: a parameter, a gradient).
    fn write_at(&self, t: &mut Tensor, from: usize, data: &[f32]) {
        assert_eq!(t.dtype(), DType::F32, "write_at: {t:?} is not f32");
        assert!(from + data.len() <= t.len(), "write_at: {} values from {from} into {t:?}", data.len());
        self.write_at_impl(t, from, data);
    }
    /// t = 0: a memset on CUDA, counted as a zero fill ([`crate::counters`]).
    fn fill_zero(&self, t: &mut Tensor);
    /// Zeroes every one of `tensors`, f32 tensors without a bf16 copy (a stage's gradients:
    /// one launch on CUDA).
    fn fill_zero_tensors(&self, tensors: &mut [&mut Tensor]);
    /// The elements `part` of f32 tensor `t` (of a parameter whose master is sharded,
    /// within the part it holds).
    fn to_host_part(&self, t: &Tensor, part: Range<usize>) -> Vec<f32> {
        self.to_host(t)[part].to_vec()
    }
    /// Keeps only the elements `part` of parameter `t`'s fp32 master, where it has one
    /// beside a bf16 copy (a bf16 device's parameters; the trainer shards the matrices'):
    /// the distributed optimizer's replica steps that part, and the matmuls read the copy,
    /// which stays whole. Reads of the whole master (`to_host`) are then bugs;
    /// [`Device::write_at`] writes the master within its part and the copy everywhere.
    /// Whether `t` had such a master.
    fn shard_master(&self, t: &mut Tensor, part: Range<usize>) -> bool {
        let _ = (t, part);
        false
    }
    /// Moves device tensor `t` to host memory (activation offload): `t` becomes the host
    /// copy, counted in [`Device::host_ledger`] as activations, and its device bytes leave
    /// the device's ledger. On a GPU the copy runs on a copy stream while later ops run.
    fn offload(&self, t: &mut Tensor) {
        assert!(Arc::ptr_eq(t.ledger(), self.ledger()), "offload: {t:?} is not on this device");
        self.offload_impl(t)
    }
    /// Moves host tensor `t` ([`Device::offload`] made it) back to this device under
    /// `category`. Its bytes count on the device at once; on a GPU the copy runs on the copy
    /// stream, and the device's ops may read `t` only after [`Device::await_reloads`].
    fn reload(&self, t: &mut Tensor, category: Category) {
        assert!(
            Arc::ptr_eq(t.ledger(), self.host_ledger()),
            "reload: {t:?} is not in this device's host memory"
        );
        self.reload_impl(t, category)
    }
    /// Orders every op issued from now on after every [`Device::reload`] issued so far.
    /// A backend whose copies are done when they return has nothing to wait for.
    fn await_reloads(&self) {}
    /// acc += x, elementwise.
    fn accumulate(&self, acc: &mut Tensor, x: &Tensor) {
        assert_same_len(acc, x);
        self.accumulate_impl(acc, x);
    }
    /// out = a + b, elementwise (the residual add).
    fn add(&self, out: &mut Tensor, a: &Tensor, b: &Tensor) {
        assert_same_len(out, a);
        assert_same_len(out, b);
        self.add_impl(out, a, b);
    }
    /// out = a + s, elementwise (a zero-centred norm weight's 1 + w).
    fn add_scalar(&self, out: &mut Tensor, a: &Tensor, s: f32) {
        assert_same_len(out, a);
        self.add_scalar_impl(out, a, s);
    }
    /// t *= s, elementwise, in place (Gemma's embedding multiplier).
    fn scale(&self, t: &mut Tensor, s: f32) {
        self.scale_impl(t, s);
    }
    /// Sum of squares, accumulated in f64 over fixed chunks (thread-count independent), as
    /// [`Device::sum_squares_into`] computes it, read at once: a host sync, for tests and tools.
    fn sum_squares(&self, t: &Tensor) -> f64 {
        let mut out = self.readout(1);
        self.sum_squares_into(&mut out, 0, &[t]);
        self.read(&out)[0]
    }

    // ---- values for the host, read once per step ------------------------------------
    /// `len` zeroed f64 slots on the device, counted in the ledger as workspace.
    fn readout(&self, len: usize) -> Readout;
    /// out[slot] = the mean of losses [N], added in f64 in order (a microbatch's loss).
    fn loss_mean(&self, out: &mut Readout, slot: usize, losses: &Tensor) {
        assert!(slot < out.len(), "loss slot {slot} of a readout of {}", out.len());
        self.loss_mean_impl(out, slot, losses);
    }
    /// out[first + i] = the sum of squares of tensors[i], each in f64 over fixed chunks, all
    /// in one pass (the per-parameter terms of the global gradient norm).
    fn sum_squares_into(&self, out: &mut Readout, first: usize, tensors: &[&Tensor]) {
        let whole: Vec<(&Tensor, Range<usize>)> = tensors.iter().map(|&t| (t, 0..t.len())).collect();
        self.sum_squares_of_parts_into(out, first, &whole);
    }
    /// out[first + i] = the sum of squares of parts[i]'s range of its tensor, as
    /// [`Device::sum_squares_into`] sums a tensor of just those elements: the terms of the
    /// global gradient norm where data-parallel replicas each hold a part of the gradients.
    fn sum_squares_of_parts_into(&self, out: &mut Readout, first: usize, parts: &[(&Tensor, Range<usize>)]) {
        assert!(
            first + parts.len() <= out.len(),
            "{} sums from slot {first} of a readout of {}",
            parts.len(),
            out.len()
        );
        for (t, range) in parts {
            assert!(range.start <= range.end && range.end <= t.len(), "sum of squares of {range:?} of {t:?}");
        }
        self.sum_squares_into_impl(out, first, parts);
    }
    /// The slots on the host: a host sync, the one a training step makes.
    fn read(&self, r: &Readout) -> Vec<f64>;

    // ---- embedding -----------------------------------------------------------------
    /// out[b,t,:] = wte[tokens[b,t],:] (+ wpe[t,:] with learned positions; None for RoPE
    /// models). out [B,T,C], tokens [B*T], wte [V,C], wpe [maxT,C]. A token
    /// [`OTHER_SHARD`] is one another tensor-parallel rank's shard of the vocabulary holds:
    /// its row is zero (plus its position), so the ranks' outputs sum to the lookup.
    fn embedding_forward(&self, out: &mut Tensor, tokens: &[u32], wte: &Tensor, wpe: Option<&Tensor>) {
        let btc = embedding_dims(out, tokens, wte, wpe);
        self.embedding_forward_impl(out, tokens, wte, wpe, btc);
    }
    /// dwte [V,C] += scatter(dout), and with learned positions dwpe [maxT,C] += sum over b of
    /// dout; dout [B,T,C]. Rows of an [`OTHER_SHARD`] token add nothing to dwte.
    fn embedding_backward(
        &self,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
        dout: &Tensor,
        tokens: &[u32],
    ) {
        let btc = embedding_dims(dout, tokens, dwte, dwpe.as_deref());
        self.embedding_backward_impl(dwte, dwpe, dout, tokens, btc);
    }

    // ---- normalization ---------------------------------------------------------------
    /// LayerNorm: out [N,C], mean [N], rstd [N] from inp [N,C], weight [C], bias [C];
    /// rstd = 1 / sqrt(var + eps) (GPT-2's eps is 1e-5; Megatron's `norm_epsilon`).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) {
        let (n, c) = residual_rows(inp, &[out]);
        assert!(mean.len() == n && rstd.len() == n, "layernorm: mean/rstd must have {n} rows");
        assert!(weight.len() == c && bias.len() == c, "layernorm: weight/bias must have {c} channels");
        self.layernorm_forward_impl(out, mean, rstd, inp, weight, bias, eps);
    }
    /// The residual add fused with the LayerNorm after it (llm.c's `fused_residual_forward`):
    /// residual [N,C] = a + b, then [`Device::layernorm_forward`] of residual into out, mean
    /// and rstd, in one pass. The bits of [`Device::add`] then that norm, so a recompute of
    /// the norm from the stored residual gives the same.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_residual_forward(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) {
        let (n, c) = residual_rows(residual, &[out, a, b]);
        assert!(mean.len() == n && rstd.len() == n, "layernorm: mean/rstd must have {n} rows");
        assert!(weight.len() == c && bias.len() == c, "layernorm: weight/bias must have {c} channels");
        self.layernorm_residual_forward_impl(residual, out, mean, rstd, a, b, weight, bias, eps);
    }
    /// dinp [N,C] = (overwrite); dweight [C] += ; dbias [C] +=
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dinp: &mut Tensor,
        dweight: &mut Tensor,
        dbias: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = residual_rows(inp, &[dinp, dout]);
        assert!(mean.len() == n && rstd.len() == n, "layernorm: mean/rstd must have {n} rows");
        assert!(weight.len() == c && dweight.len() == c && dbias.len() == c, "layernorm: {c} channels");
        self.layernorm_backward_impl(dinp, None, dweight, dbias, dout, inp, weight, mean, rstd);
    }
    /// [`Device::layernorm_backward`] of a norm on the residual stream, with the gradient
    /// that reaches its input along the residual path, dresidual [N,C], folded in:
    /// dinp [N,C] = dresidual + the norm's input gradient (overwrite), in the same pass (the
    /// bits of `layernorm_backward` then [`Device::accumulate`] of dresidual, where the
    /// activations are f32).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_residual_backward(
        &self,
        dinp: &mut Tensor,
        dresidual: &Tensor,
        dweight: &mut Tensor,
        dbias: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = residual_rows(inp, &[dinp, dresidual, dout]);
        assert!(mean.len() == n && rstd.len() == n, "layernorm: mean/rstd must have {n} rows");
        assert!(weight.len() == c && dweight.len() == c && dbias.len() == c, "layernorm: {c} channels");
        self.layernorm_backward_impl(dinp, Some(dresidual), dweight, dbias, dout, inp, weight, mean, rstd);
    }
    /// RMSNorm as Hugging Face's LlamaRMSNorm in f32: rstd [N] = 1 / sqrt(mean(x^2) + eps),
    /// out [N,C] = weight [C] * (x * rstd), from inp [N,C].
    fn rmsnorm_forward(&self, out: &mut Tensor, rstd: &mut Tensor, inp: &Tensor, weight: &Tensor, eps: f32) {
        let (n, c) = residual_rows(inp, &[out]);
        assert_eq!(rstd.len(), n, "rmsnorm: rstd must have {n} rows");
        assert_eq!(weight.len(), c, "rmsnorm: weight must have {c} channels");
        self.rmsnorm_forward_impl(out, rstd, inp, weight, eps);
    }
    /// residual [N,C] = a + b, then [`Device::rmsnorm_forward`] of residual, in one pass: as
    /// [`Device::layernorm_residual_forward`], the bits of the add and the norm.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_residual_forward(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) {
        let (n, c) = residual_rows(residual, &[out, a, b]);
        assert_eq!(rstd.len(), n, "rmsnorm: rstd must have {n} rows");
        assert_eq!(weight.len(), c, "rmsnorm: weight must have {c} channels");
        self.rmsnorm_residual_forward_impl(residual, out, rstd, a, b, weight, eps);
    }
    /// dinp [N,C] = (overwrite); dweight [C] += ; from dout [N,C], inp [N,C], weight [C] and
    /// the rstd [N] forward saved.
    fn rmsnorm_backward(
        &self,
        dinp: &mut Tensor,
        dweight: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = residual_rows(inp, &[dinp, dout]);
        assert_eq!(rstd.len(), n, "rmsnorm: rstd must have {n} rows");
        assert!(weight.len() == c && dweight.len() == c, "rmsnorm: {c} channels");
        self.rmsnorm_backward_impl(dinp, None, dweight, dout, inp, weight, rstd);
    }
    /// [`Device::rmsnorm_backward`] with dresidual [N,C] folded in, as
    /// [`Device::layernorm_residual_backward`]: dinp = dresidual + the norm's input gradient.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_residual_backward(
        &self,
        dinp: &mut Tensor,
        dresidual: &Tensor,
        dweight: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = residual_rows(inp, &[dinp, dresidual, dout]);
        assert_eq!(rstd.len(), n, "rmsnorm: rstd must have {n} rows");
        assert!(weight.len() == c && dweight.len() == c, "rmsnorm: {c} channels");
        self.rmsnorm_backward_impl(dinp, Some(dresidual), dweight, dout, inp, weight, rstd);
    }

    /// QK-norm (Qwen3's and OLMo 2's; Megatron's `qk_layernorm` with RMSNorm), in place on
    /// qkv [B,T,(NH+2*KV)*hs]: each row `h.span` names (each query and key head, or each
    /// token's whole query and whole key projection) becomes q_weight * (q * rstd) or
    /// k_weight * (k * rstd), normalised as [`Device::rmsnorm_forward`] normalises a row; the
    /// value heads untouched. `weights` [q, k] are [hs] each over heads, [NH*hs] and [KV*hs]
    /// over the projections. rstd [B*T, rows a token]: each token's query rows', then its key
    /// rows'.
    fn qk_norm_forward(
        &self,
        qkv: &mut Tensor,
        rstd: &mut Tensor,
        weights: [&Tensor; 2],
        h: QkNormHeads,
        eps: f32,
    ) {
        let rows = qk_norm_dims(qkv, rstd, weights, h);
        self.qk_norm_forward_impl(qkv, rstd, weights, rows, None, eps);
    }
    /// QK-norm's first half where each row of qkv is 1/parts of the whole (a whole
    /// projection cut across a tensor-parallel group): sums [B*T, rows a token] = each
    /// row's sum of squares, for the group to sum.
    fn qk_norm_sum_squares(&self, qkv: &Tensor, sums: &mut Tensor, h: QkNormHeads) {
        let rows = qk_norm_rows(qkv, sums, h);
        self.qk_norm_sum_squares_impl(qkv, sums, rows);
    }
    /// Its second half: [`Device::qk_norm_forward`] with each row's statistic from `stats`,
    /// the whole row's sum of squares (the group's sum of [`Device::qk_norm_sum_squares`]),
    /// a row here being 1/`parts` of it; `stats` then holds the rstd.
    fn qk_norm_forward_summed(
        &self,
        qkv: &mut Tensor,
        stats: &mut Tensor,
        weights: [&Tensor; 2],
        h: QkNormHeads,
        parts: usize,
        eps: f32,
    ) {
        let rows = qk_norm_dims(qkv, stats, weights, h);
        assert!(parts > 0, "qk-norm: a row of {parts} parts");
        self.qk_norm_forward_impl(qkv, stats, weights, rows, Some(parts), eps);
    }
    /// QK-norm's backward, in place on dqkv [B,T,(NH+2*KV)*hs]: its query and key rows (the
    /// gradient of the norm's output) become the gradient of its input `inp` (the q, k, v
    /// forward normalised), the value heads untouched; dweights [q, k] += , each as wide as
    /// its weight.
    fn qk_norm_backward(
        &self,
        dqkv: &mut Tensor,
        dweights: [&mut Tensor; 2],
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        h: QkNormHeads,
    ) {
        let rows = qk_norm_backward_dims(dqkv, dweights.each_ref().map(|d| &**d), inp, weights, rstd, h);
        self.qk_norm_backward_impl(dqkv, dweights, inp, weights, rstd, rows, None);
    }
    /// The backward's first half where each row is 1/parts of the whole: dots [B*T, rows a
    /// token] = each row's sum of dnorm * norm (dnorm = dqkv * weight, norm = inp * rstd), for
    /// the group to sum.
    fn qk_norm_backward_dots(
        &self,
        dqkv: &Tensor,
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        dots: &mut Tensor,
        h: QkNormHeads,
    ) {
        let rows = qk_norm_dims(inp, rstd, weights, h);
        assert_same_len(inp, dqkv);
        assert_same_len(rstd, dots);
        self.qk_norm_backward_dots_impl(dqkv, inp, weights, rstd, dots, rows);
    }
    /// Its second half: [`Device::qk_norm_backward`] with each row's mean of dnorm * norm
    /// from `dots`, the whole row's sum (the group's sum of
    /// [`Device::qk_norm_backward_dots`]), a row here being 1/`parts` of it.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_backward_summed(
        &self,
        dqkv: &mut Tensor,
        dweights: [&mut Tensor; 2],
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        (dots, parts): (&Tensor, usize),
        h: QkNormHeads,
    ) {
        let rows = qk_norm_backward_dims(dqkv, dweights.each_ref().map(|d| &**d), inp, weights, rstd, h);
        assert_same_len(rstd, dots);
        assert!(parts > 0, "qk-norm: a row of {parts} parts");
        self.qk_norm_backward_impl(dqkv, dweights, inp, weights, rstd, rows, Some((dots, parts)));
    }

    // ---- matmul --------------------------------------------------------------------
    /// out [N,OC] = inp [N,IC] @ W (+ bias [OC]); W per `layout`.
    fn matmul_forward(
        &self,
        out: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        bias: Option<&Tensor>,
    ) {
        let dims = matmul_dims(out, inp, weight, layout);
        if let Some(bias) = bias {
            assert_eq!(bias.len(), dims.oc, "matmul: bias {bias:?} for {dims:?}");
        }
        self.matmul_forward_impl(out, inp, weight, layout, bias, dims);
    }
    /// dinp [N,IC] = dout [N,OC] @ W^T (overwrite). The backward-input half.
    fn matmul_backward_input(&self, dinp: &mut Tensor, dout: &Tensor, weight: &Tensor, layout: WeightLayout) {
        let dims = matmul_dims(dout, dinp, weight, layout);
        self.matmul_backward_input_impl(dinp, dout, weight, layout, dims);
    }
    /// dinp [N,IC] = gelu'(gelu_input [N,IC]) * (dout [N,OC] @ W^T) (overwrite): the
    /// backward-input half of a matmul whose input was gelu(gelu_input), through the GELU.
    /// On CUDA one product with cuBLASLt's GELU-derivative epilogue (blaslt.rs).
    fn matmul_backward_input_gelu(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        gelu_input: &Tensor,
    ) {
        let dims = matmul_dims(dout, dinp, weight, layout);
        assert_same_len(dinp, gelu_input);
        self.matmul_backward_input_gelu_impl(dinp, dout, weight, layout, gelu_input, dims);
    }
    /// dweight (per `layout`) += inp^T @ dout; dbias [OC] += column sums of dout.
    /// The backward-weight half, which a zero-bubble schedule defers.
    fn matmul_backward_weight(
        &self,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
        dout: &Tensor,
        inp: &Tensor,
        layout: WeightLayout,
    ) {
        let dims = matmul_dims(dout, inp, dweight, layout);
        if let Some(dbias) = &dbias {
            assert_eq!(dbias.len(), dims.oc, "matmul: dbias {dbias:?} for {dims:?}");
        }
        self.matmul_backward_weight_impl(dweight, dbias, dout, inp, layout, dims);
    }

    // ---- attention core ------------------------------------------------------------
    /// What the attention core of kind `kind` saves for B = `batch`, NH = `heads`, T =
    /// `seq_len`, allocated under `category` with [`Device::empty`]: the forward writes every
    /// element.
    fn empty_attention_saved(
        &self,
        kind: AttentionSaves,
        [batch, heads, seq_len]: [usize; 3],
        dropout: bool,
        category: Category,
    ) -> AttentionSaved {
        match kind {
            AttentionSaves::Probabilities => {
                let shape = [batch, heads, seq_len, seq_len];
                AttentionSaved::Probabilities {
                    probs: self.empty(&shape, category),
                    dropped: dropout.then(|| self.empty(&shape, category)),
                }
            }
            AttentionSaves::RowLogSumExp => {
                AttentionSaved::RowLogSumExp { lse: self.empty(&[batch, heads, seq_len], category) }
            }
        }
    }
    /// Causal grouped-query self-attention core, per query head h: P = softmax(Q_h K_g^T /
    /// sqrt(hs) + `mask`), P' = dropout(P), out_h = P' V_g, where g = h / (NH/KV) is
    /// the key/value head h shares (Hugging Face's repeat_kv; KV == NH is multi-head
    /// attention); `mask` the causal one or a sliding window's (a window of T keys or more
    /// runs as the causal mask). qkv [B,T,(NH+2*KV)*hs] as the module docs lay it out; out
    /// [B,T,NH*hs], unless None (a recompute of `saved` for backward). `saved` receives what
    /// backward reads besides qkv and out, of the kind this backend keeps (see
    /// [`AttentionSaves`]); a kind the backend does not run is a bug in
    /// the caller. The dropout mask, keyed per (batch, query head), is never stored: it is
    /// regenerated from its key.
    #[allow(clippy::too_many_arguments)]
    fn attention_forward(
        &self,
        out: Option<&mut Tensor>,
        saved: &mut AttentionSaved,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        n_head: usize,
        n_kv_head: usize,
        mask: CausalMask,
    ) {
        let dims = qkv_dims(qkv, n_head, n_kv_head);
        if let Some(out) = &out {
            assert_eq!(out.len(), dims.out_len(), "attention: out {out:?} for qkv {qkv:?}");
        }
        self.attention_forward_impl(out, saved, dropout, qkv, dims, mask.over(dims.t));
    }
    /// dqkv [B,T,(NH+2*KV)*hs] (overwrite) from dout [B,T,NH*hs], qkv, and out [B,T,NH*hs]
    /// and `saved` as forward wrote them (the fused backward reads out; the unfused one does
    /// not need it). The k and v gradients of a key/value head sum its query heads'
    /// contributions in ascending head order.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        out: &Tensor,
        qkv: &Tensor,
        saved: &AttentionSaved,
        dropout: Option<DropoutSpec>,
        n_head: usize,
        n_kv_head: usize,
        mask: CausalMask,
    ) {
        let dims = qkv_dims(qkv, n_head, n_kv_head);
        assert_same_len(dqkv, qkv);
        assert_eq!(dout.len(), dims.out_len(), "attention: dout {dout:?} for qkv {qkv:?}");
        self.attention_backward_impl(dqkv, dout, out, qkv, saved, dropout, dims, mask.over(dims.t));
    }
    /// Rotary position embedding, in place, of the NH query and KV key heads of qkv
    /// [B,T,(NH+2*KV)*hs] (the value heads untouched), token t of each sequence at position
    /// first_position + t (0 in training; a decoder's token after its cache), in Hugging
    /// Face's rotate-half layout over the d = `freqs.rotated(hs)` leading channels of each
    /// head (the rest pass through): for i < d/2, with inv_freq_i of `freqs` and
    /// angle = position * inv_freq_i in f32, x[i] = x[i] cos - x[i + d/2] sin and
    /// x[i + d/2] = x[i + d/2] cos + x[i] sin. d must be even.
    fn rope_forward(
        &self,
        qkv: &mut Tensor,
        n_head: usize,
        n_kv_head: usize,
        freqs: RopeFrequencies,
        first_position: usize,
    ) {
        let dims = rope_dims(qkv, n_head, n_kv_head, freqs);
        self.rope_forward_impl(qkv, dims, freqs, first_position);
    }
    /// RoPE's backward, in place on dqkv [B,T,(NH+2*KV)*hs], token t at position t: the
    /// inverse rotation of the query and key gradients (the value gradients untouched).
    fn rope_backward(&self, dqkv: &mut Tensor, n_head: usize, n_kv_head: usize, freqs: RopeFrequencies) {
        let dims = rope_dims(dqkv, n_head, n_kv_head, freqs);
        self.rope_backward_impl(dqkv, dims, freqs);
    }

    // ---- pointwise -----------------------------------------------------------------
    /// GPT-2's tanh GELU: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    fn gelu_forward(&self, out: &mut Tensor, inp: &Tensor) {
        assert_same_len(out, inp);
        self.gelu_forward_impl(out, inp);
    }
    /// dinp (overwrite) = gelu'(inp) * dout
    fn gelu_backward(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        assert_same_len(dinp, inp);
        assert_same_len(dinp, dout);
        self.gelu_backward_impl(dinp, inp, dout);
    }
    /// Squared ReLU (Megatron's `squared_relu`, Nemotron's): out = relu(inp)^2, a NaN
    /// passing through.
    fn squared_relu_forward(&self, out: &mut Tensor, inp: &Tensor) {
        assert_same_len(out, inp);
        self.squared_relu_forward_impl(out, inp);
    }
    /// dinp (overwrite) = 2 relu(inp) * dout
    fn squared_relu_backward(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        assert_same_len(dinp, inp);
        assert_same_len(dinp, dout);
        self.squared_relu_backward_impl(dinp, inp, dout);
    }
    /// A gated linear unit: out [N,F] = act(a) * b, with a = inp[:, :F] (the gate) and
    /// b = inp[:, F:] (the up projection) of inp [N,2F], Megatron's fused linear_fc1 output;
    /// act is `gate`'s: silu(a) = a * sigmoid(a) (SwiGLU) or the tanh GELU (GeGLU).
    fn glu_forward(&self, out: &mut Tensor, inp: &Tensor, gate: Gate) {
        let (n, f) = rows_cols(out);
        assert_eq!(inp.len(), n * 2 * f, "glu: inp {inp:?} for out {out:?} (inp is [N,2F])");
        self.glu_forward_impl(out, inp, f, gate);
    }
    /// dinp [N,2F] (overwrite) = (dout * b * act'(a), dout * act(a)), from inp [N,2F] and
    /// dout [N,F].
    fn glu_backward(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor, gate: Gate) {
        let (n, f) = rows_cols(dout);
        assert_same_len(dinp, inp);
        assert_eq!(inp.len(), n * 2 * f, "glu: inp {inp:?} for dout {dout:?} (inp is [N,2F])");
        self.glu_backward_impl(dinp, inp, dout, f, gate);
    }
    /// out = inp * keep / (1 - p); keep drawn from Philox at (key, element index).
    fn dropout_forward(&self, out: &mut Tensor, inp: &Tensor, dropout: DropoutSpec) {
        assert_same_len(out, inp);
        self.dropout_impl(out, inp, &dropout);
    }
    /// dinp (overwrite) = dout * keep / (1 - p), the same mask regenerated.
    fn dropout_backward(&self, dinp: &mut Tensor, dout: &Tensor, dropout: DropoutSpec) {
        assert_same_len(dinp, dout);
        // The mask multiplies the gradient exactly as it multiplied the activation.
        self.dropout_impl(dinp, dout, &dropout);
    }

    // ---- LM head and loss ------------------------------------------------------------
    /// The output layer and softmax cross-entropy, fused as llm.c fuses them: logits [N,V] =
    /// inp [N,C] @ weight [V,C]^T, where weight is the output layer's (the token embedding
    /// when tied), and losses [N] receives -log softmax(logits)[targets [N]]. With `grad`
    /// (training), the head's backward runs here too, so that no [N,V] tensor outlives the
    /// call: dlogits = s * (softmax - onehot(target)), dinp [N,C] = dlogits @ weight
    /// (overwrite), dweight [V,C] += dlogits^T @ inp.
    /// A backend may pad the logits' rows (CUDA: to [`padded_vocab`] columns); a padded
    /// column is never predicted, never in the loss, and gets no gradient.
    fn classifier(
        &self,
        losses: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        targets: &[u32],
        grad: Option<ClassifierGrad>,
    ) {
        let rows = classifier_rows(losses, inp, weight, targets);
        self.classifier_impl(losses, inp, weight, targets, grad, rows);
    }
    /// A tensor-parallel rank's half of [`Device::classifier`] before the group's exchange
    /// (Megatron's `vocab_parallel_cross_entropy`), over its shard of the vocabulary: for
    /// each row of logits [N, V/t], stats [N,3] (overwrite) = the row's max, its sum of
    /// exp(logit - max), and its target's logit, 0 where `targets` [N] names [`OTHER_SHARD`]
    /// (another rank's column). Three floats a row are all that crosses the group.
    fn vocab_shard_stats(&self, stats: &mut Tensor, logits: &Tensor, targets: &[u32]) {
        let rows = vocab_shard_rows(stats, 3, logits, targets);
        self.vocab_shard_stats_impl(stats, logits, targets, rows);
    }
    /// The exchange's result: from every rank's statistics, gathered as stats [t, N, 3] in
    /// tensor rank order, losses [N] (overwrite) of the whole vocabulary and rows [N,2]
    /// (overwrite), each whole row's max and sum of exp(logit - max), combined in rank order
    /// (the max of the maxima, each sum rescaled to it, the one target logit). On the device,
    /// so that the loss takes no host sync.
    fn vocab_shard_combine(&self, losses: &mut Tensor, rows: &mut Tensor, stats: &Tensor) {
        if losses.is_empty() {
            return;
        }
        let dims = vocab_shard_members(losses, rows, stats);
        self.vocab_shard_combine_impl(losses, rows, stats, dims);
    }
    /// The half after the exchange: logits [N, V/t] (overwrite) = scale * (softmax -
    /// onehot(target)) on the shard's columns, the softmax the whole row's, from `rows` [N,2]:
    /// the whole row's max and its sum of exp(logit - max).
    fn vocab_shard_dlogits(&self, logits: &mut Tensor, rows: &Tensor, targets: &[u32], scale: f32) {
        let dims = vocab_shard_rows(rows, 2, logits, targets);
        self.vocab_shard_dlogits_impl(logits, rows, targets, scale, dims);
    }

    // ---- errors --------------------------------------------------------------------
    /// An error this device recorded where none could be returned (CUDA: what cudarc keeps
    /// from frees and event bookkeeping), as one line, cleared once taken. None on the CPU.
    fn take_error(&self) -> Option<String>;

    // ---- optimizer -----------------------------------------------------------------
    /// One AdamW step: m, v (same shape as param) updated in place, then param.
    fn adamw(&self, param: &mut Tensor, grad: &Tensor, m: &mut Tensor, v: &mut Tensor, hp: AdamWStep) {
        assert_same_len(param, m);
        self.adamw_tensors(&mut [AdamWTensor { param, grad, m, v, from: 0, decay: true }], hp);
    }
    /// AdamW on many parameters at once (every parameter of a stage: one launch on CUDA),
    /// each as [`Device::adamw`] steps it where its moments are whole, or on the part
    /// `from..from + m.len()` of param and grad that they hold (the distributed optimizer's
    /// share of a parameter), the rest untouched. `hp.weight_decay` applies to the tensors
    /// that decay.
    fn adamw_tensors(&self, tensors: &mut [AdamWTensor<'_>], hp: AdamWStep) {
        for t in tensors.iter() {
            assert_same_len(t.param, t.grad);
            assert_same_len(t.m, t.v);
            let (from, len) = (t.from, t.m.len());
            assert!(from + len <= t.param.len(), "adamw: moments of {len} from {from} of {:?}", t.param);
        }
        self.adamw_impl(tensors, &hp);
    }
}
