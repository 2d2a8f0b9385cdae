//! The values a step leaves on the device for the host (see [`crate::readout`]): each
//! microbatch's mean loss (`loss_mean.cu`) and every parameter gradient's sum of squares in
//! one fused pass (`sum_squares.cu`), read back with one synchronisation.

use super::device::{cu, int, CudaDevice};
use super::launch::{first_blocks, one_block, sum_squares, SUM_SQUARES_CHUNK};
use crate::backend::Readouts;
use crate::readout::{Readout, ReadoutStorage};
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, DevicePtr};
use std::ops::Range;

/// The fused norm's inputs on the device for one set of tensors: their addresses, lengths
/// and first stage-one blocks. `key` is the host's copy of the first two, to tell whether a
/// later call passes the same tensors.
pub(super) struct NormTables {
    key: Vec<u64>,
    tensors: CudaSlice<u64>,
    lens: CudaSlice<u64>,
    first: CudaSlice<u64>,
    blocks: usize,
}

fn slots(r: &mut Readout) -> &mut CudaSlice<f64> {
    match r.storage_mut() {
        ReadoutStorage::Cuda(s) => s,
        ReadoutStorage::Cpu(_) => panic!("cuda: a CPU readout"),
    }
}

impl Readouts for CudaDevice {
    fn loss_mean_impl(&self, out: &mut Readout, slot: usize, losses: &Tensor) {
        let n = losses.len() as u64;
        let mut target = slots(out).slice_mut(slot..slot + 1);
        launch!(self, "loss_mean", one_block(), &mut target, cu(losses), &n);
    }

    fn sum_squares_into_impl(&self, out: &mut Readout, first: usize, parts: &[(&Tensor, Range<usize>)]) {
        if parts.is_empty() {
            return;
        }
        // The addresses are read on this stream; the guards record that use for cudarc's
        // event tracking when they drop, after the launches. A part starts its range's
        // elements in: its chunks are a tensor of just those elements' chunks.
        let (addresses, _reads): (Vec<u64>, Vec<_>) = parts
            .iter()
            .map(|(t, range)| {
                let (address, read) = cu(t).device_ptr(&self.stream);
                (address + (range.start * std::mem::size_of::<f32>()) as u64, read)
            })
            .unzip();
        let lens: Vec<usize> = parts.iter().map(|(_, range)| range.len()).collect();
        let key: Vec<u64> = addresses.iter().copied().chain(lens.iter().map(|&n| n as u64)).collect();
        let mut cached = self.norm_tables.lock().unwrap_or_else(|e| e.into_inner());
        if cached.as_ref().is_none_or(|t| t.key != key) {
            let first = first_blocks(&lens, SUM_SQUARES_CHUNK);
            let blocks = *first.last().expect("at least one entry") as usize;
            *cached = Some(NormTables {
                tensors: self.upload_kept(&addresses),
                lens: self.upload_kept(&key[addresses.len()..]),
                first: self.upload_kept(&first),
                blocks,
                key,
            });
        }
        let tables = cached.as_ref().expect("set above");
        let mut partial = self.scratch::<f64>(tables.blocks);
        let (one, two) = sum_squares(tables.blocks, parts.len());
        let (count, chunk) = (int(parts.len()), SUM_SQUARES_CHUNK as u64);
        launch!(
            self,
            "sum_squares_chunks",
            one,
            &mut *partial,
            &tables.tensors,
            &tables.lens,
            &tables.first,
            &count,
            &chunk
        );
        let mut target = slots(out).slice_mut(first..first + parts.len());
        launch!(self, "sum_squares_totals", two, &mut target, &*partial, &tables.first);
    }
}
