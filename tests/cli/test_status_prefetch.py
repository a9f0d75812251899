"""`engramctl daemon status` and `ps` show what the daemon prefetched at start (/v1/status "prefetched",
daemon/prefetch.py) and its warm-up; a stand-in status dict, so only the rendering is under test here (a real
daemon's: tests/daemon/test_prefetch.py)."""

from __future__ import annotations

from engramctl.cli.status import daemon_fields, prefetch_line

MiB = 2**20


def test_a_finished_prefetch_says_how_many_states_their_bytes_and_how_long():
    p = {"states": 3, "bytes": 12 * MiB, "loading": 0, "skipped": 2, "failed": 0, "done": True, "ms": 420.0}
    assert prefetch_line(p) == "3 recent states in memory (12.0 MiB), in 420 ms (2 did not fit)"


def test_a_prefetch_under_way_says_how_many_still_load():
    p = {"states": 1, "bytes": MiB, "loading": 4, "skipped": 0, "failed": 1, "done": False, "ms": 80.0}
    assert prefetch_line(p) == "1 recent state in memory (1.0 MiB); 4 loading (1 unusable)"


def test_the_status_fields_carry_both_lines_and_nothing_without_them():
    d = {"model": "m", "pid": 7, "ready": True, "warmup_ms": 12.4}
    d["prefetched"] = {"states": 0, "bytes": 0, "loading": 0, "skipped": 0, "failed": 0, "done": True, "ms": 1.0}
    fields = dict(daemon_fields(d))
    assert fields["preload"].startswith("0 recent states in memory")
    assert fields["warm-up"].startswith("12 ms before it was ready")
    assert "preload" not in dict(daemon_fields({"model": "m"})) and "warm-up" not in dict(daemon_fields({}))
