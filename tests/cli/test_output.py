"""The output module: tables, fields, modes, errors."""

from __future__ import annotations

import io

from engramctl.cli.output import JSON, QUIET, Column, Output, ago, render_fields, render_table, short_ids, size


def test_render_table_borderless_uppercase_aligned():
    rows = [{"name": "demo", "n": 1200}, {"name": "a-much-longer-name", "n": 3}]
    text = render_table(rows, [Column("name", "name"), Column("tokens", "n", ">", lambda v: f"{v:,}")])
    lines = text.splitlines()
    assert lines[0] == "NAME                TOKENS"
    assert lines[1] == "demo                 1,200"
    assert lines[2] == "a-much-longer-name       3"
    assert all(line == line.rstrip() for line in lines)


def test_render_table_cells_and_last_column():
    """None and "" read "-" (no formatter); a left-aligned last column is not padded; a callable key is called."""
    rows = [{"a": None, "b": "x"}, {"a": "", "b": "longer"}, {"a": 7, "b": ""}]
    cols = [Column("a", "a"), Column("len", lambda r: len(r["b"]), ">"), Column("b", "b")]
    assert render_table(rows, cols).splitlines() == ["A  LEN  B", "-    1  x", "-    6  longer", "7    0  -"]
    assert render_table([], cols) == "A  LEN  B"
    assert cols[1].cell(rows[1]) == "6"


def test_render_fields():
    assert render_fields([("id", "x"), ("last used", None)]) == "ID         x\nLAST USED  -"


def test_short_ids_unique_and_at_least_12():
    ids = ["0123456789ab" + "0" * 20, "0123456789ab" + "1" + "0" * 19, "fedcba987654" + "0" * 20]
    short = short_ids(ids)
    assert len(set(short.values())) == 3
    assert short[ids[2]] == "fedcba987654"
    assert short[ids[0]] == "0123456789ab0" and all(ids_.startswith(s) for ids_, s in short.items())


def test_short_ids_are_the_shortest_unique_prefixes():
    """Against the definition, over ids that share long prefixes (snapshot ids made in one millisecond do): each
    id's prefix is the shortest of at least 12 characters that no other id starts with."""
    import random

    rng = random.Random(0)
    stems = ["01a22480a4", "01a22480a5", "ffff"]
    ids = {rng.choice(stems) + "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(2, 22)))}
    while len(ids) < 400:
        base = rng.choice(sorted(ids))
        cut = rng.randint(0, len(base))
        ids.add(base[:cut] + "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(1, 8))))
    short = short_ids(ids)
    for sid in ids:
        others = [o for o in ids if o != sid]
        n = next((n for n in range(12, len(sid) + 1) if not any(o.startswith(sid[:n]) for o in others)), len(sid))
        assert short[sid] == sid[:n], sid


def test_human_units():
    assert size(1536) == "1.5 KiB" and size(None) == "-"
    assert ago(100.0, now=100.5) == "just now"
    assert ago(100.0, now=160.0) == "1.0 min ago" or ago(100.0, now=160.0).endswith("ago")


def test_modes_route_streams():
    out, err = io.StringIO(), io.StringIO()
    o = Output(JSON, stdout=out, stderr=err)
    o.table([{"id": "a"}], [Column("ID", "id")])
    o.note("progress")
    assert out.getvalue().strip().startswith("[") and err.getvalue() == "progress\n"

    out, err = io.StringIO(), io.StringIO()
    q = Output(QUIET, stdout=out, stderr=err)
    q.table([{"id": "a"}, {"id": "b"}], [Column("ID", "id")])
    q.note("dropped")
    q.warn("kept")
    assert out.getvalue() == "a\nb\n" and err.getvalue() == "Warning: kept\n"


def test_error_and_hint():
    err = io.StringIO()
    Output(stderr=err).error("no such thing.", "engramctl snapshots ls")
    assert err.getvalue() == "Error: no such thing.\nHint: engramctl snapshots ls\n"


def test_json_output_is_the_standard_librarys():
    """emit_json writes with orjson; the text is json.dumps(indent=2, ensure_ascii=False)'s."""
    import json
    from dataclasses import dataclass
    from pathlib import Path

    from engramctl.cli.output import _json_default, dumps_indented
    from engramctl.protocol import Snapshot

    @dataclass
    class Wire:
        x: int

        def to_json(self):
            return {"wire": self.x}

    snap = Snapshot("a" * 32, "s", None, 8, 10, None, None, None, 2, 1764372000.123456, 1.5, False, None, True)
    cases = [
        [],
        {},
        [{"id": "é→ü", "n": 0, "big": 2**62, "f": 1764372000.123456, "neg": -0.25, "none": None, "t": True}],
        {"nested": {"list": [[], [1, [2, {}]], ["disk"]], "tuple": (1, "a")}, "empty": {"a": []}},
        {"path": Path("/tmp/x"), "obj": Wire(3), "snap": snap, "set": {7}},
        'a string\nwith "quotes" and \\ and \x01',
    ]
    for obj in cases:
        assert dumps_indented(obj) == json.dumps(obj, indent=2, ensure_ascii=False, default=_json_default), obj
    # what orjson refuses, the standard library writes
    for obj in ({1: "int key"}, [2**70]):
        assert dumps_indented(obj) == json.dumps(obj, indent=2, ensure_ascii=False, default=_json_default)
    assert json.loads(dumps_indented({"ratio": float("nan")})) == {"ratio": None}  # NaN is not JSON
    assert json.loads(dumps_indented([1e16, 1e-7])) == [1e16, 1e-7]  # the same numbers, exponent spelled 1e16


def test_emit_json_writes_the_same_text_to_any_stream():
    """To a UTF-8 text stream over bytes emit_json writes orjson's bytes, after what was written as text before; to
    a stream without bytes beneath (StringIO) or of another encoding, the same text."""
    import json

    obj = [{"id": "é→ü", "n": 1, "f": 1764372000.123456, "l": ["disk"]}]
    expected = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    raw = io.BytesIO()
    utf8 = io.TextIOWrapper(raw, encoding="utf-8", write_through=False)
    out = Output(JSON, stdout=utf8)
    out.write("before\n", flush=False)  # still in the text layer's buffer
    out.emit_json(obj)
    assert raw.getvalue().decode() == "before\n" + expected
    text = io.StringIO()
    Output(JSON, stdout=text).emit_json(obj)
    assert text.getvalue() == expected
    raw = io.BytesIO()
    utf16 = io.TextIOWrapper(raw, encoding="utf-16")
    Output(JSON, stdout=utf16).emit_json(obj)
    utf16.flush()
    assert raw.getvalue().decode("utf-16") == expected
    text = io.StringIO()
    Output(JSON, stdout=text).emit_json({1: [2**70]})  # orjson refuses: the standard library's text
    assert text.getvalue() == json.dumps({1: [2**70]}, indent=2) + "\n"
