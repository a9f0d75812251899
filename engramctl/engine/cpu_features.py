"""Does the loaded llama.cpp build fit this CPU? Checked when the backend is imported, before a model loads, so that a
venv copied to another machine, or a VM moved to an older host, refuses with a sentence instead of dying of SIGILL
at its first prompt.

The build's side: the x86 instruction sets ggml-cpu was compiled with (llama_print_system_info's CPU section, read
by llama_build.py). The machine's: the flags the kernel reports in /proc/cpuinfo, which already leave out what the
kernel or hypervisor does not enable. A VM that reports AMX but faults in ggml's AMX kernels passes this check;
scripts/setup.sh's smoke test is what catches that one, and rebuilds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from engramctl.errors import CpuUnsupported

SIGILL_SENTENCE = (
    "the model's CPU code uses instructions this machine does not run (the llama.cpp build was made for another "
    "CPU, or this VM hides some of its CPU's features)"
)
REBUILD_HINT = (
    "run ./scripts/setup.sh: it checks that the llama.cpp build runs on this CPU and rebuilds it if not "
    "(ENGRAM_LLAMA_CPU=portable ./scripts/setup.sh forces the portable build)"
)
# ggml's names for its compiled-in x86 features -> the /proc/cpuinfo flag each needs. Features that are not
# instruction sets (LLAMAFILE, OPENMP, REPACK) are not here and not checked.
CPUINFO_FLAG = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


def machine_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The x86 flags the kernel reports for the first CPU; None where there are none to read (not Linux, not x86)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def missing(compiled: Iterable[str], flags: frozenset[str]) -> list[str]:
    """The compiled-in features whose instructions this CPU does not report."""
    return [f for f in compiled if f in CPUINFO_FLAG and CPUINFO_FLAG[f] not in flags]


def check(compiled: Iterable[str], flags: frozenset[str] | None) -> None:
    """CpuUnsupported when the build needs instructions the CPU does not report; nothing to compare: no check."""
    if flags is None:
        return
    lacking = missing(compiled, flags)
    if lacking:
        raise CpuUnsupported(
            f"{SIGILL_SENTENCE}: this llama.cpp build was compiled for {', '.join(lacking)}, which this CPU does "
            "not report, so it would die of SIGILL at the first prompt; it was not loaded.",
            hint=REBUILD_HINT,
        )
