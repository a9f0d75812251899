"""Hugging Face model directory -> GGUF (f32, f16 or Q8_0), with the converter llama.cpp itself ships.

The converter (convert_hf_to_gguf.py + its `conversion` package + `gguf-py`) comes from the
llama-cpp-python sdist; scripts/setup.sh copies it to <venv>/share/engramctl/llama.cpp-<version>, or
ENGRAM_LLAMA_CONVERTER names such a directory. It runs in a child process: it must import its own
vendored `gguf` package, not the (older) one from PyPI this process may already hold.

The converter pins transformers 4.x; with transformers 5 three things need care (llama-cpp-notes.md),
fixed here in the converter's view of the model, never in llama.cpp's files:
1. Granite: `layer_types` is written as linear_attention/full_attention; the converter wants mamba/attention.
2. NemotronH: AutoConfig(...).to_dict() fills in `num_experts_per_tok`, so a dense model would be
   exported as nemotron_h_moe; a dense model gets its MoE keys dropped and a classic pattern string.
3. A BPE tokenizer trained offline has a pre-tokenizer hash the converter does not know; only with
   `pretokenizer_fallback` (e.g. "gpt-2") is it mapped instead of refused, because for a real model a
   wrong pre-tokenizer silently changes how text is split.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engramctl.errors import UnsupportedModel

OUTTYPES = ("f32", "f16", "q8_0")
LLAMA_CPP_VERSION = "0.3.36"
CONVERTER_ENV = "ENGRAM_LLAMA_CONVERTER"
_SETUP_HINT = "run scripts/setup.sh (it copies llama.cpp's converter into the venv), or set ENGRAM_LLAMA_CONVERTER"
_NEMOTRON_LETTERS = {
    "linear_attention": "M",
    "mamba": "M",
    "full_attention": "*",
    "attention": "*",
    "mlp": "-",
    "moe": "E",
}
# Expert keys transformers 5 fills into a dense NemotronH config; "n_group"/"topk_group" are expert groups
# (a GGUF with them aborts llama.cpp's loader), unlike "n_groups", the SSM group count.
_MOE_KEYS = (
    "num_experts_per_tok",
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "moe_latent_size",
    "num_experts",
    "n_group",
    "topk_group",
    "mtp_layers_block_type",
)


def converter_dir() -> Path:
    """Where convert_hf_to_gguf.py lives, or UnsupportedModel saying how to get it."""
    env = os.environ.get(CONVERTER_ENV)
    candidates = [Path(env)] if env else [Path(sys.prefix) / "share" / "engramctl" / f"llama.cpp-{LLAMA_CPP_VERSION}"]
    for d in candidates:
        if (d / "convert_hf_to_gguf.py").is_file() and (d / "gguf-py" / "gguf").is_dir():
            return d
    raise UnsupportedModel(f"llama.cpp's GGUF converter is not in {candidates[0]}.", hint=_SETUP_HINT)


def export_gguf(
    model_dir: Path, out_path: Path, outtype: str = "f16", *, pretokenizer_fallback: str | None = None
) -> Path:
    """Write `model_dir` (config.json + safetensors + tokenizer) as one GGUF file; returns out_path."""
    export_many([(Path(model_dir), Path(out_path), outtype)], pretokenizer_fallback=pretokenizer_fallback)
    return Path(out_path)


def export_many(jobs: list[tuple[Path, Path, str]], *, pretokenizer_fallback: str | None = None) -> None:
    """Convert several models in one child process (it pays torch/transformers imports once). Q8_0 is
    made by llama.cpp's own quantizer from an f32 export, as llama-quantize would. Each output appears
    complete or not at all (a cache of exports may trust any file that exists)."""
    for _, _, outtype in jobs:
        if outtype not in OUTTYPES:
            raise UnsupportedModel(f"GGUF export type {outtype!r} is not one of {', '.join(OUTTYPES)}.")
    conv = converter_dir()
    with tempfile.TemporaryDirectory(prefix="engram-gguf-") as tmp:
        child_jobs = []
        for i, (src, _, outtype) in enumerate(jobs):
            view = _converter_view(Path(src), Path(tmp) / f"view-{i}")
            child_jobs.append(
                {
                    "model": str(view),
                    "out": str(Path(tmp) / f"{i}.gguf"),
                    "outtype": "f32" if outtype == "q8_0" else outtype,
                }
            )
        spec = {"converter": str(conv), "jobs": child_jobs, "pretokenizer_fallback": pretokenizer_fallback}
        (Path(tmp) / "jobs.json").write_text(json.dumps(spec))
        proc = subprocess.run(
            [sys.executable, "-m", "engramctl.engine.gguf_export", str(Path(tmp) / "jobs.json")],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout)[-2000:]
            raise UnsupportedModel(f"llama.cpp's converter failed on {[str(src) for src, _, _ in jobs]}:\n{tail}")
        for i, (_, out, outtype) in enumerate(jobs):
            out = Path(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            staged = out.with_name(f".{out.name}.tmp")
            if outtype == "q8_0":
                quantize_q8_0(Path(tmp) / f"{i}.gguf", staged)
            else:
                shutil.move(Path(tmp) / f"{i}.gguf", staged)  # /tmp may be another filesystem
            os.replace(staged, out)


def quantize_q8_0(src: Path, out: Path) -> None:
    from engramctl.engine.llama_lib import import_llama_cpp, n_cpu_threads

    llama_cpp = import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = n_cpu_threads()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if rc != 0:
        Path(out).unlink(missing_ok=True)
        raise UnsupportedModel(f"llama.cpp could not quantize {src} to Q8_0 (status {rc}).")


def _converter_view(model_dir: Path, view: Path) -> Path:
    """`model_dir` as the converter must see it: every file linked, config.json rewritten. Some converter
    classes (Mamba2 and its hybrids) read config.json themselves instead of going through AutoConfig."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise UnsupportedModel(f"{model_dir} has no config.json; only Hugging Face model directories can be exported.")
    view.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.name != "config.json":
            (view / f.name).symlink_to(f.resolve())
    (view / "config.json").write_text(json.dumps(_fix_hparams(json.loads(config_path.read_text())), indent=1))
    return view


