"""Agent tool tests share the daemon helpers of tests/daemon (a real daemon on a free loopback port
serving a tiny random granitemoehybrid in float32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.conftest import FAMILY, greedy_reference, reference_backend, served, start_daemon  # noqa: F401

TOKEN = "agent-test-token"


@pytest.fixture(scope="module")
def model_dir(zoo) -> Path:
    return zoo.path(FAMILY)
