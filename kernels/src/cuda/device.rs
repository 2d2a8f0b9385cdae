//! [`CudaDevice`]: one GPU's stream, cuBLAS handle and ledger behind the [`Device`] trait.
//! The ops themselves live in the files named after their kernel families, each implementing
//! its family's trait of [`crate::backend`]; this file holds the buffers and the choice of
//! attention core.

use super::arena::{Arena, FreeOnStream};
use super::blaslt::Lt;
use super::clock::EventClock;
use super::gpu::{gpu, Gpu, GpuUse};
use super::launch::per_pack;
use super::scratch::Scratch;
use super::tensor_table::KeptTable;
use super::views::{cu, cu16, cu16_mut, cu_mut, master_is_sharded, same_dtype};
use crate::attention::{AttentionSaved, CausalMask};
use crate::backend::{Attention, Buffers};
use crate::counters::{Counters, DeviceCounters};
use crate::device::{bf16_copy_len, Device};
use crate::dropout::DropoutSpec;
use crate::memory::{Category, MemoryLedger};
use crate::readout::{Readout, ReadoutStorage};
pub(super) use crate::shapes::assert_same_len;
use crate::shapes::QkvDims;
pub(super) use crate::tensor::rows_cols;
use crate::tensor::{DType, Detached, Fence, Storage, Tensor};
use crate::timing::{Clock, Mark, Readings};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The arithmetic of the layer matmuls, and so the dtype of the activations they read
/// ([`Device::activation_dtype`](crate::Device::activation_dtype)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// Full fp32 (cuBLAS's default math mode: no TF32), f32 activations.
    Fp32,
    /// bf16 activations and bf16 weight copies as operands, accumulated in fp32; the
    /// weights themselves stay fp32 (the master copy the optimizer updates).
    Bf16,
}

/// A GPU as a [`Device`]. Each device has its own stream, so ops on one device run in
/// the order they are called; several devices may share a GPU (and its compiled kernels).
pub struct CudaDevice {
    pub(super) ordinal: usize,
    pub(super) gpu: Arc<Gpu>,
    pub(super) stream: Arc<CudaStream>,
    /// cuBLAS handles are not meant for concurrent calls; a device serialises its own.
    pub(super) blas: Mutex<CudaBlas>,
    /// cuBLASLt, for the matmuls with an epilogue (blaslt.rs); serialised as `blas` is.
    pub(super) lt: Mutex<Lt>,
    pub(super) precision: MatmulPrecision,
    /// Whether matmuls fold the op after them into cuBLASLt epilogues (blaslt.rs).
    pub(super) epilogue_fusion: bool,
    pub(super) ledger: Arc<MemoryLedger>,
    /// Offloaded activations in host memory (`Device::offload`).
    host_ledger: Arc<MemoryLedger>,
    /// The stream that copies offloaded activations out and back (offload.rs).
    pub(super) copies: Arc<CudaStream>,
    /// Copies back the device's stream has not waited for yet (`Device::await_reloads`).
    pub(super) reloads: Mutex<Vec<cudarc::driver::CudaEvent>>,
    pub(super) counters: Arc<Counters>,
    pub(super) arena: Arc<Arena>,
    /// The tables of the last tensors the fused grad norm, AdamW and the zeroing of
    /// gradients were given (tensor_table.rs): after the first step they upload nothing.
    pub(super) norm_table: KeptTable,
    pub(super) adamw_table: KeptTable,
    pub(super) zero_table: KeptTable,
    clock: EventClock,
    /// Kernels of ours launched ([`CudaDevice::launches`]).
    pub(super) launches: AtomicU64,
    /// Opened as the sole device of its GPU in this process (see `adopt`).
    pub(super) sole: bool,
}

impl CudaDevice {
    /// Opens GPU `ordinal`, which other devices of this process may share, with fp32
    /// matmuls and a fresh ledger. An error (no driver, no such GPU, no NVRTC or cuBLAS
    /// library, a kernel that does not compile) is a message that says which; this never
    /// panics for want of a GPU.
    pub fn new(ordinal: usize) -> Result<CudaDevice, String> {
        Self::open(ordinal, GpuUse::Shared)
    }

