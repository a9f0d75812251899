"""A KV stream per sequence: the llama.cpp context layout for attention-only models, and its state blobs.

With one unified KV cache every row of a step walks every resident conversation's cells (ggml-cpu's flash
attention reads the mask of each cell up to the highest in use before it can skip it: docs/batching.md), so
a prompt prefilled beside four resident conversations cost 1.14x what it costs alone, and a 4-row decode
step 1.06x. With `kv_unified = false` (llama-server's layout with `-np N`) each sequence has a stream of
its own cells and a row reads only those. Attention-only models get it; a model with recurrent layers keeps
the unified cache (its attention is a few layers of many, and this commit's multi-stream hybrid path ran
a decode step in seconds: docs/batching.md).

What it changes around the context: each conversation holds at most the stream's cells (the context's
n_ctx / n_seq_max); llama.cpp splits a step into ubatches of consecutive sequence ids (split_equal with
`sequential`), so a step feeds its conversations in sequence order; no kept states (they share cells with
the live conversation, which only one stream can); a shared prefix is copied into the new stream instead
of its cells gaining a sequence id. And the blobs: llama_state_seq_get_data writes one entry per stream,
every one but the sequence's own empty (a u32 cell count of 0), and set_data wants as many. The rest of
engramctl (llama_state.parse, snapshots, a unified context loading them) knows the one-stream form, which
is what a unified context writes: `one_stream` and `of_streams` convert, with nothing else to change (an
attention-only blob has nothing after its KV part).
"""

from __future__ import annotations

import struct

from engramctl.errors import StateFormatError

_N_STREAM_AT = 8  # u32 magic | i32 seq_id | u32 n_stream (llama_state.py)


def one_stream(blob: bytearray) -> bytearray:
    """A sequence's blob from a context of several streams, as one stream writes it, in place (no copy of
    the cells: a capture is on the path between two steps): the empty streams' entries (a cell count of 0
    each) go."""
    (n_stream,) = struct.unpack_from("<I", blob, _N_STREAM_AT)
    if n_stream == 1:
        return blob
    at = _N_STREAM_AT + 4
    for s in range(n_stream):
        (cells,) = struct.unpack_from("<I", blob, at)
        if cells:  # the sequence's own stream: its data runs to the empty entries of the streams after it
            break
        at += 4
    else:  # no cells at all: the last entry stays, a count of 0
        s, at = n_stream - 1, at - 4
    end = len(blob) - 4 * (n_stream - 1 - s)
    if any(blob[end:]):
        raise StateFormatError("a llama.cpp state blob holds cells in more than one KV stream.")
    del blob[end:]
    # the header moves up to just before the stream's entry; dropping a bytearray's front copies nothing
    at -= _N_STREAM_AT + 4
    blob[at : at + _N_STREAM_AT] = blob[:_N_STREAM_AT]
    struct.pack_into("<I", blob, at + _N_STREAM_AT, 1)
    del blob[:at]
    return blob


def of_streams(blob: bytearray, n_stream: int, into: bytearray | None = None) -> tuple[bytearray, int]:
    """A one-stream blob as set_data takes it into a context of `n_stream` streams: (a buffer, the blob's length
    in it). `blob` (a captured state's) is never modified: the cells are copied first (they go into the stream of
    the sequence it is loaded into, whichever entry holds them), then the empty entries, into `into` when given
    (grown as needed: a buffer kept and reused is already in memory, where a new one of a conversation's KV
    faults in each page as it is written: 26 ms of a 33 ms restore of 1,900 SmolLM2 tokens), else a new one."""
    (have,) = struct.unpack_from("<I", blob, _N_STREAM_AT)
    if have == n_stream:
        return blob, len(blob)
    if have != 1:
        raise StateFormatError(f"a llama.cpp state blob of {have} KV streams cannot load into {n_stream}.")
    n = len(blob) + 4 * (n_stream - 1)
    out = bytearray(n) if into is None else into
    if len(out) < n:
        out.extend(bytes(n - len(out)))
    out[: len(blob)] = memoryview(blob)  # a bytearray, or the uint8 array a restore was read into
    out[len(blob) : n] = bytes(n - len(blob))  # the empty entries: a cell count of 0 each
    struct.pack_into("<I", out, _N_STREAM_AT, n_stream)
    return out, n


def as_streams(blob, n_stream: int):
    """`blob` as set_data takes it into `n_stream` streams without copying it, when it is a uint8 array with room
    after it in its buffer (a restore read into place: llama_place.place's slack_bytes): (that buffer, the length
    to load) with its stream count and the empty entries written in place; None otherwise (of_streams copies).
    Call one_stream_again(blob) after the load: nothing else may see the blob as several streams."""
    import numpy as np

    if not isinstance(blob, np.ndarray) or blob.base is None or n_stream == 1:
        return None
    (have,) = struct.unpack_from("<I", blob, _N_STREAM_AT)
    owner = np.frombuffer(blob.base, np.uint8) if not isinstance(blob.base, np.ndarray) else blob.base
    n = len(blob) + 4 * (n_stream - 1)
    if have != 1 or owner.ndim != 1 or owner.nbytes < n or owner.ctypes.data != blob.ctypes.data:
        return None
    owner[len(blob) : n] = 0  # the empty entries: a cell count of 0 each
    struct.pack_into("<I", owner, _N_STREAM_AT, n_stream)
    return owner, n


def one_stream_again(blob) -> None:
    """Undo as_streams's stream count: the blob is one stream's again (what parse() and the store read)."""
    struct.pack_into("<I", blob, _N_STREAM_AT, 1)
