//! The CPU backend: rayon + gemm, one file per kernel.
//!
//! Each kernel file holds plain functions on slices; [`CpuDevice`] unwraps tensors, checks
//! shapes and calls them inside its own rayon pool, so a pipeline stage's ops use exactly the
//! threads that stage was given.

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
mod layernorm;
pub mod math;
mod matmul;
mod peak;
mod rmsnorm;
mod rope;
mod swiglu;
#[cfg(test)]
mod testutil;

pub use peak::measure_matmul_peak;

use crate::attention::AttentionSaved;
use crate::counters::{Counters, DeviceCounters};
use crate::device::{classifier_rows, AdamWStep, ClassifierGrad, Device, WeightLayout};
use crate::dropout::DropoutSpec;
use crate::memory::{Category, MemoryLedger};
use crate::readout::{Readout, ReadoutStorage};
use crate::tensor::{rows_cols, DType, Detached, Fence, Storage, Tensor};
use crate::timing::{HostClock, Mark, Readings};
use buffers::BufferCache;
use rayon::ThreadPool;
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

    fn workspace(&self, len: usize) -> Tensor {
        self.zeros(&[len], Category::Workspace)
    }
}

/// The CPU stores f32 only (its activation dtype): any other is a bug in the caller.
fn assert_f32(dtype: DType) {
    assert_eq!(dtype, DType::F32, "cpu: tensors are f32 here, {dtype:?} asked");
}

/// Panics on a token id outside a vocabulary of `vocab`: a bug in the caller.
fn assert_tokens_below(tokens: &[u32], vocab: usize) {
    if let Some(bad) = tokens.iter().find(|&&tok| tok as usize >= vocab) {
        panic!("token id {bad} is outside the vocabulary of {vocab}");
    }
}

/// The slots of a CPU readout. Panics on another device's: a backend only writes its own.
fn slots(r: &mut Readout) -> &mut [f64] {
    match r.storage_mut() {
        ReadoutStorage::Cpu(v) => v,
        #[allow(unreachable_patterns)]
        _ => panic!("cpu: a readout of another device"),
    }
}

