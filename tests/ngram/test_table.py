"""N-gram tables on disk (spec §3): written once and deterministically, read row by row (never whole) in every
read mode with rows equal to T[ids], refused with a typed error when truncated, corrupt or written for
another configuration, and claimed on the tier budgets (RAM first, then disk) as `engramctl tiers` shows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engramctl.errors import NgramTableCorrupt, NgramTableError, NgramTableMismatch, UsageError
from engramctl.ngram.table_file import _probe_offsets, write_table
from engramctl.ngram.table_read import ResidentTable, open_table
from engramctl.ngram.table_spec import GEN_BLOCK_ROWS, PAGE_BYTES, TableSpec, installed_tables, meta_path, table_path
from engramctl.tiers.hardware import Hardware
from engramctl.tiers.plan import claim_tables, plan, plan_json

SPEC = TableSpec(layer_id=1, rows=30000, dim=8, dtype="float16", seed=7, config_hash="abc")


@pytest.fixture
def written(tmp_path):
    write_table(tmp_path, SPEC, threads=1)
    return tmp_path


def _ids(rows: int, n: int = 200, seed: int = 0) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(0, rows, n))


@pytest.mark.parametrize("read_mode", ["pread", "mmap", "direct"])
def test_rows_read_from_disk_equal_the_table(written, read_mode):
    ref = ResidentTable.generate(SPEC)
    try:
        table = open_table(written, 1, expect=SPEC, read_mode=read_mode)
    except UsageError as e:  # a filesystem without O_DIRECT (tmpfs)
        pytest.skip(str(e))
    with table:
        ids = np.concatenate([_ids(SPEC.rows), [0, 1, 2, SPEC.rows - 1]])  # a run of consecutive rows, the end
        ids = np.unique(ids)
        out = np.empty((len(ids), SPEC.dim), SPEC.storage_dtype)
        table.gather(ids, out)
        assert out.tobytes() == ref.array[ids].tobytes()
        resident = table.load_resident()
    assert resident.array.tobytes() == ref.array.tobytes()
    assert table_path(written, 1).stat().st_size == SPEC.size_bytes  # flat: no header inside the file


def test_bytes_do_not_depend_on_threads_and_follow_the_seed(tmp_path):
    spec = TableSpec(layer_id=3, rows=2 * GEN_BLOCK_ROWS + 5, dim=4, dtype="float32", seed=1, init="bits")
    one = write_table(tmp_path / "a", spec, threads=1)
    three = write_table(tmp_path / "b", spec, threads=3)
    assert one.checksum == three.checksum
    other = write_table(tmp_path / "c", TableSpec(**{**spec.to_json(), "seed": 2}), threads=1)
    assert other.checksum != one.checksum
    values = ResidentTable.generate(spec).array
    assert np.isfinite(values).all() and np.abs(values).max() < 2 and (values != 0).mean() > 0.99


def test_normal_init_in_every_dtype_matches_torch_casts():
    import torch

    spec32 = TableSpec(layer_id=0, rows=100, dim=16, dtype="float32", seed=3)
    f32 = ResidentTable.generate(spec32).array
    assert abs(float(f32.mean())) < 0.1 and 0.9 < float(f32.std()) < 1.1  # N(0, 1), as nn.Embedding
    for dtype, torch_dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        got = ResidentTable.generate(TableSpec(**{**spec32.to_json(), "dtype": dtype})).array
        want = torch.from_numpy(f32).to(torch_dtype).view(torch.int16).numpy().view(got.dtype)
        assert got.tobytes() == want.tobytes(), dtype


def test_truncated_table_is_refused(written):
    path = table_path(written, 1)
    with open(path, "r+b") as f:
        f.truncate(SPEC.size_bytes - SPEC.row_bytes)
    with pytest.raises(NgramTableCorrupt, match="truncated"):
        open_table(written, 1, expect=SPEC)


def test_corrupt_bytes_are_refused(written):
    path = table_path(written, 1)
    probed = {off // PAGE_BYTES for off, _ in _probe_offsets(SPEC.size_bytes)}
    unprobed = next(p for p in range(SPEC.size_bytes // PAGE_BYTES) if p not in probed)
    data = bytearray(path.read_bytes())
    data[unprobed * PAGE_BYTES + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    open_table(written, 1, expect=SPEC).close()  # the cheap probe misses it ...
    with pytest.raises(NgramTableCorrupt, match="checksum"):
        open_table(written, 1, expect=SPEC, verify=True)  # ... the full checksum does not
    data[0] ^= 0xFF  # the first page is always probed
    path.write_bytes(bytes(data))
    with pytest.raises(NgramTableCorrupt, match="probe checksum"):
        open_table(written, 1, expect=SPEC)


def test_table_for_another_config_or_layer_is_refused(written):
    for field, value in (("config_hash", "other"), ("seed", 8), ("dim", 4), ("dtype", "float32"), ("rows", 30001)):
        with pytest.raises(NgramTableMismatch, match=field):
            open_table(written, 1, expect=TableSpec(**{**SPEC.to_json(), field: value}))
    with pytest.raises(NgramTableError, match="missing or incomplete"):
        open_table(written, 2)
    side = meta_path(written, 1)
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({**meta, "format": "something-else/9"}))
    with pytest.raises(NgramTableMismatch, match="format"):
        open_table(written, 1)
    side.write_text("{not json")
    with pytest.raises(NgramTableCorrupt):
        open_table(written, 1)


def test_a_table_without_its_sidecar_is_incomplete(written):
    meta_path(written, 1).unlink()
    with pytest.raises(NgramTableError, match="incomplete"):
        open_table(written, 1, expect=SPEC)
    assert installed_tables(written) == []


def test_out_of_range_ids_are_refused(written):
    with open_table(written, 1) as table:
        with pytest.raises(UsageError, match="row ids"):
            table.gather(np.array([SPEC.rows]), np.empty((1, SPEC.dim), SPEC.storage_dtype))


def _hardware(ram_available: int, disk_free: int) -> Hardware:
    return Hardware(
        ram_total_bytes=2 * ram_available,
        ram_available_bytes=ram_available,
        disk_total_bytes=2 * disk_free,
        disk_free_bytes=disk_free,
        cpu="test",
        cpu_cores=2,
        cpu_threads=2,
    )


def test_tables_are_claimed_on_the_tier_budgets_ram_first():
    base = plan(_hardware(ram_available=1000, disk_free=10_000))  # ram budget 500, disk 5,000
    got = claim_tables(base, [("layer-1", 300), ("layer-15", 300), ("layer-20", 100)])
    assert [(c.name, c.tier) for c in got.tables] == [("layer-1", "ram"), ("layer-15", "disk"), ("layer-20", "ram")]
    assert got.budget("ram") == 100 and got.tier("ram").table_bytes == 400
    assert got.budget("disk") == 4700 and got.tier("disk").table_bytes == 300
    assert "minus N-gram tables" in got.tier("ram").rule
    data = plan_json(got)
    assert data["tables"][1] == {"name": "layer-15", "size_bytes": 300, "tier": "disk"}
    assert [t["table_bytes"] for t in data["tiers"]] == [0, 400, 300]
    forced = claim_tables(base, [("layer-1", 300)], tier="disk")
    assert forced.tables[0].tier == "disk" and forced.budget("ram") == 500
    with pytest.raises(NgramTableError, match="fits in no tier"):
        claim_tables(base, [("huge", 6000)])


def test_tiers_command_shows_installed_tables(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from engramctl.cli import app

    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path))
    monkeypatch.setenv("ENGRAM_NO_AUTOSTART", "1")
    monkeypatch.setenv("ENGRAM_TIER_RAM_BYTES", "1MiB")
    # 768 KiB fits the 1 MiB RAM budget; the 512 KiB after it no longer does and goes to disk
    write_table(tmp_path / "ngram" / "cfg", TableSpec(layer_id=1, rows=6144, dim=64, dtype="float16"), threads=1)
    write_table(tmp_path / "ngram" / "cfg", TableSpec(layer_id=2, rows=4096, dim=64, dtype="float16"), threads=1)
    runner = CliRunner()
    result = runner.invoke(app, ["tiers", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(t["name"], t["size_bytes"], t["tier"]) for t in data["tables"]] == [
        ("ngram/cfg/layer-1.table", 6144 * 128, "ram"),
        ("ngram/cfg/layer-2.table", 4096 * 128, "disk"),
    ]
    ram = next(t for t in data["tiers"] if t["name"] == "ram")
    assert ram["table_bytes"] == 6144 * 128 and ram["budget_bytes"] == (1 << 20) - 6144 * 128
    human = runner.invoke(app, ["tiers"], catch_exceptions=False).stdout
    assert "N-GRAM TABLES" in human and "ngram/cfg/layer-2.table" in human