# -- child process -------------------------------------------------------------------------------------
def _fix_hparams(config: dict) -> dict:
    """The converter's view of a transformers-5 config (traps 1 and 2 above)."""
    arch = (config.get("architectures") or [""])[0]
    if arch in ("GraniteMoeHybridForCausalLM", "BambaForCausalLM") and isinstance(config.get("layer_types"), list):
        names = {"linear_attention": "mamba", "full_attention": "attention"}
        config["layer_types"] = [names.get(t, t) for t in config["layer_types"]]
    if arch == "NemotronHForCausalLM":
        pattern = config.get("layers_block_type") or config.get("hybrid_override_pattern")
        if isinstance(pattern, list):
            if "moe" not in pattern:
                for k in _MOE_KEYS:
                    config.pop(k, None)
            config["hybrid_override_pattern"] = "".join(_NEMOTRON_LETTERS[t] for t in pattern)
            config.pop("layers_block_type")
            config["num_hidden_layers"] = len(pattern)
    if arch == "BambaForCausalLM" and "attn_rotary_emb" not in config:
        # transformers 5 keeps Bamba's half-rotary attention in rope_parameters; the converter reads the
        # rotary width from attn_rotary_emb and otherwise writes a full-width RoPE (measured: rel-L2 5e-3)
        factor = (config.get("rope_parameters") or {}).get("partial_rotary_factor", config.get("partial_rotary_factor"))
        if factor:
            head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
            config["attn_rotary_emb"] = int(head_dim * factor)
    if arch == "FalconH1ForCausalLM" and not config.get("head_dim"):
        # transformers 5 leaves it out and derives it the same way (modeling_falcon_h1.py)
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    return config


def _child(job_file: str) -> None:
    import importlib
    import logging

    spec = json.loads(Path(job_file).read_text())
    conv = Path(spec["converter"])
    sys.path[:0] = [str(conv), str(conv / "gguf-py")]  # its own gguf before any installed one
    logging.basicConfig(level=logging.WARNING)  # makes the converter's own basicConfig(INFO) a no-op
    convert = importlib.import_module("convert_hf_to_gguf")
    base = importlib.import_module("conversion.base")
    load = base.ModelBase.load_hparams
    base.ModelBase.load_hparams = staticmethod(lambda *a, **kw: _fix_hparams(load(*a, **kw)))
    fallback = spec.get("pretokenizer_fallback")
    if fallback:
        vocab_pre = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            try:
                return vocab_pre(self, tokenizer)
            except NotImplementedError:  # unknown hash: the caller accepted `fallback` for it
                return fallback

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sentencepiece_vocab = base.TextModel._create_vocab_sentencepiece

    def create_vocab_sentencepiece(self):  # checked before the import, so a BPE model needs no sentencepiece
        if not (self.dir_model / "tokenizer.model").is_file():
            raise FileNotFoundError(f"File not found: {self.dir_model / 'tokenizer.model'}")
        return sentencepiece_vocab(self)

    base.TextModel._create_vocab_sentencepiece = create_vocab_sentencepiece
    jamba = importlib.import_module("conversion.jamba").JambaModel
    jamba_vocab = jamba.set_vocab

    def set_jamba_vocab(self):  # a byte-level BPE tokenizer (no tokenizer.model, no byte fallback)
        try:
            jamba_vocab(self)
        except FileNotFoundError:
            self._set_vocab_gpt2()

    jamba.set_vocab = set_jamba_vocab
    for job in spec["jobs"]:
        sys.argv = ["convert_hf_to_gguf.py", job["model"], "--outfile", job["out"], "--outtype", job["outtype"]]
        config = json.loads((Path(job["model"]) / "config.json").read_text())
        if config.get("architectures") == ["Qwen3NextForCausalLM"] and not config.get("mtp_num_hidden_layers"):
            sys.argv.append("--no-mtp")  # the converter otherwise insists on a multi-token-prediction head
        convert.main()


if __name__ == "__main__":
    _child(sys.argv[1])
