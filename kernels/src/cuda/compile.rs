//! NVRTC: a kernel source to PTX for one GPU architecture. This needs only the NVRTC
//! library (no GPU, no CUDA toolkit), so tests compile every kernel on any machine that
//! has it, and the device compiles for exactly the GPU it runs on.

use super::sources::{KernelSource, HEADERS};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

/// Whether the NVRTC shared library can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn require_nvrtc() -> Result<(), String> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err("the NVRTC library (libnvrtc.so) was not found; install it (e.g. the PyPI wheel \
             nvidia-cuda-nvrtc, see .ci/install-nvrtc.sh) and put its lib directory on LD_LIBRARY_PATH"
            .into())
    }
}

/// NVRTC's (major, minor) version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    status.result().map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// Compiles `source` to PTX for a virtual architecture such as `compute_90`.
pub fn compile(source: &KernelSource, arch: &str) -> Result<String, String> {
    require_nvrtc()?;
    let options = CompileOptions {
        name: Some(source.name.to_string()),
        // Every function of kernels/cuda is device code: with -default-device an unannotated
        // one is a device function, as a generic lambda's call operator must be (warp_row.cuh's
        // with_whole), which no annotation can make it without nvcc's --extended-lambda.
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
            "-default-device".to_string(),
        ],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(with_headers(source)?, options).map_err(|e| match e {
        CompileError::CompileError { log, .. } => {
            format!("NVRTC failed on {} for {arch}:\n{}", source.name, log.to_string_lossy())
        }
        other => format!("NVRTC failed on {} for {arch}: {other}", source.name),
    })?;
    Ok(ptx.to_src())
}

/// The source with each `#include "header"` replaced by that header from [`HEADERS`],
/// headers within headers too, each header once (as its `#pragma once` asks of a
/// preprocessor that reads files; NVRTC sees one text). `#line` directives keep NVRTC's
/// messages pointing at the right file and line.
fn with_headers(source: &KernelSource) -> Result<String, String> {
    let mut out = String::with_capacity(source.source.len());
    inline_headers(source.name, source.source, &mut Vec::new(), &mut out)?;
    Ok(out)
}

/// `text` (file `name`) onto `out`, its includes inlined; `included` lists the headers
/// already inlined.
fn inline_headers(
    name: &str,
    text: &str,
    included: &mut Vec<&'static str>,
    out: &mut String,
) -> Result<(), String> {
    for (i, line) in text.lines().enumerate() {
        let Some(header) = line.trim().strip_prefix("#include \"").and_then(|s| s.strip_suffix('"')) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let &(header, body) = HEADERS
            .iter()
            .find(|(h, _)| *h == header)
            .ok_or_else(|| format!("{name}:{}: unknown header \"{header}\"", i + 1))?;
        if !included.contains(&header) {
            included.push(header);
            out.push_str(&format!("#line 1 \"{header}\"\n"));
            inline_headers(header, body, included, out)?;
        }
        out.push_str(&format!("#line {} \"{name}\"\n", i + 2));
    }
    Ok(())
}
