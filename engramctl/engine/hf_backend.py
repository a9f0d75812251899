"""The transformers backend: load a model, run it over a conversation's cache, and move state between
the cache and backend-neutral SessionState objects.

Traps this file handles (reference/hf-cache-notes.md):
- positions come from the K/V length in most families, but Bamba ignores the cache: always pass
  explicit position_ids where the forward accepts them;
- no attention mask for batch 1 (a mask covering only the new tokens silently corrupts logits);
- a restored linear-attention layer must go through update_conv_state/update_recurrent_state so that
  has_previous_state is set, otherwise the model treats the resume as a fresh prefill;
- logits_to_keep=1, or a long prefill allocates tokens x vocab logits;
- the PyTorch Mamba2 scan pads every multi-token forward to the config's chunk (256 on Granite 4.0-H):
  scan_chunk.py fits the chunk to each forward, so a short message costs its own length.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from pathlib import Path
from typing import Sequence

import torch

from engramctl.engine.backend import Live, ModelInfo
from engramctl.engine.ngram_hooks import NgramHooks
from engramctl.engine.families import Family, family_for
from engramctl.engine.fingerprint import model_fingerprint
from engramctl.engine.hf_kernels import describe_model as describe_kernels
from engramctl.engine.scan_chunk import ScanChunks
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import Cancelled, EngramError, SnapshotMismatch, UnsupportedModel
from engramctl.ngram.hashing import NgramConfig
from engramctl.ngram.tableset import TableSetup
from engramctl.state import AttentionState, EmptyState, HybridState, NgramState, RecurrentState, SessionState
from engramctl.state.layers import TOKEN_DIM
from engramctl.state.spec import TOKENS, LayerSpec, StateSpec, TensorSpec

DEFAULT_CHUNK_TOKENS = 256


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _torch_build(device: str, model) -> str:
    """What computes on transformers (ModelInfo.build): torch's version, on a GPU its CUDA and the card, and
    for recurrent layers whether mamba-ssm / causal-conv1d or PyTorch's fallback runs them (hf_kernels.py)."""
    version = torch.__version__.split("+")[0]
    if device.startswith("cuda"):
        line = f"torch {version}, CUDA {torch.version.cuda} on {torch.cuda.get_device_name(torch.device(device))}"
    else:
        line = f"torch {version}, {device.upper()}"
    kernels = describe_kernels(model, device)
    return f"{line}; recurrent layers: {kernels}" if kernels else line


