"""scripts/setup.sh's choice of llama.cpp build (scripts/llama_build_args.py), on stand-in hardware: an
`nvidia-smi` that lists the GPUs given and an `nvcc` that is only ever looked for, never run. Nothing is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "llama_build_args.py"
CPU = "-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF"  # the CPU build as CI has always made it


def _executable(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _hardware(bin_dir: Path, gpus=None, nvcc=True, old_driver=False) -> None:
    """Stand-ins in bin_dir: an nvidia-smi listing `gpus` [(name, compute capability)] (None: no nvidia-smi;
    []: one that finds no driver, as on a cloud image without a GPU), and an nvcc that is never run."""
    for f in bin_dir.iterdir():
        f.unlink()
    if gpus is not None:
        rows = "".join(f"{name}, {cap}\\n" for name, cap in gpus)
        listing = "".join(f"GPU {i}: {name} (UUID: GPU-{i})\\n" for i, (name, _) in enumerate(gpus))
        query = '[ "$*" = "--query-gpu=name,compute_cap --format=csv,noheader" ]'
        if old_driver:  # drivers before 510 know no compute_cap field
            body = f'[ "$1" = "-L" ] && {{ printf "{listing}"; exit 0; }}\n'
            body += 'echo "Field compute_cap is not a valid field to query."; exit 2\n'
        elif gpus:
            body = f'{query} && {{ printf "{rows}"; exit 0; }}\necho "unexpected arguments: $*" >&2; exit 9\n'
        else:
            body = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9\n'
        _executable(bin_dir / "nvidia-smi", body)
    if nvcc:
        _executable(bin_dir / "nvcc", "exit 99\n")


@pytest.fixture
def machine(tmp_path):
    """run(gpus=[(name, cap)], nvcc=True, **env) -> CompletedProcess of llama_build_args.py on that machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def run(gpus=None, nvcc=True, cuda_home=None, old_driver=False, **env):
        _hardware(bin_dir, gpus, nvcc, old_driver)
        full = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            # where a toolkit would be besides PATH: none unless the test makes one
            "CUDA_HOME": str(cuda_home or tmp_path / "no-toolkit"),
            **env,
        }
        return subprocess.run(
            [sys.executable, str(SCRIPT)], check=False, env=full, capture_output=True, text=True, timeout=60
        )

    return run


def _ok(proc) -> tuple[str, list[str]]:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr.splitlines()


def test_no_gpu_is_exactly_the_cpu_build(machine):
    for gpus in (None, []):  # no nvidia-smi at all; nvidia-smi without a driver
        args, why = _ok(machine(gpus=gpus))
        assert args == CPU
        assert why == ["llama.cpp: CPU build (no NVIDIA GPU found by nvidia-smi)"]


