"""The one seam between numpy arrays and torch tensors, for everything that holds a model state's arrays.

The llama.cpp backend's states and logits are numpy arrays (torch would cost ~200 MiB of resident memory and
1,100 modules for a container); the transformers backend's are torch tensors (bfloat16 and CUDA have no numpy
form). state/ and store/ handle either through these functions and never test for a kind themselves. Neither
library is imported here until an array of its kind is handled (an array exists only once its library is
loaded), so listings that open the store load neither.

Which kind a snapshot read from a file becomes is decided once, here (`kind_of`): the kind of the backend that
wrote it. A snapshot is only ever restored by the backend that wrote it (state/codec.py refuses the others),
so that is the kind the engine in use wants; the file's bytes are the same either way.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import numpy as np
    import torch

Array = Union["np.ndarray", "torch.Tensor"]
NUMPY, TORCH = "numpy", "torch"
# backend name (a snapshot's "backend" metadata) -> the kind of its arrays; any other backend's are torch
# tensors, and so is a file without the key (the transformers backend wrote those)
KIND_OF_BACKEND = {"llama.cpp": NUMPY}
BACKEND_KEY = "backend"
# numpy / torch dtype names (arrays.dtype_name) -> safetensors' names
SAFETENSORS_DTYPE = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
}
# safetensors dtype names numpy has a form of: a file holding any other (BF16) decodes into torch tensors
NUMPY_SAFETENSORS_DTYPES = frozenset({"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL"})


def kind_of_backend(backend: str) -> str:
    return KIND_OF_BACKEND.get(backend, TORCH)


def kind_of(meta: dict[str, str]) -> str:
    """The kind a snapshot with this metadata is decoded into: its writer backend's."""
    return kind_of_backend(meta.get(BACKEND_KEY) or "transformers")


def is_numpy(a: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(a, np.ndarray)


def is_array(a: Any) -> bool:
    torch = sys.modules.get("torch")
    return is_numpy(a) or (torch is not None and isinstance(a, torch.Tensor))


def kind(a: Array) -> str:
    return NUMPY if is_numpy(a) else TORCH


def dtype_name(a: Array) -> str:
    """ "float32", "bfloat16", "int64", ...: torch's name without "torch.", which numpy's names agree with."""
    return a.dtype.name if is_numpy(a) else str(a.dtype).removeprefix("torch.")


def shape(a: Array) -> tuple[int, ...]:
    return tuple(a.shape)


def nbytes(a: Array) -> int:
    return int(a.nbytes) if is_numpy(a) else a.numel() * a.element_size()


def is_floating(a: Array) -> bool:
    return a.dtype.kind == "f" if is_numpy(a) else a.is_floating_point()


def all_finite(a: Array) -> bool:
    """No NaN or Inf in a floating array. A NaN/Inf anywhere makes the sum non-finite, and a sum is ~10x
    cheaper than isfinite().all(); only a non-finite sum (possibly a mere overflow) pays for the exact check."""
    if is_numpy(a):
        import numpy as np

        if a.dtype == np.float16:
            # numpy emulates float16 arithmetic (a sum ran ~5x slower than this): bytes_finite's bit test
            return bytes_finite(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)), "F16")
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(np.isfinite(a.sum())) or bool(np.isfinite(a).all())
    import torch

    return bool(torch.isfinite(a.sum())) or bool(torch.isfinite(a).all())


# safetensors dtype code -> (unsigned type of its width, its exponent bits): a float is NaN or Inf exactly when its
# exponent bits are all ones
FLOAT_BITS = {
    "F16": ("uint16", 0x7C00),
    "BF16": ("uint16", 0x7F80),
    "F32": ("uint32", 0x7F800000),
    "F64": ("uint64", 0x7FF0000000000000),
}
_PIECE_BYTES = 1 << 19  # both reductions read a piece while it is in the L2 cache (1 MiB a core here)


