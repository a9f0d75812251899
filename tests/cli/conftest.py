"""CLI test helpers: a CliRunner that keeps stdout and stderr apart, a store with known content, and a
daemon over it for the commands that change something."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch
from typer.testing import CliRunner

from engramctl.cli import app


def make_payload(n_tokens: int, seed: int = 0, fingerprint: str = "test-fingerprint") -> tuple[dict, dict]:
    """A small hybrid-shaped snapshot payload (recurrent + attention layers, token ids, logits)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 512, (n_tokens,), generator=g)
    tensors = {
        "layers.0.conv": torch.randn(1, 96, 4, generator=g),
        "layers.0.recurrent": torch.randn(1, 4, 16, 8, generator=g),
        "layers.1.keys": torch.randn(1, 2, n_tokens, 16, generator=g),
        "layers.1.values": torch.randn(1, 2, n_tokens, 16, generator=g),
        "token_ids": ids.to(torch.int64),
        "last_logits": torch.randn(512, generator=g),
    }
    meta = {
        "n_tokens": str(n_tokens),
        "fingerprint": fingerprint,
        "model_id": "test/tiny-hybrid",
        "dtype": "float32",
        "text": f"{n_tokens} tokens",
    }
    return tensors, meta


@dataclass
class Seeded:
    """What `seeded` put in the store: sessions -> snapshot ids, oldest first."""

    sessions: dict[str, list[str]] = field(default_factory=dict)

    @property
    def all_ids(self) -> list[str]:
        return sorted(i for ids in self.sessions.values() for i in ids)

    def prefix(self, sid: str, at_least: int = 20) -> str:
        """The shortest prefix of `sid`, of `at_least` characters or more, that no other seeded id starts with: ids
        made in the same millisecond differ only in their last digits (store/names.py new_snapshot_id)."""
        others = [i for i in self.all_ids if i != sid]
        n = next(n for n in range(at_least, len(sid) + 1) if not any(o.startswith(sid[:n]) for o in others))
        return sid[:n]


def seed_store(spec: dict[str, int], *, pin: list[tuple[str, int]] = (), label: dict = None) -> Seeded:
    """spec: session -> number of snapshots (each a turn of 2 messages, growing by 8 tokens)."""
    from engramctl.settings import load_settings
    from tests.helpers import open_planned

    out = Seeded()
    with open_planned(load_settings())[0] as store:
        for session, n in spec.items():
            ids = []
            for i in range(n):
                msgs = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
                rec = store.snapshots.commit(session, make_payload(8 * (i + 1), seed=i), messages=msgs)
                ids.append(rec.id)
            out.sessions[session] = ids
        store.flush()
        for session, i in pin:
            store.snapshots.pin(out.sessions[session][i])
        for (session, i), text in (label or {}).items():
            store.snapshots.label(out.sessions[session][i], text)
    return out


@pytest.fixture
def seeded() -> Seeded:
    return seed_store({"demo": 3, "other": 2})


@pytest.fixture
def daemon(tiny_engine, engram_home):
    """A daemon over this test's ENGRAM_HOME (tests.helpers.inprocess: real HTTP, the tiny model), which
    every change goes through. Ask for it after `seeded`: the store is seeded before the daemon opens it."""
    from tests.helpers.inprocess import InProcessDaemon

    with InProcessDaemon(tiny_engine("transformers")) as d:
        yield d


class Runner:
    def __init__(self):
        self._runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None, code: int | None = 0, env: dict | None = None):
        result = self._runner.invoke(app, list(args), input=input, env=env, catch_exceptions=False)
        if code is not None:
            assert result.exit_code == code, (
                f"engramctl {' '.join(args)} exited {result.exit_code}, expected {code}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result

    def json(self, *args: str, **kw):
        result = self(*args, "--json", **kw)
        return json.loads(result.stdout)


@pytest.fixture
def cli() -> Runner:
    return Runner()
