//! The CPU backend: rayon + gemm, one file per kernel.
//!
//! Each kernel file holds plain functions on slices; [`CpuDevice`] implements each kernel
//! family's trait of [`crate::backend`] by unwrapping the tensors (whose shapes
//! [`Device`] has checked) and calling them inside its own rayon pool, so a pipeline stage's
//! ops use exactly the threads that stage was given.

mod adamw;
mod attention;
mod buffers;
/// Public so that the SIMT harness holds the CUDA fused classifier to it, row by row.
pub mod cross_entropy;
#[cfg(test)]
mod device_tests;
mod disjoint;
mod dropout;
mod elementwise;
mod embedding;
mod gelu;
mod glu;
mod layernorm;
pub mod math;
mod matmul;
mod peak;
mod rmsnorm;
mod rope;
mod squared_relu;
#[cfg(test)]
mod testutil;

pub use peak::measure_matmul_peak;

use crate::attention::{AttentionSaved, CausalMask};
use crate::backend::{
    matmul_backward_input_then_gelu, AdamW, Attention, Buffers, Classifier, Dropout, Elementwise, Embedding,
    Gelu, Glu, LayerNorm, Matmul, Readouts, RmsNorm, Rope, SquaredRelu,
};
use crate::counters::{Counters, DeviceCounters};
use crate::device::Device;
use crate::dropout::DropoutSpec;
use crate::gate::Gate;
use crate::memory::{Category, MemoryLedger};
use crate::op_args::{AdamWStep, AdamWTensor, ClassifierGrad, WeightLayout};
use crate::qk_norm::QkNormRows;
use crate::readout::{Readout, ReadoutStorage};
use crate::rope_frequencies::RopeFrequencies;
use crate::shapes::{assert_same_len, MatmulDims, QkvDims};
use crate::tensor::{rows_cols, DType, Detached, Fence, Storage, Tensor};
use crate::timing::{Clock, HostClock, Mark, Readings};
use buffers::BufferCache;
use rayon::ThreadPool;
use std::ops::Range;
use std::sync::Arc;

/// Elements per parallel task in the elementwise kernels: large enough to amortise rayon's
/// per-task cost, small enough to balance. Also the fixed reduction chunk of
/// `sum_squares`, so changing it changes that op's rounding.
const CHUNK: usize = 1 << 14;

/// Rows per parallel task of a row-wise kernel whose rows are `width` elements: about CHUNK
/// elements a task.
fn rows_per_task(width: usize) -> usize {
    (CHUNK / width.max(1)).max(1)
}

/// A CPU device with its own rayon pool.
pub struct CpuDevice {
    pool: ThreadPool,
    ledger: Arc<MemoryLedger>,
    /// Offloaded activations: a copy in other buffers of the same memory, counted apart, so
    /// that offload's accounting and ordering run (and are tested) on the CPU as on a GPU.
    host_ledger: Arc<MemoryLedger>,
    buffers: Arc<BufferCache>,
    clock: HostClock,
    counters: Counters,
}

impl CpuDevice {
    /// A device whose ops run on a new pool of `threads` threads (at least 1), with a fresh
    /// memory ledger.
    pub fn new(threads: usize) -> CpuDevice {
        assert!(threads > 0, "a CPU device needs at least one thread");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("pipetrain-cpu-{i}"))
            .build()
            .expect("cannot start the CPU device's threads");
        CpuDevice {
            pool,
            ledger: Arc::new(MemoryLedger::new()),
            host_ledger: Arc::new(MemoryLedger::new()),
            buffers: Arc::default(),
            clock: HostClock::default(),
            counters: Counters::default(),
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Bytes of freed buffers the device keeps for reuse (not in the ledger: no tensor holds
    /// them).
    pub fn cached_bytes(&self) -> usize {
        self.buffers.cached_bytes()
    }

    /// Wraps a buffer of this device's cache as a tensor that returns it there when dropped.
    fn tensor(&self, shape: &[usize], data: Vec<f32>, category: Category) -> Tensor {
        Tensor::recycled(shape, Storage::Cpu(data), category, self.ledger.clone(), self.buffers.clone())
    }

    /// gemm's threading for a matmul that has the whole pool.
    fn gemm_parallelism(&self) -> gemm::Parallelism {
        match self.threads() {
            1 => gemm::Parallelism::None,
            n => gemm::Parallelism::Rayon(n),
        }
    }

    /// Zeroed scratch of an op's own, as a CUDA kernel zeroes its own: not a zero fill in
    /// [`Device::counters`].
    fn workspace(&self, len: usize) -> Tensor {
        let mut t = self.empty(&[len], Category::Workspace);
        self.zero(&mut [&mut t]);
        t
    }

    /// Zeroes `tensors` on the pool, uncounted: the one body of every zeroing here.
    fn zero(&self, tensors: &mut [&mut Tensor]) {
        self.pool.install(|| tensors.iter_mut().for_each(|t| elementwise::fill_zero(t.cpu_mut())));
    }
}

/// The CPU stores f32 only (its activation dtype): any other is a bug in the caller.
fn assert_f32(dtype: DType) {
    assert_eq!(dtype, DType::F32, "cpu: tensors are f32 here, {dtype:?} asked");
}

/// The slots of a CPU readout. Panics on another device's: a backend only writes its own.
fn slots(r: &mut Readout) -> &mut [f64] {
    match r.storage_mut() {
        ReadoutStorage::Cpu(v) => v,
        #[allow(unreachable_patterns)]
        _ => panic!("cpu: a readout of another device"),
    }
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads())
    }

