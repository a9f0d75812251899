"""N-gram tables in the engine (spec §4.5 on a real tiny model): table files written once under the data
dir, placed by the tier planner (and kept there by TierPlanner.replan), the output with the table on disk (prefetched
or read at the layer) equal to it in RAM bitwise across prefill, chunked prefill, decode and resume, and the
prefetched row ids equal to a reference hash of the whole sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engramctl.engine.hf_backend import TransformersBackend
from engramctl.ngram.hashing import NgramConfig
from engramctl.ngram.tableset import TableSetup

NGRAM = NgramConfig(n_embed_per_ngram=64, engram_vocab_size=[53, 59], layer_ids=[1, 3], seed=3)
FAMILY = "granitemoehybrid"


def _load(zoo, setup: TableSetup | None, chunk_tokens=7) -> TransformersBackend:
    model_dir = zoo.path(FAMILY)
    backend = TransformersBackend.load(model_dir, model_dir.name, "cpu", torch.float32, ngram=NGRAM, tables=setup)
    backend.chunk_tokens = chunk_tokens
    return backend


def _ids(n, seed=4):
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(backend, ids, more):
    """Chunked prefill, three decode steps, a snapshot, and the rest continued from it in a new live."""
    live = backend.new_live()
    out = [backend.prefill(live, ids)]
    for t in more[:3]:
        out.append(backend.decode(live, t))
    resumed = backend.inject(backend.capture(live))
    out.append(backend.prefill(resumed, more[3:]))
    out.append(backend.decode(resumed, more[0]))
    return out, [s.conv for s in resumed.ngram]


def _record_prefetches(backend) -> dict[int, list[np.ndarray]]:
    """Every step's global row ids as each layer's prefetcher was handed them (before the backbone ran)."""
    seen: dict[int, list[np.ndarray]] = {}
    for layer, reader in backend.engram.tables.readers.items():
        submit, seen[layer] = reader.prefetcher.submit, []

        def recording(ids, submit=submit, out=seen[layer]):
            out.append(np.array(ids, copy=True))
            return submit(ids)

        reader.prefetcher.submit = recording
    return seen


@pytest.mark.parametrize("read", ["prefetch", "sync"])
def test_table_on_disk_equals_it_in_ram_bitwise(zoo, tmp_path, read):
    ids, more = _ids(19), _ids(9, seed=5)
    ram = _load(zoo, TableSetup(data_dir=tmp_path, tier="ram"))
    disk = _load(zoo, TableSetup(data_dir=tmp_path, tier="disk", read=read, io_threads=2))
    generated = _load(zoo, None)  # no data dir: the same bytes, generated in RAM
    assert {r.tier for r in ram.engram.tables.readers.values()} == {"ram"}
    assert {r.tier for r in disk.engram.tables.readers.values()} == {"disk"}
    assert all(r.prefetch == (read == "prefetch") for r in disk.engram.tables.readers.values())
    assert ram.info.fingerprint == disk.info.fingerprint == generated.info.fingerprint
    want, want_conv = _run(ram, ids, more)
    for other in (disk, generated):
        got, conv = _run(other, ids, more)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert all(torch.equal(a, b) for a, b in zip(conv, want_conv))
    # a snapshot taken with the table in RAM resumes on the disk one, exactly
    live = ram.new_live()
    ram.prefill(live, ids)
    state = ram.capture(live)
    a, b = ram.inject(state), disk.inject(state)
    assert torch.equal(ram.prefill(a, more), disk.prefill(b, more))


def test_prefetched_ids_equal_a_reference_hash_of_the_whole_sequence(zoo, tmp_path):
    ids, more = _ids(23), _ids(6, seed=6)
    backend = _load(zoo, TableSetup(data_dir=tmp_path, tier="disk"))
    seen = _record_prefetches(backend)
    live = backend.new_live()
    backend.prefill(live, ids)  # chunks of 7
    backend.decode(live, more[0])
    resumed = backend.inject(backend.capture(live))  # resume from a snapshot
    backend.prefill(resumed, more[1:4])
    for t in more[4:]:
        backend.decode(resumed, t)
    hooks = backend.engram
    full = hooks.token_map.compress([ids + more], hooks.pad_raw)
    reference = hooks.hasher.hash(full.tolist())
    for layer in NGRAM.layer_ids:
        assert len(seen[layer]) == 4 + 1 + 1 + 2  # prefill chunks 7+7+7+2, decode, chunk of 3, two decodes
        got = np.concatenate(seen[layer], axis=1)
        want = reference[layer] + hooks.hasher.offsets(layer)
        assert got.shape == want.shape and np.array_equal(got, want)


def test_tables_are_files_written_once_and_the_token_map_is_cached(zoo, tmp_path):
    setup = TableSetup(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", tier="disk")
    first = _load(zoo, setup)
    directory = first.engram.tables.directory
    assert directory.parent == tmp_path / "data" / "ngram"
    files = sorted(p.name for p in directory.iterdir())
    assert files == ["layer-1.table", "layer-1.table.json", "layer-3.table", "layer-3.table.json"]
    mtimes = {p: p.stat().st_mtime_ns for p in directory.iterdir()}
    maps = list((tmp_path / "cache" / "ngram").glob("tokenmap-*.safetensors"))
    assert len(maps) == 1
    again = _load(zoo, setup)
    assert {p: p.stat().st_mtime_ns for p in directory.iterdir()} == mtimes  # opened, not written again
    assert np.array_equal(again.engram.token_map.token_map, first.engram.token_map.token_map)
    assert again.info.fingerprint == first.info.fingerprint


def test_the_planner_places_the_tables_and_replan_keeps_them(zoo, tmp_path):
    """The daemon's store claims the tables while the model loads; /v1/tiers shows them after replan."""
    from fastapi.testclient import TestClient

    from engramctl.daemon.app import create_app
    from engramctl.settings import load_settings

    flags = {"model": str(zoo.path(FAMILY)), "device": "cpu", "dtype": "float32", "ngram_layers": "1,3"}
    # a 10 KiB RAM budget: both tables (848 rows of 256 B each) go to disk
    flags.update(ngram_table_rows=53, tier_ram_bytes="10KiB", api_key="t" * 32)
    settings = load_settings(flags, env={"ENGRAM_HOME": str(tmp_path)})
    settings.paths.ensure()
    app = create_app(settings)  # opens the store, loads the model (the store claims its tables), replans
    daemon = app.state.daemon
    try:
        client = TestClient(app, headers={"Authorization": f"Bearer {'t' * 32}"})
        tiers = client.get("/v1/tiers").json()
        assert [(t["name"], t["tier"]) for t in tiers["tables"]] == [
            (f"ngram/{daemon.engine.backend.engram.table_key}/layer-{i}.table", "disk") for i in (1, 3)
        ]
        assert {r.tier for r in daemon.engine.backend.engram.tables.readers.values()} == {"disk"}
        daemon.tiers.replan(model_bytes=0, model_on_cpu=True)
        after = client.get("/v1/tiers").json()
        assert after["tables"] == tiers["tables"]
        disk = next(t for t in after["tiers"] if t["name"] == "disk")
        assert disk["table_bytes"] == sum(t["size_bytes"] for t in tiers["tables"]) > 0
    finally:
        daemon.close()
