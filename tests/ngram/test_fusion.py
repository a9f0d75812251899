"""The fusion against references written from the spec's pseudo-code (§2.6, §2.7, §2.10, §2.11), and
the conv state: a sequence fed in chunks or token by token gives what it gives fed whole."""

from __future__ import annotations

import math

import pytest
import torch

from engramctl.errors import UsageError
from engramctl.ngram.fusion import NgramFusion, NgramFusionV41, signed_sqrt_sigmoid
from engramctl.ngram.shortconv import ShortConv

B, T, M, D, D_MEM = 2, 23, 2, 16, 24


def _rms(x, weight, eps):
    return x / math.sqrt(float((x * x).mean()) + eps) * weight


def _gate(s):
    return 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(s), 1e-6)), s))) if s else 0.5


def reference_engram(f: NgramFusion, hidden, memory):
    """Spec §2.10 engram_forward, one token and branch at a time; the conv as F.conv1d padded on both
    sides and cut to the first T outputs, the way the demo writes it."""
    eps_qk = torch.finfo(hidden.dtype).eps
    u = torch.zeros_like(hidden)
    for b in range(hidden.shape[0]):
        for t in range(hidden.shape[1]):
            e = memory[b, t]
            v = f.value_proj.weight @ e + f.value_proj.bias
            for m in range(f.branches):
                k = f.key_projs[m].weight @ e + f.key_projs[m].bias
                q = _rms(hidden[b, t, m], f.query_norms[m].weight, eps_qk)
                s = float(q @ _rms(k, f.key_norms[m].weight, eps_qk)) / math.sqrt(f.hidden_size)
                u[b, t, m] = _gate(s) * v
    sc = f.short_conv
    normed = torch.zeros_like(u)
    for b in range(u.shape[0]):
        for t in range(u.shape[1]):
            for m in range(f.branches):
                normed[b, t, m] = _rms(u[b, t, m], sc.norms[m].weight, 1e-5)
    x = normed.flatten(2).transpose(1, 2)  # (B, M*D, T)
    pad = (sc.kernel_size - 1) * sc.dilation
    conv = torch.nn.functional.conv1d(x, sc.weight.unsqueeze(1), padding=pad, dilation=sc.dilation, groups=x.shape[1])[
        ..., : x.shape[-1]
    ]
    y = u + torch.nn.functional.silu(conv).transpose(1, 2).reshape(u.shape)
    return hidden + y


def _module(seed=0, **kw):
    torch.manual_seed(seed)
    f = NgramFusion(D_MEM, D, branches=M, kernel_size=4, dilation=3, **kw)
    with torch.no_grad():  # non-trivial norm weights and biases, so a swapped one shows
        for p in f.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return f


def _inputs(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, M, D, generator=g, dtype=dtype), torch.randn(B, T, D_MEM, generator=g, dtype=dtype)


def test_forward_matches_the_spec_reference():
    f = _module().double()
    hidden, memory = _inputs(torch.float64)
    with torch.no_grad():
        got, state = f(hidden, memory)
        want = reference_engram(f, hidden, memory)
    assert (got - want).abs().max().item() < 1e-12
    assert state.shape == (B, M * D, 9)  # (w-1)*dilation = 9 normalised positions per channel


def test_signed_sqrt_gate_values():
    s = torch.tensor([-4.0, -1e-9, 0.0, 1e-9, 0.25, 4.0])
    want = torch.tensor([_gate(float(v)) for v in s])
    assert torch.allclose(signed_sqrt_sigmoid(s), want, atol=1e-7)
    assert signed_sqrt_sigmoid(torch.tensor(4.0)).item() == pytest.approx(1 / (1 + math.exp(-2)))


def test_zero_initialised_conv_passes_the_gated_value_through():
    f = _module(conv_zero_init=False)
    hidden, memory = _inputs()
    with torch.no_grad():
        torch.nn.init.zeros_(f.short_conv.weight)
        out, _ = f(hidden, memory)
        u = f.gates(hidden, memory) * f.value_proj(memory).unsqueeze(2)
    assert torch.equal(out, hidden + u)
    assert not NgramFusion(D_MEM, D, conv_zero_init=True).short_conv.weight.any()


