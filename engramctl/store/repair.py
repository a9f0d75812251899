"""Repairing a damaged KV block from a hot copy of the same bytes, so that one bad sector costs one block.

A KV block (blocks.py) is shared by every snapshot and prefix state holding its tokens: with agents, one block of
the system prompt is used by all of them. When a read finds it damaged or missing (blocks.BlockCorrupt), a user
of that block may still be whole in memory: a RAM or VRAM tier's copy, or a payload waiting for its write. Its
payload holds the block's bytes. `from_hot_copy` cuts the block again from that payload (blocks.split) and keeps it
only when the id it computes is the damaged block's: an id chains over the model fingerprint, every token up to
the block's end and the block's bytes, so the same id is the same bytes. It moves the damaged file to quarantine,
writes the block atomically (tmp, fsync, rename, directory fsync), checks the file it wrote, and records its
checksum. Only when no user is hot does the caller drop the block's users (they resume from their transcripts).

A crash while repairing leaves the row as it was: the block file is either absent (reconcile drops its users, as
without a repair) or complete and verifying (reconcile keeps it).
"""

from __future__ import annotations

import logging

from engramctl.store import blocks
from engramctl.store.core import StoreCore
from engramctl.store.reconcile import verify_block
from engramctl.store.records import TOKEN_IDS, Payload

log = logging.getLogger("engramctl.store")


def from_hot_copy(core: StoreCore, block_id: str, reason: str) -> bool:
    """Rewrite a damaged block from a user held in memory; True when the block's file now verifies (nothing to
    drop), False when no hot user holds it (then nothing changed). Under the lock: a rare path, and the hot copy
    must not be evicted while it is cut."""
    with core.lock:
        row = core.index.block(block_id)
        if row is None:
            return False
        block = _cut_from_hot_user(core, block_id, int(row["n_tokens"]))
        if block is None:
            return False
        block, fingerprint = block
        files = core.files
        files.quarantine(files.block_path(block_id), reason)  # the damaged bytes are kept aside, never deleted
        try:
            files.write_block(block_id, block.parts(fingerprint))
            files.sync_blocks()
        except OSError as e:
            log.error("KV block %s is damaged and could not be rewritten: %s", block_id, e)
            return False
        checksum, bad = verify_block(files, block_id)
        if checksum is None:
            log.error("KV block %s rewritten from a hot copy does not verify: %s", block_id, bad)
            return False
        core.index.update_block(block_id, durable=1, nbytes=files.block_size(block_id), checksum=checksum)
        log.warning("KV block %s was damaged (%s): rewritten from a copy in memory", block_id, reason)
        return True


def _cut_from_hot_user(core: StoreCore, block_id: str, block_tokens: int) -> tuple[blocks.Block, str] | None:
    """(the block cut from the payload of a user held in memory, its fingerprint), or None when no hot user's
    bytes give the block's id."""
    for sid in core.index.block_users(block_id):
        payload = _hot_payload(core, sid)
        if payload is None:
            continue
        tensors, meta = payload
        ids_t = tensors.get(TOKEN_IDS)
        if ids_t is None:
            continue
        _, _, cut = blocks.split(tensors, meta, ids_t.tolist(), block_tokens)
        found = next((b for b in cut if b.id == block_id), None)
        if found is not None:  # the id is recomputed from these bytes: the same id, the same bytes
            return found, meta.get("fingerprint", "")
    return None


def _hot_payload(core: StoreCore, sid: str) -> Payload | None:
    hit = core.placement.get(sid, touch=False)
    if hit is not None:
        return hit[0]
    return core.pending.get(sid)
