"""Fill-in-the-middle prompts (engine/fim.py): a vocabulary's FIM tokens are found by their spelling as
special tokens, the prompt is prefix-suffix-middle, and a vocabulary without them is refused naming `suffix`."""

from __future__ import annotations

import pytest

from engramctl.engine.fim import fim_ids, infill_ids
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import UsageError
from tests.factory import VOCAB, build_tokenizer


def test_a_vocabulary_with_fim_tokens_gets_a_psm_prompt():
    hf = build_tokenizer(VOCAB)
    hf.add_special_tokens({"additional_special_tokens": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]})
    tok = ChatTokenizer(hf)
    pre, suf, mid = fim_ids(tok)
    assert [hf.convert_ids_to_tokens(i) for i in (pre, suf, mid)] == ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    prefix = tok.encode("def add(a, b):\n    return ")
    ids = infill_ids(tok, prefix, "\nprint(add(1, 2))")
    assert ids == [pre, *prefix, suf, *tok.encode("\nprint(add(1, 2))"), mid]


def test_a_plain_spelling_is_not_a_fim_token():
    """ "<fim_prefix>" as ordinary text (several tokens, shown as text) is no FIM token: refused, naming suffix."""
    tok = ChatTokenizer(build_tokenizer(VOCAB))
    assert len(tok.encode("<fim_prefix>")) > 1 and fim_ids(tok) is None
    with pytest.raises(UsageError, match="^suffix: this model has no fill-in-the-middle tokens"):
        infill_ids(tok, tok.encode("x"), "y")
