"""One daemon (`python -m engramctl.daemon --device cuda`, float32) through its real HTTP interface: a
chat turn answers what an in-process full prefill on the GPU answers, the daemon plans a VRAM tier from
the real GPU and keeps the snapshots there, and a snapshot restored from VRAM continues exactly like the
conversation that never stopped."""

from __future__ import annotations

import pytest

from tests.cuda._common import load_backend, record, requires_cuda
from tests.daemon.conftest import greedy_reference, start_daemon
from tests.helpers import chat

pytestmark = requires_cuda

FAMILY = "granitemoehybrid"
FIRST = [{"role": "user", "content": "What is a state space model?"}]


@pytest.fixture(scope="module")
def daemon(zoo, tmp_path_factory):
    # a fresh interpreter: CUDA in a daemon forked from the server (tests/daemon/forks.py) has not been run on a GPU
    d = start_daemon(
        zoo.path(FAMILY), tmp_path_factory.mktemp("cuda-home"), "--device", "cuda", timeout=180, fresh=True
    )
    yield d
    d.stop()


def test_chat_on_cuda_over_http(daemon, zoo):
    reference = load_backend(zoo.path(FAMILY), chunk_tokens=256)  # the backend's default chunk
    with daemon.http() as h:
        status = h.get("/v1/status").json()
        assert status["device"].startswith("cuda") and status["dtype"] == "float32", status
        r1 = chat(h, "g", FIRST[0]["content"], 8)
        assert r1["choices"][0]["message"]["content"] == greedy_reference(reference, FIRST, 8)
        head1 = r1["engram"]["snapshot_id"]
        info = h.post("/get_snapshot_info", json={"snapshot_id": head1}).json()
        assert info["tier"] == "vram", info  # the daemon planned a VRAM tier from the real GPU and used it
        tiers = {t["name"]: t for t in h.get("/v1/tiers").json()["tiers"]}
        assert tiers["vram"]["budget_bytes"] > 0 and tiers["vram"]["used_bytes"] > 0 and tiers["vram"]["snapshots"] >= 2

        r2 = chat(h, "g", "Second question?", 6)  # continues the daemon's live state
        assert r2["engram"]["resumed"] and r2["engram"]["tier"] == "live"
        chat(h, "other", "Something else.", 4)  # the live state is another session's now
        body = {
            "snapshot_id": head1,
            "session": "g-again",
            "max_tokens": 6,
            "temperature": 0,
            "continuation": "Second question?",
        }
        r3 = h.post("/restore_snapshot", json=body).json()
        assert r3["engram"]["tier"] == "vram" and r3["engram"]["restored_tokens"] == info["tokens"], r3
        assert r3["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
        record(
            "daemon",
            FAMILY,
            {
                "device": status["device"],
                "first_reply": r1["choices"][0]["message"]["content"],
                "vram_budget_bytes": tiers["vram"]["budget_bytes"],
                "restore_from_vram_ms": r3["engram"].get("restore_ms"),
            },
        )
