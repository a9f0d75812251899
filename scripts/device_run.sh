#!/usr/bin/env bash
# On a lent GPU machine (docs/gpu.md "Running it again"): install the carried wheels/device-kit
# (scripts/device_kit.sh) beside the image's torch, run tests/cuda, then measure; one call of the device tool:
#   run(command="scripts/device_run.sh", carry=["wheels/device-kit"], timeout_s=590)
# Every step runs under `timeout`, and each step's limit is cut to what is left of TOTAL_S (default 560 s: the tool
# allows 600 s a command), so the script ends in time whatever hangs. It writes at most 8 files to $OUT:
#   log.txt             install, nvidia-smi, llama.cpp's build line, each step's rc and seconds, their stderr tails
#   pytest.txt          tests/cuda (TESTS picks others), -v -s in one process (-o addopts=): every [gpu-figure] line
#   figures.json        the figures the tests recorded (ENGRAM_GPU_REPORT)
#   vram-tier.json      scripts/vram_tier_probe.py on the Granite-4.0-H-350M preset (Q8_0), 2,048 tokens
#   bench-backends.json engramctl bench backends on that preset (transformers bf16 vs llama.cpp f16)
#   bench-store.json    scripts/bench_store.py: restore from RAM and from disk against their floors (issue 45 item 1)
#   prefetch.json       scripts/prefetch_check.py: the turn after a restart, prefetched vs read from disk
#   bench-serve.json    SERVE=1 only: engramctl bench serve against llama-server over the same CUDA libraries
# PYTHON names the interpreter (default python3); FIGURES=0 skips everything after the tests. A rehearsal on a machine
# without a GPU: KIT=<a kit> DEVICE=cpu GGUF=<a small GGUF instead of building the preset> ENGRAM_LLAMA_TEST_DEVICE=cpu.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
KIT="${KIT:-wheels/device-kit}"
DEVICE="${DEVICE:-cuda}"
SITE="${SITE:-/tmp/engram-site}"
OUT="${OUT:-/tmp/engram-out}"
TOTAL_S="${TOTAL_S:-560}"
LOG="$OUT/log.txt"
mkdir -p "$OUT"
start=$(date +%s)

left() { echo $((TOTAL_S - ($(date +%s) - start))); }
# step NAME CAP_S CMD...: run CMD under timeout min(CAP_S, what is left - 5 s); log its rc, its seconds and, on a
# failure, the tail of its stderr (which goes to /tmp, not to $OUT)
step() {
  local name=$1 cap=$2 t0 rc budget
  shift 2
  budget=$(($(left) - 5))
  [ "$budget" -lt "$cap" ] && cap=$budget
  if [ "$cap" -lt 10 ]; then
    echo "$name: skipped, $(left) s left" | tee -a "$LOG" >&2
    return 124
  fi
  t0=$(date +%s)
  timeout "$cap" "$@" 2>"/tmp/engram-$name.err"
  rc=$?
  echo "$name: rc $rc in $(($(date +%s) - t0)) s (limit $cap s), $(($(date +%s) - start)) s in all" | tee -a "$LOG" >&2
  [ "$rc" -ne 0 ] && tail -15 "/tmp/engram-$name.err" | sed "s/^/  $name: /" >>"$LOG"
  return $rc
}

step install 90 "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$KIT"/deps/*.whl \
  || { tail -20 "$LOG"; exit 1; }
step untar 60 tar xJf "$KIT"/cuda/llama_cpp_python.tar.xz -C "$SITE"  # what pip --target would lay out
# tests/daemon/conftest.py starts daemons with PYTHONPATH=<checkout> only: this file, in the checkout's root, puts
# the installed wheels first for them too
printf 'import sys\n\nif "%s" not in sys.path:\n    sys.path.insert(0, "%s")\n' "$SITE" "$SITE" >sitecustomize.py
trap 'rm -f sitecustomize.py' EXIT
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1
[ -d "$KIT/converter" ] && export ENGRAM_LLAMA_CONVERTER="$(cd "$KIT/converter" && pwd)"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"  # libcudart and libcublas for ggml-cuda
{ nvidia-smi 2>&1 || true; } >>"$LOG"
timeout 60 "$PY" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" >>"$LOG" 2>&1

export ENGRAM_GPU_REPORT="$OUT/figures.json"
step tests "${TESTS_TIMEOUT_S:-240}" "$PY" -m pytest ${TESTS:-tests/cuda} -v -s -p no:cacheprovider -o addopts= >"$OUT/pytest.txt"
rc=$?
grep -E " (PASSED|FAILED|ERROR|SKIPPED)|passed|failed|\[gpu-figure\]" "$OUT/pytest.txt" | tail -60

# The figures, on the Granite-4.0-H-350M preset built here from its seed (the GGUF is 365 MB: more than a carry);
# ENGRAM_HOME outside $OUT so that nothing big comes back
export ENGRAM_HOME=/tmp/engram-bench-home ENGRAM_NO_AUTOSTART=1
if [ "${FIGURES:-1}" = 1 ]; then
  gguf="${GGUF:-}"
  [ -n "$gguf" ] || gguf=$(step preset 120 "$PY" -c "from pathlib import Path; from engramctl.bench.gguf_presets import preset_gguf
print(preset_gguf('granite-4.0-h-350m', 0, 'q8_0', Path('/tmp/engram-bench-home/cache')))")
  if [ -n "$gguf" ]; then
    step vram-tier 60 "$PY" scripts/vram_tier_probe.py "$gguf" --tokens 2048 --json "$OUT/vram-tier.json" >/dev/null
    # restore against its floor (issue 45 item 1), a 350M-shaped state at 10K tokens, with the flags every version of
    # the script has (what a newer one adds, its floors among them, it prints and writes by default)
    [ -f scripts/bench_store.py ] && step bench-store 60 "$PY" scripts/bench_store.py --blocks --tokens 10240 \
      --repeat 5 --json "$OUT/bench-store.json" >/dev/null
    step prefetch 90 "$PY" scripts/prefetch_check.py "$gguf" --tokens 2048 --device "$DEVICE" \
      --json "$OUT/prefetch.json" >/dev/null
  fi
  # 130 s was enough where 50 s once timed out (2026-11-28): the transformers row builds the preset first
  step bench-backends 150 "$PY" -m engramctl bench backends --preset granite-4.0-h-350m --device "$DEVICE" \
    --dtype bfloat16 --gguf-type f16 --prefill-tokens 512 --decode-tokens 64 --runs 3 --json \
    >"$OUT/bench-backends.json"
fi
# SERVE=1: bench serve against llama-server, whose CPU front-end (carried) runs over the CUDA wheel's libraries
# (bench/llama_server.py); its cache folder is where find_or_build looks for the CPU build
if [ "${SERVE:-0}" = 1 ] && [ -f "$KIT/llama-server-front.tar.xz" ] && [ -n "${gguf:-}" ]; then
  front=$("$PY" -c "from engramctl.bench.llama_server import install_dir; from engramctl.settings import load_settings
print(install_dir(load_settings().paths.cache_dir) / 'bin')")
  mkdir -p "$front" && tar xJf "$KIT/llama-server-front.tar.xz" -C "$front"
  step bench-serve "${SERVE_TIMEOUT_S:-300}" "$PY" -m engramctl bench serve --model "$gguf" --json \
    >"$OUT/bench-serve.json"
fi
echo "done: $(($(date +%s) - start)) s in all; tests rc $rc" | tee -a "$LOG"
exit $rc
