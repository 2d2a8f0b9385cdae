//! Activation offload on a GPU: a device's tensors to page-locked host memory and back on a
//! copy stream of the device's own, so the copies run beside its kernels.
//!
//! Every crossing between the device's stream and the copy stream is an event, so the
//! order holds with cudarc's per-buffer tracking on or off (`GpuUse`):
//! - **Out.** The copy stream waits for the device's stream to reach the offload (the
//!   tensor is written), then copies. The tensor's device buffer leaves the ledger at once
//!   and goes back to the arena with the copy's event, which its next user's stream waits
//!   for: the next layer's forward runs while the copy does.
//! - **Back.** The copy stream waits for the device's stream to reach the reload (the
//!   buffer it fills is free there), then copies, and leaves its event pending until
//!   [`Device::await_reloads`](crate::Device::await_reloads). A block's tensors start back
//!   before the backward of the block after it (stages' chunk.rs), so the copy runs under
//!   that backward.
//! - **Host buffers** come from the arena, by type and length, so no step after the first
//!   allocates. A buffer's copy back and the next copy out into it are both on the copy
//!   stream, in that order.

use super::arena::{wait, FreeOnStream};
use super::device::CudaDevice;
use super::views::{cu, cu16, cu16_mut, cu_mut};
use crate::device::Device;
use crate::memory::Category;
use crate::tensor::{DType, Detached, Fence, Recycle, Storage, Tensor};
use cudarc::driver::CudaEvent;

impl CudaDevice {
    /// `t` becomes its copy in page-locked host memory, counted by the host ledger; the copy
    /// runs on the copy stream.
    pub(super) fn offload_op(&self, t: &mut Tensor) {
        let len = t.len();
        let copies = &self.copies;
        let out = || -> Result<(Storage, CudaEvent), cudarc::driver::DriverError> {
            copies.wait(&self.stream.record_event(None)?)?;
            let storage = match t.dtype() {
                DType::F32 => {
                    let mut host = self.arena.take_pinned::<f32>(&self.gpu.ctx, len);
                    copies.memcpy_dtoh(&cu(t).slice(..len), &mut host)?;
                    Storage::Pinned(host)
                }
                DType::Bf16 => {
                    let mut host = self.arena.take_pinned::<u16>(&self.gpu.ctx, len);
                    copies.memcpy_dtoh(&cu16(t).slice(..len), &mut host)?;
                    Storage::PinnedBf16(host)
                }
            };
            Ok((storage, copies.record_event(None)?))
        };
        let (storage, copied) = out().unwrap_or_else(|e| panic!("cuda: cannot offload {t:?}: {e:?}"));
        let host = Tensor::recycled(
            t.shape(),
            storage,
            Category::Activations,
            self.host_ledger().clone(),
            self.arena.clone(),
        );
        let Detached { storage, .. } = std::mem::replace(t, host).detach(Fence::Done);
        self.release_after_copy(storage, copied);
    }

    /// Where an offloaded tensor's device buffer goes once its copy has read it: to the
    /// arena, filed with the copy's event; a buffer a sole device received from another
    /// stream (see `CudaDevice::adopted`) is freed on the copy stream, after the copy.
    fn release_after_copy(&self, storage: Storage, copied: CudaEvent) {
        if self.sole && self.allocated_elsewhere(&storage) {
            return FreeOnStream(self.copies.clone()).recycle(storage);
        }
        match storage {
            Storage::Cuda(slice) => self.arena.put_after(slice, copied),
            Storage::CudaBf16(slice) => self.arena.put_after(slice, copied),
            _ => panic!("cuda: an offloaded tensor was not an activation on the GPU"),
        }
    }

    /// `t`, a host copy [`CudaDevice::offload_op`] made, becomes a copy on this device under
    /// `category`, filled on the copy stream; the device's stream waits for it at
    /// [`CudaDevice::await_reloads_op`].
    pub(super) fn reload_op(&self, t: &mut Tensor, category: Category) {
        let mut out = self.empty_of(t.dtype(), t.shape(), category);
        let copies = &self.copies;
        let mut back = || -> Result<CudaEvent, cudarc::driver::DriverError> {
            copies.wait(&self.stream.record_event(None)?)?;
            match t.storage() {
                Storage::Pinned(host) => copies.memcpy_htod(host, cu_mut(&mut out))?,
                Storage::PinnedBf16(host) => copies.memcpy_htod(host, cu16_mut(&mut out))?,
                _ => panic!("cuda: reload of {t:?}, which is not in host memory"),
            }
            copies.record_event(None)
        };
        let loaded = back().unwrap_or_else(|e| panic!("cuda: cannot reload {t:?}: {e:?}"));
        self.reloads.lock().unwrap_or_else(|e| e.into_inner()).push(loaded);
        *t = out;
    }

    /// The device's stream waits for every copy back issued so far.
    pub(super) fn await_reloads_op(&self) {
        for loaded in self.reloads.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            wait(&self.stream, &loaded);
        }
    }
}
