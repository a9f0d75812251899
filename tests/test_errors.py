"""One errors module: every typed error declares its kind and HTTP status once (engramctl/errors.py), and
each one raised in the daemon comes back out of the client as the same class, message, hint and field.
Real HTTP: the daemon's app in a thread of this process (tests.helpers.inprocess) on the tiny model."""

from __future__ import annotations

import httpx
import pytest

import engramctl
from engramctl.client import Client
from engramctl.errors import EngramError, ToolArgumentError

MODULES = {"engramctl.errors"}


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


def _import_everything() -> None:
    """Import every module that defines an error class (lazily imported ones included)."""
    import engramctl.agent.tools  # noqa: F401
    import engramctl.client  # noqa: F401
    import engramctl.daemon.app  # noqa: F401
    import engramctl.daemon.streaming  # noqa: F401
    import engramctl.store.store  # noqa: F401


def test_every_error_class_is_declared_once_in_the_errors_module():
    _import_everything()
    for cls in _all_subclasses(EngramError):
        if not cls.__module__.startswith(engramctl.__name__) or cls.__module__.startswith("tests"):
            continue
        if "kind" in cls.__dict__:
            assert cls.__module__ in MODULES, f"{cls.__qualname__} ({cls.__module__}) is not in engramctl/errors.py"
            assert EngramError.for_kind(cls.kind) is cls
        else:  # a refinement that crosses the wire as its parent (daemon/streaming.py's ClientGone)
            assert cls.__module__ not in MODULES and EngramError.for_kind(cls.kind) is not None
    kinds = EngramError.kinds()
    assert len(kinds) == len(set(kinds.values()))
    # the kinds the client's hand-kept table used to miss (they came back as a class picked by status)
    once_missed = {"backend_unavailable", "state_format_error", "ngram_table_error", "ngram_table_corrupt"}
    once_missed |= {"ngram_table_mismatch", "disk_full", "data_dir_unusable", "invalid_arguments", "unknown_tool"}
    assert once_missed <= set(kinds)
    with pytest.raises(TypeError, match="already names"):
        type("Again", (EngramError,), {"kind": "not_found"})


def _raised(cls: type[EngramError]) -> EngramError:
    message, hint = f"it went wrong: {cls.kind}.", f"engramctl fix {cls.kind}"
    if issubclass(cls, ToolArgumentError):
        return cls(message, "arguments.label", hint)
    return cls(message, hint)


@pytest.fixture(scope="module")
def raising_daemon(tiny_engine, tmp_path_factory):
    """The daemon with one extra route that raises the error class its kind names."""
    from tests.helpers.inprocess import InProcessDaemon

    mp = pytest.MonkeyPatch()
    mp.setenv("ENGRAM_HOME", str(tmp_path_factory.mktemp("errors-home")))

    async def raise_it(kind: str):
        raise _raised(EngramError.for_kind(kind))

    try:
        with InProcessDaemon(tiny_engine("transformers")) as d:
            d.app.add_api_route("/v1/test/raise/{kind}", raise_it, methods=["POST"])
            yield d
    finally:
        mp.undo()


@pytest.mark.parametrize("kind", sorted(EngramError.kinds()))
def test_each_error_round_trips_from_the_daemon_to_the_client(raising_daemon, kind):
    cls = EngramError.for_kind(kind)
    sent = _raised(cls)
    with Client(raising_daemon.settings, autostart=False) as client:
        with pytest.raises(EngramError) as got:
            client.connection.request("POST", f"/v1/test/raise/{kind}")
    assert type(got.value) is cls, (kind, type(got.value))
    assert (got.value.message, got.value.hint, got.value.param) == (sent.message, sent.hint, sent.param)
    assert got.value.exit_code == cls.exit_code
    r = httpx.post(
        f"{raising_daemon.url}/v1/test/raise/{kind}", headers={"Authorization": f"Bearer {raising_daemon.daemon.token}"}
    )
    assert r.status_code == cls.status and r.json()["error"]["code"] == kind
