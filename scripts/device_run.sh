#!/usr/bin/env bash
# On a lent GPU machine (docs/gpu.md "Running it again"): install the carried wheels/device-kit
# (scripts/device_kit.sh) beside the image's torch, then run tests/cuda; everything it prints and measures goes to
# $OUT (nvidia-smi, llama.cpp's build line, pytest's output, figures.json). One call of the device tool:
#   run(command="scripts/device_run.sh", carry=["wheels/device-kit"], timeout_s=540)
# PYTHON names the interpreter (default python3); TESTS picks the tests (default tests/cuda); FIGURES=0 skips the
# figures after them (the VRAM tier probe, bench backends); SERVE=1 adds bench serve against llama-server (item 6).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
KIT=wheels/device-kit
SITE="${SITE:-/tmp/engram-site}"
OUT="${OUT:-/tmp/engram-out}"
mkdir -p "$OUT"
start=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$KIT"/deps/*.whl \
  >"$OUT/install.txt" 2>&1 || { tail -20 "$OUT/install.txt"; exit 1; }
tar xJf "$KIT"/cuda/llama_cpp_python.tar.xz -C "$SITE"  # the wheel's files: what pip --target would lay out
# tests/daemon/conftest.py starts daemons with PYTHONPATH=<checkout> only: this file, in the checkout's root, puts
# the installed wheels first for them too
printf 'import sys\n\nif "%s" not in sys.path:\n    sys.path.insert(0, "%s")\n' "$SITE" "$SITE" >sitecustomize.py
trap 'rm -f sitecustomize.py' EXIT
export PYTHONPATH="$SITE:$PWD" ENGRAM_LLAMA_CONVERTER="$PWD/$KIT/converter" HF_HUB_OFFLINE=1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"  # libcudart and libcublas for ggml-cuda
echo "install: $(( $(date +%s) - start )) s" | tee "$OUT/times.txt"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" 2>&1 | tee "$OUT/llama-build.txt"
ENGRAM_GPU_REPORT="$OUT/figures.json" timeout "${TESTS_TIMEOUT_S:-420}" \
  "$PY" -m pytest ${TESTS:-tests/cuda} -v -s -p no:cacheprovider >"$OUT/pytest.txt" 2>&1
rc=$?
echo "tests: rc $rc, $(( $(date +%s) - start )) s in all" | tee -a "$OUT/times.txt"
grep -E " (PASSED|FAILED|ERROR|SKIPPED)|passed|failed|\[gpu-figure\]" "$OUT/pytest.txt" | tail -60
# Item 3's figures (scripts/vram_tier_probe.py) and item 7's (bench backends) on the Granite-4.0-H-350M preset, built
# here from its seed (the GGUF is 365 MB: more than a carry); ENGRAM_HOME outside $OUT so that nothing big comes back
export ENGRAM_HOME=/tmp/engram-bench-home ENGRAM_NO_AUTOSTART=1
if [ "${FIGURES:-1}" = 1 ]; then
  gguf=$(timeout 240 "$PY" -c "from pathlib import Path; from engramctl.bench.gguf_presets import preset_gguf
print(preset_gguf('granite-4.0-h-350m', 0, 'q8_0', Path('/tmp/engram-bench-home/cache')))" 2>"$OUT/preset.txt")
  [ -n "$gguf" ] && timeout 180 "$PY" scripts/vram_tier_probe.py "$gguf" --tokens 2048 --json "$OUT/vram-tier.json" \
    >"$OUT/vram-tier.txt" 2>&1
  echo "vram tier probe: rc $?, $(( $(date +%s) - start )) s in all" | tee -a "$OUT/times.txt"
  timeout 240 "$PY" -m engramctl bench backends --preset granite-4.0-h-350m --device cuda --dtype bfloat16 \
    --gguf-type f16 --prefill-tokens 512 --decode-tokens 64 --runs 3 --json >"$OUT/bench-backends.json" \
    2>"$OUT/bench-backends.txt"
  echo "bench backends: rc $?, $(( $(date +%s) - start )) s in all" | tee -a "$OUT/times.txt"
fi
# Item 6 (SERVE=1): bench serve against llama-server, whose CPU front-end (carried) runs over the CUDA wheel's
# libraries (bench/llama_server.py); its cache folder is where find_or_build looks for the CPU build
if [ "${SERVE:-0}" = 1 ] && [ -f "$KIT/llama-server-front.tar.xz" ] && [ -n "${gguf:-}" ]; then
  front=$("$PY" -c "from engramctl.bench.llama_server import install_dir; from engramctl.settings import load_settings
print(install_dir(load_settings().paths.cache_dir) / 'bin')")
  mkdir -p "$front" && tar xJf "$KIT/llama-server-front.tar.xz" -C "$front"
  timeout "${SERVE_TIMEOUT_S:-300}" "$PY" -m engramctl bench serve --model "$gguf" --json >"$OUT/bench-serve.json" \
    2>"$OUT/bench-serve.txt"
  echo "bench serve: rc $?, $(( $(date +%s) - start )) s in all" | tee -a "$OUT/times.txt"
fi
exit $rc
