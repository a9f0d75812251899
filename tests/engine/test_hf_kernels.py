"""Which kernels the transformers backend's recurrent layers run (engine/hf_kernels.py), and that
ModelInfo.build says it.

On this machine (CPU torch, no mamba-ssm, no causal-conv1d) a real tiny model takes PyTorch's fallback and
the build line gives the reasons. The kernel side cannot run here: stand-in `mamba_ssm` / `causal_conv1d`
modules go through transformers' own binding decorator (`use_kernel_func_from_hub_with_fallback`, what
every recurrent modeling file applies at import) and the decision reads what it bound; no model runs on them.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from engramctl.engine.hf_kernels import binding_of, describe_model, kernel_path, model_bindings
from engramctl.engine.scan_chunk import ScanChunks, torch_scan_in_use

FALLBACK_HERE = "PyTorch fallback: not on CUDA (cpu); mamba-ssm not installed; causal-conv1d not installed"


@pytest.fixture(autouse=True)
def _no_kernels_here():
    for name in ("mamba_ssm", "causal_conv1d"):
        if importlib.util.find_spec(name) is not None:
            pytest.skip(f"{name} is installed: this machine is not the CPU-only one these cases describe")


def _backend(family: str):
    from engramctl.engine.hf_backend import TransformersBackend
    from engramctl.engine.tokenizer import ChatTokenizer
    from tests.factory import build_model, build_tokenizer

    return TransformersBackend(build_model(family).eval(), ChatTokenizer(build_tokenizer()), f"tiny-{family}")


def test_a_hybrid_on_cpu_takes_the_pytorch_fallback_and_build_says_why():
    backend = _backend("granitemoehybrid")
    ops = {(b.package, b.func_name): b.kernel for b in model_bindings(backend.model)}
    assert ops == {
        ("causal_conv1d", "causal_conv1d_fn"): False,
        ("causal_conv1d", "causal_conv1d_update"): False,
        ("mamba_ssm", "mamba_chunk_scan_combined"): False,
        ("mamba_ssm", "selective_state_update"): False,
        ("mamba_ssm", "mamba_split_conv1d_scan_combined"): False,
    }
    version = torch.__version__.split("+")[0]
    assert backend.info.build == f"torch {version}, CPU; recurrent layers: {FALLBACK_HERE}"
    assert backend.scan_chunks.mixers  # the PyTorch scan runs, so its chunk is fitted (scan_chunk.py)


def test_a_plain_attention_model_adds_nothing_to_the_build():
    backend = _backend("llama")
    assert model_bindings(backend.model) == [] and describe_model(backend.model, "cpu") == ""
    assert backend.info.build == f"torch {torch.__version__.split('+')[0]}, CPU"


def _bind(monkeypatch, *, conv: bool = True) -> list:
    """Stand-in packages laid out as mamba-ssm 2.x and causal-conv1d are (mamba-ssm's scan only under
    ops.triton.ssd_combined, not at its root), bound by transformers' real decorator."""
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback as bind

    def stub(x, dt, A, B, C, chunk_size, D=None, **kwargs):
        raise AssertionError("a stand-in kernel never runs")

    parts = ["mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined"]
    for name in parts:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for parent, child in zip(parts, parts[1:]):
        setattr(sys.modules[parent], child.rsplit(".", 1)[1], sys.modules[child])
    sys.modules[parts[-1]].mamba_chunk_scan_combined = stub
    if conv:
        cc = types.ModuleType("causal_conv1d")
        cc.causal_conv1d_fn = cc.causal_conv1d_update = stub
        monkeypatch.setitem(sys.modules, "causal_conv1d", cc)

    def reference(x, dt, A, B, C, chunk_size, D=None, **kwargs):
        return None

    ops = [bind("mamba_chunk_scan_combined", "mamba_ssm")(reference)]
    ops += [bind(name, "causal_conv1d")(reference) for name in ("causal_conv1d_fn", "causal_conv1d_update")]
    return ops


def test_with_both_packages_on_cuda_the_kernels_are_picked(monkeypatch):
    bindings = [binding_of(op) for op in _bind(monkeypatch)]
    assert all(b is not None and b.kernel for b in bindings)
    path = kernel_path("cuda:0", bindings)
    assert path.all_kernels and path.describe() == "mamba-ssm + causal-conv1d CUDA kernels"
    # transformers never checks the device: bound kernels on a CPU model are said to be there, not hidden
    assert (
        kernel_path("cpu", bindings).describe()
        == "mamba-ssm + causal-conv1d kernels bound on a cpu model (they need CUDA tensors)"
    )


def test_a_missing_causal_conv1d_leaves_the_convolution_on_pytorch(monkeypatch):
    path = kernel_path("cuda:0", [binding_of(op) for op in _bind(monkeypatch, conv=False)])
    assert not path.all_kernels
    assert path.describe() == "mamba-ssm CUDA kernels, the other ops PyTorch fallback: causal-conv1d not installed"


def test_a_package_that_fails_to_import_is_named_with_its_error(tmp_path, monkeypatch):
    pkg = tmp_path / "causal_conv1d"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback as bind

    op = bind("causal_conv1d_fn", "causal_conv1d")(lambda x, weight, bias=None, activation=None: x)
    assert kernel_path("cuda", [binding_of(op)]).describe() == (
        "PyTorch fallback: causal-conv1d does not import: libcudart.so.12: cannot open shared object file"
    )


def test_the_scan_chunk_is_left_alone_when_mamba_ssm_runs_the_scan(monkeypatch):
    """scan_chunk.py fits the chunk for the PyTorch scan only; the old probe (`mamba_ssm.mamba_chunk_scan_combined`
    at the package root) missed mamba-ssm 2.x, which keeps it under ops.triton.ssd_combined."""
    scan = _bind(monkeypatch)[0]
    modeling = types.ModuleType("stand_in_modeling")
    modeling.mamba2_chunk_scan = scan
    monkeypatch.setitem(sys.modules, modeling.__name__, modeling)
    mixer_cls = type("StandInMixer", (torch.nn.Module,), {"__module__": modeling.__name__})
    model = mixer_cls()
    model.chunk_size = 256
    assert not torch_scan_in_use(model)
    assert ScanChunks.find(model, "StandInMixer").mixers == []
    monkeypatch.setattr(modeling, "mamba2_chunk_scan", lambda *a: None)  # an unbound scan: fitted again
    assert torch_scan_in_use(model) and ScanChunks.find(model, "StandInMixer").base_tokens == [256]
