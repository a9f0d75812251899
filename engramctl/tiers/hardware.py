"""What this machine has: RAM, VRAM, free disk under the data dir, CPU model and cores.

torch is never imported here: VRAM is read only when the process has already imported torch (the
engine has) and CUDA is available, so `engramctl tiers` in a CLI process stays fast. The llama.cpp backend
measures VRAM through ggml instead (engine/llama_offload.py) and its owner passes that figure in (`gpu=`):
the tier plan and the offload plan then start from the same number.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil


@dataclass(frozen=True)
class Hardware:
    ram_total_bytes: int
    ram_available_bytes: int
    disk_total_bytes: int
    disk_free_bytes: int  # on the filesystem holding the data dir
    cpu: str
    cpu_cores: int  # physical
    cpu_threads: int  # logical
    vram_total_bytes: int | None = None  # None: no CUDA (or torch not loaded in this process)
    vram_free_bytes: int | None = None
    gpu: str | None = None

    @property
    def has_cuda(self) -> bool:
        return self.vram_total_bytes is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "ram_total_bytes": self.ram_total_bytes,
            "ram_available_bytes": self.ram_available_bytes,
            "vram_total_bytes": self.vram_total_bytes,
            "vram_free_bytes": self.vram_free_bytes,
            "disk_total_bytes": self.disk_total_bytes,
            "disk_free_bytes": self.disk_free_bytes,
            "cpu": self.cpu,
            "cpu_cores": self.cpu_cores,
            "cpu_threads": self.cpu_threads,
            "gpu": self.gpu,
        }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def cuda_memory() -> tuple[int, int, str] | None:
    """(free, total, name) of CUDA device 0, only if torch is already imported and sees a GPU."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(0)
        return int(free), int(total), str(torch.cuda.get_device_name(0))
    except Exception:  # a broken driver is "no GPU" for planning purposes
        return None


NVIDIA_SMI_TIMEOUT_S = 5.0


def nvidia_smi_memory() -> tuple[int, int, str] | None:
    """(free, total, name) of GPU 0 from nvidia-smi (~50-300 ms), None without it or a GPU: for a llama.cpp
    library whose ggml device calls cannot be reached."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, "--query-gpu=memory.free,memory.total,name", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
        free, total, name = (part.strip() for part in out.splitlines()[0].split(",", 2))
        return int(free) << 20, int(total) << 20, name  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def detect_hardware(data_dir: Path, gpu: tuple[int, int, str] | None = None) -> Hardware:
    """The figures now; `gpu` (free, total, name) replaces torch's VRAM reading (the llama.cpp engine's)."""
    vm = psutil.virtual_memory()
    disk = shutil.disk_usage(_existing(data_dir))
    cuda = gpu or cuda_memory()
    threads = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    return Hardware(
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
        disk_total_bytes=int(disk.total),
        disk_free_bytes=int(disk.free),
        cpu=cpu_model(),
        cpu_cores=psutil.cpu_count(logical=False) or threads,
        cpu_threads=threads,
        vram_total_bytes=None if cuda is None else cuda[1],
        vram_free_bytes=None if cuda is None else cuda[0],
        gpu=None if cuda is None else cuda[2],
    )
