//! The stand-in GPUs, as the environment describes them, and their contexts.
//!
//! - `CUDA_STANDIN_GPUS`: how many GPUs this process sees (default 1).
//! - `CUDA_STANDIN_MEMORY`: each GPU's capacity, in bytes or with a `KiB`, `MiB` or `GiB`
//!   suffix (default 16 GiB; the memory is mapped only as it is written).
//!
//! A value that does not parse is reported on standard error and the process exits: a
//! test double that guesses would hide the mistake.

use crate::stream::{made_stream, Stream};
use cudarc::driver::sys::CUstream;
use std::cell::Cell;
use std::sync::{Arc, OnceLock};

/// What a stand-in GPU reports: an H100's compute capability, so NVRTC compiles the
/// kernels (tensor-core ones included) for the architecture the project targets.
pub const NAME: &str = kernels::STANDIN_GPU_NAME;
pub const COMPUTE_CAPABILITY: (i32, i32) = (9, 0);
pub const MULTIPROCESSORS: i32 = 132;
/// Shared memory a block may have (static and dynamic), and what a kernel may take once its
/// MAX_DYNAMIC_SHARED_SIZE_BYTES is raised, as on an H100.
pub const SHARED_PER_BLOCK: i32 = 48 * 1024;
pub const SHARED_PER_BLOCK_OPTIN: i32 = 227 * 1024;
/// CUDA 13.0, as `cuDriverGetVersion` encodes it: the NVRTC the project installs.
pub const DRIVER_VERSION: i32 = 13000;

fn fatal(what: &str) -> ! {
    eprintln!("cuda stand-in: {what}");
    std::process::exit(2)
}

fn parse_bytes(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, scale) = [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|d| (d.trim(), *scale)))
        .unwrap_or((text, 1));
    digits.parse::<usize>().ok()?.checked_mul(scale)
}

fn from_env<T>(key: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> T {
    match std::env::var(key) {
        Err(_) => default,
        Ok(v) => parse(&v).unwrap_or_else(|| fatal(&format!("{key}={v:?} is not a valid value"))),
    }
}

/// GPUs this process sees.
pub fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| from_env("CUDA_STANDIN_GPUS", 1, |v| v.trim().parse().ok()))
}

/// GPU `device`'s capacity in bytes.
pub fn capacity(_device: usize) -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| from_env("CUDA_STANDIN_MEMORY", 16 << 30, parse_bytes))
}

/// A GPU's primary context: what `cuDevicePrimaryCtxRetain` hands out, and the stream
/// that the null stream handle means in it.
pub struct Context {
    pub device: usize,
    pub null_stream: Arc<Stream>,
}

/// The primary contexts, one per GPU, made on first use and never destroyed (a primary
/// context outlives its users in CUDA too).
pub fn primary(device: usize) -> Option<&'static Context> {
    static CONTEXTS: OnceLock<Vec<Context>> = OnceLock::new();
    CONTEXTS
        .get_or_init(|| {
            (0..count()).map(|device| Context { device, null_stream: Stream::new(device) }).collect()
        })
        .get(device)
}

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The calling thread's current context (`cuCtxSetCurrent`), by GPU.
pub fn current() -> Option<&'static Context> {
    CURRENT.with(|c| c.get()).and_then(primary)
}

pub fn set_current(device: Option<usize>) {
    CURRENT.with(|c| c.set(device));
}

/// The stream a handle names: a null handle the current context's null stream, any other
/// one a stream this library made. None for a null handle where no context is current.
pub fn stream_of(handle: CUstream) -> Option<Arc<Stream>> {
    made_stream(handle).or_else(|| current().map(|c| c.null_stream.clone()))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn capacities_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64MiB"), Some(64 << 20));
        assert_eq!(parse_bytes("2 GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("1.5GiB"), None);
        assert_eq!(parse_bytes("lots"), None);
    }
}
