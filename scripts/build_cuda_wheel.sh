#!/usr/bin/env bash
# Build a CUDA wheel of llama-cpp-python on a machine WITHOUT a GPU, to carry to one (docs/gpu.md).
#   scripts/build_cuda_wheel.sh [ARCHS]       build into wheels/cuda-<ARCHS>/ (git-ignored)
#   scripts/build_cuda_wheel.sh --print-args [ARCHS]   print the CMAKE_ARGS only, build nothing
# ARCHS: CMake CUDA architectures, default $ENGRAM_CUDA_ARCHS or 90-real (the lent H100/H200); 89-real for an
# RTX 40xx, 86-real for an RTX 30xx, "86-real;89-real" for both.
# Without a GPU, CMake's "native" architecture resolves to garbage, so it is named. The wheel runs on another
# CPU: no -march=native, but AVX2/FMA/F16C/BMI2 (any x86-64 CPU beside a CUDA card of the last decade has them).
# The toolkit beside nvcc may lack cuBLAS (the development machines' does): then the headers and libraries come
# from NVIDIA's cuBLAS wheel on PyPI, with the link names (libcublas.so) it lacks. -DGGML_CUDA_NO_VMM=ON drops
# the link to libcuda (the driver, absent without a GPU). On the GPU machine the wheel needs libcudart and
# libcublas of the same CUDA major version on the loader's path (LD_LIBRARY_PATH=/usr/local/cuda/lib64).
# Environment: PYTHON (the interpreter the wheel is for; default .venv/bin/python), ENGRAM_CUBLAS_DIR (an
# unpacked cuBLAS wheel; default wheels/cublas-cuN, fetched when absent), ENGRAM_LLAMA_SDIST (a local sdist
# instead of PyPI's), CMAKE_BUILD_PARALLEL_LEVEL (default: all cores; 35 minutes on 2 for one architecture).
# The wheel is slimmed (scripts/slim_wheel.py: ~24 MB for 90-real) to fit the device tool's 64 MiB carry.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP_VERSION=0.3.36 # as scripts/setup.sh
print_only=0
if [ "${1:-}" = "--print-args" ]; then
  print_only=1
  shift
fi
ARCHS="${1:-${ENGRAM_CUDA_ARCHS:-90-real}}"
PY="${PYTHON:-.venv/bin/python}"
OUT="$PWD/wheels/cuda-${ARCHS//;/_}"

NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [ ! -x "$NVCC" ]; then
  echo "Error: no CUDA compiler (nvcc on PATH or /usr/local/cuda/bin/nvcc): install the CUDA toolkit" >&2
  exit 2
fi
CUDA_MAJOR="$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
TOOLKIT="$(dirname "$(readlink -f "$NVCC")")/.."

# The CPU side: llama_build_args.py's portable level (the one place the build flags are written).
read -ra CPU_SIDE <<<"$(python3 scripts/llama_build_args.py --cpu-only --level portable)"
ARGS=(
  -DGGML_CUDA=on "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_COMPRESSION_MODE=size
  "${CPU_SIDE[@]}"
)
toolkit_cublas=0
for f in "$TOOLKIT"/lib64/libcublas.so "$TOOLKIT"/targets/*/lib/libcublas.so; do
  [ ! -e "$f" ] || toolkit_cublas=1
done
if [ "$toolkit_cublas" = 0 ]; then
  CUBLAS_DIR="${ENGRAM_CUBLAS_DIR:-$PWD/wheels/cublas-cu$CUDA_MAJOR}"
  if [ -z "$(find "$CUBLAS_DIR" -name 'libcublas.so.*' 2>/dev/null | head -1)" ]; then
    [ "$print_only" = 0 ] || { echo "Error: no cuBLAS in the toolkit nor in $CUBLAS_DIR" >&2; exit 2; }
    case "$CUDA_MAJOR" in
      13) pkg="nvidia-cublas==13.10.0.20" ;; # carries nvidia/cu13/{include,lib}
      12) pkg="nvidia-cublas-cu12" ;;        # carries nvidia/cublas/{include,lib}
      *) echo "Error: no cuBLAS wheel known for CUDA $CUDA_MAJOR: set ENGRAM_CUBLAS_DIR" >&2; exit 2 ;;
    esac
    echo "the CUDA toolkit at $TOOLKIT has no cuBLAS: fetching $pkg (~450 MB) into $CUBLAS_DIR" >&2
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$PY" -m pip download -q --no-deps "$pkg" -d "$tmp"
    "$PY" -m zipfile -e "$tmp"/nvidia_cublas*.whl "$CUBLAS_DIR"
  fi
  lib="$(dirname "$(find "$CUBLAS_DIR" -name 'libcublas.so.*' | head -1)")"
  inc="$(dirname "$(find "$CUBLAS_DIR" -name 'cublas_v2.h' | head -1)")"
  for name in cublas cublasLt; do # the wheel has only the versioned names; the linker asks for libNAME.so
    [ -e "$lib/lib$name.so" ] || ln -s "$(basename "$(ls "$lib/lib$name.so."*[0-9] | head -1)")" "$lib/lib$name.so"
  done
  ARGS+=("-DCUDA_cublas_LIBRARY=$lib/libcublas.so" "-DCUDA_cublasLt_LIBRARY=$lib/libcublasLt.so"
    "-DCMAKE_CUDA_FLAGS=-I$inc" "-DCMAKE_CXX_FLAGS=-I$inc")
fi
if [ "$print_only" = 1 ]; then
  echo "${ARGS[*]}"
  exit 0
fi

echo "building llama-cpp-python $LLAMA_CPP_VERSION for CUDA $ARCHS into $OUT (nvcc $NVCC):" \
  "~35 minutes on 2 cores for one architecture" >&2
start="$(date +%s)"
rm -rf "$OUT.partial"
CMAKE_ARGS="${ARGS[*]}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$PY" -m pip wheel --no-deps --no-binary :all: --no-cache-dir -w "$OUT.partial" \
  "${ENGRAM_LLAMA_SDIST:-llama-cpp-python==$LLAMA_CPP_VERSION}"
# a wheel holds each library three times and CMake's install a second set at its root: ~140 MB -> ~20 MB
python3 scripts/slim_wheel.py "$OUT.partial"/llama_cpp_python-*.whl
{
  echo "cmake_args: ${ARGS[*]}"
  echo "nvcc: $("$NVCC" --version | tail -1)"
  echo "build_s: $(($(date +%s) - start)) on $(nproc) cores"
} >"$OUT.partial/BUILD-INFO"
rm -rf "$OUT"
mv "$OUT.partial" "$OUT" # complete or absent
echo "built $(ls "$OUT"/*.whl) in $(($(date +%s) - start)) s" >&2
