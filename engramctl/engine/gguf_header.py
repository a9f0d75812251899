"""A GGUF file's header: metadata, tensor table, weight type and identity, read without llama.cpp.

gguf-py's GGUFReader takes ~5 s on SmolLM2 (it wraps every vocabulary string in numpy objects); this
reader skips string arrays (keeping only their length) and reads the rest in ~50 ms. The fingerprint
hashes the whole header (metadata + tensor table, byte for byte) and a strided sample of every
tensor's bytes, so another quantization, a fine-tune or an edited chat template is another model.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from engramctl.errors import ModelNotFound, UnsupportedModel

_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SAMPLES_PER_TENSOR = 16
SAMPLE_BYTES = 32
# general.file_type (llama_ftype) -> the name users know from file names; tensor type ids for the fallback
_FTYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}
_TENSOR_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    30: "BF16",
}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] (fastest varying) first
    type_id: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    metadata: dict  # key -> int/float/bool/str/list; string arrays become {"strings": count}
    tensors: tuple[GgufTensor, ...]
    header_bytes: int  # where the header ends (before alignment padding)
    data_offset: int  # file offset of the data section

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default=None):
        """`{architecture}.{key}`, e.g. arch_value("block_count")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def weight_type(self) -> str:
        ftype = self.metadata.get("general.file_type")
        if isinstance(ftype, int) and ftype in _FTYPES:
            return _FTYPES[ftype]
        # no file type recorded: the type holding most matrices (1-D norms and biases stay F32 anyway)
        counts = Counter(t.type_id for t in self.tensors if len(t.shape) >= 2)
        if not counts:
            return "unknown"
        type_id = counts.most_common(1)[0][0]
        return _TENSOR_TYPES.get(type_id, f"ggml type {type_id}")


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise UnsupportedModel(f"{self.path} is truncated: its GGUF header runs past the end of the file.")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        raw = bytes(self.buf[self.pos : self.pos + n])
        if len(raw) != n:
            raise UnsupportedModel(f"{self.path} is truncated: its GGUF header runs past the end of the file.")
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            if etype == _STRING:  # the vocabulary and merges: skipped, ~100k entries
                for _ in range(n):
                    length = self.take("<Q")  # not `pos += take()`: that would add to the pos from before the read
                    self.pos += length
                return {"strings": n}
            if etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype])
                values = list(struct.unpack_from(f"<{n}{_SCALARS[etype][1]}", self.buf, self.pos))
                self.pos += n * size
                return values
            return [self.value(etype) for _ in range(n)]  # arrays of arrays: rare and short
        raise UnsupportedModel(f"{self.path} has a GGUF value of unknown type {vtype}; the file is corrupt or newer.")


def read_header(path: Path) -> GgufHeader:
    path = Path(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path)
    except (OSError, ValueError) as e:  # missing, unreadable, or empty (mmap of 0 bytes)
        raise ModelNotFound(f"cannot read GGUF file {path}: {e}") from None


def _parse(buf, path: Path) -> GgufHeader:
    if bytes(buf[:4]) != _MAGIC:
        raise UnsupportedModel(f"{path} is not a GGUF file (it does not start with 'GGUF').")
    c = _Cursor(buf, path)
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise UnsupportedModel(f"{path} is GGUF version {version}; only versions 2 and 3 are readable.")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        shape = tuple(c.take("<Q") for _ in range(c.take("<I")))
        tensors.append(GgufTensor(name, shape, c.take("<I"), c.take("<Q")))
    align = int(metadata.get("general.alignment", 32))
    data_offset = (c.pos + align - 1) // align * align
    if tensors and data_offset + max(t.offset for t in tensors) > len(buf):
        raise UnsupportedModel(f"{path} is truncated: its tensor data ends before the tensors it lists.")
    return GgufHeader(path, metadata, tuple(tensors), c.pos, data_offset)


def tensor_sizes(header: GgufHeader) -> dict[str, int]:
    """name -> bytes each tensor takes in the file (to the next tensor's offset, alignment padding included:
    at most general.alignment bytes more than its data)."""
    end = header.path.stat().st_size - header.data_offset
    ends = sorted({t.offset for t in header.tensors} | {end})
    next_offset = dict(zip(ends, ends[1:]))
    return {t.name: next_offset.get(t.offset, t.offset) - t.offset for t in header.tensors}


def gguf_fingerprint(header: GgufHeader) -> str:
    h = hashlib.sha256(b"gguf1")
    try:
        with header.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            h.update(buf[: header.header_bytes])  # metadata + tensor table, byte for byte
            ends = sorted({t.offset for t in header.tensors} | {len(buf) - header.data_offset})
            next_offset = {a: b for a, b in zip(ends, ends[1:])}
            for t in header.tensors:
                start = header.data_offset + t.offset
                size = next_offset.get(t.offset, 0)  # the tensor's bytes, padding included
                for i in range(SAMPLES_PER_TENSOR):
                    at = (
                        start + (size - SAMPLE_BYTES) * i // max(SAMPLES_PER_TENSOR - 1, 1)
                        if size > SAMPLE_BYTES
                        else start
                    )
                    h.update(buf[at : at + min(SAMPLE_BYTES, size)])
    except (OSError, ValueError) as e:
        raise ModelNotFound(f"cannot read GGUF file {header.path}: {e}") from None
    return h.hexdigest()[:16]