fn assert_same_len(a: &Tensor, b: &Tensor) {
    assert_eq!(a.len(), b.len(), "element counts differ: {a:?} vs {b:?}");
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads())
    }

    fn ledger(&self) -> &Arc<MemoryLedger> {
        &self.ledger
    }

    fn counters(&self) -> DeviceCounters {
        self.counters.snapshot()
    }

    fn zeros_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor {
        let mut t = self.empty_of(dtype, shape, category);
        t.cpu_mut().fill(0.0);
        t
    }

    fn empty_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor {
        assert_f32(dtype);
        self.tensor(shape, self.buffers.take(shape.iter().product(), &self.counters), category)
    }

    fn from_host_of(&self, dtype: DType, data: &[f32], shape: &[usize], category: Category) -> Tensor {
        assert_f32(dtype);
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "from_host: {} values for {shape:?}",
            data.len()
        );
        let mut buffer = self.buffers.take(data.len(), &self.counters);
        buffer.copy_from_slice(data);
        self.tensor(shape, buffer, category)
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

    fn copy(&self, dst: &mut Tensor, src: &Tensor) {
        assert_same_len(dst, src);
        self.pool.install(|| elementwise::copy(dst.cpu_mut(), src.cpu()));
    }

    fn fill_zero(&self, t: &mut Tensor) {
        self.pool.install(|| elementwise::fill_zero(t.cpu_mut()));
    }

    fn accumulate(&self, acc: &mut Tensor, x: &Tensor) {
        assert_same_len(acc, x);
        self.pool.install(|| elementwise::accumulate(acc.cpu_mut(), x.cpu()));
    }

    fn add(&self, out: &mut Tensor, a: &Tensor, b: &Tensor) {
        assert_same_len(out, a);
        assert_same_len(out, b);
        self.pool.install(|| elementwise::add(out.cpu_mut(), a.cpu(), b.cpu()));
    }

    fn sum_squares(&self, t: &Tensor) -> f64 {
        let mut out = self.readout(1);
        self.sum_squares_into(&mut out, 0, &[t]);
        self.read(&out)[0]
    }

    fn readout(&self, len: usize) -> Readout {
        self.counters.backing_allocation();
        Readout::new(len, ReadoutStorage::Cpu(vec![0.0; len]), self.ledger.clone())
    }

    fn loss_mean(&self, out: &mut Readout, slot: usize, losses: &Tensor) {
        slots(out)[slot] = math::mean_in_order(losses.cpu());
    }

    fn sum_squares_into(&self, out: &mut Readout, first: usize, tensors: &[&Tensor]) {
        let out = &mut slots(out)[first..first + tensors.len()];
        self.pool.install(|| {
            for (slot, t) in out.iter_mut().zip(tensors) {
                *slot = elementwise::sum_squares(t.cpu());
            }
        });
    }

    fn read(&self, r: &Readout) -> Vec<f64> {
        self.counters.host_sync();
        match r.storage() {
            ReadoutStorage::Cpu(v) => v.clone(),
            #[allow(unreachable_patterns)]
            _ => panic!("cpu: a readout of another device"),
        }
    }

    fn embedding_forward(&self, out: &mut Tensor, tokens: &[u32], wte: &Tensor, wpe: Option<&Tensor>) {
        let &[b, t, c] = out.shape() else { panic!("embedding out must be [B,T,C], got {out:?}") };
        assert_eq!(tokens.len(), b * t, "embedding: {} tokens for {out:?}", tokens.len());
        assert_eq!(rows_cols(wte).1, c, "embedding: wte {wte:?} vs out {out:?}");
        assert_tokens_below(tokens, rows_cols(wte).0);
        if let Some(wpe) = wpe {
            assert!(wpe.len() >= t * c && rows_cols(wpe).1 == c, "embedding: wpe {wpe:?} vs out {out:?}");
        }
        let wpe = wpe.map(Tensor::cpu);
        self.pool.install(|| embedding::forward(out.cpu_mut(), tokens, wte.cpu(), wpe, t, c));
    }

    fn embedding_backward(
        &self,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
        dout: &Tensor,
        tokens: &[u32],
    ) {
        let &[b, t, c] = dout.shape() else { panic!("embedding dout must be [B,T,C], got {dout:?}") };
        assert_eq!(tokens.len(), b * t, "embedding: {} tokens for {dout:?}", tokens.len());
        assert_eq!(rows_cols(dwte).1, c, "embedding: dwte {dwte:?} vs dout {dout:?}");
        assert_tokens_below(tokens, rows_cols(dwte).0);
        if let Some(dwpe) = &dwpe {
            assert!(
                dwpe.len() >= t * c && rows_cols(dwpe).1 == c,
                "embedding: dwpe {dwpe:?} vs dout {dout:?}"
            );
        }
        let dwpe = dwpe.map(Tensor::cpu_mut);
        self.pool.install(|| embedding::backward(dwte.cpu_mut(), dwpe, dout.cpu(), tokens, t, c));
    }

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
        let (n, c) = rows_cols(inp);
        assert_same_len(out, inp);
        assert!(mean.len() == n && rstd.len() == n, "layernorm: mean/rstd must have {n} rows");
        assert!(weight.len() == c && bias.len() == c, "layernorm: weight/bias must have {c} channels");
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
        let (n, c) = rows_cols(inp);
        assert_same_len(dinp, inp);
        assert_same_len(dout, inp);
        assert!(mean.len() == n && rstd.len() == n, "layernorm: mean/rstd must have {n} rows");
        assert!(weight.len() == c && dweight.len() == c && dbias.len() == c, "layernorm: {c} channels");
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
    }

    fn rmsnorm_forward(&self, out: &mut Tensor, rstd: &mut Tensor, inp: &Tensor, weight: &Tensor, eps: f32) {
        let (n, c) = rows_cols(inp);
        assert_same_len(out, inp);
        assert_eq!(rstd.len(), n, "rmsnorm: rstd must have {n} rows");
        assert_eq!(weight.len(), c, "rmsnorm: weight must have {c} channels");
        self.pool.install(|| rmsnorm::forward(out.cpu_mut(), rstd.cpu_mut(), inp.cpu(), weight.cpu(), eps));
    }

    fn rmsnorm_backward(
        &self,
        dinp: &mut Tensor,
        dweight: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = rows_cols(inp);
        assert_same_len(dinp, inp);
        assert_same_len(dout, inp);
        assert_eq!(rstd.len(), n, "rmsnorm: rstd must have {n} rows");
        assert!(weight.len() == c && dweight.len() == c, "rmsnorm: {c} channels");
        let mut partials = self.workspace(rmsnorm::partials_len(n, c));
        let saved = rmsnorm::Saved { inp: inp.cpu(), weight: weight.cpu(), rstd: rstd.cpu() };
        self.pool.install(|| {
            rmsnorm::backward(dinp.cpu_mut(), dweight.cpu_mut(), dout.cpu(), saved, partials.cpu_mut())
        });
    }

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
        let par = self.gemm_parallelism();
        self.pool.install(|| {
            matmul::forward(out.cpu_mut(), inp.cpu(), weight.cpu(), layout, bias.map(Tensor::cpu), dims, par)
        });
    }

    fn matmul_backward_input(&self, dinp: &mut Tensor, dout: &Tensor, weight: &Tensor, layout: WeightLayout) {
        let dims = matmul_dims(dout, dinp, weight, layout);
        let par = self.gemm_parallelism();
        self.pool
            .install(|| matmul::backward_input(dinp.cpu_mut(), dout.cpu(), weight.cpu(), layout, dims, par));
    }

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

    fn attention_forward(
        &self,
        out: Option<&mut Tensor>,
        saved: &mut AttentionSaved,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        n_head: usize,
        n_kv_head: usize,
    ) {
        let dims = attention_dims(qkv, n_head, n_kv_head);
        if let Some(out) = &out {
            assert_eq!(
                out.len(),
                dims.b * dims.t * dims.out_width(),
                "attention: out {out:?} for qkv {qkv:?}"
            );
        }
        let (att, dropped) = saved_probabilities(saved, dims, dropout.is_some());
        let groups = self.threads().min(dims.b * dims.nh);
        let (out, att, qkv) = (out.map(|out| out.cpu_mut()), att.cpu_mut(), qkv.cpu());
        let dropout = dropout.as_ref().zip(dropped.map(Tensor::cpu_mut));
        self.pool.install(|| attention::forward(out, att, dropout, qkv, dims, groups));
    }

    fn attention_backward(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        _out: &Tensor,
        qkv: &Tensor,
        saved: &AttentionSaved,
        dropout: Option<DropoutSpec>,
        n_head: usize,
        n_kv_head: usize,
    ) {
        let dims = attention_dims(qkv, n_head, n_kv_head);
        assert_same_len(dqkv, qkv);
        assert_eq!(
            dout.len(),
            dims.b * dims.t * dims.out_width(),
            "attention: dout {dout:?} for qkv {qkv:?}"
        );
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

    fn rope_forward(
        &self,
        qkv: &mut Tensor,
        n_head: usize,
        n_kv_head: usize,
        base: f32,
        first_position: usize,
    ) {
        let dims = rope::Dims { first: first_position, ..rope_dims(qkv, n_head, n_kv_head) };
        let mut table = self.workspace(rope::table_len(dims));
        self.pool.install(|| rope::forward(qkv.cpu_mut(), table.cpu_mut(), dims, base));
    }

    fn rope_backward(&self, dqkv: &mut Tensor, n_head: usize, n_kv_head: usize, base: f32) {
        let dims = rope_dims(dqkv, n_head, n_kv_head);
        let mut table = self.workspace(rope::table_len(dims));
        self.pool.install(|| rope::backward(dqkv.cpu_mut(), table.cpu_mut(), dims, base));
    }

    fn gelu_forward(&self, out: &mut Tensor, inp: &Tensor) {
        assert_same_len(out, inp);
        self.pool.install(|| gelu::forward(out.cpu_mut(), inp.cpu()));
    }

    fn gelu_backward(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        assert_same_len(dinp, inp);
        assert_same_len(dinp, dout);
        self.pool.install(|| gelu::backward(dinp.cpu_mut(), inp.cpu(), dout.cpu()));
    }

    fn swiglu_forward(&self, out: &mut Tensor, inp: &Tensor) {
        let (n, f) = rows_cols(out);
        assert_eq!(inp.len(), n * 2 * f, "swiglu: inp {inp:?} for out {out:?} (inp is [N,2F])");
        self.pool.install(|| swiglu::forward(out.cpu_mut(), inp.cpu(), f));
    }

    fn swiglu_backward(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        let (n, f) = rows_cols(dout);
        assert_same_len(dinp, inp);
        assert_eq!(inp.len(), n * 2 * f, "swiglu: inp {inp:?} for dout {dout:?} (inp is [N,2F])");
        self.pool.install(|| swiglu::backward(dinp.cpu_mut(), inp.cpu(), dout.cpu(), f));
    }

    fn dropout_forward(&self, out: &mut Tensor, inp: &Tensor, dropout: DropoutSpec) {
        assert_same_len(out, inp);
        self.pool.install(|| dropout::apply(out.cpu_mut(), inp.cpu(), &dropout));
    }

    fn dropout_backward(&self, dinp: &mut Tensor, dout: &Tensor, dropout: DropoutSpec) {
        assert_same_len(dinp, dout);
        // The mask multiplies the gradient exactly as it multiplied the activation.
        self.pool.install(|| dropout::apply(dinp.cpu_mut(), dout.cpu(), &dropout));
    }

    fn classifier(
        &self,
        losses: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        targets: &[u32],
        grad: Option<ClassifierGrad>,
    ) {
        let (n, v) = classifier_rows(losses, inp, weight, targets);
        let mut logits = self.zeros(&[n, v], Category::Workspace); // [N,V]
        self.matmul_forward(&mut logits, inp, weight, WeightLayout::OutIn, None);
        let scale = grad.as_ref().map(|g| g.scale);
        self.pool
            .install(|| cross_entropy::forward_backward(losses.cpu_mut(), logits.cpu_mut(), targets, scale));
        let Some(grad) = grad else { return };
        let dlogits = logits; // [N,V], overwritten in place by forward_backward
        self.matmul_backward_input(grad.dinp, &dlogits, weight, WeightLayout::OutIn);
        self.matmul_backward_weight(grad.dweight, None, &dlogits, inp, WeightLayout::OutIn);
    }

    fn adamw(&self, param: &mut Tensor, grad: &Tensor, m: &mut Tensor, v: &mut Tensor, hp: AdamWStep) {
        assert_same_len(param, grad);
        assert_same_len(param, m);
        assert_same_len(param, v);
        self.pool.install(|| adamw::step(param.cpu_mut(), grad.cpu(), m.cpu_mut(), v.cpu_mut(), &hp));
    }

    fn clock_start(&self) {
        self.clock.start();
    }

    fn clock_mark(&self) -> Mark {
        self.clock.mark()
    }

    fn clock_read(&self) -> Readings {
        self.clock.read()
    }

    fn take_error(&self) -> Option<String> {
        None
    }
}

