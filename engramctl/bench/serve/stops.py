"""The token ids that end a reply on a GGUF model (llama.cpp's end-of-generation set), so that the bench can
ask both servers for replies of a fixed length: `no_end(gguf)` is a logit_bias banning every one of them."""

from __future__ import annotations

from pathlib import Path

from engramctl.errors import UnsupportedModel


def end_of_generation_ids(gguf: Path) -> list[int]:
    """Every token that ends a reply (<|im_end|>, <|endoftext|>, ...): the daemon's stop set, GgufTokenizer's
    eos_ids, which holds llama.cpp's end-of-generation tokens (llama-server's), read from the file's vocabulary
    alone (no weights loaded)."""
    from engramctl.engine.gguf_tokenizer import GgufTokenizer
    from engramctl.engine.llama_lib import import_llama_cpp

    lib = import_llama_cpp()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(gguf).encode(), params)
    if not model:
        raise UnsupportedModel(f"llama.cpp could not read the vocabulary of {gguf.name}.")
    try:
        return sorted(GgufTokenizer(lib, model, None).eos_ids)
    finally:
        lib.llama_model_free(model)


def no_end(gguf: Path) -> dict:
    """Sampling fields (OpenAI's logit_bias, which both servers take) that keep a reply from ending before
    max_tokens."""
    return {"logit_bias": {str(t): -100 for t in end_of_generation_ids(gguf)}}
