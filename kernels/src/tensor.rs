//! A tensor: a shape, storage on one device, and a ledger entry that lives exactly as long
//! as the storage does.

use crate::memory::{Category, MemoryLedger};
use std::sync::Arc;

/// The type of a tensor's stored elements. The arithmetic is f32 either way: a bf16 tensor
/// is read into f32 and rounded once, to nearest even, when written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// Activations and their gradients on a CUDA device under `precision: bf16`.
    Bf16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
}

/// Where a tensor's elements live.
pub enum Storage {
    Cpu(Vec<f32>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaSlice<f32>),
    /// bf16 elements, as their bits.
    #[cfg(feature = "cuda")]
    CudaBf16(cudarc::driver::CudaSlice<u16>),
    /// An offloaded f32 activation ([`Device::offload`](crate::Device::offload)) in
    /// page-locked host memory, which copies to and from the GPU run asynchronously.
    #[cfg(feature = "cuda")]
    Pinned(cudarc::driver::PinnedHostSlice<f32>),
    /// An offloaded bf16 activation in page-locked host memory, as its bits (2 bytes an
    /// element on the host too).
    #[cfg(feature = "cuda")]
    PinnedBf16(cudarc::driver::PinnedHostSlice<u16>),
    /// An f32 parameter (the master copy the optimizer updates) with the bf16 copy that
    /// bf16 matmuls read, kept equal to it rounded by every op that writes the parameter;
    /// the copy's rows are padded with zeros to a multiple of
    /// [`VOCAB_PADDING`](crate::VOCAB_PADDING), so the LM head's GEMMs run over the padded
    /// vocabulary. `master` holds the elements `part` of the parameter: all of them, or
    /// under the distributed optimizer the replica's part
    /// ([`Device::shard_master`](crate::Device::shard_master)).
    #[cfg(feature = "cuda")]
    CudaMaster {
        master: cudarc::driver::CudaSlice<f32>,
        bf16: cudarc::driver::CudaSlice<u16>,
        part: std::ops::Range<usize>,
    },
}

impl Storage {
    fn dtype(&self) -> DType {
        match self {
            #[cfg(feature = "cuda")]
            Storage::CudaBf16(_) | Storage::PinnedBf16(_) => DType::Bf16,
            _ => DType::F32,
        }
    }

    /// Bytes of device (or host) memory this storage holds for `len` elements: theirs, or
    /// a parameter's master part and its bf16 copy.
    fn bytes(&self, len: usize) -> usize {
        match self {
            #[cfg(feature = "cuda")]
            Storage::CudaMaster { bf16, part, .. } => {
                part.len() * DType::F32.size() + bf16.len() * DType::Bf16.size()
            }
            _ => len * self.dtype().size(),
        }
    }
}

/// Where a dropped tensor's storage goes (a device's buffer cache).
pub trait Recycle: Send + Sync {
    fn recycle(&self, storage: Storage);
}

pub struct Tensor {
    shape: Vec<usize>,
    storage: Storage,
    category: Category,
    ledger: Arc<MemoryLedger>,
    recycler: Option<Arc<dyn Recycle>>,
}

impl Tensor {
    /// Wraps storage a device allocated; counts it in `ledger` until the tensor drops.
    pub fn new(shape: &[usize], storage: Storage, category: Category, ledger: Arc<MemoryLedger>) -> Self {
        let t = Tensor { shape: shape.to_vec(), storage, category, ledger, recycler: None };
        t.ledger.allocated(category, t.bytes());
        t
    }

