#!/usr/bin/env bash
# Install llama-cpp-python VERSION into VENV, built from source as scripts/llama_build_args.py chooses (CUDA for
# the GPUs' own architectures when nvidia-smi lists a GPU and nvcc is there, else the CPU build), unless that very
# build is installed already. scripts/setup.sh runs it:  scripts/install_llama.sh VENV VERSION
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$1"
LLAMA_CPP_VERSION="$2"
# ggml-cuda is 69 .cu files and ~120 template instances per architecture: 90-real took 2,076 s on 2 cores
CUDA_BUILD_TIME="~35 minutes per GPU architecture on 2 cores, less with more"
# PyPI has no Linux wheel of llama-cpp-python: pip builds the sdist with the system gcc and cmake (and nvcc).
# Which build: llama_build_args.py prints its CMAKE_ARGS and says on stderr what it builds and why: CUDA for the
# GPUs' own architectures when nvidia-smi lists a GPU and nvcc is there, else the CPU build (CI's). The CPU side
# of both: native SIMD, no vision objects, ggml's thread pool instead of OpenMP (docs/llama-threads.md).
LLAMA_ARGS="$(python3 scripts/llama_build_args.py)"
cuda_on=' -DGGML_CUDA=(on|1|true|yes) '
shopt -s nocasematch
if [[ " $LLAMA_ARGS " =~ $cuda_on ]]; then LLAMA_KIND=cuda; else LLAMA_KIND=cpu; fi
shopt -u nocasematch
# The args the installed build was made with: a change rebuilds (pip alone would keep the installed one).
LLAMA_MARK="$VENV/share/engramctl/llama-cpp-python.cmake-args"
installed_llama() {  # "cpu" or "cuda" for the pinned version installed, nothing otherwise; never loads the library
  "$VENV/bin/python" - "$LLAMA_CPP_VERSION" <<'PY' 2>/dev/null || true
import importlib.metadata as m, importlib.util as u, pathlib, sys
try:
    ok = m.version("llama_cpp_python") == sys.argv[1]
except m.PackageNotFoundError:
    ok = False
spec = u.find_spec("llama_cpp") if ok else None
if spec is not None:
    print("cuda" if any((pathlib.Path(spec.origin).parent / "lib").glob("libggml-cuda*")) else "cpu")
PY
}
have="$(installed_llama)"
if [ "$have" != "$LLAMA_KIND" ] || ! { [ "$(cat "$LLAMA_MARK" 2>/dev/null)" = "$LLAMA_ARGS" ] ||
    { [ "$LLAMA_KIND" = cpu ] && [ ! -f "$LLAMA_MARK" ]; }; }; then  # a CPU build from before the mark is today's
  if [ "$LLAMA_KIND" = cuda ]; then
    # pip's wheel cache keys a built sdist by its URL and hash, not by CMAKE_ARGS (pip/_internal/cache.py): a
    # CUDA wheel there would later be reused for a CPU install. CUDA wheels go to a folder of their own, keyed by
    # their args, so a second venv on this machine installs in seconds.
    echo "building llama-cpp-python $LLAMA_CPP_VERSION with CUDA from source: $CUDA_BUILD_TIME;" \
         "the wheel is kept, so later installs with the same architectures take seconds" >&2
    key="$(printf '%s %s %s' "$LLAMA_CPP_VERSION" "$("$VENV/bin/python" -V)" "$LLAMA_ARGS" | sha256sum | cut -c1-16)"
    wheels="${XDG_CACHE_HOME:-$HOME/.cache}/engramctl/llama-cpp-python-$key"
    if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
      rm -rf "$wheels.partial"
      CMAKE_ARGS="$LLAMA_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$VENV/bin/pip" wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$wheels.partial" \
        "llama-cpp-python==$LLAMA_CPP_VERSION"
      mv "$wheels.partial" "$wheels"
    fi
    if [ -z "$have" ]; then
      "$VENV/bin/pip" install -q "$wheels"/llama_cpp_python-*.whl
    else  # the same version is installed (another build): pip would call it satisfied
      "$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
    fi
  else
    echo "building llama-cpp-python $LLAMA_CPP_VERSION from source: the first build takes ~10 minutes on 2 cores;" \
         "pip caches the built wheel, so later installs take seconds" >&2
    if [ -z "$have" ]; then
      CMAKE_ARGS="$LLAMA_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$VENV/bin/pip" install -q "llama-cpp-python==$LLAMA_CPP_VERSION"
    fi
    # Another build is installed, or pip's cache held one (a CUDA wheel made outside this script): pip may have
    # taken it from the cache, which does not know CMAKE_ARGS, so build afresh.
    if [ -n "$have" ] || [ "$(installed_llama)" != cpu ]; then
      echo "installed: a llama-cpp-python build other than this one; building the CPU one afresh" >&2
      CMAKE_ARGS="$LLAMA_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$VENV/bin/pip" install -q --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$LLAMA_CPP_VERSION"
    fi
  fi
  if [ "$(installed_llama)" != "$LLAMA_KIND" ]; then
    echo "Error: llama-cpp-python $LLAMA_CPP_VERSION is not the $LLAMA_KIND build after installing it" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$LLAMA_MARK")"
  printf '%s\n' "$LLAMA_ARGS" >"$LLAMA_MARK"
fi