    /// As [`CudaDevice::new`], for the one device of this process on GPU `ordinal` (a rank
    /// alone in its process): no per-buffer event tracking (`GpuUse::Sole` in gpu.rs). No other
    /// device of this process may open the GPU after it.
    pub fn sole(ordinal: usize) -> Result<CudaDevice, String> {
        Self::open(ordinal, GpuUse::Sole)
    }

    fn open(ordinal: usize, used: GpuUse) -> Result<CudaDevice, String> {
        let gpu = gpu(ordinal, used)?;
        // SAFETY: only tries to open the library by its candidate names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("the cuBLAS library (libcublas.so) was not found; install it (e.g. the PyPI \
                        wheel nvidia-cublas) and put its lib directory on LD_LIBRARY_PATH"
                .into());
        }
        // SAFETY: as above.
        if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
            return Err("the cuBLASLt library (libcublasLt.so) was not found; it comes with cuBLAS \
                        (the PyPI wheel nvidia-cublas): put its lib directory on LD_LIBRARY_PATH"
                .into());
        }
        let stream =
            gpu.ctx.new_stream().map_err(|e| format!("GPU {ordinal}: cannot create a stream: {e:?}"))?;
        let copies =
            gpu.ctx.new_stream().map_err(|e| format!("GPU {ordinal}: cannot create a stream: {e:?}"))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| format!("GPU {ordinal}: cannot start cuBLAS: {e:?}"))?;
        gpu.ctx.bind_to_thread().map_err(|e| format!("GPU {ordinal}: cannot bind the context: {e:?}"))?;
        let lt = Lt::new(&stream).map_err(|e| format!("GPU {ordinal}: {e}"))?;
        let counters = Arc::new(Counters::default());
        Ok(CudaDevice {
            ordinal,
            gpu,
            stream,
            blas: Mutex::new(blas),
            lt: Mutex::new(lt),
            precision: MatmulPrecision::Fp32,
            epilogue_fusion: true,
            ledger: Arc::new(MemoryLedger::new()),
            host_ledger: Arc::new(MemoryLedger::new()),
            copies,
            reloads: Mutex::default(),
            clock: EventClock::default(),
            launches: AtomicU64::new(0),
            arena: Arc::new(Arena::new(counters.clone())),
            counters,
            norm_table: KeptTable::default(),
            adamw_table: KeptTable::default(),
            zero_table: KeptTable::default(),
            sole: used == GpuUse::Sole,
        })
    }

    /// The same device storing activations in `precision`: under bf16, activations and
    /// their gradients are bf16 tensors, parameters carry a bf16 copy that AdamW
    /// refreshes, and every matmul and the fused attention run on tensor cores into fp32
    /// accumulators; parameters, their gradients and the optimizer stay fp32. bf16 needs
    /// tensor-core bf16 (sm_80 on): an older GPU is an error that says so.
    pub fn with_matmul_precision(mut self, precision: MatmulPrecision) -> Result<CudaDevice, String> {
        let (major, minor) = self.gpu.compute_capability;
        if precision == MatmulPrecision::Bf16 && major < 8 {
            return Err(format!(
                "precision bf16 needs a GPU of compute capability 8.0 or later (bf16 tensor cores); {} is sm_{major}{minor}",
                self.name()
            ));
        }
        self.precision = precision;
        Ok(self)
    }

    /// The same device with the matmuls' epilogue fusion on (the default) or off: off, the
    /// bias add and GELU's backward run as kernels of their own (to measure the fusion).
    pub fn with_epilogue_fusion(mut self, fused: bool) -> CudaDevice {
        self.epilogue_fusion = fused;
        self
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// How many kernels of ours (kernels/cuda) this device has launched: a product whose
    /// epilogue did a kernel's work launches none.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Waits until every op issued so far on this device has finished (for timing).
    pub fn synchronize(&self) {
        self.stream.synchronize().unwrap_or_else(|e| panic!("cuda: synchronize failed: {e:?}"));
    }

    pub(super) fn scratch<T: DeviceRepr + Send + 'static>(&self, len: usize) -> Scratch<T> {
        Scratch::uninit(&self.stream, &self.arena, &self.ledger, len)
    }

    pub(super) fn upload<T: DeviceRepr + Send + 'static>(&self, data: &[T]) -> Scratch<T> {
        Scratch::from_host(&self.stream, &self.arena, &self.ledger, data)
    }

    /// Wraps storage as a tensor that goes back to the arena when dropped.
    fn tensor(&self, shape: &[usize], storage: Storage, category: Category) -> Tensor {
        Tensor::recycled(shape, storage, category, self.ledger.clone(), self.arena.clone())
    }

    /// Waits for the stream and counts it: every download the host waits for.
    pub(super) fn host_sync(&self) {
        self.counters.host_sync();
        self.synchronize();
    }

    /// Whether `slice` is on this GPU: in its primary context, whichever cudarc context
    /// wrapper it was made through (an NCCL communicator's stream has its own).
    fn on_this_gpu<T>(&self, slice: &CudaSlice<T>) -> bool {
        slice.context().cu_ctx() == self.gpu.ctx.cu_ctx()
    }

    /// A tensor of storage on this GPU that another stream allocated. Devices that share
    /// the GPU (stages in threads) hand buffers back and forth, so the arena keeps it. A
    /// sole device's only other streams are its communicators': their receive buffers
    /// would pile up in the arena, and freed on their own stream they would be freed
    /// before this stream has used them; so this stream frees them, after its last use.
    fn adopted(&self, shape: &[usize], storage: Storage, category: Category) -> Tensor {
        if self.sole && self.allocated_elsewhere(&storage) {
            let free = Arc::new(FreeOnStream(self.stream.clone()));
            Tensor::recycled(shape, storage, category, self.ledger.clone(), free)
        } else {
            self.tensor(shape, storage, category)
        }
    }

    /// Whether `storage` was allocated on a stream other than this device's.
    pub(super) fn allocated_elsewhere(&self, storage: &Storage) -> bool {
        match storage {
            Storage::Cuda(s) => !Arc::ptr_eq(s.stream(), &self.stream),
            Storage::CudaBf16(s) => !Arc::ptr_eq(s.stream(), &self.stream),
            _ => false,
        }
    }

    /// A copy on this GPU of a tensor another GPU's stage detached.
    fn copy_from_another_gpu<T: DeviceRepr + Send + 'static>(
        &self,
        slice: CudaSlice<T>,
        shape: &[usize],
    ) -> CudaSlice<T> {
        // cudarc's cross-context copy records the source's read event on the source's own
        // stream, before the copy runs on ours: freeing the source on its stream would not
        // wait for the copy. The source's stream waits for it here, before `slice` drops
        // (ARCHITECTURE.md, "Streams").
        let copy_then_order = || -> Result<_, cudarc::driver::DriverError> {
            let mut copy = self.arena.take::<T>(&self.stream, slice.len());
            self.stream.memcpy_dtod(&slice, &mut copy)?;
            slice.stream().wait(&self.stream.record_event(None)?)?;
            Ok(copy)
        };
        copy_then_order()
            .unwrap_or_else(|e| panic!("cuda: cannot copy {shape:?} to GPU {}: {e:?}", self.ordinal))
    }

    /// The length of the bf16 copy a tensor of `shape` carries: a parameter's
    /// ([`bf16_copy_len`]) on a device whose matmuls are bf16.
    fn bf16_copy_len(&self, shape: &[usize], category: Category) -> Option<usize> {
        let bf16_parameter = self.precision == MatmulPrecision::Bf16 && category == Category::Parameters;
        bf16_parameter.then(|| bf16_copy_len(shape))
    }

    /// Makes a parameter's bf16 copy equal to its master rounded (the padding rows stay
    /// zero): after every op that writes a parameter other than AdamW, which refreshes it in
    /// its own pass.
    pub(super) fn refresh_bf16_copy(&self, t: &mut Tensor) {
        if let Storage::CudaMaster { master, bf16, part } = t.storage_mut() {
            let n = part.len() as u64;
            let mut copy = bf16.slice_mut(part.clone());
            launch!(self, "f32_to_bf16", per_pack(part.len(), DType::Bf16), &mut copy, &*master, &n);
        }
    }

    /// Writes `data` at element `from` of a parameter whose master holds only `part` of it:
    /// the master takes the values within its part, the bf16 copy all of them, rounded.
    fn write_at_sharded(&self, t: &mut Tensor, from: usize, data: &[f32]) {
        let upload = self.upload(data);
        let Storage::CudaMaster { master, bf16, part } = t.storage_mut() else {
            unreachable!("the caller matched a sharded master")
        };
        let n = data.len() as u64;
        let mut copy = bf16.slice_mut(from..from + data.len());
        launch!(self, "f32_to_bf16", per_pack(data.len(), DType::Bf16), &mut copy, &*upload, &n);
        let mine = from.max(part.start)..(from + data.len()).min(part.end);
        if !mine.is_empty() {
            let mut into = master.slice_mut(mine.start - part.start..mine.end - part.start);
            (self.stream.memcpy_htod(&data[mine.start - from..mine.end - from], &mut into)).unwrap_or_else(
                |e| panic!("cuda: cannot upload {} values at element {from}: {e:?}", data.len()),
            );
        }
    }
}

