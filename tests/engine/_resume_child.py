"""Fresh-process half of test_resume and test_llama_resume: restore each snapshot, continue, write what came out.

A job names a GGUF ("gguf": llama.cpp) or a model directory ("model_dir": transformers on the CPU, float32).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from engramctl.store import arrays
from tests.conftest import LLAMA_TEST_SEQUENCES
from tests.snapshot_io import read_state


def _backend(job: dict):
    if job.get("gguf"):
        from engramctl.engine.llama_backend import LlamaCppBackend

        path = Path(job["gguf"])
        return LlamaCppBackend(
            path,
            path.name,
            chunk_tokens=job["chunk_tokens"],
            device=job.get("device", "cpu"),
            sequences=job.get("sequences", LLAMA_TEST_SEQUENCES),  # as load_llama: not the GPU's default 16
        )
    from engramctl.engine.hf_backend import TransformersBackend
    from engramctl.ngram.hashing import NgramConfig

    model_dir = Path(job["model_dir"])
    ngram = NgramConfig(**job["ngram"]) if job.get("ngram") else None  # N-gram layers, rebuilt from their seed
    backend = TransformersBackend.load(model_dir, model_dir.name, "cpu", torch.float32, ngram=ngram)
    backend.chunk_tokens = 16
    return backend


def main(job_file: str, out_file: str) -> None:
    results = {}
    for job in json.loads(Path(job_file).read_text()):
        backend, fam = _backend(job), job["family"]
        live = backend.inject(read_state(Path(job["snapshot"]), backend.spec))
        results[f"{fam}.restored_logits"] = arrays.copy(live.last_logits)
        logits = backend.prefill(live, job["more_ids"])
        results[f"{fam}.continued_logits"] = arrays.copy(logits)
        greedy = []
        for _ in range(job["greedy"]):
            greedy.append(int(logits.argmax()))
            logits = backend.decode(live, greedy[-1])
        results[f"{fam}.greedy"] = torch.tensor(greedy)
        results[f"{fam}.final_logits"] = arrays.copy(logits)
    save_file({k: arrays.as_kind(v, arrays.TORCH) for k, v in results.items()}, out_file)  # llama.cpp's: numpy


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
