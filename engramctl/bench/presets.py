"""Random-weight models for benchmarking without hub access, with an offline ChatML tokenizer.

Presets (``engramctl bench --preset NAME``):

    tiny                a Granite-4.0-H-like hybrid shrunk to hidden 64, 4 layers (L A L L), vocab 512:
                        what ``--quick`` runs; tests/factory.py's tiny granitemoehybrid is built from it.
    granite-4.0-h-350m  GraniteMoeHybrid shaped like ibm-granite/granite-4.0-h-350m (340 M params):
                        hidden 768, 32 layers of which 4 attention (7, 15, 23, 31), Mamba2 48 heads x 32,
                        d_state 128, vocab 100352, no positional encoding ("nope"). Everything that
                        sets cost and state size matches the published config; the attention
                        positions are a guess.

Weights are random (seeded: the same seed gives the same weights), so replies are gibberish; timings and
state sizes are what the real model would give on this machine, since they depend only on the shapes.

The tokenizer is a byte-level BPE of 512 entries trained on a built-in corpus, with ChatML specials and
a prefix-stable ChatML template. For the 350M preset the model's vocabulary stays 100352 (the
embedding and the LM head cost what they cost in the real model) but the embedding rows past the
tokenizer's 512 are zeroed: those logits are then 0 while the max of ~500 random logits is positive,
so greedy decoding only ever picks tokens the tokenizer can decode. Compute is unchanged.

tests/factory.py builds its tokenizers with `build_tokenizer` and its granitemoehybrid from the tiny preset here.
The bench loads a preset like any model: preset_dir.py writes it once to a cached model directory,
gguf_presets.py converts that to GGUF, and engine/loading.load_engine loads either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VOCAB = 512
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

# ChatML like SmolLM2's minus its default system prompt: render(history) is a prefix of
# render(history + [msg], add_generation_prompt=True), which incremental resume relies on.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Varied text so BPE finds far more than the ~250 merges a 512-entry vocab needs; byte-level BPE
# still encodes anything outside it. Also the filler the context sweep prefills.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A state space model keeps a fixed-size recurrent state,
while attention layers keep a key/value cache that grows with every token of the conversation.
Hello! How are you today? I am fine, thank you. Can you summarise the previous answer in one line?
Snapshots are written to disk, restored in a fresh process, and generation continues from there.
def forward(self, input_ids, past_key_values=None, use_cache=True):
    return self.model(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache)
{"role": "user", "content": "What is the capital of France?"} {"role": "assistant", "content": "Paris."}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 512 1024 2048 4096 3.14159 2.71828 -1 1e-5 0x1f.
Café, naïve, résumé, Zürich, smörgåsbord; 日本語のテキスト; Привет, мир; γειά σου κόσμε.
user assistant system tool message content conversation history context window tokens layer cache
Once upon a time, in a small village by the sea, there lived an old fisherman and his curious cat.
Every morning they walked down to the harbour, counted the boats, and listened to the gulls.
"""


def build_tokenizer(vocab_size: int = VOCAB, chat_template: str = CHATML_TEMPLATE):
    """Byte-level BPE with exactly `vocab_size` entries, ChatML specials (ids 0, 1, 2) and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # decode(encode(t)) == t
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: no <unk> ever needed
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"BPE trained {tok.get_vocab_size()} entries, wanted {vocab_size}")
    if [tok.token_to_id(s) for s in SPECIALS] != [PAD_ID, BOS_ID, EOS_ID]:
        raise RuntimeError("ChatML specials did not get ids 0, 1, 2")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def granite_kwargs(name: str) -> dict[str, Any]:
    if name == "tiny":
        return dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            shared_intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_d_state=16,
            mamba_n_groups=1,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_chunk_size=64,
            num_local_experts=0,
            num_experts_per_tok=0,
            position_embedding_type="nope",
            max_position_embeddings=32768,
        )
    if name == "granite-4.0-h-350m":
        return dict(
            vocab_size=100352,
            hidden_size=768,
            intermediate_size=2048,
            shared_intermediate_size=2048,
            num_hidden_layers=32,
            num_attention_heads=12,
            num_key_value_heads=4,
            layer_types=["full_attention" if i in {7, 15, 23, 31} else "linear_attention" for i in range(32)],
            mamba_n_heads=48,
            mamba_d_head=32,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_chunk_size=256,
            num_local_experts=0,
            num_experts_per_tok=0,
            position_embedding_type="nope",
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            embedding_multiplier=12.0,
            logits_scaling=3.0,
            residual_multiplier=0.246,
            attention_multiplier=0.015625,
        )
    raise KeyError(name)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", "Granite-4.0-H-like hybrid, hidden 64, 4 layers (1 attention), vocab 512 (random weights)"),
    "granite-4.0-h-350m": Preset(
        "granite-4.0-h-350m",
        "GraniteMoeHybrid shaped like Granite 4.0-H 350M: hidden 768, 32 layers (4 attention), "
        "Mamba2 48x32, d_state 128, vocab 100352 (random weights)",
    ),
}
ALIASES = {"350m": "granite-4.0-h-350m", "granite-350m": "granite-4.0-h-350m"}


def preset_name(name: str) -> str:
    from engramctl.errors import UsageError

    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}.")
    return key


def build_model(name: str, seed: int = 0, dtype: str = "float32"):
    """A random-init model of preset `name`; the same (name, seed, dtype) gives identical weights."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, GraniteMoeHybridConfig

    cfg = GraniteMoeHybridConfig(**granite_kwargs(preset_name(name)))
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = PAD_ID, BOS_ID, EOS_ID
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    if cfg.vocab_size > VOCAB:
        with torch.no_grad():  # see the module docstring: greedy never picks an undecodable id
            model.get_input_embeddings().weight[VOCAB:] = 0
            out = model.get_output_embeddings()
            if out is not None and out.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
                out.weight[VOCAB:] = 0
    return model.eval()


def preset_id(name: str, seed: int = 0) -> str:
    """The model id a preset is served and reported as."""
    return f"preset:{preset_name(name)}@seed{seed}"
