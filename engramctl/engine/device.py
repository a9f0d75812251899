"""Pick device and dtype. On CPU, float32 unless the CPU computes bf16 natively: on AVX2-only CPUs bf16
measured 3-4x slower than float32 on this project's 2-core AVX2 machines."""

from __future__ import annotations

from pathlib import Path

import torch

from engramctl.errors import UsageError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_device(requested: str = "auto") -> str:
    if requested not in ("auto", "cpu", "cuda"):
        raise UsageError(f"device {requested!r} is not one of auto, cpu, cuda.")
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("device cuda was requested but no CUDA GPU is available.", hint="use --device cpu")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def pick_dtype(requested: str, device: str) -> torch.dtype:
    if requested == "auto":
        if device == "cuda" or cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if requested not in DTYPES:
        raise UsageError(f"dtype {requested!r} is not one of auto, {', '.join(DTYPES)}.")
    return DTYPES[requested]
