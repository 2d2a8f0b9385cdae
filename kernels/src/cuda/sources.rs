//! Every CUDA source of the backend, embedded in the binary so that a run needs no files
//! beside it, and listed so that tests can compile each one. The lists are generated from
//! kernels/cuda by the crate's build script (build/main.rs): a `.cu` file and the kernels it
//! declares `extern "C" __global__` are all the backend needs to compile and load them.

use crate::tensor::DType;

/// One `.cu` file: a kernel family compiled by NVRTC into one module.
pub struct KernelSource {
    /// The file name under `kernels/cuda/`.
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C"` kernels the module exports; the device loads exactly these.
    pub kernels: &'static [&'static str],
}

include!(concat!(env!("OUT_DIR"), "/sources.rs"));

/// Kernel `name` for activations of `dtype`: `name` itself for f32, its `name_bf16` twin
/// (the same template body storing bf16, see common.cuh) for bf16. A family without the twin
/// is a bug in the caller.
pub fn kernel_name(name: &'static str, dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => name,
        DType::Bf16 => bf16_twin(name).unwrap_or_else(|| panic!("cuda: kernel {name} has no bf16 twin")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_name_is_its_family_name_and_the_dtype() {
        assert_eq!(kernel_name("gelu_forward", DType::F32), "gelu_forward");
        assert_eq!(kernel_name("gelu_forward", DType::Bf16), "gelu_forward_bf16");
        // A kernel whose name merely ends in _bf16 is nobody's twin.
        assert_eq!(bf16_twin("f32_to"), None);
        assert_eq!(kernel_name("f32_to_bf16", DType::F32), "f32_to_bf16");
    }

    #[test]
    #[should_panic(expected = "cuda: kernel loss_mean has no bf16 twin")]
    fn a_kernel_without_a_twin_has_no_bf16_name() {
        kernel_name("loss_mean", DType::Bf16);
    }
}