    fn ledger(&self) -> &Arc<MemoryLedger> {
        &self.ledger
    }

    fn host_ledger(&self) -> &Arc<MemoryLedger> {
        &self.host_ledger
    }

    fn counters(&self) -> DeviceCounters {
        self.counters.snapshot()
    }

    fn zeros_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor {
        let mut t = self.empty_of(dtype, shape, category);
        self.fill_zero(&mut t);
        t
    }

    fn empty_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor {
        assert_f32(dtype);
        self.tensor(shape, self.buffers.take(shape.iter().product(), &self.counters), category)
    }

    fn to_host(&self, t: &Tensor) -> Vec<f32> {
        self.counters.host_sync();
        t.cpu().to_vec()
    }

    fn adopt(&self, t: Detached, category: Category) -> Tensor {
        match t.storage {
            // Every CPU device of a process shares one memory: the buffer itself moves.
            Storage::Cpu(data) => self.tensor(&t.shape, data, category),
            #[cfg(feature = "cuda")]
            _ => panic!("cpu: a GPU tensor reached a CPU stage; a run's stages share one kind of device"),
        }
    }

    fn fence(&self) -> Fence {
        Fence::Done
    }

    fn wait_for(&self, fence: &Fence) {
        match fence {
            Fence::Done => {}
            #[cfg(feature = "cuda")]
            Fence::Event(_) => {
                panic!("cpu: asked to wait for a GPU; a run's stages share one kind of device")
            }
        }
    }

    fn fill_zero(&self, t: &mut Tensor) {
        self.counters.zero_fill();
        self.zero(&mut [t]);
    }

    fn fill_zero_tensors(&self, tensors: &mut [&mut Tensor]) {
        self.counters.zero_fill();
        self.zero(tensors);
    }

    fn readout(&self, len: usize) -> Readout {
        self.counters.backing_allocation();
        Readout::new(len, ReadoutStorage::Cpu(vec![0.0; len]), self.ledger.clone())
    }

    fn read(&self, r: &Readout) -> Vec<f64> {
        self.counters.host_sync();
        match r.storage() {
            ReadoutStorage::Cpu(v) => v.clone(),
            #[allow(unreachable_patterns)]
            _ => panic!("cpu: a readout of another device"),
        }
    }

    fn take_error(&self) -> Option<String> {
        None
    }
}

// Each op's implementation: the shapes were checked by `Device` (crate::shapes).

impl Clock for CpuDevice {
    fn clock_start(&self) {
        self.clock.start();
    }

    fn clock_mark(&self) -> Mark {
        self.clock.mark()
    }

    fn clock_read(&self) -> Readings {
        self.clock.read()
    }
}

impl Buffers for CpuDevice {
    fn from_host_of_impl(&self, dtype: DType, data: &[f32], shape: &[usize], category: Category) -> Tensor {
        assert_f32(dtype);
        let mut buffer = self.buffers.take(data.len(), &self.counters);
        buffer.copy_from_slice(data);
        self.tensor(shape, buffer, category)
    }

    fn copy_impl(&self, dst: &mut Tensor, at: usize, src: &Tensor, part: Range<usize>) {
        let dst = &mut dst.cpu_mut()[at..at + part.len()];
        self.pool.install(|| elementwise::copy(dst, &src.cpu()[part]));
    }

