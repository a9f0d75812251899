"""An N-gram layer in one piece: seeded construction, the flat-table lookup and its forward."""

from __future__ import annotations

import torch

from engramctl.ngram.hashing import NgramConfig, NgramHasher
from engramctl.ngram.layer import NgramStack, gather_rows

CFG = NgramConfig(n_head_per_ngram=2, n_embed_per_ngram=8, engram_vocab_size=[31, 37], layer_ids=[0, 2], seed=5)


def _stack(hidden=12):
    return NgramStack(CFG, NgramHasher(CFG, 50, compressed_pad_id=1), hidden)


def test_layers_are_seeded_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b = _stack(), _stack()
    assert torch.equal(torch.rand(3), before)  # building did not draw from the caller's stream
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.layer(0).table.weight[:5], a.layer(2).table.weight[:5])  # one stream per layer
    layer = a.layer(2)
    assert layer.table.weight.shape == (a.hasher.rows(2), 4) and layer.primes.tolist() == a.hasher.primes(2).tolist()


def test_rows_are_read_at_offset_plus_local_index_in_column_order():
    stack = _stack()
    layer = stack.layer(0)
    local = stack.hasher.hash([[3, 9, 9, 4]])[0]  # (1, 4, 4)
    rows = torch.from_numpy(local) + layer.offsets
    memory = gather_rows(layer.table, rows)
    assert memory.shape == (1, 4, 4 * 4)
    t, col = 2, 3  # position 2, order 3 head 1
    row = int(stack.hasher.offsets(0)[col] + local[0, t, col])
    assert torch.equal(memory[0, t, col * 4 : (col + 1) * 4], layer.table.weight[row])
    assert (rows < stack.hasher.rows(0)).all()


def test_forward_is_the_fusion_over_the_looked_up_rows():
    stack = _stack()
    layer = stack.layer(2)
    hidden = torch.randn(1, 4, 12)
    local = stack.hasher.hash([[3, 9, 9, 4]])[2]
    with torch.no_grad():
        out, state = layer(hidden, local, None)
        memory = gather_rows(layer.table, torch.from_numpy(local) + layer.offsets)
        want, want_state = layer.fusion(hidden.unsqueeze(2), memory, None)
    assert torch.equal(out, want.squeeze(2)) and torch.equal(state, want_state)
    assert state.shape == (1, 12, layer.conv_state_len) == (1, 12, 9)
