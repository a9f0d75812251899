"""Which llama-cpp-python build this machine gets: prints its CMAKE_ARGS on stdout, and on stderr one line
saying what it builds and why. scripts/setup.sh runs it with the system python3 before engramctl is
installed, so it uses the standard library only.

The choice:
- An NVIDIA GPU (nvidia-smi lists one) and a CUDA compiler (nvcc on PATH, else under $CUDA_HOME/bin or
  /usr/local/cuda/bin): a CUDA build for the GPUs' own compute capabilities (8.9 -> 89-real), keeping the CPU
  side of the CPU build (native SIMD, ggml's thread pool instead of OpenMP).
- No GPU: exactly the CPU build (CI's).
- A GPU but no compiler: the CPU build, and the line says what to install.
- The CPU side, by level (CPU_LEVELS), tried in that order by scripts/install_llama.py until a smoke test runs:
  native (the CPU's own SIMD, AMX included where it reports AMX), no-amx (native without AMX: some VMs report
  AMX and ggml's AMX kernels die there of SIGILL), portable (no -march=native: the AVX2/FMA/F16C/BMI2 set).
This file is the one place the llama.cpp build flags are written: setup (install_llama.py), the CUDA wheel
(build_cuda_wheel.sh: --cpu-only --level portable) and llama-server's build (engramctl/bench/llama_server.py takes the
CPU flags the installed build was made with, from the mark file install_llama.py writes).
Setup-time environment (not daemon settings):
  ENGRAM_CUDA=0|1      force the CPU (0) or the CUDA (1) build; 1 without a compiler is an error (exit 2)
  ENGRAM_CUDA_ARCHS    the CUDA architectures instead of the GPUs' own: "89", "8.9", "86;89", "90-real", "native"
  ENGRAM_LLAMA_CPU     force one CPU level: native, no-amx or portable (portable runs on any x86-64 CPU with AVX2)
  CMAKE_ARGS           set and non-empty: used as given (the caller's own build)

    python3 scripts/llama_build_args.py [--level LEVEL] [--cpu-only]   CMAKE_ARGS on stdout (shell-quoted)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys

# The CPU side of every build, by level. GGML_NATIVE: the CPU's own SIMD (AVX2/AVX-512/AMX). GCC lets an explicit
# -mno-<isa> win over what -march=native implies whatever their order, so no-amx keeps AVX-512, VNNI and BF16.
# portable: what build_cuda_wheel.sh has always built for a CPU it does not know.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CPU_LEVELS = {
    "native": ["-DGGML_NATIVE=ON"],
    "no-amx": ["-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"],
    "portable": ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"],
}
LEVEL_WHY = {
    "no-amx": "native without AMX (some VMs report AMX but ggml's AMX kernels die there)",
    "portable": "the portable AVX2 set, no -march=native",
}
# LLAVA_BUILD=OFF skips the vision objects (~25% of the build); GGML_OPENMP=OFF: ggml's own thread pool (with
# OpenMP, llama_decode called from another thread than the loading one runs ~1.8x slower: docs/llama-threads.md).
COMMON_ARGS = ["-DLLAVA_BUILD=OFF", "-DGGML_OPENMP=OFF"]
INSTALL_NVCC = (
    "install the CUDA toolkit's compiler (nvcc: NVIDIA's cuda-toolkit package, or `apt install nvidia-cuda-toolkit`) "
    "and rerun scripts/setup.sh"
)
_ARCH = re.compile(r"^(\d+)([af]?)(-real|-virtual)?$")


class Refused(Exception):
    """The environment asks for something this machine cannot build; the message says what to change."""


def gpus(run=subprocess.run) -> list[tuple[str, str]]:
    """(name, compute capability) of each NVIDIA GPU nvidia-smi lists; [] without nvidia-smi or a GPU.
    A capability nvidia-smi cannot report (drivers before 510) is ""."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True, text=True)
    except OSError:
        return []
    if out.returncode == 0:
        rows = [[c.strip() for c in line.rsplit(",", 1)] for line in out.stdout.splitlines() if line.strip()]
        return [(r[0], r[1] if len(r) == 2 and re.fullmatch(r"\d+\.\d+", r[1]) else "") for r in rows]
    try:  # an old driver without the compute_cap field: the GPUs are there, their capability is not known
        listed = run([smi, "-L"], capture_output=True, text=True)
    except OSError:
        return []
    names = [m.group(1) for m in re.finditer(r"^GPU \d+: (.+?)(?: \(UUID.*)?$", listed.stdout, re.MULTILINE)]
    return [(name, "") for name in names] if listed.returncode == 0 else []


def find_nvcc(env: dict[str, str]) -> tuple[str | None, bool]:
    """(nvcc's path, whether it is on PATH): PATH first, then $CUDA_HOME/bin (or /usr/local/cuda/bin)."""
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        return on_path, True
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "nvcc")
    return (candidate, False) if os.access(candidate, os.X_OK) else (None, False)


def arch_of(cap: str) -> str:
    """A compute capability as CMake names its real architecture: 8.9 -> 89-real, 12.0 -> 120-real (ggml
    turns 12X into the 12Xa that Blackwell's FP4 instructions need)."""
    major, minor = cap.split(".")
    return f"{int(major)}{int(minor)}-real"


