"""Fresh-process half of test_llama_resume: restore each snapshot on llama.cpp, continue, write what came out."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from engramctl.engine.llama_backend import LlamaCppBackend
from tests.snapshot_io import read_state


def main(job_file: str, out_file: str) -> None:
    results = {}
    for job in json.loads(Path(job_file).read_text()):
        path, fam = Path(job["gguf"]), job["family"]
        backend = LlamaCppBackend(path, path.name, chunk_tokens=job["chunk_tokens"])
        live = backend.inject(read_state(Path(job["snapshot"]), backend.spec))
        results[f"{fam}.restored_logits"] = live.last_logits.clone()
        logits = backend.prefill(live, job["more_ids"])
        results[f"{fam}.continued_logits"] = logits.clone()
        greedy = []
        for _ in range(job["greedy"]):
            greedy.append(int(torch.argmax(logits)))
            logits = backend.decode(live, greedy[-1])
        results[f"{fam}.greedy"] = torch.tensor(greedy)
        results[f"{fam}.final_logits"] = logits.clone()
    save_file(results, out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
