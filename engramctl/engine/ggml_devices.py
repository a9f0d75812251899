"""The GPUs in ggml's device registry: those llama.cpp splits a model's layers across, with their memory now.
llama-cpp-python binds none of ggml_backend_dev_*, so they are typed here, once, on the loaded libggml (a CUDA
build registers its devices when llama_backend_init runs; a CPU build's registry holds the CPU alone)."""

from __future__ import annotations

import ctypes
from functools import cache

from engramctl.tiers.offload import Gpu

_GPU_TYPES = (1, 2)  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU (ggml-backend.h)


@cache
def _ggml():
    """The loaded libggml with the registry's functions typed, or None where they cannot be reached."""
    try:
        from llama_cpp import _ggml as bindings

        ggml = ctypes.CDLL(bindings.libggml._name)  # the library already loaded; its own function objects
        size_p = ctypes.POINTER(ctypes.c_size_t)
        for name, restype, argtypes in (
            ("ggml_backend_dev_count", ctypes.c_size_t, []),
            ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
            ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_backend_dev_memory", None, [ctypes.c_void_p, size_p, size_p]),
        ):
            fn = getattr(ggml, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (ImportError, AttributeError, OSError):
        return None
    return ggml


def gpus() -> tuple[Gpu, ...] | None:
    """Each GPU device of the registry in its order (its description as the name), or None where the registry
    cannot be read."""
    ggml = _ggml()
    if ggml is None:
        return None
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if dev and ggml.ggml_backend_dev_type(dev) in _GPU_TYPES:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            name = (ggml.ggml_backend_dev_description(dev) or b"GPU").decode("utf-8", "replace")
            found.append(Gpu(name, int(free.value), int(total.value)))
    return tuple(found)
