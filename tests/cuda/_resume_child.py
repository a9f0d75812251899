"""Fresh-process half of test_cuda_resume: restore each snapshot on CUDA, continue, write what came out.

Per job: read + verify the snapshot file (snapshot_file.decode via read_state), inject it into a fresh
cache on the GPU, check that the injected cache captures back to exactly the file's tensors and lives on
the GPU, feed the remaining tokens, decode greedily.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from engramctl.engine.hf_backend import TransformersBackend
from tests.snapshot_io import read_state


def main(job_file: str, out_file: str) -> None:
    results = {}
    backends: dict[tuple[str, str], TransformersBackend] = {}
    for job in json.loads(Path(job_file).read_text()):
        model_dir = Path(job["model_dir"])
        dtype = getattr(torch, job["dtype"])
        if (job["model_dir"], job["dtype"]) not in backends:
            backend = TransformersBackend.load(model_dir, model_dir.name, "cuda", dtype)
            backend.chunk_tokens = 16
            backends[(job["model_dir"], job["dtype"])] = backend
        backend = backends[(job["model_dir"], job["dtype"])]
        state = read_state(Path(job["snapshot"]), backend.spec)
        live = backend.inject(state)
        back = backend.capture(live)
        on_cuda = back.last_logits.is_cuda and all(t.is_cuda for layer in back.layers for t in layer.tensors().values())
        same = back.token_ids == state.token_ids and all(
            torch.equal(a.cpu(), b.cpu())
            for la, lb in zip(back.layers, state.layers)
            for a, b in zip(la.tensors().values(), lb.tensors().values())
        )
        key = job["key"]
        results[f"{key}.on_cuda"] = torch.tensor(int(on_cuda))
        results[f"{key}.inject_exact"] = torch.tensor(int(same))
        results[f"{key}.restored_logits"] = live.last_logits.float().cpu().clone()
        logits = backend.prefill(live, job["more_ids"])
        results[f"{key}.continued_logits"] = logits.float().cpu().clone()
        greedy, steps = [], []
        for _ in range(job["greedy"]):
            greedy.append(int(torch.argmax(logits)))
            logits = backend.decode(live, greedy[-1])
            steps.append(logits.float().cpu().clone())
        results[f"{key}.greedy"] = torch.tensor(greedy)
        results[f"{key}.steps"] = torch.stack(steps)
    save_file(results, out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
