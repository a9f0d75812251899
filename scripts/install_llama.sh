#!/usr/bin/env bash
# Install llama-cpp-python VERSION into VENV, built from source as scripts/llama_build_args.py chooses, and check
# that it runs on this CPU (scripts/install_llama.py says how). scripts/setup.sh runs it:
#   scripts/install_llama.sh VENV VERSION
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/install_llama.py "$@"
