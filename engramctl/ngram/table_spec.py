"""What an N-gram table is (spec §3): its spec, its sidecar and where its files live.

One flat row-major file per N-gram layer: `layer-<id>.table` holds rows x row_bytes bytes, row r at byte
r * row_bytes (rows in (order, head, index) order, so a global row id = offsets[col] + head-local index,
spec §2.5). Next to it `layer-<id>.table.json` (JSON, never pickle) records the format, layer, shape,
dtype, seed, init, the config hash of the N-gram config it belongs to, an XXH3-128 checksum of every
byte, and a probe checksum of a few sampled pages. The sidecar is written last: a table without one is
incomplete and refused. Writing and checking: table_file.py; reading: table_read.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engramctl.errors import NgramTableCorrupt, NgramTableError, NgramTableMismatch, UsageError

FORMAT = "engramctl-ngram-table/1"
GEN_BLOCK_ROWS = 65536  # part of the format: block b of the init is seeded (seed, layer, b)
PAGE_BYTES = 4096
PROBE_PAGES = 16  # pages checked at every open: first, last and evenly spaced ones between
INITS = ("normal", "bits")
# storage dtype, element bytes, the mask that keeps random bits finite and below 2 in magnitude
DTYPES: dict[str, tuple[type, int, int]] = {
    "float32": (np.float32, 4, 0xBFFFFFFF),
    "float16": (np.float16, 2, 0xBFFF),
    "bfloat16": (np.uint16, 2, 0xBFFF),  # numpy has no bfloat16: raw bits, viewed as torch.bfloat16
}


@dataclass(frozen=True)
class TableSpec:
    """What one layer's table is: the sidecar records all of it and opening checks all of it."""

    layer_id: int
    rows: int
    dim: int  # D_h: values per row
    dtype: str = "float16"
    seed: int = 0
    init: str = "normal"
    config_hash: str = ""  # the N-gram config (and compressed vocabulary) the row ids come from

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"table dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}.")
        if self.init not in INITS:
            raise UsageError(f"table init must be one of {', '.join(INITS)}; got {self.init!r}.")
        if self.rows < 1 or self.dim < 1 or self.layer_id < 0:
            raise UsageError(f"a table needs rows >= 1, dim >= 1 and a layer id >= 0; got {self}.")

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.dtype][0])

    @property
    def row_bytes(self) -> int:
        return self.dim * DTYPES[self.dtype][1]

    @property
    def size_bytes(self) -> int:
        return self.rows * self.row_bytes

    def to_json(self) -> dict:
        return asdict(self)


def config_hash(*parts: object) -> str:
    """A short stable hash of whatever defines the row ids (the NgramConfig, V', the pad id)."""
    import hashlib

    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def table_path(directory: Path, layer_id: int) -> Path:
    return Path(directory) / f"layer-{layer_id}.table"


def meta_path(directory: Path, layer_id: int) -> Path:
    return Path(directory) / f"layer-{layer_id}.table.json"


@dataclass(frozen=True)
class TableMeta:
    spec: TableSpec
    checksum: str  # XXH3-128 of every byte of the table file
    probe_checksum: str  # XXH3-128 of the PROBE_PAGES sampled pages, checked at every open

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            **self.spec.to_json(),
            "row_bytes": self.spec.row_bytes,
            "size_bytes": self.spec.size_bytes,
            "checksum": self.checksum,
            "probe_checksum": self.probe_checksum,
        }

    @classmethod
    def read(cls, directory: Path, layer_id: int) -> "TableMeta":
        side = meta_path(directory, layer_id)
        try:
            raw = json.loads(side.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NgramTableError(
                f"the N-gram table of layer {layer_id} in {directory} is missing or incomplete (no {side.name}).",
                hint="write it again (the engine does this on first load)",
            ) from None
        except (OSError, ValueError) as e:
            raise NgramTableCorrupt(f"{side} is not a readable table sidecar: {e}.") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise NgramTableMismatch(
                f"{side} is not an {FORMAT} sidecar (format {raw.get('format') if isinstance(raw, dict) else '?'})."
            )
        try:
            spec = TableSpec(**{k: raw[k] for k in TableSpec.__dataclass_fields__})
            return cls(spec=spec, checksum=str(raw["checksum"]), probe_checksum=str(raw["probe_checksum"]))
        except (KeyError, TypeError, UsageError) as e:
            raise NgramTableCorrupt(f"{side} lacks or garbles a field: {e}.") from None


def tables_dir(data_dir: Path, name: str) -> Path:
    """Where one N-gram config's tables live: <data dir>/ngram/<name>/ (name: its config hash, say)."""
    return Path(data_dir) / "ngram" / name


def installed_tables(directory: Path, recursive: bool = False) -> list[tuple[Path, TableMeta]]:
    """(table file, sidecar) of the complete tables in `directory` (with `recursive`, in its
    subdirectories too: the data dir's ngram/); an incomplete or foreign one is skipped."""
    out = []
    pattern = "**/layer-*.table.json" if recursive else "layer-*.table.json"
    for side in sorted(Path(directory).glob(pattern)):
        try:
            layer = int(side.name[len("layer-") : -len(".table.json")])
            out.append((table_path(side.parent, layer), TableMeta.read(side.parent, layer)))
        except (ValueError, NgramTableError):
            continue
    return out
