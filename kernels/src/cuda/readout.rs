//! The values a step leaves on the device for the host (see [`crate::readout`]): each
//! microbatch's mean loss (`loss_mean.cu`) and every parameter gradient's sum of squares in
//! one fused pass (`sum_squares.cu`), read back with one synchronisation.

use super::device::CudaDevice;
use super::launch::{one_block, sum_squares, SUM_SQUARES_CHUNK};
use super::views::cu;
use crate::backend::Readouts;
use crate::readout::{Readout, ReadoutStorage};
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, DevicePtr};
use std::ops::Range;

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
        // elements in: its chunks are a tensor of just those elements' chunks. A record is
        // sum_squares.cu's `SquaredTensor`: the first element's address and the length.
        let (records, _reads): (Vec<[u64; 2]>, Vec<_>) = parts
            .iter()
            .map(|(t, range)| {
                let (address, read) = cu(t).device_ptr(&self.stream);
                ([address + (range.start * std::mem::size_of::<f32>()) as u64, range.len() as u64], read)
            })
            .unzip();
        let lens: Vec<usize> = parts.iter().map(|(_, range)| range.len()).collect();
        let chunk = SUM_SQUARES_CHUNK as u64;
        self.norm_table.with(
            (&self.arena, &self.stream),
            records.concat(),
            &lens,
            SUM_SQUARES_CHUNK,
            |table| {
                let mut partial = self.scratch::<f64>(table.blocks);
                let (one, two) = sum_squares(table.blocks, parts.len());
                launch!(
                    self,
                    "sum_squares_chunks",
                    one,
                    &mut *partial,
                    &table.records,
                    &table.first,
                    &table.count,
                    &chunk
                );
                let mut target = slots(out).slice_mut(first..first + parts.len());
                launch!(self, "sum_squares_totals", two, &mut target, &*partial, &table.first);
            },
        );
    }
}
