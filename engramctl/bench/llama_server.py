"""llama-server, the peer a user would run instead, built from the llama.cpp that llama-cpp-python vendors.

    binary, why_not = find_or_build(cache_dir, say)   # (Path, None) or (None, "the reason")

The pinned llama-cpp-python sdist (0.3.36: llama.cpp commit 0c1e570) carries llama.cpp's whole source,
`tools/server` and its HTTP library included, so the peer is the very engine our llama.cpp backend runs,
built from source on this machine (never downloaded as a binary). It is built as a user would build it:
OpenMP on (llama-server runs every llama_decode on one thread, so OpenMP costs it nothing), the CPU's own
SIMD, no web UI, no network features. ~13 min on 2 cores, once: the binary and its shared libraries are
kept under <cache dir>/llama-server/<version>-<flags hash>/ and reused. The libraries there are also the
OpenMP build of the same commit, for comparing against ours (docs/llama-threads.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from engramctl.engine.llama_build import installed_cpu_args
from engramctl.engine.llama_lib import PINNED_VERSION

# The CPU side comes from the installed llama-cpp-python's build (llama_build.installed_cpu_args: what setup's smoke
# test chose, e.g. native without AMX on a VM whose AMX faults), so both servers run the same kernels.
SERVER_FLAGS = (
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)
BUILD_MINUTES = 13  # on 2 cores, measured (llama-cpp-notes.md)
# llama-server's own files (the binary and its HTTP front-end libraries); the rest of a build's bin/ is llama.cpp
FRONT_END = ("llama-server", "libllama-server-impl.so", "libllama-common.so", "libmtmd.so")
CUDA_BUILD_MINUTES = 35  # more, per GPU architecture on 2 cores: our own CUDA wheel's ggml-cuda (docs/gpu.md)


def cmake_flags(cuda_archs: tuple[str, ...] = (), cpu: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The build a user would make on this machine, with our llama.cpp's CPU flags (`cpu`, default: the installed
    build's): with CUDA for `cuda_archs` (CMake's names, "89-real") where our llama.cpp runs on a GPU, so that both
    servers use the same card."""
    flags = (*(installed_cpu_args() if cpu is None else cpu), *SERVER_FLAGS)
    if not cuda_archs:
        return flags
    return (*flags, "-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(cuda_archs)}")


def gpu_archs() -> tuple[str, ...]:
    """CMake's names of the architectures the loaded llama-cpp-python runs on a GPU with ("sm_90" -> "90-real"),
    () for a CPU build or a CUDA build that found no GPU: then the peer is the CPU build too."""
    from engramctl.engine.llama_build import loaded_build
    from engramctl.engine.llama_lib import import_llama_cpp

    build = loaded_build(import_llama_cpp())
    if not (build.cuda and build.gpus):
        return ()
    return tuple(f"{a.removeprefix('sm_')}-real" for a in build.cuda_archs)


def install_dir(cache_dir: Path, cuda_archs: tuple[str, ...] = ()) -> Path:
    tag = hashlib.sha256(" ".join(cmake_flags(cuda_archs)).encode()).hexdigest()[:8]
    return Path(cache_dir) / "llama-server" / f"{PINNED_VERSION}-{tag}"


def find_or_build(
    cache_dir: Path,
    say: Callable[[str], None],
    *,
    build: bool = True,
    cuda_archs: tuple[str, ...] = (),
    cuda_libs: Path | None = None,
) -> tuple[Path | None, str | None]:
    """The cached llama-server, else build it (when `build`), with CUDA for `cuda_archs` where given. Returns
    (binary, None) or (None, why not). With CUDA and `cuda_libs` (the folder of the loaded llama-cpp-python's
    CUDA build of llama.cpp, wheel_libs()), the peer is assembled instead of built with CUDA from source (35 min
    per architecture on 2 cores): the CPU build's llama-server front-end over those very libraries (the same
    llama.cpp commit), so both servers run the same llama.cpp binaries on the card."""
    dest = install_dir(cache_dir, cuda_archs)
    binary = dest / "bin" / "llama-server"
    if binary.is_file():
        return binary, None
    if cuda_archs and cuda_libs is not None:
        front, why = find_or_build(cache_dir, say, build=build)
        if front is None:
            return None, why
        return _assemble(front.parent, Path(cuda_libs), dest, say)
    if not build:
        return None, f"llama-server is not built yet ({binary} is missing)"
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        return None, f"cannot build llama-server: {', '.join(missing)} not found (apt-get install cmake g++)"
    dest.parent.mkdir(parents=True, exist_ok=True)
    log_path = dest.parent / f"{dest.name}.build.log"
    minutes = BUILD_MINUTES + CUDA_BUILD_MINUTES * len(cuda_archs)
    kind = f"with CUDA for {', '.join(cuda_archs)} " if cuda_archs else ""
    say(
        f"building llama-server {kind}from llama-cpp-python {PINNED_VERSION}'s llama.cpp source: ~{minutes} min on "
        f"2 cores, once (cached in {dest}; log: {log_path})"
    )
    try:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, open(log_path, "w") as log:
            src = _unpack_source(Path(tmp), log)
            build_dir = Path(tmp) / "build"
            jobs = str(max(1, len(os.sched_getaffinity(0))))
            _run(["cmake", "-S", str(src), "-B", str(build_dir), *cmake_flags(cuda_archs)], log)
            _run(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "llama-server"], log)
            staged = Path(tmp) / "install"
            (staged / "bin").mkdir(parents=True)
            for item in (build_dir / "bin").iterdir():  # the binary and the shared libraries it loads
                if item.name == "llama-server" or ".so" in item.name:
                    shutil.copy2(item, staged / "bin" / item.name, follow_symlinks=False)
            staged.rename(dest)  # complete or absent, never half there
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"building llama-server failed ({e}); see {log_path}"
    say(f"llama-server built: {binary}")
    return binary, None


def wheel_libs() -> Path | None:
    """The folder of the loaded llama-cpp-python's llama.cpp libraries when they hold the CUDA backend, else None."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    return lib if any(lib.glob("libggml-cuda.so*")) else None


def _assemble(front: Path, libs: Path, dest: Path, say: Callable[[str], None]) -> tuple[Path | None, str | None]:
    """dest/bin: llama-server's front-end files from the CPU build in `front`, llama.cpp's libraries from `libs`."""
    try:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            staged = Path(tmp) / "install"
            (staged / "bin").mkdir(parents=True)
            for item in front.iterdir():
                if item.name.startswith(FRONT_END):
                    shutil.copy2(item, staged / "bin" / item.name, follow_symlinks=False)
            for item in libs.iterdir():
                if item.name.startswith(("libllama.so", "libggml")):
                    shutil.copy2(item, staged / "bin" / item.name)
            staged.rename(dest)
    except OSError as e:
        return None, f"assembling llama-server with CUDA failed ({e})"
    say(f"llama-server with CUDA: the CPU build's front-end over llama-cpp-python's CUDA libraries ({libs}), in {dest}")
    return dest / "bin" / "llama-server", None


def _unpack_source(tmp: Path, log) -> Path:
    """vendor/llama.cpp of the pinned sdist (pip download: PyPI, no binary)."""
    _run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        + [f"llama-cpp-python=={PINNED_VERSION}", "-d", str(tmp)],
        log,
    )
    sdist = tmp / f"llama_cpp_python-{PINNED_VERSION}.tar.gz"
    prefix = f"llama_cpp_python-{PINNED_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(tmp, members=members, filter="data")
    return tmp / prefix


def _run(cmd: list[str], log) -> None:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
