"""A stream's per-token JSON made once and filled (daemon/json_frame.py)."""

from __future__ import annotations

import json

import pytest

from engramctl.daemon.json_frame import Frame, encode, slot

TEXTS = ["", "Hello", ' "quoted" \\ back', "naïve – 日本語 🙂", slot(0), slot(1), "line\nbreak\t\x01", "\ud800"]


@pytest.mark.parametrize("text", TEXTS)
def test_a_filled_frame_is_the_object_encoded_whole(text):
    shape = {"a": 1, "at": "{}", "nested": {"list": [None, True], "text": "{}"}, "z": "{}"}
    frame = Frame({**shape, "at": slot(0), "nested": {**shape["nested"], "text": slot(1)}, "z": slot(0)})
    for _ in range(2):
        got = frame.fill("2026-11-25T06:00:00Z", text)
        assert got == encode(
            {
                **shape,
                "at": "2026-11-25T06:00:00Z",
                "nested": {**shape["nested"], "text": text},
                "z": "2026-11-25T06:00:00Z",
            }
        )
    assert json.loads(got)["nested"]["text"] == text


def test_slots_fill_in_the_order_they_are_numbered_not_where_they_stand():
    frame = Frame({"second": slot(1), "first": slot(0)})
    assert json.loads(frame.fill("one", "two")) == {"second": "two", "first": "one"}
    assert Frame({"plain": 1}).fill() == encode({"plain": 1})


def test_encode_keeps_utf8_as_is():
    assert encode({"t": "é"}) == '{"t": "é"}' == json.dumps({"t": "é"}, ensure_ascii=False)
