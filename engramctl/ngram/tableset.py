"""The tables of one model's N-gram layers as the engine holds them (spec §3-§4): table files written once
under the data dir, placed in RAM or on disk by the tier planner, each read through a RowReader.

    tables = TableSet.open(config, hasher, key, "float32", TableSetup(data_dir, place=daemon.tiers.claim_tables))
    tables.begin(local_ids)         # before the backbone runs: a disk table's prefetch starts here
    rows = tables.take(layer_id)    # at the N-gram layer: (1, T, (N-1)*K, D_h), waits only for rows not there

Without a data dir (a backend built directly, tests) the tables are generated in RAM, the same bytes the
files would hold, so a model's output never depends on where its tables are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from engramctl.errors import EngramError, NgramTableCorrupt, NgramTableMismatch, UsageError
from engramctl.ngram.hashing import NgramConfig, NgramHasher
from engramctl.ngram.prefetch import Prefetcher
from engramctl.ngram.table_file import check_table, write_table
from engramctl.ngram.table_read import DiskTable, ResidentTable, open_table
from engramctl.ngram.table_spec import TableSpec, table_path, tables_dir

TIERS = ("auto", "ram", "disk")
READS = ("prefetch", "sync")
_PROGRESS_MIN_BYTES = 256 << 20  # tables smaller than this are written without progress lines
_PROGRESS_STEP = 0.1

# (name, size_bytes) per table, earliest layer first, and the forced tier or None -> {name: "ram" | "disk"}
Place = Callable[[Sequence[tuple[str, int]], "str | None"], Mapping[str, str]]


@dataclass(frozen=True)
class TableSetup:
    """Where the tables live and how a disk table is read. `place` is the tier planner's claim (the store's
    claim_tables in the daemon); without one every table goes where `tier` says, RAM for auto."""

    data_dir: Path | None = None  # tables under <data_dir>/ngram/<config hash>/; None: generated in RAM
    cache_dir: Path | None = None  # the tokenizer's compression map is kept under <cache_dir>/ngram/
    tier: str = "auto"  # auto (the planner decides) | ram | disk
    place: Place | None = None
    read: str = "prefetch"  # a disk table: prefetch (gathered while the earlier blocks run) | sync (at the layer)
    io_threads: int = 2
    read_mode: str = "pread"
    init: str = "normal"  # N(0, 1) as the demo's nn.Embedding; "bits" writes the benchmark's big tables faster
    progress: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if self.tier not in TIERS or self.read not in READS:
            raise UsageError(
                f"N-gram table tier must be one of {', '.join(TIERS)} and read one of {', '.join(READS)}; "
                f"got {self.tier!r}, {self.read!r}."
            )
        if self.tier == "disk" and self.data_dir is None:
            raise UsageError("N-gram tables on disk need a data dir to write them in.")


class RowReader:
    """One layer's rows. In RAM: gathered at the layer (numpy.take). On disk: submitted to the prefetcher
    when the step begins and waited for at the layer, or (read "sync") read at the layer."""

    def __init__(self, table: ResidentTable | DiskTable, offsets: np.ndarray, setup: TableSetup):
        self.table, self.offsets, self.spec = table, offsets, table.spec
        self.prefetcher = None if table.resident else Prefetcher(table, threads=setup.io_threads)
        self.prefetch = setup.read == "prefetch" and not table.resident
        self._ids: np.ndarray | None = None
        self._pending = None
        self.waited_ms = 0.0  # summed time the layer spent in take(): waiting for, or doing, the reads

    @property
    def tier(self) -> str:
        return "ram" if self.table.resident else "disk"

    def begin(self, local_ids: np.ndarray) -> np.ndarray:
        """Global row ids of a step from head-local ones; a prefetching reader starts reading them now."""
        self._ids = np.asarray(local_ids, dtype=np.int64) + self.offsets
        self._pending = self.prefetcher.submit(self._ids) if self.prefetch else None
        return self._ids

    def take(self) -> np.ndarray:
        """(*ids.shape, D_h) rows of the step begun last, in the table's storage dtype."""
        ids, pending = self._ids, self._pending
        self._ids = self._pending = None
        if ids is None:
            raise EngramError(f"the rows of N-gram layer {self.spec.layer_id} were taken before a step began.")
        t0 = time.perf_counter()
        if pending is not None:
            rows = pending.wait()
        elif self.prefetcher is not None:
            rows = self.prefetcher.fetch(ids)
        else:
            rows = np.empty((ids.size, self.spec.dim), self.spec.storage_dtype)
            self.table.gather(ids.reshape(-1), rows)
            rows = rows.reshape(*ids.shape, -1)
        self.waited_ms += (time.perf_counter() - t0) * 1000
        return rows

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.table.close()