    fn write_at_impl(&self, t: &mut Tensor, from: usize, data: &[f32]) {
        t.cpu_mut()[from..from + data.len()].copy_from_slice(data);
    }

    fn offload_impl(&self, t: &mut Tensor) {
        let mut data = self.buffers.take(t.len(), &self.counters);
        self.pool.install(|| elementwise::copy(&mut data, t.cpu()));
        let (ledger, buffers) = (self.host_ledger.clone(), self.buffers.clone());
        *t = Tensor::recycled(t.shape(), Storage::Cpu(data), Category::Activations, ledger, buffers);
    }

    fn reload_impl(&self, t: &mut Tensor, category: Category) {
        let mut out = self.empty(t.shape(), category);
        self.copy(&mut out, t);
        *t = out;
    }
}

impl Elementwise for CpuDevice {
    fn accumulate_impl(&self, acc: &mut Tensor, x: &Tensor) {
        self.pool.install(|| elementwise::accumulate(acc.cpu_mut(), x.cpu()));
    }

    fn add_impl(&self, out: &mut Tensor, a: &Tensor, b: &Tensor) {
        self.pool.install(|| elementwise::add(out.cpu_mut(), a.cpu(), b.cpu()));
    }

    fn add_scalar_impl(&self, out: &mut Tensor, a: &Tensor, s: f32) {
        self.pool.install(|| elementwise::add_scalar(out.cpu_mut(), a.cpu(), s));
    }

    fn scale_impl(&self, t: &mut Tensor, s: f32) {
        self.pool.install(|| elementwise::scale(t.cpu_mut(), s));
    }
}

impl Readouts for CpuDevice {
    fn loss_mean_impl(&self, out: &mut Readout, slot: usize, losses: &Tensor) {
        slots(out)[slot] = math::mean_in_order(losses.cpu());
    }

    fn sum_squares_into_impl(&self, out: &mut Readout, first: usize, parts: &[(&Tensor, Range<usize>)]) {
        let out = &mut slots(out)[first..first + parts.len()];
        self.pool.install(|| {
            for (slot, (t, range)) in out.iter_mut().zip(parts) {
                *slot = elementwise::sum_squares(&t.cpu()[range.clone()]);
            }
        });
    }
}

impl Embedding for CpuDevice {
    fn embedding_forward_impl(
        &self,
        out: &mut Tensor,
        tokens: &[u32],
        wte: &Tensor,
        wpe: Option<&Tensor>,
        [_, t, c]: [usize; 3],
    ) {
        let wpe = wpe.map(Tensor::cpu);
        self.pool.install(|| embedding::forward(out.cpu_mut(), tokens, wte.cpu(), wpe, t, c));
    }

    fn embedding_backward_impl(
        &self,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
        dout: &Tensor,
        tokens: &[u32],
        [_, t, c]: [usize; 3],
    ) {
        let dwpe = dwpe.map(Tensor::cpu_mut);
        self.pool.install(|| embedding::backward(dwte.cpu_mut(), dwpe, dout.cpu(), tokens, t, c));
    }
}

impl LayerNorm for CpuDevice {
    fn layernorm_forward_impl(
        &self,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) {
        self.pool.install(|| {
            layernorm::forward(
                out.cpu_mut(),
                mean.cpu_mut(),
                rstd.cpu_mut(),
                inp.cpu(),
                weight.cpu(),
                bias.cpu(),
                eps,
            )
        });
    }

    fn layernorm_residual_forward_impl(
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
        // The add and then the norm, as the unfused ops run them: the same bits.
        self.add_impl(residual, a, b);
        self.layernorm_forward_impl(out, mean, rstd, residual, weight, bias, eps);
    }

    fn layernorm_backward_impl(
        &self,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        dweight: &mut Tensor,
        dbias: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = rows_cols(inp);
        let mut partials = self.workspace(layernorm::partials_len(n, c));
        let saved =
            layernorm::Saved { inp: inp.cpu(), weight: weight.cpu(), mean: mean.cpu(), rstd: rstd.cpu() };
        self.pool.install(|| {
            layernorm::backward(
                dinp.cpu_mut(),
                dweight.cpu_mut(),
                dbias.cpu_mut(),
                dout.cpu(),
                saved,
                partials.cpu_mut(),
            )
        });
        if let Some(dresidual) = dresidual {
            self.accumulate_impl(dinp, dresidual);
        }
    }
}

