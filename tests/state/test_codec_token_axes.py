"""state/codec.to_payload names the tensors that grow with the tokens and their axis, from the StateSpec (the
dims a TensorSpec marks TOKENS), so the store keeps their full blocks in shared KV blocks: attention keys and
values on both backends (their layouts differ), nothing for a pure recurrent state."""

from __future__ import annotations

import json

import pytest

from engramctl.state.codec import to_payload


def _payload(backend, n_tokens: int = 20):
    live = backend.new_live()
    try:
        backend.prefill(live, list(range(3, 3 + n_tokens)))
        return to_payload(backend.capture(live), backend.spec, {})
    finally:
        backend.release(live)


@pytest.mark.parametrize("family", ["granitemoehybrid", "mamba2"])
def test_token_axes_name_exactly_the_tensors_that_grow_with_the_tokens(family, zoo, load_backend, gguf_zoo, load_llama):
    for backend in (load_backend(zoo.path(family)), load_llama(gguf_zoo.path(family))):
        tensors, meta = _payload(backend)
        axes = json.loads(meta["token_axes"])
        longer, _ = _payload(backend, 37)
        grows = {k for k in tensors if k.startswith("layers.") and longer[k].shape != tensors[k].shape}
        assert set(axes) == grows and (grows != set()) == (family != "mamba2"), backend.spec.backend
        for name, axis in axes.items():
            assert tensors[name].shape[axis] == 20 and longer[name].shape[axis] == 37
