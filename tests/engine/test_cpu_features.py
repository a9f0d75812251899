"""The start-up check of the llama.cpp build against the machine (engine/cpu_features.py): a build compiled for
instructions this CPU does not report refuses to load, in words, before any kernel runs; the build installed here
passes on this machine."""

from __future__ import annotations

import pytest

from engramctl.engine import cpu_features, llama_lib
from engramctl.engine.cpu_features import REBUILD_HINT, SIGILL_SENTENCE, check, machine_flags, missing
from engramctl.errors import CpuUnsupported

AVX2_ONLY = frozenset("fpu sse2 pni ssse3 avx avx2 f16c fma bmi2".split())
BUILT_FOR_SAPPHIRE_RAPIDS = ("SSE3", "AVX", "AVX2", "F16C", "FMA", "AVX512", "AVX512_VNNI", "AMX_INT8", "LLAMAFILE")


def test_cpuinfo_flags_are_read_from_the_first_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx avx2 amx_int8\n\nprocessor\t: 1\n")
    assert machine_flags(info) == frozenset({"fpu", "avx", "avx2", "amx_int8"})
    info.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # aarch64: nothing of ours to compare
    assert machine_flags(info) is None and machine_flags(tmp_path / "absent") is None


def test_a_build_for_a_newer_cpu_is_refused_naming_what_is_missing():
    assert missing(BUILT_FOR_SAPPHIRE_RAPIDS, AVX2_ONLY) == ["AVX512", "AVX512_VNNI", "AMX_INT8"]
    with pytest.raises(CpuUnsupported) as e:
        check(BUILT_FOR_SAPPHIRE_RAPIDS, AVX2_ONLY)
    assert e.value.message.startswith(SIGILL_SENTENCE)
    assert "compiled for AVX512, AVX512_VNNI, AMX_INT8, which this CPU does not report" in e.value.message
    assert e.value.hint == REBUILD_HINT and e.value.kind == "cpu_unsupported"
    check(("SSE3", "AVX2", "FMA", "LLAMAFILE", "REPACK", "OPENMP"), AVX2_ONLY)  # not instruction sets: not checked
    check(BUILT_FOR_SAPPHIRE_RAPIDS, None)  # no flags to read: no check


def test_the_installed_build_fits_this_machine():
    pytest.importorskip("llama_cpp")
    from engramctl.engine.llama_build import compiled_cpu_features

    lib = llama_lib.import_llama_cpp()
    compiled = compiled_cpu_features(lib.llama_print_system_info().decode())
    assert "AVX2" in compiled or "SSE3" in compiled  # an x86 build lists its instruction sets
    assert missing(compiled, machine_flags()) == []


def test_the_daemon_engine_refuses_to_load_on_a_cpu_the_build_does_not_fit(gguf_zoo, monkeypatch):
    """A venv copied to an older machine: the stand-in machine reports AVX2 only, the build has AVX-512."""
    pytest.importorskip("llama_cpp")
    from engramctl.engine.llama_build import compiled_cpu_features
    from engramctl.engine.loading import load_engine

    compiled = compiled_cpu_features(llama_lib.import_llama_cpp().llama_print_system_info().decode())
    older = frozenset(flag for flag in machine_flags() or () if not flag.startswith("avx512"))
    monkeypatch.setattr(cpu_features, "machine_flags", lambda: older)
    monkeypatch.setattr(llama_lib, "_state", {})  # as in a fresh daemon: the library is checked when imported
    gguf = gguf_zoo.path("granitemoehybrid")
    if not missing(compiled, older):
        pytest.skip("this build has no AVX-512 to take away")
    with pytest.raises(CpuUnsupported) as e:
        load_engine(str(gguf), gguf.parent, "cpu", backend="llama.cpp")
    assert e.value.message.startswith(SIGILL_SENTENCE) and "AVX512" in e.value.message
