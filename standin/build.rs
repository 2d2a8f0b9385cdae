//! Builds every kernel family of kernels/cuda for the host, with the SIMT emulator of
//! kernels/tests/simt, each into a shared object the stand-in embeds and loads when a module
//! holding its kernels is loaded (src/emulator.rs). Each family is its own object so that
//! its `__shared__` variables, and only its own, are what the emulator clears per block.
//!
//! The kernels a family exports are read from its `extern "C" __global__` declarations, and
//! the layout of each kernel's parameters from those declarations' types by the C++
//! compiler (simt.hpp's `library_entry`): nothing is listed by hand. Without a C++
//! compiler the stand-in builds with no families and says so when a module is loaded.

#[path = "../kernels/build/cuda_decls.rs"]
mod cuda_decls;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// As the SIMT harness compiles (kernels/tests/simt/harness.rs): contraction off, so the
/// host rounds a * b + c as the CPU backend does.
const CXXFLAGS: [&str; 6] =
    ["-std=c++17", "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-fvisibility=hidden"];

fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Compiles family `file` (with its kernels) into `out`/`stem`.so; the compiler's message
/// on failure.
fn build_family(
    kernels_dir: &Path,
    emulator: &Path,
    out: &Path,
    file: &str,
    kernels: &[String],
) -> Result<PathBuf, String> {
    let stem = file.trim_end_matches(".cu");
    let table: String = kernels.iter().map(|k| format!("    simt::library_entry<{k}>(\"{k}\"),\n")).collect();
    let main = format!(
        "#include \"simt.hpp\"\n#include \"{file}\"\n\nstatic const simt::LibraryKernel kernels[] = {{\n{table}}};\nSIMT_LIBRARY(kernels)\n"
    );
    let main_path = out.join(format!("{stem}.cpp"));
    std::fs::write(&main_path, main).map_err(|e| e.to_string())?;
    let lib = out.join(format!("{stem}.so"));
    let result = Command::new(compiler())
        .args(CXXFLAGS)
        .arg("-I")
        .arg(kernels_dir)
        .arg("-I")
        .arg(emulator.parent().expect("simt.hpp's directory"))
        .arg("-o")
        .arg(&lib)
        .arg(&main_path)
        .output()
        .map_err(|e| format!("cannot run the C++ compiler `{}`: {e}", compiler()))?;
    if !result.status.success() {
        return Err(format!("{file}: {}", String::from_utf8_lossy(&result.stderr)));
    }
    Ok(lib)
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels_dir = manifest.join("../kernels/cuda");
    let emulator = manifest.join("../kernels/tests/simt/simt.hpp");
    println!("cargo:rerun-if-changed={}", kernels_dir.display());
    println!("cargo:rerun-if-changed={}", emulator.display());
    println!("cargo:rerun-if-changed={}", manifest.join("../kernels/build/cuda_decls.rs").display());
    println!("cargo:rerun-if-env-changed=CXX");

    let families: Vec<(String, Vec<String>)> = cuda_decls::cuda_files(&kernels_dir)
        .into_iter()
        .filter(|(file, _)| file.ends_with(".cu"))
        .map(|(file, source)| {
            let kernels = cuda_decls::kernel_names(&source);
            (file, kernels)
        })
        .collect();

    // As many compiles at once as there are cores: each takes a second or two.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut built: Vec<Result<PathBuf, String>> = Vec::new();
    for batch in families.chunks(cores) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|(file, kernels)| {
                    scope.spawn(|| build_family(&kernels_dir, &emulator, &out, file, kernels))
                })
                .collect();
            built.extend(handles.into_iter().map(|h| h.join().expect("a compile thread")));
        });
    }

    let mut rs = String::from("/// Every kernel family: its file, its kernels, and its shared object.\n");
    let unavailable = built.iter().find_map(|b| b.as_ref().err().cloned());
    match &unavailable {
        Some(why) => {
            println!("cargo:warning=the CUDA stand-in runs no kernels: {}", why.lines().next().unwrap_or(""));
            writeln!(rs, "pub const UNAVAILABLE: Option<&str> = Some({why:?});").unwrap();
            writeln!(rs, "pub const FAMILIES: &[(&str, &[&str], &[u8])] = &[];").unwrap();
        }
        None => {
            writeln!(rs, "pub const UNAVAILABLE: Option<&str> = None;").unwrap();
            writeln!(rs, "pub const FAMILIES: &[(&str, &[&str], &[u8])] = &[").unwrap();
            for ((file, kernels), lib) in families.iter().zip(&built) {
                let lib = lib.as_ref().expect("built");
                writeln!(
                    rs,
                    "    ({file:?}, &{kernels:?}, include_bytes!({:?})),",
                    lib.display().to_string()
                )
                .unwrap();
            }
            writeln!(rs, "];").unwrap();
        }
    }
    std::fs::write(out.join("families.rs"), rs).expect("write families.rs");
}
