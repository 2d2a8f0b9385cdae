//! AdamW over every parameter of a stage in one launch (`adamw.cu`), from a kept table of
//! the tensors' addresses, lengths and weight decay (tensor_table.rs).

use super::device::CudaDevice;
use super::launch::{per_table_chunk, ADAMW_CHUNK};
use super::views::{cu, cu_mut};
use crate::backend::AdamW;
use crate::op_args::{AdamWStep, AdamWTensor};
use crate::tensor::Storage;
use cudarc::driver::{DevicePtr, DevicePtrMut};

/// The words of one tensor's record: `AdamWTensor` in adamw.cu, field for field (param, its
/// bf16 copy or 0, grad, m, v, the length, whether it decays).
const RECORD: usize = 7;

impl AdamW for CudaDevice {
    /// One launch for all of `tensors`; a parameter with a bf16 copy has its part of the
    /// copy refreshed in the same pass.
    fn adamw_impl(&self, tensors: &mut [AdamWTensor<'_>], hp: &AdamWStep) {
        if tensors.is_empty() {
            return;
        }
        let stream = &self.stream;
        // The addresses are read on this stream; the guards record that use for cudarc's
        // event tracking when they drop, after the launch.
        let (mut records, mut lens, mut guards) = (Vec::new(), Vec::new(), Vec::new());
        const F32: u64 = std::mem::size_of::<f32>() as u64;
        const BF16: u64 = std::mem::size_of::<u16>() as u64;
        for t in tensors.iter_mut() {
            let part = t.from..t.from + t.m.len();
            let (param, copy) = match t.param.storage_mut() {
                Storage::CudaMaster { master, bf16, part: held } => {
                    assert!(
                        held.start <= part.start && part.end <= held.end,
                        "cuda: AdamW on elements {part:?} of a parameter whose master holds {held:?}"
                    );
                    let (param, guard) = master.device_ptr_mut(stream);
                    guards.push(guard);
                    let (copy, guard) = bf16.device_ptr_mut(stream);
                    guards.push(guard);
                    (param + (part.start - held.start) as u64 * F32, copy + part.start as u64 * BF16)
                }
                Storage::Cuda(master) => {
                    let (param, guard) = master.device_ptr_mut(stream);
                    guards.push(guard);
                    (param + part.start as u64 * F32, 0)
                }
                _ => panic!("cuda: AdamW on a parameter that is not an f32 GPU tensor"),
            };
            let (grad, guard) = cu(t.grad).device_ptr(stream);
            guards.push(guard);
            let (m, guard) = cu_mut(t.m).device_ptr_mut(stream);
            guards.push(guard);
            let (v, guard) = cu_mut(t.v).device_ptr_mut(stream);
            guards.push(guard);
            let grad = grad + part.start as u64 * F32;
            records.extend([param, copy, grad, m, v, part.len() as u64, u64::from(t.decay)]);
            lens.push(part.len());
        }
        debug_assert_eq!(records.len(), RECORD * lens.len());
        let c = hp.constants();
        self.adamw_table.with((&self.arena, &self.stream), records, &lens, ADAMW_CHUNK, |table| {
            launch!(
                self,
                "adamw",
                per_table_chunk(table.blocks),
                &table.records,
                &table.first,
                &table.count,
                &hp.beta1,
                &hp.beta2,
                &hp.eps,
                &hp.grad_scale,
                &c.decay,
                &c.step_size,
                &c.bias2_sqrt,
            )
        });
        drop(guards);
    }
}
