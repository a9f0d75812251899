"""The GGUF's own tokenizer and chat template (llama.cpp vocabulary + Jinja from tokenizer.chat_template)
give the same text, token ids and end-of-turn tokens as the transformers tokenizer of the same model."""

from __future__ import annotations

import pytest

from engramctl.engine.chat import is_prefix_stable

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo wörld, ça va? 日本語 🙂"},
    {"role": "assistant", "content": "Fine, thanks."},
    {"role": "user", "content": "And the weather?"},
]


@pytest.fixture(scope="module")
def both(gguf_zoo, load_llama, load_backend, zoo):
    return load_backend(zoo.path("granitemoehybrid")).tokenizer, load_llama(gguf_zoo.path("granitemoehybrid")).tokenizer


def test_render_encode_decode_match_transformers(both):
    hf, gg = both
    for gen in (True, False):
        assert gg.render(CHAT, add_generation_prompt=gen) == hf.render(CHAT, add_generation_prompt=gen)
    text = gg.render(CHAT)
    ids = gg.encode(text)
    assert ids == hf.encode(text)
    assert gg.decode(ids, skip_special=False) == text
    assert gg.decode(ids) == hf.decode(ids)  # specials dropped the same way
    # llama.cpp also ends a turn on <|endoftext|> (it marks end-of-generation tokens by name), as
    # llama-server and Ollama do; transformers only on the configured eos <|im_end|>
    assert gg.eos_ids == hf.eos_ids | {0}
    assert is_prefix_stable(gg)


def test_a_window_of_a_reply_decodes_to_its_own_text(both):
    _, gg = both
    ids = gg.encode(" one two three")
    assert "".join(gg.decode([i]) for i in ids) == " one two three"  # no leading space is dropped


def test_a_model_without_template_cannot_chat(both):
    from engramctl.engine.gguf_tokenizer import GgufTokenizer
    from engramctl.errors import UnsupportedModel

    _, gg = both
    bare = object.__new__(GgufTokenizer)
    bare.chat_template = None
    assert not bare.has_chat_template
    with pytest.raises(UnsupportedModel, match="no chat template"):
        bare.render(CHAT)
