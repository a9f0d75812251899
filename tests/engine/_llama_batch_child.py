"""Fresh-process half of test_llama_batch: restore a snapshot captured mid-batch, capture it again at once
(its bytes), then continue alone; write what came out."""

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from engramctl.engine.llama_backend import LlamaCppBackend
from tests.snapshot_io import read_state


def main(job_file: str, out_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    path = Path(job["gguf"])
    backend = LlamaCppBackend(path, path.name, chunk_tokens=job["chunk_tokens"])
    live = backend.inject(read_state(Path(job["snapshot"]), backend.spec))
    again = backend.capture(live)
    results = {
        f"layer{i}.{name}": t.copy() for i, layer in enumerate(again.layers) for name, t in layer.tensors().items()
    }
    logits = backend.prefill(live, job["more_ids"])
    results["continued_logits"] = logits.copy()
    greedy = []
    for _ in range(job["greedy"]):
        greedy.append(int(logits.argmax()))
        logits = backend.decode(live, greedy[-1])
    results["greedy"] = np.array(greedy, dtype=np.int64)
    results["final_logits"] = logits.copy()
    save_file(results, out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