impl Clock for CudaDevice {
    fn clock_start(&self) {
        self.clock.start(&self.stream);
    }

    fn clock_mark(&self) -> Mark {
        self.clock.mark(&self.stream)
    }

    fn clock_read(&self) -> Readings {
        let (readings, waited) = self.clock.read();
        // A wait for marks the host has not already synced past is a host sync of its own.
        if waited {
            self.counters.host_sync();
        }
        readings
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        let (major, minor) = self.gpu.compute_capability;
        format!("cuda:{} ({}, sm_{major}{minor})", self.ordinal, self.gpu.name)
    }

    fn ledger(&self) -> &Arc<MemoryLedger> {
        &self.ledger
    }

    fn host_ledger(&self) -> &Arc<MemoryLedger> {
        &self.host_ledger
    }

    fn await_reloads(&self) {
        self.await_reloads_op()
    }

    fn counters(&self) -> DeviceCounters {
        self.counters.snapshot()
    }

    fn activation_dtype(&self) -> DType {
        match self.precision {
            MatmulPrecision::Fp32 => DType::F32,
            MatmulPrecision::Bf16 => DType::Bf16,
        }
    }

    fn zeros_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor {
        let mut t = self.empty_of(dtype, shape, category);
        self.fill_zero(&mut t);
        t
    }

