import pytest
import torch

from engramctl.engine import device
from engramctl.errors import UsageError


def test_bf16_detection_reads_cpu_flags(tmp_path):
    avx2 = tmp_path / "avx2"
    avx2.write_text("flags\t: fpu sse avx avx2 fma\n")
    amx = tmp_path / "amx"
    amx.write_text("flags\t: avx2 avx512f avx512_bf16 amx_bf16\n")
    assert not device.cpu_has_native_bf16(avx2)
    assert device.cpu_has_native_bf16(amx)
    assert not device.cpu_has_native_bf16(tmp_path / "missing")


def test_auto_dtype_on_cpu_follows_native_bf16(monkeypatch):
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    assert device.pick_dtype("auto", "cpu") is torch.float32
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    assert device.pick_dtype("auto", "cpu") is torch.bfloat16
    assert device.pick_dtype("auto", "cuda") is torch.bfloat16
    assert device.pick_dtype("float16", "cpu") is torch.float16


def test_bad_device_and_dtype_are_usage_errors():
    with pytest.raises(UsageError):
        device.pick_dtype("float8", "cpu")
    with pytest.raises(UsageError):
        device.pick_device("tpu")
    if not torch.cuda.is_available():
        assert device.pick_device("auto") == "cpu"
        with pytest.raises(UsageError, match="no CUDA"):
            device.pick_device("cuda")
