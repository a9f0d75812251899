"""Sizes where snapshots share KV blocks (store/blocks.py): a session's SIZE in `sessions`/`ps` counts each block
its snapshots use once, and `snapshots rm` announces what the deletion frees, not the sum of the snapshots' sizes
(each of which counts the blocks it shares). A real conversation on the tiny model, over the daemon's HTTP API."""

from __future__ import annotations

from pathlib import Path

LONG = "Tell me about the harbour, the boats, the nets and the early markets of the old town. " * 12


def _disk_bytes(data: Path) -> int:
    return sum(p.stat().st_size for d in ("snapshots", "blocks") for p in (data / d).glob("*") if p.is_file())


def test_session_size_and_rm_preview_count_shared_blocks_once(cli, daemon):
    oai, h = daemon.clients()
    try:
        messages = [{"role": "user", "content": LONG}]
        for turn in range(2):
            r = oai.chat.completions.create(
                model="m", messages=messages, max_tokens=4, temperature=0, extra_body={"session": "harbour"}
            )
            messages = [{"role": "user", "content": f"And turn {turn}? " + LONG}]
        daemon.store.flush()
        snaps = cli.json("snapshots", "ls", "--session", "harbour")
        assert len(snaps) >= 2 and r.choices[0].message.content is not None
        assert any(s["shared_size_bytes"] > 0 for s in snaps), snaps  # the turns share their first blocks
        (row,) = [s for s in cli.json("sessions") if s["name"] == "harbour"]
        on_disk = _disk_bytes(daemon.settings.paths.data_dir)
        assert row["nbytes"] == row["stored_bytes"] == on_disk < sum(s["nbytes"] for s in snaps)

        first = snaps[0]["id"]
        one = cli.json("snapshots", "rm", first, "--dry-run")
        assert one["freed_bytes"] == snaps[0]["own_size_bytes"] < snaps[0]["nbytes"]
        whole = cli.json("snapshots", "rm", "--session", "harbour", "--dry-run")
        assert whole["freed_bytes"] == on_disk  # no other session or prefix state uses its blocks

        done = cli.json("snapshots", "rm", first, "--yes", "--force")
        daemon.store.flush()
        assert done["freed_bytes"] == on_disk - _disk_bytes(daemon.settings.paths.data_dir)

        missing = h.post("/v1/snapshots/freed_bytes", json={"snapshot_ids": [first]})
        assert missing.status_code == 404 and first in missing.text
        assert h.post("/v1/snapshots/freed_bytes", json={"snapshot_ids": "x"}).status_code == 400
        assert h.post("/v1/snapshots/freed_bytes", json={"ids": []}).status_code == 400
    finally:
        h.close()