    fn empty_of(&self, dtype: DType, shape: &[usize], category: Category) -> Tensor {
        // An empty tensor holds one unused element (the arena never hands out none).
        let len = shape.iter().product();
        let storage = match dtype {
            DType::Bf16 => Storage::CudaBf16(self.arena.take::<u16>(&self.stream, len)),
            DType::F32 => match self.bf16_copy_len(shape, category) {
                Some(copy_len) => {
                    let mut bf16 = self.arena.take::<u16>(&self.stream, copy_len);
                    // The padding rows stay zero for the tensor's life; the rest is refreshed.
                    let zeroed = self.stream.memset_zeros(&mut bf16);
                    zeroed.unwrap_or_else(|e| panic!("cuda: cannot zero: {e:?}"));
                    Storage::CudaMaster {
                        master: self.arena.take::<f32>(&self.stream, len),
                        bf16,
                        part: 0..len,
                    }
                }
                None => Storage::Cuda(self.arena.take::<f32>(&self.stream, len)),
            },
        };
        self.tensor(shape, storage, category)
    }

    fn to_host(&self, t: &Tensor) -> Vec<f32> {
        if t.is_empty() {
            return Vec::new();
        }
        let downloaded = match t.dtype() {
            DType::F32 => {
                let mut host = vec![0.0; t.len()];
                self.stream.memcpy_dtoh(&cu(t).slice(..t.len()), &mut host).map(|()| host)
            }
            DType::Bf16 => {
                let mut bits = vec![0u16; t.len()];
                let copied = self.stream.memcpy_dtoh(&cu16(t).slice(..t.len()), &mut bits);
                copied.map(|()| bits.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect())
            }
        };
        let host = downloaded.unwrap_or_else(|e| panic!("cuda: cannot download {t:?}: {e:?}"));
        self.host_sync();
        host
    }

    fn to_host_part(&self, t: &Tensor, part: Range<usize>) -> Vec<f32> {
        let (slice, held) = match t.storage() {
            Storage::CudaMaster { master, part: held, .. } => (master, held.clone()),
            _ => (cu(t), 0..t.len()),
        };
        assert!(
            held.start <= part.start && part.end <= held.end,
            "cuda: elements {part:?} of {t:?}, which holds {held:?}"
        );
        let mut host = vec![0.0; part.len()];
        if !part.is_empty() {
            (self
                .stream
                .memcpy_dtoh(&slice.slice(part.start - held.start..part.end - held.start), &mut host))
            .unwrap_or_else(|e| panic!("cuda: cannot download {t:?}: {e:?}"));
            self.host_sync();
        }
        host
    }