class TableSet:
    """The RowReaders of a model's N-gram layers, keyed by block index, and what identifies their bytes."""

    def __init__(self, readers: dict[int, RowReader], checksums: dict[int, str], directory: Path | None):
        self.readers, self.checksums, self.directory = readers, checksums, directory

    @classmethod
    def open(cls, config: NgramConfig, hasher: NgramHasher, key: str, dtype: str, setup: TableSetup) -> "TableSet":
        """Open (writing once what is missing) the tables of `config`; `key` is the config hash that names
        their directory and is recorded in every sidecar."""
        specs = [
            TableSpec(layer, hasher.rows(layer), config.head_dim, dtype, config.seed, setup.init, key)
            for layer in config.layer_ids
        ]
        if setup.data_dir is None:
            tables = [ResidentTable.generate(s) for s in specs]
            return cls._readers(hasher, tables, [_checksum(t.array) for t in tables], None, setup)
        directory = tables_dir(setup.data_dir, key)
        metas = [_ensure_written(directory, s, setup.progress) for s in specs]
        names = [str(Path("ngram", key, table_path(directory, s.layer_id).name)) for s in specs]
        forced = None if setup.tier == "auto" else setup.tier
        claims = [(n, s.size_bytes) for n, s in zip(names, specs)]
        placed = setup.place(claims, forced) if setup.place is not None else {n: forced or "ram" for n in names}
        tables: list[ResidentTable | DiskTable] = []
        for spec, name in zip(specs, names):
            disk = open_table(directory, spec.layer_id, expect=spec, read_mode=setup.read_mode)
            if placed[name] == "ram":
                with disk:
                    tables.append(disk.load_resident())
            else:
                tables.append(disk)
        return cls._readers(hasher, tables, [m.checksum for m in metas], directory, setup)

    @classmethod
    def _readers(cls, hasher, tables, checksums, directory, setup) -> "TableSet":
        readers = {t.spec.layer_id: RowReader(t, hasher.offsets(t.spec.layer_id), setup) for t in tables}
        return cls(readers, {t.spec.layer_id: c for t, c in zip(tables, checksums)}, directory)

    def begin(self, local_ids: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Start the step's reads, earliest layer first (its window is the shortest); the global ids."""
        return {layer: self.readers[layer].begin(local_ids[layer]) for layer in sorted(self.readers)}

    def take(self, layer_id: int) -> np.ndarray:
        return self.readers[layer_id].take()

    @property
    def n_values(self) -> int:
        return sum(r.spec.rows * r.spec.dim for r in self.readers.values())

    def close(self) -> None:
        for r in self.readers.values():
            r.close()


def _checksum(array: np.ndarray) -> str:
    """The XXH3-128 a table file of these bytes records in its sidecar."""
    import xxhash

    return xxhash.xxh3_128(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))).hexdigest()


def _ensure_written(directory: Path, spec: TableSpec, progress: Callable[[str], None] | None):
    """The table's sidecar, writing the table first when it is missing or incomplete. A table written for
    another configuration or with changed bytes is refused (typed), never silently replaced."""
    try:
        return check_table(directory, spec.layer_id, expect=spec)
    except (NgramTableMismatch, NgramTableCorrupt):
        raise
    except EngramError:
        pass  # missing or incomplete: written now, once
    say = progress if progress is not None and spec.size_bytes >= _PROGRESS_MIN_BYTES else None
    marks = {"next": _PROGRESS_STEP}

    def on_block(done: int, total: int) -> None:
        if say is not None and done / total >= marks["next"]:
            say(f"writing N-gram table layer-{spec.layer_id} ({total / 2**30:.1f} GiB): {100 * done // total}%")
            marks["next"] = done / total + _PROGRESS_STEP

    if say is not None:
        say(f"writing N-gram table layer-{spec.layer_id} once, to {directory}")
    return write_table(directory, spec, on_block=on_block)