/// The matmul dimensions from `rows` [N,OC] (out or dout), `inp` [N,IC] and the weight.
fn matmul_dims(rows: &Tensor, inp: &Tensor, weight: &Tensor, layout: WeightLayout) -> matmul::Dims {
    let &[w0, w1] = weight.shape() else { panic!("matmul weight must be 2-D, got {weight:?}") };
    let (ic, oc) = match layout {
        WeightLayout::InOut => (w0, w1),
        WeightLayout::OutIn => (w1, w0),
    };
    let (n, inp_cols) = rows_cols(inp);
    assert_eq!(inp_cols, ic, "matmul: input {inp:?} vs weight {weight:?} ({layout:?})");
    assert_eq!(rows.len(), n * oc, "matmul: {rows:?} vs {n} rows x {oc} outputs");
    matmul::Dims { n, ic, oc }
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

/// B, T and the head size of qkv [B,T,(NH+2*KV)*hs], checked: KV must divide NH.
fn qkv_dims(qkv: &Tensor, n_head: usize, n_kv_head: usize) -> (usize, usize, usize) {
    let &[b, t, width] = qkv.shape() else { panic!("qkv must be [B,T,(NH+2*KV)*hs], got {qkv:?}") };
    assert!(
        n_kv_head > 0
            && n_head >= n_kv_head
            && n_head.is_multiple_of(n_kv_head)
            && width.is_multiple_of(n_head + 2 * n_kv_head),
        "qkv {qkv:?} with {n_head} query heads on {n_kv_head} key/value heads"
    );
    (b, t, width / (n_head + 2 * n_kv_head))
}

fn attention_dims(qkv: &Tensor, n_head: usize, n_kv_head: usize) -> attention::Dims {
    let (b, t, hs) = qkv_dims(qkv, n_head, n_kv_head);
    attention::Dims { b, t, nh: n_head, kv: n_kv_head, hs }
}

fn rope_dims(qkv: &Tensor, n_head: usize, n_kv_head: usize) -> rope::Dims {
    let (_, t, hs) = qkv_dims(qkv, n_head, n_kv_head);
    rope::Dims { t, nh: n_head, kv: n_kv_head, hs, first: 0 }
}
