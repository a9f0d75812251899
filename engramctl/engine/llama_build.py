"""Which llama.cpp build this process loaded: CPU only, or CUDA and the GPU architectures it was compiled for,
and the CPU features its ggml-cpu was compiled with (what `engramctl ps` and `tiers` show as the build).

Two sources, both in the loaded library: llama_print_system_info() writes each compiled-in backend's build
features ("CUDA : ARCHS = 890 | USE_GRAPHS = 1 | ... | CPU : SSE3 = 1 | AVX2 = 1 | ..."), the CUDA backend's
ARCHS being nvcc's __CUDA_ARCH_LIST__; ggml's device registry (libggml, which llama-cpp-python loads) lists the
devices found at run time. A CUDA build on a machine without a usable GPU has the first and none of the second.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from engramctl.engine import ggml_devices

# Written by scripts/install_llama.py: the installed build's CMAKE_ARGS on its first line, then how its smoke test went.
MARK = Path(sys.prefix) / "share" / "engramctl" / "llama-cpp-python.cmake-args"
# The CMake options that set which CPU instructions ggml compiles (scripts/llama_build_args.py's CPU_LEVELS).
_CPU_OPTIONS = (
    "GGML_NATIVE",
    "GGML_AVX",
    "GGML_FMA",
    "GGML_F16C",
    "GGML_BMI2",
    "GGML_AMX",
    "CMAKE_C_FLAGS",
    "CMAKE_CXX_FLAGS",
)


@dataclass(frozen=True)
class LlamaBuild:
    cuda_archs: tuple[str, ...]  # compute capabilities compiled for, as sm_XY names ("sm_89"); () without CUDA
    cuda: bool  # the CUDA backend is compiled in
    gpus: tuple[str, ...] | None  # the GPU devices ggml found; None where the registry could not be read
    cpu_features: tuple[str, ...]  # ggml-cpu's compiled features that are on: "AVX2", "AVX512", "OPENMP", ...

    def describe(self) -> str:
        """One line: "CPU (AVX2 FMA ...)", "CUDA sm_89 on NVIDIA GeForce RTX 4090; CPU (...)" or
        "CUDA sm_90, no CUDA device found; CPU (...)"."""
        cpu = f"CPU ({' '.join(self.cpu_features)})" if self.cpu_features else "CPU"
        if not self.cuda:
            return cpu
        cuda = "CUDA " + (",".join(self.cuda_archs) or "(architectures not reported)")
        if self.gpus:
            cuda += " on " + ", ".join(self.gpus)
        elif self.gpus is not None:
            cuda += ", no CUDA device found"
        return f"{cuda}; {cpu}"


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """llama_print_system_info()'s text as {backend: {feature: value}}, in the order printed."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for item in text.split("|"):
        item = item.strip()
        if " : " in item:  # "CPU : SSE3 = 1" opens the next backend's features
            name, item = (x.strip() for x in item.split(" : ", 1))
            current = sections.setdefault(name, {})
        if current is not None and " = " in item:
            key, value = (x.strip() for x in item.split(" = ", 1))
            current[key] = value
    return sections


def compiled_cpu_features(text: str) -> tuple[str, ...]:
    """ggml-cpu's compiled features that are on ("AVX2", "AVX512", "OPENMP", ...), from llama_print_system_info()."""
    return tuple(k for k, v in parse_system_info(text).get("CPU", {}).items() if v == "1")


def from_system_info(text: str, gpus: tuple[str, ...] | None) -> LlamaBuild:
    sections = parse_system_info(text)
    cuda = sections.get("CUDA")
    archs: tuple[str, ...] = ()
    if cuda and cuda.get("ARCHS"):  # __CUDA_ARCH_LIST__: 890 -> sm_89, 1200 -> sm_120
        archs = tuple(f"sm_{int(a) // 10}" for a in cuda["ARCHS"].split(",") if a.strip().isdigit())
    return LlamaBuild(cuda_archs=archs, cuda=cuda is not None, gpus=gpus, cpu_features=compiled_cpu_features(text))


def gpu_devices() -> tuple[str, ...] | None:
    """The descriptions of the GPU devices in ggml's registry, or None where it cannot be read."""
    found = ggml_devices.gpus()
    return None if found is None else tuple(g.name for g in found)


def loaded_build(lib) -> LlamaBuild:
    """The build of the llama.cpp that `lib` (llama_lib.import_llama_cpp()) loaded."""
    return from_system_info(lib.llama_print_system_info().decode("utf-8", "replace"), gpu_devices())


def installed_cpu_args(mark: Path = MARK) -> tuple[str, ...]:
    """The CPU flags the installed llama-cpp-python was built with (from its mark file); the native build where
    setup did not record one."""
    try:
        first = mark.read_text().splitlines()[0]
    except (OSError, IndexError):
        return ("-DGGML_NATIVE=ON",)
    args = tuple(a for a in shlex.split(first) if a.removeprefix("-D").split("=")[0].startswith(_CPU_OPTIONS))
    return args or ("-DGGML_NATIVE=ON",)
