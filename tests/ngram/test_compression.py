"""Tokenizer compression (spec §2.2): which tokens merge, first-seen ids, padded-vocabulary ids, the
persisted file, and the unicodedata normaliser against the HF `tokenizers` chain the demo runs."""

from __future__ import annotations

import numpy as np
import pytest

from engramctl.errors import SnapshotCorrupt, UsageError
from engramctl.ngram.compression import TokenMap, build_from_decoder, build_token_map, demo_normalizer, identity_map


def test_normaliser_folds_case_accents_width_and_whitespace():
    norm = demo_normalizer()
    cases = {
        "Apple": "apple",
        " apple": "apple",
        "\u00e1": "a",
        "e\u0301": "e",
        "Ａｂｃ": "abc",
        "ﬁ": "fi",
        "ΣΑΣ": "σασ",  # one character at a time: no final-sigma rule
        "\t\n": " ",  # whitespace-only tokens all keep the key " "
        " \r\n ": " ",
        " x ": "x",
        "a \t b": "a b",
        "<|im_end|>": "<|im_end|>",
    }
    assert {s: norm.normalize_str(s) for s in cases} == cases


def test_merges_first_seen_ids_and_partial_utf8_pieces():
    decoded = ["<pad>", "Apple", " apple", "\n", "  ", "\u00e1", "a", "\ufffd", "\ufffd", "apple"]
    raw = ["<pad>", "Apple", "Ġapple", "Ċ", "ĠĠ", "Ã¡", "a", "<0xE2>", "<0x82>", "apple"]
    m = build_token_map(decoded, raw)
    assert m.token_map.dtype == np.int32
    # pad 0; apple x3 -> 1; whitespace -> 2; á and a -> 3; the two partial pieces stay apart by raw string
    assert m.token_map.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 5, 1]
    assert m.compressed_vocab_size == 6
    # without raw strings the partial pieces fall back to their decoded text (and merge)
    assert build_token_map(decoded).token_map.tolist()[7:9] == [4, 4]
    with pytest.raises(UsageError):
        build_token_map(decoded, raw[:-1])


def test_compress_maps_padded_vocabulary_slots_to_the_pad_and_refuses_negatives():
    m = build_token_map(["x", "X", "<pad>", "y"])
    assert m.compressed_pad(2) == 1
    assert m.compress([[0, 1, 3, 4, 700]], pad_id=2).tolist() == [[0, 0, 2, 1, 1]]
    with pytest.raises(UsageError):
        m.compress([-1], pad_id=2)
    with pytest.raises(UsageError):
        m.compressed_pad(9)


def test_a_real_tokenizer_compresses_surjectively_and_deterministically():
    from engramctl.bench import presets

    tok = presets.build_tokenizer(presets.VOCAB)
    one = build_from_decoder(len(tok), lambda t: tok.decode([t], skip_special_tokens=False), tok.convert_ids_to_tokens)
    again = build_from_decoder(
        len(tok), lambda t: tok.decode([t], skip_special_tokens=False), tok.convert_ids_to_tokens
    )
    assert np.array_equal(one.token_map, again.token_map) and one.source == again.source
    assert 0 < one.compressed_vocab_size < len(tok)  # byte-level BPE: case and leading-space variants merge
    assert set(one.token_map.tolist()) == set(range(one.compressed_vocab_size))
    first = {}  # ids are handed out in first-seen order over ascending raw ids
    for t, c in enumerate(one.token_map.tolist()):
        first.setdefault(c, t)
    assert list(first) == list(range(one.compressed_vocab_size))
    ids = tok.encode("Hello hello HELLO", add_special_tokens=False)
    assert len(set(one.compress(ids, pad_id=presets.PAD_ID).tolist())) < len(set(ids))


def test_saved_map_loads_back_and_a_foreign_file_is_refused(tmp_path):
    m = build_token_map(["a", "A", "b"])
    path = tmp_path / "map.safetensors"
    m.save(path)
    back = TokenMap.load(path)
    assert np.array_equal(back.token_map, m.token_map) and back.compressed_vocab_size == 2 and back.source == m.source
    assert identity_map(5).compress([4, 9], pad_id=1).tolist() == [4, 1]
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(SnapshotCorrupt):
        TokenMap.load(path)