@pytest.mark.parametrize("chunks", [[1] * T, [4, 1, 9, 9], [9, 14]], ids=["token-by-token", "ragged", "two"])
def test_conv_state_makes_chunked_and_token_by_token_equal_whole(chunks):
    """The conv itself is bitwise chunk-invariant (each output one fixed-order sum of taps). The whole
    module is held to 1e-6 relative (a few float32 ulps), not bitwise: its projections are GEMMs, and a
    GEMM's blocking, hence its float summation order, may depend on how many rows (tokens) it gets."""
    torch.manual_seed(3)
    conv = ShortConv(D, M, kernel_size=4, dilation=3)
    f = _module()
    hidden, memory = _inputs()
    u = torch.randn(B, T, M, D)
    with torch.no_grad():
        whole_conv, whole_conv_state = conv(u)
        whole, whole_state = f(hidden, memory)
        conv_parts, parts, conv_state, state, pos = [], [], None, None, 0
        for n in chunks:
            y, conv_state = conv(u[:, pos : pos + n], conv_state)
            out, state = f(hidden[:, pos : pos + n], memory[:, pos : pos + n], state)
            conv_parts.append(y)
            parts.append(out)
            pos += n
    assert pos == T
    assert torch.equal(torch.cat(conv_parts, dim=1), whole_conv) and torch.equal(conv_state, whole_conv_state)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, whole_state, rtol=1e-6, atol=1e-6)


def test_a_restored_conv_state_resumes_exactly():
    f = _module()
    hidden, memory = _inputs()
    with torch.no_grad():
        _, state = f(hidden[:, :10], memory[:, :10])
        saved = state.clone()  # what a snapshot holds
        live, _ = f(hidden[:, 10:], memory[:, 10:], state)
        resumed, _ = f(hidden[:, 10:], memory[:, 10:], saved)
        fresh, _ = f(hidden[:, 10:], memory[:, 10:])
    assert torch.equal(live, resumed) and not torch.allclose(live, fresh)


def reference_v41(f: NgramFusionV41, hidden, memory, mask):
    out = hidden.clone()
    d = f.hidden_size
    for b in range(hidden.shape[0]):
        for t in range(hidden.shape[1]):
            kv = f.wkv.weight @ memory[b, t]
            v = kv[f.branches * d :]
            for m in range(f.branches):
                q = _rms(hidden[b, t, m], f.q_weight[m], f.eps)
                k = _rms(kv[m * d : (m + 1) * d], f.k_weight[m], f.eps)
                alpha = _gate(float(q @ k) / math.sqrt(d)) if mask[b, t] else 0.0
                out[b, t, m] = hidden[b, t, m] + alpha * v
    return out


def test_v41_variant_matches_its_reference_and_masks_non_text():
    torch.manual_seed(5)
    f = NgramFusionV41(D_MEM, D, branches=M).double()
    with torch.no_grad():
        f.q_weight.add_(0.3 * torch.randn_like(f.q_weight))
        f.k_weight.add_(0.3 * torch.randn_like(f.k_weight))
    hidden, memory = _inputs(torch.float64)
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(2)) > 0.3
    with torch.no_grad():
        got = f(hidden, memory, mask)
        want = reference_v41(f, hidden, memory, mask)
    assert (got - want).abs().max().item() < 1e-12
    assert torch.equal(got[~mask], hidden[~mask])


def test_wrong_shapes_are_refused():
    f = _module()
    hidden, memory = _inputs()
    with pytest.raises(UsageError):
        f(hidden[:, :, :1], memory)
    with pytest.raises(UsageError):
        f(hidden, memory[:, :5])
    with pytest.raises(UsageError):
        f(hidden, memory, torch.zeros(B, M * D, 4))
