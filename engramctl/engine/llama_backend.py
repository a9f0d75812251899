"""The llama.cpp backend (llama-cpp-python's C API): a GGUF model memory-mapped and kept in its own
weight type, one context, and typed per-layer state moved in and out through the per-sequence state calls.

One context, unified KV: each resident conversation has a sequence of its own, and step() feeds several of
them in one llama_decode (continuous batching); a few more sequences keep recently captured states
resident so that restoring one copies nothing (llama_pool.py: which Live is where, and why a Live stepped
alone computes what a fresh process restoring its state computes). Llama.save_state is never used: it
copies llama-cpp-python's whole logits array (5-35 ms); the per-sequence calls move only the state.

The context's size and parameters are llama_context.py's, the batch fed to each llama_decode llama_batch.py's.
Cancellation is checked between chunks, as on transformers.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engramctl.engine import llama_place, llama_state
from engramctl.engine.backend import Live, ModelInfo
from engramctl.engine.gguf_header import gguf_fingerprint, read_header
from engramctl.engine.gguf_tokenizer import GgufTokenizer
from engramctl.engine.llama_batch import Batch
from engramctl.engine.llama_buffers import AHEAD, HostBuffers
from engramctl.engine.llama_build import loaded_build
from engramctl.engine.llama_context import DEFAULT_CHUNK_TOKENS, SHARE_MIN_TOKENS, context_params, context_size
from engramctl.engine.llama_layout import blob_layout
from engramctl.engine.llama_lib import import_llama_cpp, library_version, n_cpu_threads, take_errors
from engramctl.engine.llama_offload import gpu_memory, place
from engramctl.engine.llama_pool import ParkedState, SequencePool
from engramctl.engine.llama_threadpool import ThreadPool
from engramctl.errors import (
    Cancelled,
    ContextOverflow,
    EngramError,
    SnapshotMismatch,
    StateFormatError,
    UnsupportedModel,
    UsageError,
)
from engramctl.state import SessionState
from engramctl.state.spec import TOKENS, LayerSpec, StateSpec, TensorSpec
from engramctl.store import arrays

BACKEND = "llama.cpp"
STATE_FORMAT = "llama.cpp-seq3-typed1"  # LLAMA_STATE_SEQ_VERSION 3, as llama_state.py (layout 1) parses it


class LlamaCppBackend:
    # its states are host arrays (numpy), never held in the VRAM tier: VRAM holds its layers and conversations
    vram_snapshots = False

    def __init__(
        self,
        path: Path,
        model_id: str,
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        context_tokens: int | None = None,
        threads: int | None = None,
        device: str = "cpu",
        sequences: int | None = None,
        vram_tier_bytes: int | None = None,
        copies_bytes: int | None = None,
    ):
        lib = self._lib = import_llama_cpp()
        if lib.LLAMA_STATE_SEQ_VERSION != 3:
            raise StateFormatError(
                f"llama-cpp-python {library_version()} writes state format "
                f"{lib.LLAMA_STATE_SEQ_VERSION}; engramctl parses format 3 (llama-cpp-python 0.3.36)."
            )
        path = Path(path)
        header = read_header(path)  # typed errors for a missing, truncated or non-GGUF file, before llama.cpp
        layout = blob_layout(header, v_trans=False)  # refuses unknown recurrent architectures early
        self.chunk_tokens = chunk_tokens
        self._lock = threading.RLock()
        self._model = self._ctx = None

        mparams = lib.llama_model_default_params()
        mparams.load_mode = lib.LLAMA_LOAD_MODE_MMAP  # weights stay in the page cache, in their GGUF type
        if device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"device {device!r} is not one of auto, cpu, cuda.")
        if device == "cuda" and not lib.llama_supports_gpu_offload():
            raise UsageError(
                "device cuda was requested but llama-cpp-python was built without GPU support.",
                hint="rebuild it for this machine's GPU: ENGRAM_CUDA=1 scripts/setup.sh (or use --device cpu)",
            )
        threads = threads or n_cpu_threads()
        # how many layers go to the GPU, and the context (conversations at once, KV cells) it counted
        placed = place(
            lib,
            header,
            layout,
            device=device,
            context_tokens=context_tokens,
            sequences=sequences,
            threads=threads,
            chunk_tokens=chunk_tokens,
            vram_tier_bytes=vram_tier_bytes,
            copies_bytes=copies_bytes,
        )
        self.offload = placed.plan  # /v1/tiers, `engramctl tiers`
        self.copies_rule = placed.copies_rule
        gpu = placed.plan.n_gpu_layers > 0
        mparams.n_gpu_layers = placed.plan.n_gpu_layers
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise UnsupportedModel(
                f"llama.cpp could not load {path.name} (architecture {header.architecture!r}): "
                f"{take_errors() or 'see the daemon log'}"
            )
        size = placed.size
        n_ctx_train, swa = int(lib.llama_model_n_ctx_train(self._model)), bool(lib.llama_model_n_swa(self._model))
        if (n_ctx_train, swa) != (placed.n_ctx_train, placed.swa):  # a trained length or window the header hid
            resized = context_size(layout, context_tokens, size.sequences, threads, n_ctx_train=n_ctx_train, swa=swa)
            copies = {"device_slots": size.device_slots, "device_bytes": size.device_bytes}
            size = resized if resized.streams else dataclasses.replace(resized, **copies)
        self.max_sequences, n_ctx = size.sequences, size.n_ctx  # n_ctx: tokens one conversation can hold
        cparams = context_params(lib, size, chunk_tokens, threads)
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise UnsupportedModel(
                f"llama.cpp could not create a context for {path.name}: {take_errors() or 'see the log'}"
            )
        self._pool = SequencePool(lib, self._ctx, size, layout.has_kv)
        self._buffers = HostBuffers()  # captured and restored blobs' memory, reused (llama_buffers.py)
        self.prompts_per_step = 1 if size.streams else None  # Engine.prompts_per_step
        self.kv_layout = (  # for `engramctl ps` (daemon/context.py serving)
            f"each in a KV stream of its own ({n_ctx} tokens)"
            if size.streams
            else f"sharing one KV cache ({n_ctx} tokens)"
        )
        self.n_ctx = n_ctx
        # the stream layout's models are those whose state can be cut back to a prefix (attention only, no
        # sliding window) with more than one conversation at a time: llama_context.context_size decides both
        self._shares_prefixes = size.streams
        self._threadpool = ThreadPool.attach(lib, self._ctx, threads)  # one for the context's life, not one a token
        # The model is freed after the last of this backend and its tokenizer (which reads its vocabulary)
        # is gone; the context with the backend, always before the model (the finalizer holds it), and the
        # thread pool after the context that runs on it.
        model = _ModelHandle(lib, self._model)
        self._finalizer = weakref.finalize(self, _free, lib, model, self._ctx, self._threadpool)

        template = lib.llama_model_chat_template(self._model, None)
        self.tokenizer = GgufTokenizer(
            lib, self._model, template.decode("utf-8") if template else None, keepalive=model
        )
        self.n_vocab = self.tokenizer.n_vocab
        self._batch = Batch(lib, chunk_tokens, self.n_vocab)
        self.header = header
        self.library_version = library_version()
        desc = ctypes.create_string_buffer(256)
        lib.llama_model_desc(self._model, desc, len(desc))
        self.info = ModelInfo(
            model_id=model_id,
            family=header.architecture,
            architecture=desc.value.decode("utf-8", "replace") or header.architecture,
            device="cuda" if gpu else "cpu",
            dtype=header.weight_type,
            n_params=int(lib.llama_model_n_params(self._model)),
            weights_bytes=int(lib.llama_model_size(self._model)),
            context_length=n_ctx if layout.has_kv else None,  # a pure recurrent state has no length limit
            fingerprint=gguf_fingerprint(header),
            resume="chunked",
            backend=BACKEND,
            weight_type=header.weight_type,
            build=loaded_build(lib).describe(),
        )
        self.layout = self._probe_layout(layout)
        self.spec = self._spec()

    # -- loading -------------------------------------------------------------------------------------
    def _probe_layout(self, layout: llama_state.BlobLayout) -> llama_state.BlobLayout:
        """Run 3 tokens and check that this build's blob parses and re-serializes byte for byte."""
        live = self.new_live()
        try:
            self.prefill(live, [0, 0, 0])
            blob = self._get_blob()
            for v_trans in (False, True):  # flash attention normally keeps V untransposed
                candidate = llama_state.BlobLayout(layout.layers, v_trans)
                try:
                    layers = llama_state.parse(blob, candidate, 3)
                except StateFormatError as e:
                    error = e
                    continue
                if llama_state.serialize(layers, candidate, 3, reuse=False) == blob:
                    return candidate
                error = StateFormatError("re-serializing the parsed state did not reproduce llama.cpp's bytes.")
            raise StateFormatError(
                f"llama.cpp's state for {self.header.architecture!r} models does not have the "
                f"layout engramctl parses: {error.message}"
            )
        finally:
            self.release(live)

    def _spec(self) -> StateSpec:
        live = self.new_live()
        try:
            self.prefill(live, [0])
            state = self.capture(live)
        finally:
            self.release(live)
        layers = []
        for layer in state.layers:
            specs = {}
            for name, t in layer.tensors().items():
                shape = list(t.shape)
                if name in ("keys", "values"):
                    shape[1] = TOKENS  # (1, tokens, kv_heads * head_dim)
                specs[name] = TensorSpec(tuple(shape), arrays.dtype_name(t))
            layers.append(LayerSpec(layer.kind, specs))
        return StateSpec(
            model_id=self.info.model_id,
            fingerprint=self.info.fingerprint,
            dtype=self.info.dtype,
            vocab_size=self.n_vocab,
            layers=tuple(layers),
            backend=BACKEND,
            state_format=STATE_FORMAT,
            backend_version=self.library_version,
        )

    @property
    def device_slots(self) -> int:
        """Parked conversations that can keep a device copy of their state (llama_device_copies.py)."""
        return 0 if self._pool.device is None else self._pool.device.slots

    def device_copies(self) -> dict | None:
        """The VRAM tier of this backend (device copies of parked states): /v1/tiers, `engramctl tiers`."""
        with self._lock:
            device = self._pool.device
            if device is None:
                return {"slots": 0, "rule": self.copies_rule}
            return {
                "slots": device.slots,
                "budget_bytes": device.budget_bytes,
                "used_bytes": device.used_bytes,
                "held": device.held,
                "restores": device.restores,
                "rule": self.copies_rule,
            }

    def gpu_memory(self) -> tuple[int, int, str] | None:
        """(free, total, name) of the GPU now, as ggml measures it (None on the CPU): the tier plan's VRAM figure."""
        gpu = gpu_memory(self._lib) if self.offload.n_gpu_layers else None
        return None if gpu is None else (gpu.free_bytes, gpu.total_bytes, gpu.name)

    def close(self) -> None:
        """Free the context now (it is freed anyway when the backend is collected); the model follows
        once the tokenizer is gone too."""
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()
        elif self._model:
            self._lib.llama_model_free(self._model)
        self._model = self._ctx = None

    # -- conversations -------------------------------------------------------------------------------
    def new_live(self) -> Live:
        return Live(cache=ParkedState())

    def _get_blob(self) -> bytearray:
        """What sequence 0 holds: the state of the Live that last stepped alone."""
        return self._pool.get_blob()

    def release(self, live: Live) -> None:
        with self._lock:
            self._pool.release(live)

    def take_load(self, live: Live) -> tuple[str, float] | None:
        """How a parked `live` was loaded back since the last call (SequencePool.take_load)."""
        with self._lock:
            return self._pool.take_load(live)

    # -- running -------------------------------------------------------------------------------------
    def step(self, work: Sequence[tuple[Live, Sequence[int]]]) -> list[np.ndarray]:
        """Feed each Live its tokens, in one llama_decode where they fit (chunk_tokens in all, max_sequences
        Lives); the logits after each one's last token, in order. One Live, or max_sequences = 1, runs alone
        (SequencePool.solo): exactly what a fresh process restoring its state computes. Lives not in `work`
        may be parked to make room."""
        entries = [(live, [int(t) for t in ids]) for live, ids in work]
        if any(not ids for _, ids in entries):
            raise EngramError("a step feeds each conversation at least one token.")
        if len({id(live) for live, _ in entries}) != len(entries):
            raise EngramError("a step names the same conversation twice.")
        with self._lock:
            if len(entries) == 1 or self.max_sequences == 1:
                for live, ids in entries:
                    self._alone(live, ids)
            else:
                for at in range(0, len(entries), self.max_sequences):
                    self._together(entries[at : at + self.max_sequences])
        return [live.last_logits for live, _ in entries]

    def share_prefix(self, live: Live, ids: Sequence[int]) -> int:
        """Start `live` (holding nothing) from the longest prefix of `ids` a resident conversation holds
        (SequencePool.share); the tokens shared, 0 where the model keeps recurrent state or a sliding window
        (neither can be cut back to a prefix) or runs one conversation at a time."""
        if not self._shares_prefixes:
            return 0
        with self._lock:
            return self._pool.share(live, ids, SHARE_MIN_TOKENS, self.layout)

    def shareable_prefix(self, live: Live, ids: Sequence[int]) -> int:
        """The tokens share_prefix would give `live` now, nothing shared."""
        if not self._shares_prefixes:
            return 0
        with self._lock:
            return self._pool.shareable(live, ids, SHARE_MIN_TOKENS)

    def _alone(self, live: Live, ids: list[int]) -> None:
        self._pool.solo(live)
        for start in range(0, len(ids), self.chunk_tokens):
            self._decode([(live, ids[start : start + self.chunk_tokens])], alone=True)

    def _together(self, group: list[tuple[Live, list[int]]]) -> None:
        """One llama_decode per chunk_tokens of the group's tokens, each Live's in order."""
        pending = group
        while pending:
            room, pieces, rest = self.chunk_tokens, [], []
            for live, ids in pending:
                take = ids[:room]
                room -= len(take)
                if take:
                    pieces.append((live, take))
                if len(take) < len(ids):
                    rest.append((live, ids[len(take) :]))
            self._pool.seat([live for live, _ in pieces])
            if self._pool.streams:  # llama.cpp puts consecutive sequence ids in one ubatch (llama_streams.py)
                pieces.sort(key=lambda piece: piece[0].cache.seq)
            self._decode(pieces, alone=False)
            pending = rest

    def _decode(self, pieces: list[tuple[Live, list[int]]], alone: bool) -> None:
        if self.info.context_length is not None:
            for live, ids in pieces:
                if len(live.token_ids) + len(ids) > self.n_ctx:
                    raise ContextOverflow(
                        f"the conversation needs {len(live.token_ids) + len(ids)} tokens; "
                        f"the llama.cpp context holds {self.n_ctx}."
                    )
        b = self._batch
        rows = b.fill([(live.cache.seq, len(live.token_ids), ids) for live, ids in pieces])
        rc = self._lib.llama_decode(self._ctx, b.c)
        if rc == 1 and not alone:  # no room in the KV cache for all of them: nothing ran (llama.h)
            self._pool.park_others([live for live, _ in pieces])
            rc = self._lib.llama_decode(self._ctx, b.c)
            if rc == 1:
                for live, ids in pieces:  # one at a time, each alone in the context
                    self._alone(live, ids)
                return
        if rc != 0:
            raise EngramError(
                f"llama.cpp could not run {b.n_tokens} tokens (status {rc}): {take_errors() or 'see the log'}"
            )
        for (live, ids), row in zip(pieces, rows):
            live.token_ids.extend(ids)
            live.last_logits = b.logits_of(self._ctx, row)
        self._pool.stepped([live for live, _ in pieces], alone)

    def prefill(self, live: Live, token_ids: Sequence[int], cancel: threading.Event | None = None) -> np.ndarray:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise EngramError("prefill needs at least one token.")
        for start in range(0, len(ids), self.chunk_tokens):
            if cancel is not None and cancel.is_set():  # between chunks: the state holds whole chunks only
                raise Cancelled("the request was cancelled during the prompt prefill.")
            self.step([(live, ids[start : start + self.chunk_tokens])])
        return live.last_logits

    def decode(self, live: Live, token_id: int) -> np.ndarray:
        return self.step([(live, [int(token_id)])])[0]

    # -- state ---------------------------------------------------------------------------------------
    def capture(self, live: Live) -> SessionState:
        """`live`'s state: views of one blob copied out of the context, which the pool remembers (a restore of
        this state while it is unchanged then costs one copy, or none: SequencePool.remember)."""
        if not live.token_ids or live.last_logits is None:
            raise EngramError("cannot capture a state that has consumed no tokens.")
        n = len(live.token_ids)
        with self._lock:
            blob = self._pool.blob_of(live, take=self._buffers.take)  # memory faulted in already, if any
            if not self._pool.streams:
                self._buffers.prepare(int(len(blob) * AHEAD))  # the next capture's, beside the next step
            blob = llama_state.in_position_order(blob, self.layout, n)  # cells a batch left out of order
            layers = llama_state.parse(blob, self.layout, n)  # views of `blob`, never modified again
            state = SessionState(
                layers=tuple(layers),
                token_ids=tuple(live.token_ids),
                last_logits=live.last_logits.copy(),
                text=live.text,
            )
            self._pool.remember(live, state, blob)
        return state

    def place_state(self, meta: dict[str, str], entries: dict[str, tuple[str, tuple[int, ...]]]) -> dict | None:
        """store/reader.py's Placer: a snapshot this model wrote is read from disk straight into a blob laid out
        as llama_state_seq_set_data takes it (llama_place.place); inject() then finds its tensors in place and
        loads that blob (serialize copies nothing). None for any other snapshot: it is read as it is, and
        from_payload says what does not match."""
        if meta.get("backend") != BACKEND or meta.get("fingerprint") != self.spec.fingerprint:
            return None
        n = meta.get("n_tokens", "")
        if not n.isdigit() or int(n) < 1:
            return None
        slack = 4 * (self._pool.n_seq - 1) if self._pool.streams else 0  # llama_streams.as_streams writes there
        return llama_place.place(self.layout, int(n), entries, slack, take=self._buffers.take)

    def inject(self, state: SessionState) -> Live:
        """A Live holding `state`, loaded into the context now (so a restore's cost is paid here), beside
        the resident ones (SequencePool.admit): from the blob its tensors are views of (captured into, or read
        into by store/reader.py), known by their identity once found (SequencePool.original), else serialized
        from its tensors."""
        if state.layout != self.spec.layout:
            raise SnapshotMismatch(
                f"state layout {list(state.layout)} does not fit this model's {list(self.spec.layout)}."
            )
        found = self._pool.original(state)
        if found is not None:
            blob, serial = found
        else:
            blob = llama_state.in_place(state.layers, self.layout, state.n_tokens)
            if blob is not None:  # read into place: found there once, known by its arrays from now on
                serial = self._pool.remember_blob(state, blob)
            else:
                blob, serial = llama_state.serialize(state.layers, self.layout, state.n_tokens, reuse=False), None
        live = Live(
            cache=ParkedState(blob, kept=serial),
            token_ids=list(state.token_ids),
            last_logits=arrays.as_kind(arrays.float32(state.last_logits), arrays.NUMPY),
            text=state.text,
        )
        with self._lock:
            self._pool.admit(live)
        return live


class _ModelHandle:
    """Owns a llama_model: frees it when the last holder (backend finalizer, tokenizer) lets go."""

    def __init__(self, lib, ptr):
        self.ptr = ptr
        weakref.finalize(self, lib.llama_model_free, ptr)


def _free(lib, model: _ModelHandle, ctx, threadpool: ThreadPool | None) -> None:
    del model  # held only so that it outlives the context
    if ctx:
        lib.llama_free(ctx)
    if threadpool is not None:
        threadpool.free()
