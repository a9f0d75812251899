from __future__ import annotations

import shutil
import subprocess
import sys

import psutil

from engramctl.tiers.hardware import cpu_model, detect_hardware


def test_figures_match_psutil(engram_home):
    hw = detect_hardware(engram_home)  # need not exist yet: measured on its nearest existing parent
    vm = psutil.virtual_memory()
    assert hw.ram_total_bytes == vm.total
    assert abs(hw.ram_available_bytes - vm.available) < 0.05 * vm.total
    assert hw.cpu_threads == psutil.cpu_count(logical=True)
    assert hw.cpu_cores == (psutil.cpu_count(logical=False) or hw.cpu_threads)
    disk = shutil.disk_usage(engram_home.parent)
    assert hw.disk_total_bytes == disk.total
    assert abs(hw.disk_free_bytes - disk.free) < 2**30
    assert hw.cpu == cpu_model() and hw.cpu
    assert (hw.vram_total_bytes is None) == (hw.gpu is None)


def test_detection_never_imports_torch():
    code = (
        "import sys; from engramctl.tiers.hardware import detect_hardware; "
        "detect_hardware('.'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_json_has_the_documented_keys(engram_home):
    j = detect_hardware(engram_home).to_json()
    for k in ("ram_total_bytes", "ram_available_bytes", "vram_total_bytes", "disk_free_bytes", "cpu", "gpu"):
        assert k in j


def test_nvidia_smi_is_read_for_a_llama_cpp_without_ggml_device_calls(tmp_path, monkeypatch):
    from engramctl.tiers.hardware import nvidia_smi_memory

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '11000, 12282, NVIDIA GeForce RTX 4070, rev 1'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi_memory() == (11000 << 20, 12282 << 20, "NVIDIA GeForce RTX 4070, rev 1")
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    assert nvidia_smi_memory() is None
    smi.unlink()
    assert nvidia_smi_memory() is None


def test_an_engines_vram_figure_replaces_torchs(engram_home):
    hw = detect_hardware(engram_home, gpu=(3 << 30, 12 << 30, "NVIDIA GeForce RTX 4070"))
    assert (hw.vram_free_bytes, hw.vram_total_bytes, hw.gpu) == (3 << 30, 12 << 30, "NVIDIA GeForce RTX 4070")
    assert hw.has_cuda
