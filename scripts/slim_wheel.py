"""Rewrite a llama-cpp-python wheel without what the package never loads, so a CUDA wheel can be carried to a
GPU machine (the device tool carries 64 MiB; a one-architecture CUDA wheel of 0.3.36 is ~140 MB, ~20 MB slim).

A wheel cannot hold symlinks, so each shared library is in it three times (libX.so, the soname libX.so.0, the real
name libX.so.0.25.3), and CMake's install also put a second copy of them, the C headers and CMake files at the
wheel's root (site-packages/lib, site-packages/include). The package loads llama_cpp/lib/libllama.so and
libggml.so by those names (ctypes); the dynamic loader then asks for the sonames only (DT_NEEDED, found through
the $ORIGIN runpath). Kept: the package, those two names, and every soname; RECORD lists what is kept.
    python3 scripts/slim_wheel.py WHEEL   (rewritten in place; stdlib only)
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import zipfile

LOADED_BY_NAME = {"llama_cpp/lib/libllama.so", "llama_cpp/lib/libggml.so"}


def keep(name: str) -> bool:
    if not name.startswith("llama_cpp/") and ".dist-info/" not in name:
        return False  # the root lib/ and include/: CMake's install for C users
    if name.startswith("llama_cpp/lib/") and name not in LOADED_BY_NAME:
        return re.search(r"\.so\.\d+$", name) is not None  # the soname; not libX.so nor libX.so.0.25.3
    return True


def slim(path: str) -> tuple[int, int]:
    """Rewrite the wheel at `path`; (bytes before, bytes after)."""
    before = os.path.getsize(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".whl")
    os.close(fd)
    try:
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if not keep(info.filename):
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines()
                    data = "".join(ln + "\n" for ln in lines if keep(ln.rsplit(",", 2)[0])).encode()
                dst.writestr(info, data)
        os.chmod(tmp, os.stat(path).st_mode & 0o777)  # mkstemp's file is 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return before, os.path.getsize(path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 scripts/slim_wheel.py WHEEL", file=sys.stderr)
        sys.exit(2)
    b, a = slim(sys.argv[1])
    print(f"{sys.argv[1]}: {b / 2**20:.1f} MiB -> {a / 2**20:.1f} MiB", file=sys.stderr)
