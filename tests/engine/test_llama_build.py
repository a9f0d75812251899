"""Which llama.cpp build is loaded (engine/llama_build.py): the real one here (scripts/setup.sh's CPU build), and
the parser on the text a CUDA build prints, with and without a GPU."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from engramctl.engine.llama_build import from_system_info, parse_system_info

CPU_TEXT = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | REPACK = 1 | "
)
# What the CUDA wheel scripts/build_cuda_wheel.sh makes (90-real, GGML_CUDA_NO_VMM, AVX2 without -march=native)
# prints, verbatim, on a machine without a GPU (ARCHS is nvcc's __CUDA_ARCH_LIST__); its CPU section is CPU_TEXT
CUDA_TEXT = (
    "CUDA : ARCHS = 900 | NO_VMM = 1 | USE_GRAPHS = 1 | FA_QUANTS = q4_0-q4_0,q8_0-q8_0,f16-f16,bf16-bf16 | " + CPU_TEXT
)
CPU_DESC = "CPU (SSE3 SSSE3 AVX AVX2 F16C FMA BMI2 LLAMAFILE REPACK)"


def test_the_loaded_build_is_setup_shs_cpu_build():
    pytest.importorskip("llama_cpp")
    from engramctl.engine.llama_build import gpu_devices, loaded_build
    from engramctl.engine.llama_lib import import_llama_cpp

    lib = import_llama_cpp()
    build = loaded_build(lib)
    assert not build.cuda and build.cuda_archs == ()
    assert build.gpus == gpu_devices() == ()  # ggml's registry was read: its one device is the CPU
    assert not lib.llama_supports_gpu_offload()
    assert "OPENMP" not in build.cpu_features  # setup.sh builds with ggml's own thread pool
    assert build.describe() == f"CPU ({' '.join(build.cpu_features)})"
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() == "x86_64" and cpuinfo.exists():  # GGML_NATIVE: compiled for this CPU's own SIMD
        flags = next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")).split()
        assert ("AVX2" in build.cpu_features) == ("avx2" in flags)
        assert ("FMA" in build.cpu_features) == ("fma" in flags)


def test_the_parser_reads_each_backends_features():
    sections = parse_system_info(CUDA_TEXT)
    assert list(sections) == ["CUDA", "CPU"]
    assert sections["CUDA"] == {
        "ARCHS": "900",
        "NO_VMM": "1",
        "USE_GRAPHS": "1",
        "FA_QUANTS": "q4_0-q4_0,q8_0-q8_0,f16-f16,bf16-bf16",
    }
    assert sections["CPU"]["AVX2"] == "1" and len(sections["CPU"]) == 9
    assert parse_system_info("") == {}


def test_a_cuda_build_says_its_architectures_and_its_gpus():
    on_gpu = from_system_info(CUDA_TEXT, ("NVIDIA H100 80GB HBM3",))
    assert on_gpu.cuda and on_gpu.cuda_archs == ("sm_90",)
    assert on_gpu.describe() == f"CUDA sm_90 on NVIDIA H100 80GB HBM3; {CPU_DESC}"
    two = from_system_info(CUDA_TEXT.replace("ARCHS = 900", "ARCHS = 860,890,1200"), ("A", "B"))
    assert two.describe() == f"CUDA sm_86,sm_89,sm_120 on A, B; {CPU_DESC}"


def test_a_cuda_build_without_a_gpu_says_so():
    assert from_system_info(CUDA_TEXT, ()).describe() == f"CUDA sm_90, no CUDA device found; {CPU_DESC}"
    # the device registry could not be read: the build, without a claim about devices
    assert from_system_info(CUDA_TEXT, None).describe() == f"CUDA sm_90; {CPU_DESC}"


def test_a_cpu_build_names_its_features_and_openmp_when_built_with_it():
    assert from_system_info(CPU_TEXT, ()).describe() == CPU_DESC
    with_omp = from_system_info(CPU_TEXT + "OPENMP = 1 | AVX512 = 0 | ", ())
    assert with_omp.cpu_features[-1] == "OPENMP" and "AVX512" not in with_omp.cpu_features