def parse_archs(text: str) -> list[str]:
    """ENGRAM_CUDA_ARCHS: architectures separated by ; , or spaces, each 89, 8.9 or 89-real/89-virtual; or
    one of CMake's native, all, all-major."""
    items = [x for x in re.split(r"[;,\s]+", text.strip()) if x]
    if len(items) == 1 and items[0] in ("native", "all", "all-major"):
        return items
    archs = []
    for item in items:
        if re.fullmatch(r"\d+\.\d+", item):
            archs.append(arch_of(item))
        elif m := _ARCH.match(item):
            archs.append(item if m.group(3) else f"{item}-real")
        else:
            raise Refused(
                f"ENGRAM_CUDA_ARCHS={text!r}: {item!r} is not a CUDA architecture "
                "(write 89, 8.9 or 89-real; several separated by ';')."
            )
    if not archs:
        raise Refused("ENGRAM_CUDA_ARCHS is empty: name an architecture such as 89 (or unset it).")
    return list(dict.fromkeys(archs))


def join(args: list[str]) -> str:
    """CMAKE_ARGS as one string: scikit-build-core splits it with shlex, so only an arg with a space is quoted."""
    return " ".join(shlex.quote(a) if " " in a else a for a in args)


def levels(env: dict[str, str]) -> list[str]:
    """The CPU levels setup tries, in order: the one ENGRAM_LLAMA_CPU forces, else all of them."""
    forced = env.get("ENGRAM_LLAMA_CPU", "").strip()
    if env.get("CMAKE_ARGS", "").strip():  # the caller's own build: one, as given
        return ["native"]
    if not forced:
        return list(CPU_LEVELS)
    if forced not in CPU_LEVELS:
        raise Refused(f"ENGRAM_LLAMA_CPU={forced!r}: write one of {', '.join(CPU_LEVELS)}, or leave it unset.")
    return [forced]


def cpu_args(level: str) -> list[str]:
    """The CPU side of a build at `level` (no CUDA, no vision objects, ggml's thread pool)."""
    return [*CPU_LEVELS[level], *COMMON_ARGS]


def choose(env: dict[str, str], found: list[tuple[str, str]], level: str | None = None) -> tuple[list[str], str]:
    """(the CMAKE_ARGS, the one line saying what is built and why), or Refused. `level`: the CPU side's
    (default: the first of levels(env))."""
    level = level or levels(env)[0]
    cpu = cpu_args(level)
    why_cpu = "" if level == "native" else f", CPU side {level}"
    if env.get("CMAKE_ARGS", "").strip():
        args = shlex.split(env["CMAKE_ARGS"])
        kind = "CUDA" if any(re.fullmatch(r"-DGGML_CUDA=(on|ON|On|1|TRUE|true)", a) for a in args) else "CPU"
        return args, f"llama.cpp: {kind} build with CMAKE_ARGS as set in the environment"
    force = env.get("ENGRAM_CUDA", "").strip()
    if force not in ("", "0", "1"):
        raise Refused(f"ENGRAM_CUDA={force!r}: write 1 (CUDA build), 0 (CPU build), or leave it unset.")
    names = ", ".join(dict.fromkeys(name for name, _ in found))
    if force == "0":
        return cpu, f"llama.cpp: CPU build{why_cpu} (ENGRAM_CUDA=0)"
    if force == "" and not found:
        return cpu, f"llama.cpp: CPU build{why_cpu} (no NVIDIA GPU found by nvidia-smi)"
    nvcc, on_path = find_nvcc(env)
    if nvcc is None:
        if force == "1":
            raise Refused(f"ENGRAM_CUDA=1 asks for a CUDA build but no CUDA compiler was found; {INSTALL_NVCC}.")
        return (
            cpu,
            f"llama.cpp: CPU build{why_cpu}: found {names} but no CUDA compiler; for a CUDA build {INSTALL_NVCC}",
        )
    if env.get("ENGRAM_CUDA_ARCHS", "").strip():
        archs, why = parse_archs(env["ENGRAM_CUDA_ARCHS"]), "ENGRAM_CUDA_ARCHS"
    elif found and all(cap for _, cap in found):
        archs = list(dict.fromkeys(arch_of(cap) for _, cap in found))
        caps = ", ".join(dict.fromkeys(f"{name} {cap}" for name, cap in found))
        why = f"compute capability of {caps}"
    elif found:  # CMake asks the GPU itself; only sound with one present, as here
        archs, why = ["native"], f"{names}: nvidia-smi does not report its compute capability"
    else:
        raise Refused(
            "ENGRAM_CUDA=1 on a machine without a GPU: name the architecture to build for in ENGRAM_CUDA_ARCHS "
            '(e.g. 89 for an RTX 40xx, 86 for an RTX 30xx, 90 for an H100); "native" means nothing without a GPU.'
        )
    args = ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}", *cpu]
    if not on_path:  # CMake looks for nvcc on PATH only
        args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    forced = " (ENGRAM_CUDA=1)" if force == "1" else ""
    return args, f"llama.cpp: CUDA build{forced}{why_cpu} for {';'.join(archs)} ({why}), nvcc {nvcc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the CMAKE_ARGS of this machine's llama-cpp-python build.")
    parser.add_argument("--level", choices=list(CPU_LEVELS), help="the CPU side's level (default: the first to try)")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU side at --level, nothing detected")
    opts = parser.parse_args(argv)
    if opts.cpu_only:
        print(join(cpu_args(opts.level or "native")))
        return 0
    try:
        args, reason = choose(dict(os.environ), gpus(), opts.level)
    except Refused as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    print(reason, file=sys.stderr)
    print(join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