impl RmsNorm for CpuDevice {
    fn rmsnorm_forward_impl(
        &self,
        out: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) {
        self.pool.install(|| rmsnorm::forward(out.cpu_mut(), rstd.cpu_mut(), inp.cpu(), weight.cpu(), eps));
    }

    fn rmsnorm_residual_forward_impl(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) {
        // The add and then the norm, as the unfused ops run them: the same bits.
        self.add_impl(residual, a, b);
        self.rmsnorm_forward_impl(out, rstd, residual, weight, eps);
    }

    fn rmsnorm_backward_impl(
        &self,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        dweight: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = rows_cols(inp);
        let mut partials = self.workspace(rmsnorm::partials_len(n, c));
        let saved = rmsnorm::Saved { inp: inp.cpu(), weight: weight.cpu(), rstd: rstd.cpu() };
        self.pool.install(|| {
            rmsnorm::backward(dinp.cpu_mut(), dweight.cpu_mut(), dout.cpu(), saved, partials.cpu_mut())
        });
        if let Some(dresidual) = dresidual {
            self.accumulate_impl(dinp, dresidual);
        }
    }

    fn qk_norm_forward_impl(
        &self,
        qkv: &mut Tensor,
        rstd: &mut Tensor,
        weights: [&Tensor; 2],
        rows: QkNormRows,
        summed: Option<usize>,
        eps: f32,
    ) {
        let weights = weights.map(Tensor::cpu);
        let (qkv, rstd) = (qkv.cpu_mut(), rstd.cpu_mut());
        self.pool.install(|| match summed {
            None => rmsnorm::heads_forward(qkv, rstd, weights, rows, eps),
            Some(parts) => rmsnorm::heads_forward_summed(qkv, rstd, weights, rows, parts, eps),
        });
    }

    fn qk_norm_sum_squares_impl(&self, qkv: &Tensor, sums: &mut Tensor, rows: QkNormRows) {
        self.pool.install(|| rmsnorm::heads_sum_squares(qkv.cpu(), sums.cpu_mut(), rows));
    }

    fn qk_norm_backward_impl(
        &self,
        dqkv: &mut Tensor,
        dweights: [&mut Tensor; 2],
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        rows: QkNormRows,
        summed: Option<(&Tensor, usize)>,
    ) {
        let mut partials = self.workspace(rmsnorm::heads_partials_len(inp.len() / rows.token_width(), rows));
        let (dweights, weights) = (dweights.map(|t| t.cpu_mut()), weights.map(Tensor::cpu));
        let saved = rmsnorm::HeadsSaved { inp: inp.cpu(), weights, rstd: rstd.cpu() };
        let (dqkv, partials) = (dqkv.cpu_mut(), partials.cpu_mut());
        self.pool.install(|| match summed {
            None => rmsnorm::heads_backward(dqkv, dweights, saved, rows, partials),
            Some((dots, parts)) => {
                rmsnorm::heads_backward_summed(dqkv, dweights, saved, (dots.cpu(), parts), rows, partials)
            }
        });
    }

    fn qk_norm_backward_dots_impl(
        &self,
        dqkv: &Tensor,
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        dots: &mut Tensor,
        rows: QkNormRows,
    ) {
        let saved =
            rmsnorm::HeadsSaved { inp: inp.cpu(), weights: weights.map(Tensor::cpu), rstd: rstd.cpu() };
        self.pool.install(|| rmsnorm::heads_backward_dots(dqkv.cpu(), saved, rows, dots.cpu_mut()));
    }
}

impl Matmul for CpuDevice {
    fn matmul_forward_impl(
        &self,
        out: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        bias: Option<&Tensor>,
        dims: MatmulDims,
    ) {
        let par = self.gemm_parallelism();
        self.pool.install(|| {
            matmul::forward(out.cpu_mut(), inp.cpu(), weight.cpu(), layout, bias.map(Tensor::cpu), dims, par)
        });
    }

    fn matmul_backward_input_impl(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        dims: MatmulDims,
    ) {
        let par = self.gemm_parallelism();
        self.pool
            .install(|| matmul::backward_input(dinp.cpu_mut(), dout.cpu(), weight.cpu(), layout, dims, par));
    }

