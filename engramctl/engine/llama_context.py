"""The llama.cpp backend's one context: how big (tokens, sequences, kept states) and with which parameters.

Chunks: n_batch = n_ubatch = chunk_tokens with flash attention measured ~1.2x faster at prefill than the
library defaults (llama-cpp-notes.md). KV: a stream per sequence for attention-only models (llama_streams.py:
each conversation then holds n_ctx tokens of its own), else one unified cache whose cells every sequence
shares (a conversation can grow to the whole context, kept states share the live one's cells).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engramctl.engine import llama_state
from engramctl.errors import UsageError

DEFAULT_CHUNK_TOKENS = 512
DEFAULT_CONTEXT_TOKENS = 32768
KV_BUDGET_BYTES = 512 << 20  # the KV cache is allocated (and zeroed) up front: cap it, whatever n_ctx_train says
# Kept states (llama_pool.py): each takes one recurrent cell, allocated up front with the context (23 MB
# on Granite-4.0-H-350M), and shares sequence 0's KV cells; a model whose cell exceeds the budget keeps none.
KEPT_STATES_MAX = 4
KEPT_STATES_BYTES = 128 << 20
# Conversations stepped together (continuous batching), when the user sets none: on 2 cores raw llama.cpp
# decodes 4 sequences in one step at 1.5x the aggregate rate of one, and 8 at 1.3-1.9x (llama-cpp-notes.md);
# more cores gain more, so 2 per core, 4 to 16. Each sequence takes a recurrent cell allocated with the context
# (23 MB on Granite-4.0-H-350M; the KV cache is shared): together at most 1/8 of the RAM available at load.
SEQUENCES_PER_CORE, SEQUENCES_MIN, SEQUENCES_MAX = 2, 4, 16
SEQUENCES_RAM_SHARE = 8
# A prompt starts from another conversation's cells (llama_pool.py, share) only for a common prefix this long:
# a shorter one saves little (16 tokens: ~90 ms of SmolLM2's prefill on 2 threads) and still changes the
# last bits of the rest, as any other cut of a prompt into chunks does (docs/batching.md).
SHARE_MIN_TOKENS = 16
SEQUENCES_LIMIT = 64  # what the setting accepts; llama.cpp's own limit on n_seq_max is larger
# Device copies (llama_device_copies.py): at most this many slots, each a sequence id with its own recurrent cell
# allocated with the context; a slot is counted for a conversation of COPY_TOKENS tokens (what the budget is
# then checked against is each copy's real size).
DEVICE_SLOTS_MAX = 64
COPY_TOKENS = 2048


@dataclass(frozen=True)
class ContextSize:
    n_ctx: int  # tokens one conversation can hold: the whole KV cache, or with streams each stream's cells
    sequences: int  # conversations stepped together
    kept_max: int  # more sequences, each keeping a captured state resident
    streams: bool = False  # a KV stream per sequence (llama_streams.py) instead of one unified cache
    device_slots: int = 0  # more sequences, each the slot of a parked state's device copy (llama_device_copies.py)
    device_bytes: int = 0  # what those copies may take on the device (the VRAM tier's budget)

    @property
    def n_seq_max(self) -> int:
        return self.sequences + self.kept_max + self.device_slots

    @property
    def cells(self) -> int:
        """The context's n_ctx: every stream's cells."""
        return self.n_ctx * self.n_seq_max if self.streams else self.n_ctx


def context_size(
    layout: llama_state.BlobLayout,
    context_tokens: int | None,
    sequences: int | None,
    threads: int,
    *,
    n_ctx_train: int,
    swa: bool = False,
) -> ContextSize:
    """The context's size: what was asked, within the model's trained length (n_ctx_train: llama.cpp's
    llama_model_n_ctx_train, the GGUF's context_length) and the KV budget (with a stream per sequence, each
    conversation's share of it). `swa`: the model has a sliding window (llama_model_n_swa)."""
    if sequences is not None and not 1 <= sequences <= SEQUENCES_LIMIT:
        raise UsageError(f"sequences {sequences} is not between 1 and {SEQUENCES_LIMIT}.")
    cell_bytes = _cell_bytes(layout)
    sequences = sequences or default_sequences(cell_bytes, threads)
    # attention-only, and no sliding window (its cells cannot be cut back to a prefix: llama_pool.py share)
    streams = sequences > 1 and layout.has_kv and not layout.has_recurrent and not swa
    kept_max = KEPT_STATES_MAX if not cell_bytes else min(KEPT_STATES_MAX, KEPT_STATES_BYTES // cell_bytes)
    if streams:  # a kept state shares the live conversation's cells, which another stream cannot
        kept_max = 0
    kv_per_token = _kv_bytes_per_token(layout)
    n_ctx_train = n_ctx_train or DEFAULT_CONTEXT_TOKENS
    n_ctx = min(context_tokens or DEFAULT_CONTEXT_TOKENS, n_ctx_train)
    if kv_per_token:
        budget = KV_BUDGET_BYTES // (sequences if streams else 1)
        n_ctx = max(min(n_ctx, budget // kv_per_token // 256 * 256), min(2048, n_ctx))
    return ContextSize(n_ctx, sequences, kept_max, streams)


def with_device_copies(
    size: ContextSize, layout: llama_state.BlobLayout, budget_bytes: int, chunk_tokens: int
) -> ContextSize:
    """`size` with slots for device copies of parked states within `budget_bytes`: each slot's recurrent cell
    in the context, and a copy of a COPY_TOKENS-token state, are taken from the budget; none with a KV stream per
    sequence (a slot would be a whole stream) or when not one fits. A batch holds a token of every sequence
    (context_params), so the slots also stop at chunk_tokens."""
    cell = _cell_bytes(layout)
    copy = cell + _kv_bytes_per_token(layout) * min(size.n_ctx, COPY_TOKENS)
    if size.streams or budget_bytes <= 0 or not copy:
        return size
    room = chunk_tokens - size.sequences - size.kept_max
    slots = max(0, min(DEVICE_SLOTS_MAX, room, budget_bytes // (cell + copy)))
    if not slots:
        return size
    return dataclasses.replace(size, device_slots=slots, device_bytes=budget_bytes - slots * cell)


def context_params(lib, size: ContextSize, chunk_tokens: int, threads: int):
    """llama_context_params for `size`."""
    n_seq_max = size.n_seq_max
    if chunk_tokens < n_seq_max:  # llama.cpp aborts the process on it (a batch holds a token of every sequence)
        raise UsageError(
            f"chunk_tokens {chunk_tokens} is smaller than the context's {n_seq_max} sequences "
            f"({size.sequences} stepped together, {size.kept_max} kept states, {size.device_slots} device copies): "
            f"give at least {n_seq_max}."
        )
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = size.cells
    cparams.n_batch = cparams.n_ubatch = chunk_tokens
    cparams.n_seq_max = n_seq_max
    cparams.kv_unified = not size.streams  # else each sequence gets a stream of n_ctx / n_seq_max cells
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
    # each layer's KV cache and recurrent cells on its layer's device (the library's default, stated: the
    # offload plan, tiers/offload.py, counts them in VRAM for every layer on the GPU)
    cparams.offload_kqv = True
    cparams.no_perf = True
    return cparams


def default_sequences(cell_bytes: int, cores: int, available_bytes: int | None = None) -> int:
    """How many conversations to step together when the user sets no number (see SEQUENCES_PER_CORE)."""
    n = min(SEQUENCES_MAX, max(SEQUENCES_MIN, SEQUENCES_PER_CORE * cores))
    if cell_bytes:
        if available_bytes is None:
            import psutil

            available_bytes = int(psutil.virtual_memory().available)
        n = min(n, max(1, available_bytes // SEQUENCES_RAM_SHARE // cell_bytes))
    return n


def layer_state_bytes(size: ContextSize, layout: llama_state.BlobLayout) -> list[int]:
    """What the context allocates for each layer, on that layer's device: f16 K and V for each of its cells,
    and an f32 recurrent cell (conv + SSM state) for each of its sequences."""
    return [
        2 * (lay.k_elems + lay.v_elems) * size.cells
        + (4 * (math.prod(lay.conv_shape) + math.prod(lay.ssm_shape)) * size.n_seq_max if lay.recurrent else 0)
        for lay in layout.layers
    ]


def _kv_bytes_per_token(layout: llama_state.BlobLayout) -> int:
    """One token's KV cells: f16 K and V of every attention layer."""
    return 2 * sum(lay.k_elems + lay.v_elems for lay in layout.layers)


def _cell_bytes(layout: llama_state.BlobLayout) -> int:
    """One sequence's recurrent cell: conv and SSM state of every recurrent layer, f32."""
    return 4 * sum(math.prod(lay.conv_shape) + math.prod(lay.ssm_shape) for lay in layout.layers if lay.recurrent)