    /// As [`Tensor::new`], handing the storage to `recycler` when the tensor drops.
    pub fn recycled(
        shape: &[usize],
        storage: Storage,
        category: Category,
        ledger: Arc<MemoryLedger>,
        recycler: Arc<dyn Recycle>,
    ) -> Self {
        let mut t = Self::new(shape, storage, category, ledger);
        t.recycler = Some(recycler);
        t
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the ledger counts for this tensor: its elements, and a parameter's bf16 copy.
    pub fn bytes(&self) -> usize {
        self.storage.bytes(self.len())
    }

    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    pub fn category(&self) -> Category {
        self.category
    }

    /// The ledger that counts this tensor: its device's, or the device's host ledger for
    /// an offloaded one.
    pub fn ledger(&self) -> &Arc<MemoryLedger> {
        &self.ledger
    }

    /// Moves the tensor to another ledger category (e.g. a workspace buffer kept as an
    /// activation), keeping the accounting exact.
    pub fn recategorize(&mut self, category: Category) {
        self.ledger.freed(self.category, self.bytes());
        self.category = category;
        self.ledger.allocated(category, self.bytes());
    }

    /// Same elements under another shape of equal size.
    pub fn reshape(&mut self, shape: &[usize]) {
        assert_eq!(shape.iter().product::<usize>(), self.len(), "reshape {:?} -> {:?}", self.shape, shape);
        self.shape = shape.to_vec();
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// Replaces the storage with `f` of it, counting the change in bytes.
    #[cfg(feature = "cuda")]
    pub(crate) fn restore(&mut self, f: impl FnOnce(Storage) -> Storage) {
        self.ledger.freed(self.category, self.bytes());
        self.storage = f(std::mem::replace(&mut self.storage, Storage::Cpu(Vec::new())));
        self.ledger.allocated(self.category, self.bytes());
    }

    /// The elements of a CPU tensor. Panics on another device: a backend only reads its own.
    pub fn cpu(&self) -> &[f32] {
        match &self.storage {
            Storage::Cpu(v) => v,
            #[allow(unreachable_patterns)]
            _ => panic!("cpu() on a tensor that is not on the CPU"),
        }
    }

    pub fn cpu_mut(&mut self) -> &mut [f32] {
        match &mut self.storage {
            Storage::Cpu(v) => v,
            #[allow(unreachable_patterns)]
            _ => panic!("cpu_mut() on a tensor that is not on the CPU"),
        }
    }
}

/// The point in a device's work after which what it has issued is done
/// ([`Device::fence`](crate::Device::fence)): nothing to wait for on the CPU, whose ops are
/// done when they return; an event recorded on the device's stream on CUDA.
pub enum Fence {
    Done,
    #[cfg(feature = "cuda")]
    Event(cudarc::driver::CudaEvent),
}

#[cfg(feature = "cuda")]
impl Fence {
    /// A fence after the work issued so far on `stream` (a stream of the device's GPU that
    /// is not the device's own, e.g. an NCCL communicator's).
    pub fn after(stream: &cudarc::driver::CudaStream) -> Result<Fence, cudarc::driver::DriverError> {
        stream.record_event(None).map(Fence::Event)
    }
}

/// A tensor's storage between two devices of one process: counted by no ledger, so a
/// transport can hand it from one stage to another without copying it.
pub struct Detached {
    pub shape: Vec<usize>,
    pub storage: Storage,
    /// Set by the producer when it let go: the adopting device orders its use after it.
    pub ready: Fence,
}

impl Tensor {
    /// Takes the storage out of this device's accounting, to hand to another device's
    /// [`Device::adopt`](crate::Device::adopt), which waits on `ready` (the producer's
    /// [`Device::fence`](crate::Device::fence), taken now).
    pub fn detach(mut self, ready: Fence) -> Detached {
        self.ledger.freed(self.category, self.bytes());
        let storage = std::mem::replace(&mut self.storage, Storage::Cpu(Vec::new()));
        let shape = std::mem::take(&mut self.shape);
        // What drops now is an empty husk: no bytes for the ledger, nothing to recycle.
        self.shape = vec![0];
        self.recycler = None;
        Detached { shape, storage, ready }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        self.ledger.freed(self.category, self.bytes());
        if let Some(r) = &self.recycler {
            r.recycle(std::mem::replace(&mut self.storage, Storage::Cpu(Vec::new())));
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?}, {:?})", self.shape, self.dtype(), self.category)
    }
}

/// A tensor as a matrix: (rows, columns), the last dimension being the columns.
pub(crate) fn rows_cols(t: &Tensor) -> (usize, usize) {
    let cols = *t.shape().last().expect("a tensor with at least one dimension");
    (t.len().checked_div(cols).unwrap_or(0), cols)
}