def bytes_finite(data: memoryview, code: str) -> bool:
    """No NaN or Inf among the floats of dtype `code` whose bytes (native order) are `data`; True for a dtype
    that is not a float. Two reductions over the bits, nothing written: read as signed integers, a positive NaN or
    Inf is one at least the exponent mask (sign 0, exponent all ones), and read as unsigned, a negative one is at
    least sign | mask, the largest values of either view. Measured on 512 KiB of f32 or f16 in the cache (one core,
    loaded machine): 35-50 us, where a mask of the bits then its max took 80-100 us (a copy of the bytes: ~35 us).
    What a restore from disk runs on each chunk as it is read (store/reader.py), and all_finite on float16."""
    if code not in FLOAT_BITS or not data.nbytes:
        return True
    frombuffer, unsigned_type, signed_type, exponent, negative, step = _FINITE.get(code) or _finite_how(code)
    unsigned = frombuffer(data, unsigned_type)
    signed = unsigned.view(signed_type)
    if unsigned.size <= step:  # a reader's chunk: one piece (called per tensor piece, ~700 times a 10K-token read)
        return int(signed.max()) < exponent and int(unsigned.max()) < negative
    for at in range(0, unsigned.size, step):
        if int(signed[at : at + step].max()) >= exponent or int(unsigned[at : at + step].max()) >= negative:
            return False
    return True


_FINITE: dict[str, tuple] = {}  # code -> what bytes_finite needs for it, made once (numpy imported then)


def _finite_how(code: str) -> tuple:
    """(numpy's frombuffer, unsigned dtype, signed dtype, exponent mask, sign | mask, values per piece) for a
    FLOAT_BITS code."""
    import numpy as np

    kind, exponent = FLOAT_BITS[code]
    unsigned = np.dtype(kind)
    negative = exponent | (1 << (8 * unsigned.itemsize - 1))
    signed = np.dtype(kind[1:])  # "uint16" -> "int16"
    how = (np.frombuffer, unsigned, signed, exponent, negative, _PIECE_BYTES // unsigned.itemsize)
    _FINITE[code] = how
    return how


def equal(a: Array, b: Array) -> bool:
    """Same kind, dtype, shape and values (as torch.equal: a NaN equals nothing)."""
    if kind(a) != kind(b) or dtype_name(a) != dtype_name(b) or shape(a) != shape(b):
        return False
    if is_numpy(a):
        import numpy as np

        return bool(np.array_equal(a, b))
    import torch

    return bool(torch.equal(a, b))


def copy(a: Array) -> Array:
    return a.copy() if is_numpy(a) else a.clone()


def to_device(a: Array, device: str) -> Array:
    """`a` on `device`; itself when it is there. A numpy array is on the CPU: to reach a GPU it becomes a
    tensor (only a transformers payload goes to VRAM, where torch is already loaded)."""
    if is_numpy(a):
        if str(device) == "cpu":
            return a
        import torch

        return torch.from_numpy(a).to(device)
    return a.to(device)


def float32(a: Array) -> Array:
    """`a` as float32, of its kind; itself when it already is."""
    return a.astype("float32", copy=False) if is_numpy(a) else a.float()


def float32_flat(a: Array) -> Array:
    """(n,) float32 of the same kind; no copy when it already is."""
    return float32(a).reshape(-1)


def int64_like(like: Array, values) -> Array:
    """A 1-D int64 array of `values`, of `like`'s kind (on the CPU)."""
    if is_numpy(like):
        import numpy as np

        return np.asarray(values, dtype=np.int64).reshape(-1)
    import torch

    return torch.tensor(values, dtype=torch.int64)


def host_contiguous(a: Array) -> Array:
    """`a` as a contiguous CPU array of its kind (itself when it already is): memory a writer may read."""
    if is_numpy(a):
        import numpy as np

        return np.ascontiguousarray(a)
    return a.detach().contiguous().cpu()


def host_bytes(a: Array) -> memoryview:
    """The array's bytes in row-major order, on the CPU: a view of its memory when it is contiguous there."""
    a = host_contiguous(a)
    if is_numpy(a):
        return memoryview(a.reshape(-1).view("uint8"))
    import torch

    return memoryview(a.reshape(-1).view(torch.uint8).numpy())


def data_ptr(a: Array) -> int:
    return int(a.ctypes.data) if is_numpy(a) else a.data_ptr()


def where(a: Array) -> tuple:
    """Which memory `a` views, and how: (address, shape, dtype, contiguous)."""
    contiguous = bool(a.flags.c_contiguous) if is_numpy(a) else a.is_contiguous()
    return data_ptr(a), shape(a), dtype_name(a), contiguous


def as_kind(a: Array, want: str) -> Array:
    """`a` as an array of kind `want`, sharing its memory where both can (a CPU array of a numpy dtype)."""
    if kind(a) == want:
        return a
    if want == TORCH:
        import torch

        return torch.from_numpy(a)
    return a.detach().cpu().numpy()