    fn matmul_backward_input_gelu_impl(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        gelu_input: &Tensor,
        dims: MatmulDims,
    ) {
        matmul_backward_input_then_gelu(self, dinp, dout, weight, layout, gelu_input, dims);
    }

    fn matmul_backward_weight_impl(
        &self,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
        dout: &Tensor,
        inp: &Tensor,
        layout: WeightLayout,
        dims: MatmulDims,
    ) {
        let par = self.gemm_parallelism();
        self.pool.install(|| {
            matmul::backward_weight(
                dweight.cpu_mut(),
                dbias.map(Tensor::cpu_mut),
                dout.cpu(),
                inp.cpu(),
                layout,
                dims,
                par,
            )
        });
    }
}

impl Attention for CpuDevice {
    fn attention_forward_impl(
        &self,
        out: Option<&mut Tensor>,
        saved: &mut AttentionSaved,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        dims: QkvDims,
        mask: CausalMask,
    ) {
        let dims = attention_dims(dims, mask);
        let (att, dropped) = saved_probabilities(saved, dims, dropout.is_some());
        let groups = self.threads().min(dims.b * dims.nh);
        let (out, att, qkv) = (out.map(|out| out.cpu_mut()), att.cpu_mut(), qkv.cpu());
        let dropout = dropout.as_ref().zip(dropped.map(Tensor::cpu_mut));
        self.pool.install(|| attention::forward(out, att, dropout, qkv, dims, groups));
    }

    fn attention_backward_impl(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        _out: &Tensor,
        qkv: &Tensor,
        saved: &AttentionSaved,
        dropout: Option<DropoutSpec>,
        dims: QkvDims,
        mask: CausalMask,
    ) {
        let dims = attention_dims(dims, mask);
        let AttentionSaved::Probabilities { probs: att, dropped } = saved else {
            panic!("cpu: attention keeps probabilities, not {:?}", saved.kind())
        };
        check_probabilities(att, dropped.as_ref(), dims, dropout.is_some());
        let groups = self.threads().min(dims.b * dims.kv);
        let mut scratch = self.workspace(attention::backward_scratch_len(dims, groups));
        let saved = attention::Saved {
            qkv: qkv.cpu(),
            att: att.cpu(),
            dropout: dropout.as_ref().zip(dropped.as_ref().map(Tensor::cpu)),
        };
        self.pool.install(|| {
            attention::backward(dqkv.cpu_mut(), dout.cpu(), saved, dims, scratch.cpu_mut(), groups)
        });
    }
}

impl Rope for CpuDevice {
    fn rope_forward_impl(
        &self,
        qkv: &mut Tensor,
        dims: QkvDims,
        freqs: RopeFrequencies,
        first_position: usize,
    ) {
        let dims = rope::Dims { first: first_position, ..rope_dims(dims) };
        let mut table = self.workspace(rope::table_len(dims, freqs));
        self.pool.install(|| rope::forward(qkv.cpu_mut(), table.cpu_mut(), dims, freqs));
    }

    fn rope_backward_impl(&self, dqkv: &mut Tensor, dims: QkvDims, freqs: RopeFrequencies) {
        let dims = rope_dims(dims);
        let mut table = self.workspace(rope::table_len(dims, freqs));
        self.pool.install(|| rope::backward(dqkv.cpu_mut(), table.cpu_mut(), dims, freqs));
    }
}

impl Gelu for CpuDevice {
    fn gelu_forward_impl(&self, out: &mut Tensor, inp: &Tensor) {
        self.pool.install(|| gelu::forward(out.cpu_mut(), inp.cpu()));
    }

    fn gelu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        self.pool.install(|| gelu::backward(dinp.cpu_mut(), inp.cpu(), dout.cpu()));
    }
}

impl SquaredRelu for CpuDevice {
    fn squared_relu_forward_impl(&self, out: &mut Tensor, inp: &Tensor) {
        self.pool.install(|| squared_relu::forward(out.cpu_mut(), inp.cpu()));
    }

    fn squared_relu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        self.pool.install(|| squared_relu::backward(dinp.cpu_mut(), inp.cpu(), dout.cpu()));
    }
}

impl Glu for CpuDevice {
    fn glu_forward_impl(&self, out: &mut Tensor, inp: &Tensor, f: usize, gate: Gate) {
        self.pool.install(|| glu::forward(out.cpu_mut(), inp.cpu(), f, gate));
    }

