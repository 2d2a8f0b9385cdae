//! The CUDA driver API (`libcuda.so`), as far as cudarc and pipetrain call it: devices and
//! their primary contexts, memory, streams and events, modules and launches. Enum
//! arguments are taken as their integer type (same ABI), so a value this stand-in does not
//! know is an error returned, never undefined behaviour.

mod context;
mod errors;
mod launch;
mod memcpy;
mod memory;
mod streams;

// Each entry point is exported from the library by its C name, and from the crate for its
// own tests.
pub use context::*;
pub use errors::*;
pub use launch::*;
pub use memcpy::*;
pub use memory::*;
pub use streams::*;

use crate::devices::{self, Context};
use cudarc::driver::sys::CUresult;
use std::sync::atomic::{AtomicBool, Ordering};

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// The calling thread's current context, or why there is none.
fn current() -> Result<&'static Context, CUresult> {
    if !INITIALISED.load(Ordering::Acquire) {
        return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    }
    devices::current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// The result of an entry point written with `?`.
fn status(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUresult::CUDA_SUCCESS)
}

/// Says why a call is refused where a driver would only return a code: a test double's
/// refusals should be read, not guessed.
fn refuse(code: CUresult, why: &str) -> CUresult {
    eprintln!("cuda stand-in: {why}");
    code
}
