"""Model identity: config + a strided sample of every weight tensor. Cheap (microseconds per tensor)
and dtype-independent (samples are rounded to bfloat16), so it tells different weights apart while a
dtype change is reported as a dtype change."""

from __future__ import annotations

import hashlib
import json

import torch

# Config keys that describe how the model was loaded or run, not what it computes.
_VOLATILE = {
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "_commit_hash",
    "use_mamba_kernels",
}
SAMPLES_PER_TENSOR = 64


def model_fingerprint(model: torch.nn.Module, config: dict) -> str:
    h = hashlib.sha256()
    cfg = {k: v for k, v in config.items() if k not in _VOLATILE}
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            flat = p.detach().reshape(-1)
            h.update(f"{name}{tuple(p.shape)}".encode())
            if flat.numel() == 0:
                continue
            k = min(SAMPLES_PER_TENSOR, flat.numel())
            # integer strides: a float linspace rounds past the end on tensors of ~2**24+ elements
            idx = (torch.arange(k, dtype=torch.int64) * (flat.numel() - 1) // max(k - 1, 1)).to(flat.device)
            sample = flat[idx]
            if sample.is_floating_point():
                sample = sample.to(torch.bfloat16).float()
            h.update(sample.cpu().numpy().tobytes())
    return h.hexdigest()[:16]