    fn shard_master(&self, t: &mut Tensor, part: Range<usize>) -> bool {
        if !matches!(t.storage(), Storage::CudaMaster { .. }) {
            return false;
        }
        assert!(!master_is_sharded(t) && part.end <= t.len(), "cuda: shard_master {part:?} of {t:?}");
        t.restore(|storage| {
            let Storage::CudaMaster { master, bf16, .. } = storage else { unreachable!("matched above") };
            let mut mine = self.arena.take::<f32>(&self.stream, part.len());
            if !part.is_empty() {
                (self.stream.memcpy_dtod(&master.slice(part.clone()), &mut mine))
                    .unwrap_or_else(|e| panic!("cuda: cannot keep a master's part: {e:?}"));
            }
            self.arena.put(master);
            Storage::CudaMaster { master: mine, bf16, part }
        });
        true
    }

    fn adopt(&self, t: Detached, category: Category) -> Tensor {
        // Everything this stream does with the tensor waits for the producer's fence: the
        // order does not rest on cudarc's per-slice events alone (which a context created
        // with event tracking off, or a slice made before a second stream, would lack).
        self.wait_for(&t.ready);
        let storage = match t.storage {
            // Another stream on this GPU: the same memory.
            Storage::Cuda(slice) if self.on_this_gpu(&slice) => {
                return self.adopted(&t.shape, Storage::Cuda(slice), category)
            }
            Storage::CudaBf16(slice) if self.on_this_gpu(&slice) => {
                return self.adopted(&t.shape, Storage::CudaBf16(slice), category)
            }
            Storage::Cuda(slice) => Storage::Cuda(self.copy_from_another_gpu(slice, &t.shape)),
            Storage::CudaBf16(slice) => Storage::CudaBf16(self.copy_from_another_gpu(slice, &t.shape)),
            Storage::CudaMaster { .. } => panic!("cuda: a parameter {:?} was handed between stages", t.shape),
            Storage::Cpu(data) => return self.from_host(&data, &t.shape, category),
            Storage::Pinned(_) | Storage::PinnedBf16(_) => {
                panic!("cuda: an offloaded tensor {:?} was handed between stages", t.shape)
            }
        };
        self.tensor(&t.shape, storage, category)
    }

    fn fence(&self) -> Fence {
        let event = self
            .stream
            .record_event(None)
            .unwrap_or_else(|e| panic!("cuda: GPU {}: cannot record a fence: {e:?}", self.ordinal));
        Fence::Event(event)
    }

    fn wait_for(&self, fence: &Fence) {
        if let Fence::Event(event) = fence {
            self.stream
                .wait(event)
                .unwrap_or_else(|e| panic!("cuda: GPU {}: cannot wait for a fence: {e:?}", self.ordinal));
        }
    }

    fn fill_zero(&self, t: &mut Tensor) {
        self.counters.zero_fill();
        let zeroed = match t.dtype() {
            DType::F32 => self.stream.memset_zeros(cu_mut(t)),
            DType::Bf16 => self.stream.memset_zeros(cu16_mut(t)),
        };
        zeroed.unwrap_or_else(|e| panic!("cuda: cannot zero a tensor: {e:?}"));
        self.refresh_bf16_copy(t);
    }

    fn fill_zero_tensors(&self, tensors: &mut [&mut Tensor]) {
        self.counters.zero_fill();
        self.zero_tensors(tensors);
    }

    fn readout(&self, len: usize) -> Readout {
        let mut slice = self.arena.take::<f64>(&self.stream, len);
        self.stream.memset_zeros(&mut slice).unwrap_or_else(|e| panic!("cuda: cannot zero a readout: {e:?}"));
        Readout::new(len, ReadoutStorage::Cuda(slice), self.ledger.clone())
    }

    fn read(&self, r: &Readout) -> Vec<f64> {
        let ReadoutStorage::Cuda(slice) = r.storage() else { panic!("cuda: a CPU readout") };
        let mut host = vec![0.0; r.len()];
        if !host.is_empty() {
            self.stream
                .memcpy_dtoh(&slice.slice(..r.len()), &mut host)
                .unwrap_or_else(|e| panic!("cuda: cannot read a readout back: {e:?}"));
        }
        self.host_sync();
        host
    }

