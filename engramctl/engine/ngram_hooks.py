"""N-gram layers on a transformers model: a forward pre-hook on each chosen decoder block adds the
N-gram memory output to the residual stream before the block runs (spec §2.8), without editing transformers.

Per forward the backend opens a `step`: the new tokens are compressed and hashed for every N-gram layer
(with the sequence's lookback) before the backbone runs, and the tables start reading those rows then (a
disk table's prefetcher gathers them while the blocks before the N-gram layer compute); each hook takes its
rows (waiting only for what is not there) and carries its layer's conv state. The tables are table files
under the data dir, placed in RAM or on disk by the tier planner (ngram/tableset.py, TableSetup). The
per-sequence part (conv windows, lookback ids) lives in Live.ngram as NgramState objects, so snapshots
hold it like any layer state.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from engramctl.errors import EngramError, SnapshotCorrupt, UnsupportedModel, UsageError
from engramctl.ngram.compression import TokenMap, build_from_decoder
from engramctl.ngram.hashing import NgramConfig, NgramHasher
from engramctl.ngram.layer import NgramStack
from engramctl.ngram.table_spec import config_hash
from engramctl.ngram.tableset import TableSet, TableSetup
from engramctl.state import NgramState

MODULE_NAME = "engram"  # where the stack hangs on the model: its weights join the fingerprint and n_params


def decoder_blocks(model: nn.Module, n_blocks: int) -> nn.ModuleList:
    """The model's one list of decoder blocks (model.layers, backbone.layers, ...), found by shape so no
    family needs naming here."""
    found = [
        m
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and name.endswith("layers") and len(m) == n_blocks
    ]
    if len(found) != 1:
        raise UnsupportedModel(f"cannot tell which module list holds this model's {n_blocks} decoder blocks.")
    return found[0]


@dataclass
class _Step:
    local_ids: dict[int, np.ndarray]  # layer -> (1, T, (N-1)*K) head-local row ids
    conv: dict[int, torch.Tensor]  # layer -> conv state, replaced as each layer runs
    ran: set[int]


class NgramHooks:
    """The N-gram layers of one loaded model and the hooks that run them. A forward runs inside one
    `step` at a time (the backend's single worker thread), which is what the hooks read."""

    def __init__(
        self, model: nn.Module, hf_tokenizer, config: NgramConfig, n_blocks: int, setup: TableSetup | None = None
    ):
        blocks = decoder_blocks(model, n_blocks)
        too_deep = [i for i in config.layer_ids if i >= len(blocks)]
        if too_deep:
            raise UsageError(f"N-gram layers {too_deep} are past this model's {len(blocks)} decoder blocks.")
        setup = setup or TableSetup()
        self.config = config
        self.token_map = cached_tokenizer_map(hf_tokenizer, setup.cache_dir)
        # The tokenizer's own pad plays the demo's pad_id (DeepSeek-V3's pad token); without one, EOS.
        pad = next((i for i in (hf_tokenizer.pad_token_id, hf_tokenizer.eos_token_id) if i is not None), 0)
        self.pad_raw = int(pad)
        self.hasher = NgramHasher(
            config, self.token_map.compressed_vocab_size, compressed_pad_id=self.token_map.compressed_pad(self.pad_raw)
        )
        hidden = int(model.config.hidden_size)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.stack = NgramStack(config, self.hasher, hidden, with_tables=False).to(
            device=param.device, dtype=param.dtype
        )
        dtype_name = str(param.dtype).removeprefix("torch.")
        key = config_hash(config, self.token_map.compressed_vocab_size, self.hasher.pad_id, dtype_name)
        self.table_key, self.table_dtype = key, dtype_name
        self.tables = TableSet.open(config, self.hasher, key, dtype_name, setup)
        for layer_id, checksum in self.tables.checksums.items():
            # the table's bytes are part of the model's identity (the fingerprint samples every buffer)
            digest = torch.tensor(list(bytes.fromhex(checksum)), dtype=torch.uint8, device=param.device)
            self.stack.layer(layer_id).register_buffer("table_checksum", digest)
        model.add_module(MODULE_NAME, self.stack)
        self._step: _Step | None = None
        for layer_id in config.layer_ids:
            blocks[layer_id].register_forward_pre_hook(self._hook(layer_id), with_kwargs=True)

    def open_tables(self, setup: TableSetup) -> TableSet:
        """The same tables held another way (RAM, disk read at the layer, disk prefetched): the benchmark
        swaps `self.tables` between these. The same data dir and init give the same bytes (the sidecar's
        checksum is checked against the model's), hence the same outputs."""
        tables = TableSet.open(self.config, self.hasher, self.table_key, self.table_dtype, setup)
        if tables.checksums != self.tables.checksums:
            tables.close()
            raise UsageError("these tables hold other bytes than the model's (another data dir or init).")
        return tables

    def close(self) -> None:
        self.tables.close()

    def fresh(self) -> tuple[NgramState, ...]:
        """A sequence that consumed nothing: zero conv windows, a lookback of pads."""
        width = self.config.max_ngram_size - 1
        out = []
        for layer_id in self.config.layer_ids:
            conv = self.stack.layer(layer_id).fusion.short_conv.initial_state(1, self.dtype, self.device)
            out.append(NgramState(conv=conv, lookback=torch.full((1, width), self.hasher.pad_id, dtype=torch.int64)))
        return tuple(out)

    @contextmanager
    def step(self, states: Sequence[NgramState], token_ids: Sequence[int]) -> Iterator[list[NgramState]]:
        """Hash `token_ids` (raw) for every layer, run the model inside, and put the states after them
        into the yielded list once the forward is done."""
        if len(states) != len(self.config.layer_ids):
            raise EngramError(
                f"the sequence carries {len(states)} N-gram states; the model has {len(self.config.layer_ids)} layers."
            )
        compressed = self.token_map.compress([list(token_ids)], self.pad_raw)  # (1, T)
        lookback = states[0].lookback.cpu().numpy()  # the same token history for every layer
        local = self.hasher.hash_continuation(lookback, compressed)
        self.tables.begin(local)  # before the backbone runs: a disk table starts gathering now
        self._step = _Step(local, {lid: st.conv for lid, st in zip(self.config.layer_ids, states)}, set())
        result: list[NgramState] = []
        try:
            yield result
            missing = set(self.config.layer_ids) - self._step.ran
            if missing:
                raise EngramError(f"N-gram layers {sorted(missing)} did not run during the forward.")
            after = self.hasher.next_lookback(lookback, compressed)  # (1, N-1)
            # one tensor per layer: a snapshot file refuses tensors that share memory
            result.extend(
                NgramState(conv=self._step.conv[lid], lookback=torch.from_numpy(after.copy()))
                for lid in self.config.layer_ids
            )
        finally:
            self._step = None

    def _hook(self, layer_id: int):
        def pre_hook(module, args, kwargs):
            step = self._step
            if step is None:
                raise EngramError(f"the N-gram layer at block {layer_id} ran outside a backend step.")
            if layer_id in step.ran:
                raise EngramError(f"the N-gram layer at block {layer_id} ran twice in one forward.")
            in_kwargs = "hidden_states" in kwargs
            hidden = kwargs["hidden_states"] if in_kwargs else args[0]  # (1, T, d) residual stream
            rows = self.tables.take(layer_id)  # waits only for the rows not gathered yet
            rows = torch.from_numpy(rows).view(self.dtype) if rows.dtype == np.uint16 else torch.from_numpy(rows)
            layer = self.stack.layer(layer_id)
            out, step.conv[layer_id] = layer(hidden, step.local_ids[layer_id], step.conv[layer_id], rows=rows)
            step.ran.add(layer_id)
            if in_kwargs:
                return args, {**kwargs, "hidden_states": out}
            return (out, *args[1:]), kwargs

        return pre_hook


def cached_tokenizer_map(tokenizer, cache_dir: Path | None) -> TokenMap:
    """tokenizer_map, kept under <cache dir>/ngram/ by a hash of the tokenizer's vocabulary: building it
    decodes every token (about a second), which a load should not pay every time."""
    if cache_dir is None:
        return tokenizer_map(tokenizer)
    hf = getattr(tokenizer, "hf", tokenizer)
    vocab = hf.get_vocab() if hasattr(hf, "get_vocab") else {}
    key = hashlib.sha256(repr((len(hf), sorted(vocab.items()), hf.all_special_tokens)).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "ngram" / f"tokenmap-{key}.safetensors"
    if path.is_file():
        try:
            return TokenMap.load(path)
        except SnapshotCorrupt:
            pass  # torn by a crash mid-write: built again below
    token_map = tokenizer_map(tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    token_map.save(tmp)
    tmp.replace(path)
    return token_map


def tokenizer_map(tokenizer) -> TokenMap:
    """The compression map (spec §2.2) of a transformers tokenizer, a ChatTokenizer, or the llama.cpp
    backend's GgufTokenizer: each token decoded alone with specials kept, plus its vocabulary string."""
    hf = getattr(tokenizer, "hf", tokenizer)
    if hasattr(hf, "convert_ids_to_tokens"):
        return build_from_decoder(
            len(hf), lambda t: hf.decode([t], skip_special_tokens=False), hf.convert_ids_to_tokens
        )
    return build_from_decoder(
        tokenizer.n_vocab, lambda t: tokenizer.decode([t], skip_special=False), tokenizer.vocab_text
    )
