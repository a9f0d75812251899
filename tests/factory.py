"""Tiny random-weight models of every supported family, built fully offline for the tests.

Each family gets a real transformers config shrunk to hidden 64 / 2-5 layers / vocab 512, so the
tests exercise the same modeling and cache code (DynamicCache layer types) as the real checkpoints,
in well under a second per model. Hybrids always mix recurrent and attention layers so that both
kinds of state (conv/SSM and K/V) show up in snapshots.

The tokenizer is engramctl.bench.presets' byte-level BPE trained on a built-in corpus (no hub access),
saved next to the model so `AutoTokenizer.from_pretrained(dir)` works with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    BambaConfig,
    FalconH1Config,
    FalconMambaConfig,
    GenerationConfig,
    GraniteMoeHybridConfig,
    JambaConfig,
    Lfm2Config,
    LlamaConfig,
    Mamba2Config,
    MambaConfig,
    NemotronHConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3NextConfig,
    Zamba2Config,
)
from transformers.utils import logging as hf_logging

FAMILIES: tuple[str, ...] = (
    "mamba2",
    "granitemoehybrid",
    "nemotron_h",
    "falcon_h1",
    "bamba",
    "zamba2",
    "qwen3_next",
    "lfm2",
    "jamba",
    "mamba",
    "falcon_mamba",
    "llama",
)

from engramctl.bench import presets
from engramctl.bench.presets import BOS_ID, CHATML_TEMPLATE, EOS_ID, PAD_ID, SPECIALS, VOCAB  # noqa: F401

# Deliberately NOT prefix-stable: a header carries the running message count, so every new turn
# rewrites the start of the prompt. Tests use it to prove the instability check fires.
UNSTABLE_TEMPLATE = (
    "{{ '<|im_start|>system\\nmessages: ' + (messages | length | string) + '<|im_end|>\\n' }}" + CHATML_TEMPLATE
)
TEMPLATES = {"chatml": CHATML_TEMPLATE, "unstable": UNSTABLE_TEMPLATE}


def build_tokenizer(vocab_size: int = VOCAB, template: str = "chatml") -> PreTrainedTokenizerFast:
    """The bench presets' offline byte-level BPE (ChatML specials at ids 0, 1, 2) with the chosen template."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; expected one of {sorted(TEMPLATES)}")
    return presets.build_tokenizer(vocab_size, chat_template=TEMPLATES[template])


def _tiny_mamba() -> dict:
    """The Mamba2 mixer of bench/presets.py's tiny preset, which the tiny hybrids of other families share."""
    return {k: v for k, v in presets.granite_kwargs("tiny").items() if k.startswith("mamba_")}


def _config(family: str):
    """Tiny config for `family`; layer layouts noted as L = recurrent, A = attention."""
    attn = dict(num_attention_heads=4, num_key_value_heads=2)
    if family == "mamba2":  # L L L
        return Mamba2Config(
            hidden_size=64,
            num_hidden_layers=3,
            num_heads=8,
            head_dim=16,
            state_size=16,
            n_groups=1,
            expand=2,
            conv_kernel=4,
            chunk_size=64,
        )
    if family == "granitemoehybrid":  # L A L L, dense MLP only (no experts), no RoPE like Granite 4.0-H
        # the bench's tiny preset, with this config class's default context (4,096) that tests overflow
        kwargs = {k: v for k, v in presets.granite_kwargs("tiny").items() if k != "max_position_embeddings"}
        return GraniteMoeHybridConfig(**kwargs)
    if family == "nemotron_h":  # L mlp L A mlp ("M-M*-"); layers_block_type replaces num_hidden_layers
        return NemotronHConfig(
            hidden_size=64,
            **attn,
            head_dim=16,
            intermediate_size=128,
            layers_block_type=["linear_attention", "mlp", "linear_attention", "full_attention", "mlp"],
            ssm_state_size=16,
            mamba_num_heads=8,
            mamba_head_dim=16,
            n_groups=1,
            conv_kernel=4,
            expand=2,
            chunk_size=64,
        )
    if family == "falcon_h1":  # every layer is "hybrid": attention and mamba2 side by side
        return FalconH1Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            **attn,
            mamba_d_ssm=128,
            **_tiny_mamba(),  # the tiny preset's mixers
        )
    if family == "bamba":  # L A L L
        return BambaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            **attn,
            attn_layer_indices=[1],
            **_tiny_mamba(),  # the tiny preset's mixers
        )
    if family == "zamba2":  # L H L L; H = the shared attention block followed by a mamba2 layer
        return Zamba2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            layers_block_type=["linear_attention", "hybrid", "linear_attention", "linear_attention"],
            num_attention_heads=4,
            num_key_value_heads=4,
            num_mem_blocks=1,
            n_mamba_heads=8,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_ngroups=1,
            chunk_size=64,
        )
    if family == "qwen3_next":  # L L L A (gated delta net; full_attention_interval defaults to 4); MoE MLP
        return Qwen3NextConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            **attn,
            head_dim=16,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
        )
    if family == "lfm2":  # conv A conv conv; no auto-adjust, which would round the FFN up to 256
        return Lfm2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            **attn,
            layer_types=["conv", "full_attention", "conv", "conv"],
            block_auto_adjust_ff_dim=False,
        )
    if family == "jamba":  # L A L L (Mamba1 mixers), MoE on odd layers
        return JambaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            **attn,
            attn_layer_period=4,
            attn_layer_offset=1,
            num_experts=4,
            num_experts_per_tok=2,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
        )
    if family == "mamba":  # L L L (Mamba1)
        return MambaConfig(hidden_size=64, num_hidden_layers=3, state_size=16, expand=2, conv_kernel=4)
    if family == "falcon_mamba":  # L L L (Mamba1 + RMS-normed B/C/dt)
        return FalconMambaConfig(hidden_size=64, num_hidden_layers=3, state_size=16, expand=2, conv_kernel=4)
    if family == "llama":  # plain attention baseline (non-recurrent control)
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, **attn)
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def build_config(family: str):
    cfg = _config(family)
    cfg.vocab_size = VOCAB
    # Ids must agree with build_tokenizer(): generation stops on <|im_end|>, pads with <|endoftext|>.
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = PAD_ID, BOS_ID, EOS_ID
    if hasattr(cfg, "max_position_embeddings"):  # mamba/falcon_mamba have none
        cfg.max_position_embeddings = max(cfg.max_position_embeddings, 4096)
    return cfg


def build_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Random-init tiny model; same (family, seed) gives bit-identical weights."""
    cfg = build_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    # Explicit so generation_config.json holds our ids and nothing family-specific.
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    return model.eval()


def save_family(family: str, out_dir: Path, seed: int = 0, template: str = "chatml") -> Path:
    """Write model (config.json, generation_config.json, model.safetensors) + tokenizer into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained draws a "Writing model shards" bar per call; keep test output clean.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        build_model(family, seed=seed).save_pretrained(out_dir)
        build_tokenizer(VOCAB, template=template).save_pretrained(out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return out_dir