    fn glu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor, f: usize, gate: Gate) {
        self.pool.install(|| glu::backward(dinp.cpu_mut(), inp.cpu(), dout.cpu(), f, gate));
    }
}

impl Dropout for CpuDevice {
    fn dropout_impl(&self, out: &mut Tensor, inp: &Tensor, dropout: &DropoutSpec) {
        self.pool.install(|| dropout::apply(out.cpu_mut(), inp.cpu(), dropout));
    }
}

impl Classifier for CpuDevice {
    fn classifier_impl(
        &self,
        losses: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        targets: &[u32],
        grad: Option<ClassifierGrad>,
        (n, v): (usize, usize),
    ) {
        let mut logits = self.empty(&[n, v], Category::Workspace); // [N,V]
        self.matmul_forward(&mut logits, inp, weight, WeightLayout::OutIn, None);
        let scale = grad.as_ref().map(|g| g.scale);
        self.pool
            .install(|| cross_entropy::forward_backward(losses.cpu_mut(), logits.cpu_mut(), targets, scale));
        let Some(grad) = grad else { return };
        let dlogits = logits; // [N,V], overwritten in place by forward_backward
        self.matmul_backward_input(grad.dinp, &dlogits, weight, WeightLayout::OutIn);
        self.matmul_backward_weight(grad.dweight, None, &dlogits, inp, WeightLayout::OutIn);
    }

    fn vocab_shard_stats_impl(
        &self,
        stats: &mut Tensor,
        logits: &Tensor,
        targets: &[u32],
        _: (usize, usize),
    ) {
        self.pool.install(|| cross_entropy::shard_stats(stats.cpu_mut(), logits.cpu(), targets));
    }

    fn vocab_shard_combine_impl(
        &self,
        losses: &mut Tensor,
        rows: &mut Tensor,
        stats: &Tensor,
        _: (usize, usize),
    ) {
        cross_entropy::shard_combine(losses.cpu_mut(), rows.cpu_mut(), stats.cpu());
    }

    fn vocab_shard_dlogits_impl(
        &self,
        logits: &mut Tensor,
        rows: &Tensor,
        targets: &[u32],
        scale: f32,
        _: (usize, usize),
    ) {
        self.pool.install(|| cross_entropy::shard_dlogits(logits.cpu_mut(), rows.cpu(), targets, scale));
    }
}

impl AdamW for CpuDevice {
    fn adamw_impl(&self, tensors: &mut [AdamWTensor<'_>], hp: &AdamWStep) {
        for t in tensors {
            let part = t.from..t.from + t.m.len();
            let hp = AdamWStep { weight_decay: if t.decay { hp.weight_decay } else { 0.0 }, ..*hp };
            let (param, grad) = (&mut t.param.cpu_mut()[part.clone()], &t.grad.cpu()[part]);
            self.pool.install(|| adamw::step(param, grad, t.m.cpu_mut(), t.v.cpu_mut(), &hp));
        }
    }
}

/// P and, under dropout, P' out of what attention forward fills, checked against `dims`.
fn saved_probabilities(
    saved: &mut AttentionSaved,
    dims: attention::Dims,
    dropout: bool,
) -> (&mut Tensor, Option<&mut Tensor>) {
    let kind = saved.kind();
    let AttentionSaved::Probabilities { probs, dropped } = saved else {
        panic!("cpu: attention keeps probabilities, not {kind:?}")
    };
    check_probabilities(probs, dropped.as_ref(), dims, dropout);
    (probs, dropped.as_mut())
}

/// P [B,NH,T,T], and P' beside it exactly when there is dropout.
fn check_probabilities(probs: &Tensor, dropped: Option<&Tensor>, dims: attention::Dims, dropout: bool) {
    assert_eq!(probs.len(), dims.att_len(), "attention: probabilities {probs:?} for {dims:?}");
    assert_eq!(dropped.is_some(), dropout, "attention: dropped probabilities {dropped:?}, dropout {dropout}");
    if let Some(dropped) = dropped {
        assert_same_len(dropped, probs);
    }
}

fn attention_dims(d: QkvDims, mask: CausalMask) -> attention::Dims {
    attention::Dims { b: d.b, t: d.t, nh: d.nh, kv: d.kv, hs: d.hs, mask }
}

fn rope_dims(d: QkvDims) -> rope::Dims {
    rope::Dims { t: d.t, nh: d.nh, kv: d.kv, hs: d.hs, first: 0 }
}
