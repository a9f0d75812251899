"""The machine a bench ran on, as the report's "machine" object."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any


def describe_machine(engine_device: str) -> dict[str, Any]:
    import torch
    import transformers

    from engramctl.tiers.hardware import detect_hardware

    hw = detect_hardware(Path.home())
    return {
        "cpu": hw.cpu,
        "cpu_cores": hw.cpu_cores,
        "cpu_threads": hw.cpu_threads,
        "ram_total_bytes": hw.ram_total_bytes,
        "ram_available_bytes": hw.ram_available_bytes,
        "gpu": hw.gpu,
        "vram_total_bytes": hw.vram_total_bytes,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "llama_cpp_python": llama_version(),
        "device": engine_device,
    }


def llama_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:
        return None
