//! Many tensors in one launch (`sum_squares.cu`, `adamw.cu`, `zero.cu`): a table of one record per
//! tensor (its addresses and length, and whatever else its kernel reads), and the first
//! block of each tensor (common.cuh's `owner`), each block a fixed chunk of one tensor. A
//! stage's parameters and gradients never move, so a table is uploaded once and kept while
//! the same records come back.

use super::arena::Arena;
use super::launch::first_blocks;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::{Arc, Mutex};

/// A table on the device. `key` is the host's copy of the records, to tell whether a later
/// call passes the same tensors.
pub(super) struct TensorTable {
    key: Vec<u64>,
    pub records: CudaSlice<u64>,
    pub first: CudaSlice<u64>,
    /// Blocks of the launch: the last of `first`.
    pub blocks: usize,
    /// Tensors in the table.
    pub count: i32,
}

/// One kernel's kept table (a field of the device), or none yet.
#[derive(Default)]
pub(super) struct KeptTable(Mutex<Option<TensorTable>>);

impl KeptTable {
    /// `launch` with the table of `records` for tensors of `lens` elements in blocks of
    /// `chunk`: the kept one where it holds the same records, else one uploaded on `stream`
    /// and kept (a few KiB per stage; like the compiled kernels, outside the ledger). At
    /// least one tensor.
    pub(super) fn with(
        &self,
        (arena, stream): (&Arena, &Arc<CudaStream>),
        records: Vec<u64>,
        lens: &[usize],
        chunk: usize,
        launch: impl FnOnce(&TensorTable),
    ) {
        assert!(!lens.is_empty(), "cuda: a table of no tensors");
        assert!(
            records.len().is_multiple_of(lens.len()),
            "cuda: {} words of records for {} tensors",
            records.len(),
            lens.len()
        );
        let upload = |data: &[u64]| {
            let mut slice = arena.take::<u64>(stream, data.len());
            stream
                .memcpy_htod(data, &mut slice)
                .unwrap_or_else(|e| panic!("cuda: cannot upload a table: {e:?}"));
            slice
        };
        let mut table = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if table.as_ref().is_none_or(|t| t.key != records) {
            let first = first_blocks(lens, chunk);
            *table = Some(TensorTable {
                blocks: *first.last().expect("at least one entry") as usize,
                records: upload(&records),
                first: upload(&first),
                count: i32::try_from(lens.len()).expect("fewer than 2^31 tensors"),
                key: records,
            });
        }
        launch(table.as_ref().expect("set above"));
    }
}