def test_a_gpu_and_nvcc_build_cuda_for_that_gpu_and_keep_the_cpu_side(machine):
    args, why = _ok(machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")]))
    assert args == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89-real {CPU}"
    assert len(why) == 1 and "CUDA build for 89-real" in why[0] and "NVIDIA GeForce RTX 4090 8.9" in why[0]


def test_two_different_gpus_build_both_architectures_once_each(machine):
    gpus = [("NVIDIA GeForce RTX 3090", "8.6"), ("NVIDIA GeForce RTX 4090", "8.9"), ("NVIDIA GeForce RTX 3090", "8.6")]
    args, _ = _ok(machine(gpus=gpus))
    assert args == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86-real;89-real {CPU}"
    args, _ = _ok(machine(gpus=[("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA RTX PRO 6000", "12.0")]))
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real;120-real " in args  # ggml itself makes 120 the 120a FP4 needs


def test_a_gpu_without_a_compiler_gets_the_cpu_build_and_one_line_saying_what_to_install(machine):
    args, why = _ok(machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")], nvcc=False))
    assert args == CPU
    assert len(why) == 1
    assert "NVIDIA GeForce RTX 4090" in why[0] and "no CUDA compiler" in why[0] and "install" in why[0]
    assert "nvcc" in why[0] and "cuda-toolkit" in why[0]


def test_nvcc_outside_path_is_found_in_the_toolkit_and_named_to_cmake(machine, tmp_path):
    toolkit = tmp_path / "cuda-13.0"
    _executable(toolkit / "bin" / "nvcc", "exit 99\n")
    args, _ = _ok(machine(gpus=[("NVIDIA GeForce RTX 3060", "8.6")], nvcc=False, cuda_home=toolkit))
    assert args == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86-real {CPU} -DCMAKE_CUDA_COMPILER={toolkit}/bin/nvcc"


def test_engram_cuda_0_forces_the_cpu_build(machine):
    args, why = _ok(machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")], ENGRAM_CUDA="0"))
    assert args == CPU and why == ["llama.cpp: CPU build (ENGRAM_CUDA=0)"]


def test_engram_cuda_1_without_a_gpu_builds_the_named_architectures(machine):
    args, why = _ok(machine(gpus=None, ENGRAM_CUDA="1", ENGRAM_CUDA_ARCHS="90"))
    assert args == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90-real {CPU}"
    assert "ENGRAM_CUDA=1" in why[0] and "ENGRAM_CUDA_ARCHS" in why[0]


def test_engram_cuda_1_without_a_compiler_fails_naming_what_to_install(machine):
    proc = machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")], nvcc=False, ENGRAM_CUDA="1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("Error: ENGRAM_CUDA=1 asks for a CUDA build but no CUDA compiler was found")
    assert "nvcc" in proc.stderr and "cuda-toolkit" in proc.stderr


def test_engram_cuda_1_without_a_gpu_or_architecture_refuses_native(machine):
    proc = machine(gpus=None, ENGRAM_CUDA="1")
    assert proc.returncode == 2 and proc.stdout == "" and "ENGRAM_CUDA_ARCHS" in proc.stderr


def test_engram_cuda_archs_overrides_the_gpus_own(machine):
    args, _ = _ok(machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")], ENGRAM_CUDA_ARCHS="8.6, 90-virtual;89"))
    assert "-DCMAKE_CUDA_ARCHITECTURES=86-real;90-virtual;89-real " in args
    # ENGRAM_CUDA_ARCHS alone does not make a CUDA build where there is no GPU
    assert _ok(machine(gpus=None, ENGRAM_CUDA_ARCHS="89"))[0] == CPU


@pytest.mark.parametrize("env", [{"ENGRAM_CUDA_ARCHS": "sm_89"}, {"ENGRAM_CUDA": "yes"}])
def test_bad_values_are_refused_with_a_sentence(machine, env):
    proc = machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")], **env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"Error: {next(iter(env))}=")


def test_a_driver_without_compute_cap_lets_cmake_ask_the_gpu(machine):
    args, why = _ok(machine(gpus=[("NVIDIA GeForce GTX 1080", "6.1")], old_driver=True))
    assert args == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=native {CPU}"
    assert "does not report its compute capability" in why[0]


def test_cmake_args_in_the_environment_are_used_as_given(machine):
    args, why = _ok(machine(gpus=[("NVIDIA GeForce RTX 4090", "8.9")], CMAKE_ARGS="-DGGML_CUDA=ON -DGGML_NATIVE=OFF"))
    assert args == "-DGGML_CUDA=ON -DGGML_NATIVE=OFF" and why == [
        "llama.cpp: CUDA build with CMAKE_ARGS as set in the environment"
    ]


@pytest.fixture
def toolkit(tmp_path):
    """A stand-in CUDA 13 toolkit: an nvcc that only says its version, and no cuBLAS (as on this machine)."""
    root = tmp_path / "cuda-13.0"
    _executable(root / "bin" / "nvcc", 'echo "Cuda compilation tools, release 13.0, V13.0.88"\n')
    return root


def _wheel_args(toolkit: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {"PATH": f"{toolkit}/bin:/usr/bin:/bin", "HOME": str(toolkit.parent), **env}
    script = ROOT / "scripts" / "build_cuda_wheel.sh"
    return subprocess.run([script, "--print-args", *args], check=False, env=full, capture_output=True, text=True)


def test_the_cuda_wheel_names_its_architecture_and_runs_on_another_cpu(toolkit):
    (toolkit / "lib64").mkdir()
    (toolkit / "lib64" / "libcublas.so").touch()  # a whole toolkit: nothing to add for cuBLAS
    proc = _wheel_args(toolkit, "89-real")
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.split()
    assert "-DCMAKE_CUDA_ARCHITECTURES=89-real" in args and "-DGGML_CUDA=on" in args
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"} <= set(args)
    assert {"-DGGML_CUDA_NO_VMM=ON", "-DGGML_CUDA_COMPRESSION_MODE=size", "-DGGML_OPENMP=OFF"} <= set(args)
    assert not any("cublas" in a for a in args)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in _wheel_args(toolkit).stdout.split()  # the lent H100/H200's


def test_the_cuda_wheel_takes_cublas_from_its_pypi_wheel_where_the_toolkit_has_none(toolkit, tmp_path):
    unpacked = tmp_path / "cublas"
    lib, inc = unpacked / "nvidia" / "cu13" / "lib", unpacked / "nvidia" / "cu13" / "include"
    for f in (lib / "libcublas.so.13", lib / "libcublasLt.so.13", inc / "cublas_v2.h"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.touch()
    proc = _wheel_args(toolkit, ENGRAM_CUBLAS_DIR=str(unpacked))
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.split()
    assert f"-DCUDA_cublas_LIBRARY={lib}/libcublas.so" in args
    assert f"-DCUDA_cublasLt_LIBRARY={lib}/libcublasLt.so" in args
    assert f"-DCMAKE_CUDA_FLAGS=-I{inc}" in args and f"-DCMAKE_CXX_FLAGS=-I{inc}" in args
    assert os.readlink(lib / "libcublas.so") == "libcublas.so.13"  # the link name the linker asks for
    missing = _wheel_args(toolkit, ENGRAM_CUBLAS_DIR=str(tmp_path / "none"))
    assert missing.returncode == 2 and "no cuBLAS" in missing.stderr


def test_the_wheels_folder_is_git_ignored():
    proc = subprocess.run(
        ["git", "check-ignore", "-q", "wheels/cuda-90-real/llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"],
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0


# A stand-in pip in the venv: it logs each call with its CMAKE_ARGS and "installs" a llama-cpp-python 0.3.36 whose
# lib/ holds libggml-cuda.so when it was "built" with -DGGML_CUDA=on (what install_llama.sh checks, as a real CUDA
# wheel has). FAKE_PIP_CACHE=cpu|cuda: pip's wheel cache holds that build and a plain install takes it, whatever
# CMAKE_ARGS say (pip keys the cache by the sdist). FAKE_BUILD=cpu|cuda: what a build gives, whatever it was asked.
FAKE_PIP = """
import json, os, pathlib, sys

venv = pathlib.Path(sys.argv[0]).parent.parent
args = sys.argv[1:]
cmake = os.environ.get("CMAKE_ARGS", "")
with open(venv / "pip.log", "a") as f:
    f.write(json.dumps([*args, "CMAKE_ARGS=" + cmake]) + "\\n")
built = os.environ.get("FAKE_BUILD") or ("cuda" if "-DGGML_CUDA=on" in cmake.split() else "cpu")
site = next((venv / "lib").glob("python3*/site-packages"))


def install(kind):
    lib = site / "llama_cpp" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    (lib.parent / "__init__.py").write_text(f"BUILT_WITH = {cmake!r}\\n" + FAKE_LLAMA)
    (lib / "libggml-cuda.so").unlink(missing_ok=True)
    if kind == "cuda":
        (lib / "libggml-cuda.so").write_text("")
    meta = site / "llama_cpp_python-0.3.36.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\\nName: llama_cpp_python\\nVersion: 0.3.36\\n")


FAKE_LLAMA = {fake_llama!r}

if args[0] == "wheel":
    out = pathlib.Path(args[args.index("-w") + 1])
    out.mkdir(parents=True)
    (out / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_text(built)
elif args[-1].endswith(".whl"):
    install(pathlib.Path(args[-1]).read_text())
elif "--no-cache-dir" in args or not os.environ.get("FAKE_PIP_CACHE"):
    install(built)
else:
    install(os.environ["FAKE_PIP_CACHE"])
"""


# The stand-in llama_cpp that stand-in pip installs, for scripts/llama_smoke.py: its runs are logged to smoke.log;
# FAKE_RUNS_WITH=TEXT: a batch of 64+ tokens dies of SIGILL (as ggml's AMX kernels do on some VMs) unless the build's
# CMAKE_ARGS contain TEXT; FAKE_SMOKE_FAILS=1: it raises instead (a failure that is no CPU's fault).
FAKE_LLAMA = """
import os, signal, sys

class Llama:
    def __init__(self, model_path, **kw):
        with open(os.path.join(sys.prefix, "smoke.log"), "a") as f:
            f.write(BUILT_WITH + "\\n")
        self.ctx = None

    def n_vocab(self):
        return 2

    def tokenize(self, text):
        return list(range(100))

    def eval(self, tokens):
        if os.environ.get("FAKE_SMOKE_FAILS"):
            raise RuntimeError("llama_decode returned -1")
        need = os.environ.get("FAKE_RUNS_WITH")
        if len(tokens) >= 64 and need is not None and need not in BUILT_WITH:
            os.kill(os.getpid(), signal.SIGILL)


def llama_get_logits_ith(ctx, i):
    return [0.0, 1.0]
"""


@pytest.fixture
def installer(tmp_path):
    """install(venv, gpus=..., nvcc=..., **env) -> (CompletedProcess of scripts/install_llama.sh, the pip calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    model = tmp_path / "model.gguf"  # the stand-in llama_cpp never reads it
    model.write_bytes(b"GGUF")

    def install(venv: Path, gpus=None, nvcc=True, **env):
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            (venv / "bin" / "pip").write_text(
                f"#!{venv}/bin/python\n{FAKE_PIP.replace('{fake_llama!r}', repr(FAKE_LLAMA))}"
            )
            (venv / "bin" / "pip").chmod(0o755)
        (venv / "pip.log").unlink(missing_ok=True)
        _hardware(bin_dir, gpus, nvcc)
        full = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "CUDA_HOME": str(tmp_path / "no-toolkit"),
            "HOME": str(tmp_path),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "ENGRAM_SMOKE_GGUF": str(model),
            **env,
        }
        script = ROOT / "scripts" / "install_llama.sh"
        proc = subprocess.run(
            [script, str(venv), "0.3.36"], check=False, env=full, capture_output=True, text=True, timeout=120
        )
        log = venv / "pip.log"
        calls = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        return proc, calls

    return install


def _mark(venv: Path) -> str:
    """The installed build's args: the mark file's first line (the lines after it say how its check went)."""
    return (venv / "share" / "engramctl" / "llama-cpp-python.cmake-args").read_text().splitlines()[0]


RTX = [("NVIDIA GeForce RTX 4090", "8.9")]
CUDA = f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89-real {CPU}"


def test_without_a_gpu_the_cpu_build_is_installed_once(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv)
    assert proc.returncode == 0, proc.stderr
    assert calls == [["install", "-q", "llama-cpp-python==0.3.36", f"CMAKE_ARGS={CPU}"]]  # pip's cache may serve it
    assert _mark(venv) == CPU
    proc, calls = installer(venv)
    assert proc.returncode == 0 and calls == []  # the right build is there: nothing to do
    (venv / "share" / "engramctl" / "llama-cpp-python.cmake-args").unlink()
    assert installer(venv)[1] == []  # a CPU build installed before install_llama.sh recorded its args is today's


def test_a_gpu_machine_builds_its_cuda_wheel_once_outside_pips_cache(installer, tmp_path):
    venv = tmp_path / "venv"
    installer(venv)  # the CPU build, as a venv from before
    proc, calls = installer(venv, gpus=RTX)
    assert proc.returncode == 0, proc.stderr
    [wheel, install] = calls
    assert wheel[:4] == ["wheel", "-q", "--no-deps", "--no-cache-dir"] and wheel[-1] == f"CMAKE_ARGS={CUDA}"
    assert wheel[wheel.index("-w") + 1].startswith(str(tmp_path / "cache" / "engramctl" / "llama-cpp-python-"))
    assert install[:4] == ["install", "-q", "--force-reinstall", "--no-deps"] and install[4].endswith(".whl")
    assert _mark(venv) == CUDA and (next(venv.glob("lib/python3*/site-packages/llama_cpp/lib/libggml-cuda.so")))
    assert "CUDA build for 89-real" in proc.stderr and "~35 minutes per GPU architecture" in proc.stderr
    assert installer(venv, gpus=RTX)[1] == []
    # a second venv on the machine installs the kept wheel: no build
    proc, calls = installer(tmp_path / "venv2", gpus=RTX)
    assert proc.returncode == 0 and [c[0] for c in calls] == ["install"] and calls[0][-2].endswith(".whl")
    # another GPU, other architectures: built again
    _, calls = installer(venv, gpus=[("NVIDIA GeForce RTX 3090", "8.6")])
    assert calls[0][0] == "wheel" and "-DCMAKE_CUDA_ARCHITECTURES=86-real" in calls[0][-1]


def test_going_back_to_the_cpu_build_never_takes_pips_cache(installer, tmp_path):
    venv = tmp_path / "venv"
    installer(venv, gpus=RTX)
    proc, calls = installer(venv, gpus=RTX, ENGRAM_CUDA="0")
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        [
            "install",
            "-q",
            "--force-reinstall",
            "--no-deps",
            "--no-cache-dir",
            "llama-cpp-python==0.3.36",
            f"CMAKE_ARGS={CPU}",
        ]
    ]
    assert _mark(venv) == CPU and not list(venv.glob("lib/python3*/site-packages/llama_cpp/lib/libggml-cuda.so"))


def test_a_cuda_wheel_in_pips_cache_is_replaced_by_a_fresh_cpu_build(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv, FAKE_PIP_CACHE="cuda")
    assert proc.returncode == 0, proc.stderr
    assert [c[:3] for c in calls] == [
        ["install", "-q", "llama-cpp-python==0.3.36"],
        ["install", "-q", "--force-reinstall"],
    ]
    assert "--no-cache-dir" in calls[1] and _mark(venv) == CPU


def test_a_build_of_the_wrong_kind_is_an_error(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, _ = installer(venv, FAKE_BUILD="cuda")
    assert proc.returncode == 1
    assert "Error: llama-cpp-python 0.3.36 is not the cpu build after installing it" in proc.stderr
    assert not (venv / "share" / "engramctl" / "llama-cpp-python.cmake-args").exists()


_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
NO_AMX = f"-DGGML_NATIVE=ON '-DCMAKE_C_FLAGS={_FLAGS}' '-DCMAKE_CXX_FLAGS={_FLAGS}' -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF"
PORTABLE = (
    "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF"
)


def _smoked(venv: Path) -> list[str]:
    """The builds the stand-in smoke test ran with, in order (and forgets them)."""
    log = venv / "smoke.log"
    runs = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return runs


def _mark_lines(venv: Path) -> list[str]:
    return (venv / "share" / "engramctl" / "llama-cpp-python.cmake-args").read_text().splitlines()[1:]


def test_a_build_that_passes_its_smoke_test_stays_and_is_not_tested_twice(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv, FAKE_RUNS_WITH="")
    assert proc.returncode == 0, proc.stderr
    assert [c[-1] for c in calls] == [f"CMAKE_ARGS={CPU}"] and _smoked(venv) == [CPU]  # native, AMX and all
    assert _mark(venv) == CPU and _mark_lines(venv) == ["level=native", "smoke=passed"]
    proc, calls = installer(venv, FAKE_RUNS_WITH="")
    assert proc.returncode == 0 and calls == [] and _smoked(venv) == []


def test_a_build_that_dies_of_sigill_is_rebuilt_without_amx_once(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv, FAKE_RUNS_WITH="-mno-amx")
    assert proc.returncode == 0, proc.stderr
    assert [c[-1] for c in calls] == [f"CMAKE_ARGS={CPU}", f"CMAKE_ARGS={NO_AMX}"]
    assert "--no-cache-dir" in calls[1] and "--force-reinstall" in calls[1]  # pip's cache holds the native wheel
    assert _smoked(venv) == [CPU, NO_AMX]
    said = [ln for ln in proc.stderr.splitlines() if "died" in ln]
    assert said == [
        "llama.cpp: the native build died of SIGILL in its smoke test (prefilling 256 tokens in one ubatch); "
        "building no-amx instead: native without AMX (some VMs report AMX but ggml's AMX kernels die there)"
    ]
    assert _mark(venv) == NO_AMX and _mark_lines(venv) == ["level=no-amx", "smoke=passed", f"died=native SIGILL {CPU}"]
    proc, calls = installer(venv, FAKE_RUNS_WITH="-mno-amx")  # setup again: nothing rebuilt, nothing re-tested
    assert proc.returncode == 0 and calls == [] and _smoked(venv) == []


def test_without_amx_dying_too_the_portable_build_is_made(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv, FAKE_RUNS_WITH="-DGGML_NATIVE=OFF")
    assert proc.returncode == 0, proc.stderr
    assert [c[-1] for c in calls] == [f"CMAKE_ARGS={a}" for a in (CPU, NO_AMX, PORTABLE)]
    assert _smoked(venv) == [CPU, NO_AMX, PORTABLE] and _mark(venv) == PORTABLE
    assert "building portable instead: the portable AVX2 set" in proc.stderr


def test_a_cpu_that_runs_no_build_is_an_error_that_says_what_to_do(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, _ = installer(venv, FAKE_RUNS_WITH="no build has this")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: every llama.cpp build tried dies on this CPU in its smoke test: native (SIGILL)")
    assert "Hint: ENGRAM_LLAMA_CPU=portable ./scripts/setup.sh" in last and _smoked(venv) == [CPU, NO_AMX, PORTABLE]
    proc, calls = installer(venv, FAKE_RUNS_WITH="no build has this")  # known to die: none is built again
    assert proc.returncode == 1 and calls == [] and _smoked(venv) == []


def test_a_smoke_test_failing_without_a_signal_is_no_reason_to_rebuild(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv, FAKE_SMOKE_FAILS="1")
    assert proc.returncode == 1 and len(calls) == 1
    assert "not by a signal, so it is not a CPU problem" in proc.stderr and "llama_decode returned -1" in proc.stderr


def test_engram_llama_cpu_forces_one_level(installer, tmp_path):
    venv = tmp_path / "venv"
    proc, calls = installer(venv, ENGRAM_LLAMA_CPU="portable")
    assert proc.returncode == 0, proc.stderr
    assert [c[-1] for c in calls] == [f"CMAKE_ARGS={PORTABLE}"] and _mark(venv) == PORTABLE
    proc, _ = installer(venv, ENGRAM_LLAMA_CPU="amx-please")
    assert (
        proc.returncode == 2 and "ENGRAM_LLAMA_CPU='amx-please': write one of native, no-amx, portable" in proc.stderr
    )


def test_slim_wheel_keeps_what_the_package_loads(tmp_path):
    """A stand-in wheel laid out as llama-cpp-python 0.3.36's CUDA wheel is (each library under three names, and
    CMake's install at the root): the slim one keeps the package, the two names ctypes loads and the sonames."""
    import zipfile

    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    names = ["llama_cpp/__init__.py", "llama_cpp/llama_cpp.py", "include/llama.h", "lib/cmake/llama/llama-config.cmake"]
    for lib, version in [("llama", "0.5.0"), ("ggml", "0.25.3"), ("ggml-base", "0.25.3"), ("ggml-cuda", "0.25.3")]:
        for where in ("lib", "llama_cpp/lib"):
            names += [f"{where}/lib{lib}.so", f"{where}/lib{lib}.so.0", f"{where}/lib{lib}.so.{version}"]
    record = "llama_cpp_python-0.3.36.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as z:
        for n in names:
            z.writestr(n, n)
        z.writestr("llama_cpp_python-0.3.36.dist-info/METADATA", "Name: llama_cpp_python\n")
        z.writestr(record, "".join(f"{n},sha256=x,{len(n)}\n" for n in names) + f"{record},,\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "slim_wheel.py"), str(wheel)], check=False)
    assert proc.returncode == 0
    with zipfile.ZipFile(wheel) as z:
        kept = set(z.namelist())
        listed = {ln.split(",")[0] for ln in z.read(record).decode().splitlines()}
        assert z.read("llama_cpp/lib/libggml-cuda.so.0") == b"llama_cpp/lib/libggml-cuda.so.0"
    libs = {"libllama.so", "libggml.so"} | {f"lib{x}.so.0" for x in ("llama", "ggml", "ggml-base", "ggml-cuda")}
    package = {"llama_cpp/__init__.py", "llama_cpp/llama_cpp.py"} | {f"llama_cpp/lib/{x}" for x in libs}
    assert kept == package | {"llama_cpp_python-0.3.36.dist-info/METADATA", record}
    assert listed == package | {record}