    fn take_error(&self) -> Option<String> {
        let err = self.gpu.ctx.check_err().err()?;
        Some(format!("GPU {}: {err:?}, recorded by cudarc where no call could return it", self.ordinal))
    }
}

impl Buffers for CudaDevice {
    fn from_host_of_impl(&self, dtype: DType, data: &[f32], shape: &[usize], category: Category) -> Tensor {
        let mut t = self.empty_of(dtype, shape, category);
        if data.is_empty() {
            return t;
        }
        let uploaded = match dtype {
            DType::F32 => self.stream.memcpy_htod(data, cu_mut(&mut t)),
            DType::Bf16 => {
                let bits: Vec<u16> = data.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
                self.stream.memcpy_htod(&bits, cu16_mut(&mut t))
            }
        };
        uploaded.unwrap_or_else(|e| panic!("cuda: cannot upload {shape:?} to GPU {}: {e:?}", self.ordinal));
        self.refresh_bf16_copy(&mut t);
        t
    }

    fn copy_impl(&self, dst: &mut Tensor, at: usize, src: &Tensor, part: Range<usize>) {
        if part.is_empty() {
            return;
        }
        let into = at..at + part.len();
        let copied = match same_dtype(&[dst, src]) {
            DType::F32 => {
                self.stream.memcpy_dtod(&cu(src).slice(part.clone()), &mut cu_mut(dst).slice_mut(into))
            }
            DType::Bf16 => {
                self.stream.memcpy_dtod(&cu16(src).slice(part.clone()), &mut cu16_mut(dst).slice_mut(into))
            }
        };
        copied.unwrap_or_else(|e| panic!("cuda: cannot copy {src:?}[{part:?}]: {e:?}"));
        self.refresh_bf16_copy(dst);
    }

    fn write_at_impl(&self, t: &mut Tensor, from: usize, data: &[f32]) {
        if data.is_empty() {
            return;
        }
        if master_is_sharded(t) {
            return self.write_at_sharded(t, from, data);
        }
        let mut part = cu_mut(t).slice_mut(from..from + data.len());
        (self.stream.memcpy_htod(data, &mut part))
            .unwrap_or_else(|e| panic!("cuda: cannot upload {} values at element {from}: {e:?}", data.len()));
        self.refresh_bf16_copy(t);
    }

    fn offload_impl(&self, t: &mut Tensor) {
        self.offload_op(t)
    }

    fn reload_impl(&self, t: &mut Tensor, category: Category) {
        self.reload_op(t, category)
    }
}

/// The attention core of what the layers keep for it (`AttentionSaves`): the fused kernels
/// for a row log-sum-exp, the unfused core with cuBLAS for probabilities.
impl Attention for CudaDevice {
    fn attention_forward_impl(
        &self,
        out: Option<&mut Tensor>,
        saved: &mut AttentionSaved,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        dims: QkvDims,
        mask: CausalMask,
    ) {
        match saved {
            AttentionSaved::RowLogSumExp { lse } => {
                self.fused_attention_forward_op(out, lse, dropout, qkv, dims, mask)
            }
            AttentionSaved::Probabilities { probs, dropped } => {
                let dropout = dropout.map(|spec| (spec, dropped.as_mut().expect("dropout has P' to fill")));
                self.attention_forward_op(out, probs, dropout, qkv, dims, mask)
            }
        }
    }

    fn attention_backward_impl(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        out: &Tensor,
        qkv: &Tensor,
        saved: &AttentionSaved,
        dropout: Option<DropoutSpec>,
        dims: QkvDims,
        mask: CausalMask,
    ) {
        match saved {
            AttentionSaved::RowLogSumExp { lse } => {
                self.fused_attention_backward_op(dqkv, dout, out, qkv, lse, dropout, dims, mask)
            }
            AttentionSaved::Probabilities { probs, dropped } => {
                let dropout = dropout.map(|spec| (spec, dropped.as_ref().expect("dropout kept P'")));
                self.attention_backward_op(dqkv, dout, qkv, probs, dropout, dims, mask)
            }
        }
    }
}
