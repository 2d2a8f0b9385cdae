//! Element types and reductions. Contributions are combined in rank order, ((r0 op r1) op
//! r2) ..., each step rounded to the element type as a GPU's 16-bit arithmetic rounds, so
//! a result is the same bits on every rank and every run.

use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};
use half::{bf16, f16};

/// Bytes per element; None for a value that names no type.
pub fn size_of(dtype: ncclDataType_t) -> Option<usize> {
    use ncclDataType_t::*;
    match dtype {
        ncclInt8 | ncclUint8 | ncclFloat8e4m3 | ncclFloat8e5m2 => Some(1),
        ncclFloat16 | ncclBfloat16 => Some(2),
        ncclInt32 | ncclUint32 | ncclFloat32 => Some(4),
        ncclInt64 | ncclUint64 | ncclFloat64 => Some(8),
        ncclNumTypes => None,
    }
}

/// Whether the stand-in reduces `dtype` with `op` (8-bit floats only move).
pub fn supported(dtype: ncclDataType_t, op: ncclRedOp_t) -> bool {
    use ncclRedOp_t::*;
    let op_ok = matches!(op, ncclSum | ncclProd | ncclMax | ncclMin | ncclAvg);
    op_ok && !matches!(dtype, ncclDataType_t::ncclFloat8e4m3 | ncclDataType_t::ncclFloat8e5m2)
}

trait Element: Copy {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, out: &mut Vec<u8>);
    fn combine(op: ncclRedOp_t, a: Self, b: Self) -> Self;
    /// `self / n`, for ncclAvg (a sum, then one division).
    fn mean(self, n: usize) -> Self;
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("one element"))
            }
            fn store(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn combine(op: ncclRedOp_t, a: Self, b: Self) -> Self {
                match op {
                    ncclRedOp_t::ncclProd => a.wrapping_mul(b),
                    ncclRedOp_t::ncclMax => a.max(b),
                    ncclRedOp_t::ncclMin => a.min(b),
                    _ => a.wrapping_add(b),
                }
            }
            fn mean(self, n: usize) -> Self {
                (self as i128 / n as i128) as $t
            }
        }
    )*};
}
integer!(i8, u8, i32, u32, i64, u64);

/// Floats; 16-bit ones compute in f32 and round back at every step.
macro_rules! float {
    ($($t:ty, in $c:ty: $to:expr, $from:expr);*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("one element"))
            }
            fn store(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn combine(op: ncclRedOp_t, a: Self, b: Self) -> Self {
                let (a, b) = ($to(a), $to(b));
                $from(match op {
                    ncclRedOp_t::ncclProd => a * b,
                    ncclRedOp_t::ncclMax => a.max(b),
                    ncclRedOp_t::ncclMin => a.min(b),
                    _ => a + b,
                })
            }
            fn mean(self, n: usize) -> Self {
                $from($to(self) / n as $c)
            }
        }
    )*};
}
float!(
    f32, in f32: |x| x, |x| x;
    f64, in f64: |x| x, |x| x;
    f16, in f32: f16::to_f32, f16::from_f32;
    bf16, in f32: bf16::to_f32, bf16::from_f32
);

fn combine<T: Element>(op: ncclRedOp_t, parts: &[&[u8]]) -> Vec<u8> {
    let mut acc: Vec<T> = parts[0].chunks_exact(T::SIZE).map(T::load).collect();
    for part in &parts[1..] {
        for (a, b) in acc.iter_mut().zip(part.chunks_exact(T::SIZE)) {
            *a = T::combine(op, *a, T::load(b));
        }
    }
    let mut out = Vec::with_capacity(parts[0].len());
    for a in acc {
        let a = if op == ncclRedOp_t::ncclAvg { a.mean(parts.len()) } else { a };
        a.store(&mut out);
    }
    out
}

/// `parts` (one per rank, in rank order, all the same length) reduced with `op`. The
/// pair must be [`supported`].
pub fn reduce(dtype: ncclDataType_t, op: ncclRedOp_t, parts: &[&[u8]]) -> Vec<u8> {
    use ncclDataType_t::*;
    match dtype {
        ncclInt8 => combine::<i8>(op, parts),
        ncclUint8 => combine::<u8>(op, parts),
        ncclInt32 => combine::<i32>(op, parts),
        ncclUint32 => combine::<u32>(op, parts),
        ncclInt64 => combine::<i64>(op, parts),
        ncclUint64 => combine::<u64>(op, parts),
        ncclFloat16 => combine::<f16>(op, parts),
        ncclFloat32 => combine::<f32>(op, parts),
        ncclFloat64 => combine::<f64>(op, parts),
        ncclBfloat16 => combine::<bf16>(op, parts),
        ncclFloat8e4m3 | ncclFloat8e5m2 | ncclNumTypes => unreachable!("checked by `supported`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ncclDataType_t::*;
    use ncclRedOp_t::*;

    fn bytes<T: Element>(values: &[T]) -> Vec<u8> {
        let mut out = Vec::new();
        values.iter().for_each(|v| v.store(&mut out));
        out
    }

    #[test]
    fn a_sum_adds_in_rank_order() {
        // (1e8 + 1) + -1e8 is 0 in f32 (1e8 + 1 rounds to 1e8), while (1e8 + -1e8) + 1 is 1.
        let parts = [bytes(&[1e8f32]), bytes(&[1f32]), bytes(&[-1e8f32])];
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        assert_eq!(reduce(ncclFloat32, ncclSum, &refs), bytes(&[0f32]));
        let reordered = [refs[0], refs[2], refs[1]];
        assert_eq!(reduce(ncclFloat32, ncclSum, &reordered), bytes(&[1f32]));
    }

    #[test]
    fn bf16_rounds_at_every_step() {
        // 256 + 1 rounds to 256 in bf16 (8 bits of mantissa), twice; in f32 the sum is 258.
        let parts = [bytes(&[bf16::from_f32(256.0)]), bytes(&[bf16::ONE]), bytes(&[bf16::ONE])];
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        assert_eq!(reduce(ncclBfloat16, ncclSum, &refs), bytes(&[bf16::from_f32(256.0)]));
    }

    #[test]
    fn every_operation_on_integers_and_doubles() {
        let parts = [bytes(&[3i32, -7]), bytes(&[5i32, 2])];
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        assert_eq!(reduce(ncclInt32, ncclSum, &refs), bytes(&[8i32, -5]));
        assert_eq!(reduce(ncclInt32, ncclProd, &refs), bytes(&[15i32, -14]));
        assert_eq!(reduce(ncclInt32, ncclMax, &refs), bytes(&[5i32, 2]));
        assert_eq!(reduce(ncclInt32, ncclMin, &refs), bytes(&[3i32, -7]));
        assert_eq!(reduce(ncclInt32, ncclAvg, &refs), bytes(&[4i32, -2]));
        let parts = [bytes(&[1.0f64]), bytes(&[2.0f64])];
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        assert_eq!(reduce(ncclFloat64, ncclAvg, &refs), bytes(&[1.5f64]));
    }

    #[test]
    fn eight_bit_floats_move_but_do_not_reduce() {
        assert_eq!(size_of(ncclFloat8e4m3), Some(1));
        assert!(!supported(ncclFloat8e4m3, ncclSum));
        assert!(supported(ncclBfloat16, ncclAvg));
    }
}