class TransformersBackend:
    max_sequences = 1  # one conversation at a time: no step(), the engine feeds Lives one by one

    def __init__(
        self,
        model,
        tokenizer: ChatTokenizer,
        model_id: str,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        ngram: NgramConfig | None = None,
        tables: TableSetup | None = None,
    ):
        from transformers.cache_utils import DynamicCache

        self.model = model
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self._cache_cls = DynamicCache
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache_params" if "cache_params" in params else "past_key_values"
        self._pass_positions = "position_ids" in params
        self.device = str(next(model.parameters()).device)
        probe_cache = DynamicCache(config=model.config)
        classes = [type(layer).__name__ for layer in probe_cache.layers]
        self.family: Family = family_for(model.config.model_type, classes)
        # Before the fingerprint: the Engram weights and hash constants are part of the model's identity.
        self.engram = None if ngram is None else NgramHooks(model, tokenizer.hf, ngram, len(probe_cache.layers), tables)
        # so a short message on a restored state does not pay for a whole padded scan chunk
        self.scan_chunks = ScanChunks.find(model, self.family.scan_mixer)
        fingerprint = model_fingerprint(model, model.config.to_dict())
        n_params = sum(p.numel() for p in model.parameters())
        n_params += self.engram.tables.n_values if self.engram is not None else 0  # rows live in table files
        self.info = ModelInfo(
            model_id=model_id,
            family=model.config.model_type,
            architecture=type(model).__name__,
            device=self.device,
            dtype=_dtype_name(next(model.parameters())),
            n_params=n_params,
            weights_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
            context_length=getattr(model.config, "max_position_embeddings", None),
            fingerprint=fingerprint,
            resume="token_by_token" if self.family.token_by_token else "chunked",
            backend="transformers",
            weight_type=_dtype_name(next(model.parameters())),
            build=_torch_build(self.device, model),
        )
        self.spec = self._probe_spec()

    # -- loading -------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        model_dir: Path,
        model_id: str,
        device: str,
        dtype: torch.dtype,
        ngram: NgramConfig | None = None,
        tables: TableSetup | None = None,
    ) -> "TransformersBackend":
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        transformers.utils.logging.set_verbosity_error()  # the per-op "falling back to torch" lines
        try:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
            hf_tok = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError, KeyError) as e:
            raise UnsupportedModel(f"could not load a causal language model from {model_dir}: {e}") from None
        try:
            gen_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        except OSError:
            gen_eos = None
        tokenizer = ChatTokenizer(hf_tok, gen_eos if gen_eos is not None else model.config.eos_token_id)
        return cls(model, tokenizer, model_id, ngram=ngram, tables=tables)

    def _probe_spec(self) -> StateSpec:
        """Run one token through a fresh cache to learn every state tensor's shape and dtype."""
        live = self.new_live()
        logits = self.prefill(live, [0])
        layers = []
        for layer in self.capture(live).layers:
            specs = {}
            for name, t in layer.tensors().items():
                shape = list(t.shape)
                if name in ("keys", "values"):
                    shape[TOKEN_DIM] = TOKENS
                specs[name] = TensorSpec(tuple(shape), _dtype_name(t))
            layers.append(LayerSpec(layer.kind, specs))
        return StateSpec(
            model_id=self.info.model_id,
            fingerprint=self.info.fingerprint,
            dtype=self.info.dtype,
            vocab_size=int(logits.shape[-1]),
            layers=tuple(layers),
        )

    # -- running -------------------------------------------------------------------------------------
    def new_live(self) -> Live:
        return Live(cache=self._cache_cls(config=self.model.config), ngram=self.engram.fresh() if self.engram else ())

    def _forward(self, live: Live, ids: Sequence[int]) -> None:
        past = len(live.token_ids)
        kwargs = {self._cache_kw: live.cache, "use_cache": True, "logits_to_keep": 1}
        if self._pass_positions:
            kwargs["position_ids"] = torch.arange(past, past + len(ids), device=self.device).unsqueeze(0)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with torch.no_grad(), self.scan_chunks.fitted(len(ids)), self._engram_step(live, ids) as ngram_after:
            out = self.model(input_ids=input_ids, **kwargs)
        if self.engram is not None:
            live.ngram = tuple(ngram_after)
        live.token_ids.extend(int(i) for i in ids)
        live.last_logits = out.logits[0, -1].float()

    def _engram_step(self, live: Live, ids: Sequence[int]):
        return self.engram.step(live.ngram, ids) if self.engram is not None else contextlib.nullcontext([])

    def prefill(self, live: Live, token_ids: Sequence[int], cancel: threading.Event | None = None) -> torch.Tensor:
        ids = list(token_ids)
        if not ids:
            raise EngramError("prefill needs at least one token.")
        while ids:
            if cancel is not None and cancel.is_set():  # between chunks: the state holds whole chunks only
                raise Cancelled("the request was cancelled during the prompt prefill.")
            if self.family.token_by_token and live.token_ids:
                n = 1
            elif self.family.token_by_token:
                n = len(ids)  # from an empty state one long scan is exact
            else:
                n = self.chunk_tokens
            self._forward(live, ids[:n])
            ids = ids[n:]
        return live.last_logits

    def decode(self, live: Live, token_id: int) -> torch.Tensor:
        self._forward(live, [token_id])
        return live.last_logits

    def release(self, live: Live) -> None:
        live.cache = None  # the tensors go with the last reference; nothing is held outside Python

    # -- state ---------------------------------------------------------------------------------------
    def capture(self, live: Live) -> SessionState:
        """Copy the cache into a SessionState. Conv/recurrent buffers are updated in place by later
        forwards, so they are cloned; keys/values are replaced (torch.cat), never mutated, so shared."""
        from transformers.cache_utils import DummyLayer, DynamicLayer, LinearAttentionCacheLayerMixin

        if not live.token_ids or live.last_logits is None:
            raise EngramError("cannot capture a state that has consumed no tokens.")
        layers = []
        for i, layer in enumerate(live.cache.layers):
            rec = att = None
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                if layer.number_of_states != 1:
                    raise UnsupportedModel(
                        f"layer {i} keeps {layer.number_of_states} recurrent states; only 1 is supported."
                    )
                conv = layer.conv_states[0] if layer.is_conv_states_initialized[0] else None
                ssm = layer.recurrent_states[0] if layer.is_recurrent_states_initialized[0] else None
                rec = RecurrentState(
                    conv=None if conv is None else conv.detach().clone(),
                    recurrent=None if ssm is None else ssm.detach().clone(),
                )
            if isinstance(layer, DynamicLayer) and getattr(layer, "is_initialized", False) and layer.keys is not None:
                att = AttentionState(keys=layer.keys.detach(), values=layer.values.detach())
            if rec and att:
                layers.append(HybridState(rec, att))
            elif rec or att:
                layers.append(rec or att)
            elif isinstance(layer, DummyLayer):
                layers.append(EmptyState())
            else:
                raise UnsupportedModel(f"layer {i} ({type(layer).__name__}) holds no state after a forward.")
        # Engram conv states are replaced, never mutated in place, by later forwards: shared, not cloned.
        layers.extend(live.ngram)
        return SessionState(
            layers=tuple(layers),
            token_ids=tuple(live.token_ids),
            last_logits=live.last_logits.detach().clone(),
            text=live.text,
        )

    def inject(self, state: SessionState) -> Live:
        """Build a fresh cache holding `state`. The state's tensors are copied, never aliased, so the
        SessionState (a hot-tier copy, say) stays valid while the conversation goes on."""
        if state.layout != self.spec.layout:
            raise SnapshotMismatch(
                f"state layout {list(state.layout)} does not fit this model's {list(self.spec.layout)}."
            )
        live = self.new_live()
        for layer, st in zip(live.cache.layers, state.layers):
            rec = st.recurrent if isinstance(st, HybridState) else st if isinstance(st, RecurrentState) else None
            att = st.attention if isinstance(st, HybridState) else st if isinstance(st, AttentionState) else None
            if rec is not None:
                if rec.conv is not None:
                    conv = rec.conv.to(self.device)
                    layer.update_conv_state(conv, state_idx=0, conv_kernel_size=conv.shape[-1])
                if rec.recurrent is not None:
                    layer.update_recurrent_state(rec.recurrent.to(self.device), state_idx=0)
                    layer.has_previous_state[0] = True
            if att is not None:
                layer.update(att.keys.to(self.device), att.values.to(self.device))
        n_engram = len(live.ngram)
        live.ngram = (
            tuple(
                NgramState(st.conv.to(self.device).clone(), st.lookback.cpu().clone())
                for st in state.layers[len(state.layers) - n_engram :]
            )
            if n_engram
            else ()
        )
        live.token_ids = list(state.token_ids)
        live.last_logits = state.last_logits.to(self.device).float()
        live.text = state.text
        return live
