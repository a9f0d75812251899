"""The token ids that end a reply on a GGUF model (llama.cpp's end-of-generation set), so that the bench can
ask both servers for replies of a fixed length: `no_end(gguf)` is a logit_bias banning every one of them."""

from __future__ import annotations

from pathlib import Path

from engramctl.errors import UnsupportedModel


def end_of_generation_ids(gguf: Path) -> list[int]:
    """Every token llama.cpp treats as ending generation (<|im_end|>, <|endoftext|>, ...), read from the file's
    vocabulary alone (no weights loaded). The daemon's own stop set (GgufTokenizer.eos_ids) is built the same way."""
    from engramctl.engine.llama_lib import import_llama_cpp

    lib = import_llama_cpp()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(gguf).encode(), params)
    if not model:
        raise UnsupportedModel(f"llama.cpp could not read the vocabulary of {gguf.name}.")
    try:
        vocab = lib.llama_model_get_vocab(model)
        return [t for t in range(int(lib.llama_vocab_n_tokens(vocab))) if lib.llama_vocab_is_eog(vocab, t)]
    finally:
        lib.llama_model_free(model)


def no_end(gguf: Path) -> dict:
    """Sampling fields (OpenAI's logit_bias, which both servers take) that keep a reply from ending before
    max_tokens."""
    return {"logit_bias": {str(t): -100 for t in end_of_generation_ids(gguf)}}
