#!/usr/bin/env bash
# Installs NVRTC, the CUDA run-time compiler library, from PyPI: no GPU and no CUDA toolkit
# needed. With it `cargo test -p kernels --features cuda` compiles every kernel to PTX
# (tests/cuda_nvrtc.rs), which otherwise skips. Prints the environment to set, so:
#
#   eval "$(.ci/install-nvrtc.sh)"
#
# PIPETRAIN_NVRTC_CUDA picks the CUDA major version: 13 (default) agrees with cudarc's
# `cuda-13000` bindings; 12 is for GPU hosts whose driver is older than CUDA 13, because the
# driver cannot load PTX from a newer NVRTC. cudarc finds libnvrtc.so.13 and .so.12 by
# those names, so no symlink is needed; the directory must be on LD_LIBRARY_PATH, where
# NVRTC also finds its libnvrtc-builtins. The kernels include no CUDA headers, so no
# include path is needed.
#
# PIPETRAIN_NVRTC_DIR overrides the install directory (default: a per-user cache).
set -euo pipefail

major="${PIPETRAIN_NVRTC_CUDA:-13}"
dir="${PIPETRAIN_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pipetrain/nvrtc-cu$major}"
case "$major" in
  13) package="nvidia-cuda-nvrtc==13.0.*"; lib="$dir/nvidia/cu13/lib" ;;
  12) package="nvidia-cuda-nvrtc-cu12==12.9.*"; lib="$dir/nvidia/cuda_nvrtc/lib" ;;
  *) echo "install-nvrtc: PIPETRAIN_NVRTC_CUDA must be 12 or 13, not '$major'" >&2; exit 2 ;;
esac

if [ ! -e "$lib/libnvrtc.so.$major" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$dir" "$package" >&2
fi
if [ ! -e "$lib/libnvrtc.so.$major" ]; then
  echo "install-nvrtc: $package installed no libnvrtc.so.$major under $lib" >&2
  exit 1
fi
echo "export LD_LIBRARY_PATH=\"$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
