//! What the build scripts of the kernels crate and the CUDA stand-in read from kernels/cuda:
//! its files, and the kernels each `.cu` file declares `extern "C" __global__`. One parser
//! for both, so the device's table of kernels and the stand-in's emulated families cannot
//! disagree. Included by path (`#[path]`) into each build script, and into the kernels crate
//! under `cfg(test)` for its tests.

use std::path::Path;

/// The files of `dir` (name, text), sorted by name.
pub fn cuda_files(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| {
            let entry = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
            let name = entry.file_name().into_string().expect("a UTF-8 file name in kernels/cuda");
            let text = std::fs::read_to_string(entry.path())
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", entry.path().display()));
            (name, text)
        })
        .collect();
    files.sort();
    files
}

/// The `extern "C" __global__` kernels of a `.cu` source, in order of declaration. A kernel's
/// name may follow its `__launch_bounds__(...)`.
pub fn kernel_names(source: &str) -> Vec<String> {
    const DECLARATION: &str = "extern \"C\" __global__ void";
    source
        .match_indices(DECLARATION)
        .map(|(i, _)| {
            let mut rest = source[i + DECLARATION.len()..].trim_start();
            if let Some(after) = rest.strip_prefix("__launch_bounds__") {
                let close = after.find(')').expect("__launch_bounds__(...) closes");
                rest = after[close + 1..].trim_start();
            }
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_read_from_declarations_with_or_without_launch_bounds() {
        let source = "template <typename T> __device__ void helper(T* x) {}\n\
                      extern \"C\" __global__ void add(float* out) { helper(out); }\n\
                      extern \"C\" __global__ void __launch_bounds__(128, 2)\n    tiled_bf16(float* x) {}\n";
        assert_eq!(kernel_names(source), ["add", "tiled_bf16"]);
    }

    #[test]
    fn every_kernel_of_the_directory_is_found() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let files = cuda_files(&dir);
        let rope = files.iter().find(|(name, _)| name == "rope.cu").expect("rope.cu");
        assert_eq!(
            kernel_names(&rope.1),
            ["rope_forward", "rope_forward_bf16", "rope_backward", "rope_backward_bf16"]
        );
        let headers = files.iter().filter(|(name, _)| name.ends_with(".cuh"));
        assert!(headers.clone().all(|(_, text)| kernel_names(text).is_empty()), "a header declares a kernel");
    }
}
