"""What LLAMA_STATE_SEQ_FLAGS_ON_DEVICE does on this llama.cpp build (issue 38 item 3: the VRAM tier's mechanism
is to be picked by measurement): a sequence's state saved into buffers the context owns, restored into another
sequence, and the continuation compared with the run that never stopped.

    python scripts/llama_on_device_probe.py MODEL.gguf

Uses the backend's private context on purpose: it measures llama.cpp's calls, not engramctl's."""

import ctypes, sys, time
from pathlib import Path
import numpy as np
from engramctl.engine.llama_backend import LlamaCppBackend

path = Path(sys.argv[1])
b = LlamaCppBackend(path, path.name, chunk_tokens=16, sequences=4)
lib, ctx = b._lib, b._ctx
ids = list(range(5, 45))
live = b.new_live()
b.prefill(live, ids)
seq = live.cache.seq
print("seq", seq)
flags = lib.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE
n_host = lib.llama_state_seq_get_size_ext(ctx, seq, 0)
n_dev = lib.llama_state_seq_get_size_ext(ctx, seq, flags)
print("host blob bytes", n_host, "on-device blob (metadata) bytes", n_dev)
buf = (ctypes.c_uint8 * n_dev)()
t0 = time.perf_counter()
w = lib.llama_state_seq_get_data_ext(ctx, buf, n_dev, seq, flags)
t1 = time.perf_counter()
print("written", w, f"{(t1 - t0) * 1e3:.3f} ms")
# the continuation uninterrupted
want = b.prefill(live, [7, 8, 9]).copy()
# restore the on-device copy into another sequence and continue
mem = lib.llama_get_memory(ctx)
dest = (seq + 1) % 4
lib.llama_memory_seq_rm(mem, dest, -1, -1)
t0 = time.perf_counter()
r = lib.llama_state_seq_set_data_ext(ctx, buf, n_dev, dest, flags)
t1 = time.perf_counter()
print("read", r, f"{(t1 - t0) * 1e3:.3f} ms")
batch = lib.llama_batch_init(3, 0, 1)
batch.n_tokens = 3
for i, t in enumerate([7, 8, 9]):
    batch.token[i] = t
    batch.pos[i] = len(ids) + i
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = dest
    batch.logits[i] = 1 if i == 2 else 0
rc = lib.llama_decode(ctx, batch)
n_vocab = b.n_vocab
got = np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, 2), shape=(n_vocab,)).copy()
print(
    "decode rc",
    rc,
    "max |diff| vs the uninterrupted run",
    float(np.abs(got - want).max()),
    "argmax same",
    int(got.argmax()) == int(want.argmax()),
)
# and the same state restored from the host blob, for comparison
lib.llama_batch_free(batch)
