"""Settings in one place: every interface (config.toml, ENGRAM_*, the CLI's and the daemon's flags, the env a
background daemon gets, the env help, the README) is derived from the Settings fields; precedence
defaults < config.toml < env < flags; bad values get a sentence naming where they came from; no
RuntimeDirWarning without XDG_RUNTIME_DIR."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engramctl.settings import SPECS, Paths, Settings, load_settings, settings_env, spec

ROOT = Path(__file__).resolve().parents[1]
DAEMON_SPECS = [s for s in SPECS if s.daemon and s.flag]


@pytest.fixture
def cli():
    from tests.cli.conftest import Runner

    return Runner()


def _config(engram_home: Path, text: str) -> None:
    (engram_home / "config").mkdir(parents=True, exist_ok=True)
    (engram_home / "config" / "config.toml").write_text(text)


def test_precedence_defaults_config_env_flags(engram_home):
    env = {"ENGRAM_HOME": str(engram_home)}
    assert load_settings(env=env).backend == "auto"
    _config(engram_home, 'backend = "transformers"\ntier_ram_bytes = "1GiB"\nkeep_last = 3\nlater_layer = 1\n')
    st = load_settings(env=env)
    assert (st.backend, st.tier_ram_bytes, st.keep_last, st.extra) == ("transformers", 2**30, 3, {"later_layer": 1})
    env |= {"ENGRAM_BACKEND": "llama.cpp", "ENGRAM_TIER_RAM_BYTES": "2GiB"}
    st = load_settings(env=env)
    assert (st.backend, st.tier_ram_bytes, st.keep_last) == ("llama.cpp", 2 * 2**30, 3)
    st = load_settings({"backend": "transformers", "keep_last": 5}, env=env)
    assert (st.backend, st.tier_ram_bytes, st.keep_last) == ("transformers", 2 * 2**30, 5)


@pytest.mark.parametrize("source", ["config", "env", "flag"])
def test_a_bad_backend_names_its_source_and_the_choices(engram_home, source):
    from engramctl.errors import UsageError

    env = {"ENGRAM_HOME": str(engram_home)}
    flags = {}
    if source == "config":
        _config(engram_home, 'backend = "vllm"\n')
    elif source == "env":
        env["ENGRAM_BACKEND"] = "vllm"
    else:
        flags["backend"] = "vllm"
    with pytest.raises(UsageError) as e:
        load_settings(flags, env=env)
    where = {"config": "config.toml", "env": "ENGRAM_BACKEND", "flag": "--backend"}[source]
    assert where in e.value.message and "'vllm' is not one of auto, transformers, llama.cpp" in e.value.message
    assert "--backend" in e.value.hint and "ENGRAM_BACKEND" in e.value.hint


def test_bad_values_of_each_kind():
    from engramctl.errors import UsageError

    bad = [
        ("port", "http", "whole number"),
        ("port", "70000", "between 0 and 65535"),
        ("allow_remote", "maybe", "1/0"),
        ("tier_ram_bytes", "lots", "not a size"),
        ("session_ttl_s", "soon", "a number"),
        ("device", "tpu", "auto, cpu, cuda"),
    ]
    for name, value, words in bad:
        with pytest.raises(UsageError) as e:
            load_settings({name: value})
        assert f"--{name.replace('_', '-')}: " in e.value.message and words in e.value.message, e.value.message
    assert load_settings({"allow_remote": "yes", "port": "0"}).allow_remote is True


def test_the_cli_refuses_a_bad_backend(cli):
    r = cli("daemon", "start", "--backend", "vllm", code=2)
    assert r.stderr.startswith("Error: --backend: backend 'vllm' is not one of auto, transformers, llama.cpp.")
    assert "Hint: " in r.stderr and r.stdout == ""
    r = cli("serve", env={"ENGRAM_BACKEND": "llama"}, code=2)
    assert "Error: ENGRAM_BACKEND: backend 'llama' is not one of" in r.stderr


def test_every_setting_is_a_field_with_metadata():
    fields = {f.name for f in Settings.__dataclass_fields__.values()} - {"paths", "extra"}
    assert {s.name for s in SPECS} == fields
    assert spec("backend").choices == ("auto", "transformers", "llama.cpp") and spec("backend").default == "auto"
    assert spec("api_key").flag is None  # a secret on a command line shows in `ps`
    assert not spec("no_autostart").daemon


def test_cli_and_daemon_flags_come_from_the_settings(cli):
    from engramctl.daemon.runner import add_setting_arguments, setting_flags

    for command in (["serve"], ["daemon", "start"]):
        text = cli(*command, "--help").stdout
        for s in DAEMON_SPECS:
            assert s.flag in text and s.env in text, (command, s.name)
        assert "--api-key" not in text and "--no-autostart" not in text
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    args = parser.parse_args(["--backend", "llama.cpp", "--tier-ram-bytes", "1GiB", "--loopback-only", "-p", "0"])
    assert setting_flags(args) == {"backend": "llama.cpp", "tier_ram_bytes": "1GiB", "allow_remote": "0", "port": "0"}
    st = load_settings(setting_flags(args))
    assert (st.backend, st.tier_ram_bytes, st.allow_remote, st.port) == ("llama.cpp", 2**30, False, 0)
    assert {a.dest for a in parser._actions} - {"help"} == {s.name for s in DAEMON_SPECS}


def test_env_help_lists_every_variable(cli):
    epilog = cli("--help").stdout
    for s in SPECS:
        assert s.env in epilog, s.env
    assert "ENGRAM_HOME" in epilog


def test_a_background_daemon_gets_every_daemon_setting(engram_home, tmp_path, monkeypatch):
    from engramctl.daemon.background import _settings_env

    _config(engram_home, 'tier_disk_bytes = "3GB"\n')
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    flags = {"backend": "llama.cpp", "allow_remote": True, "model": "m.gguf", "session_ttl_s": 60}
    env = {"ENGRAM_HOME": str(engram_home), "ENGRAM_KEEP_LAST": "4", "ENGRAM_NO_AUTOSTART": "1"}
    st = load_settings(flags, env=env)
    spawned = _settings_env(st)
    assert spawned["ENGRAM_BACKEND"] == "llama.cpp" and spawned["ENGRAM_MODEL"] == str(model.resolve())
    assert spawned["ENGRAM_ALLOW_REMOTE"] == "1" and spawned["ENGRAM_TIER_DISK_BYTES"] == "3000000000"
    assert "ENGRAM_NO_AUTOSTART" not in spawned and "ENGRAM_API_KEY" not in spawned  # a client setting; unset
    back = load_settings(env={"ENGRAM_HOME": str(engram_home), **settings_env(st)})
    for s in SPECS:
        if s.daemon:
            assert getattr(back, s.name) == getattr(st, s.name), s.name


def test_readme_table_matches_the_settings():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_settings_docs
    finally:
        sys.path.pop(0)
    readme = (ROOT / "README.md").read_text()
    fix = "README.md's settings table is out of date; run python scripts/gen_settings_docs.py"
    assert gen_settings_docs.render(readme) == readme, fix
    for s in SPECS:
        assert f"`{s.env}`" in readme


# -- the run directory -------------------------------------------------------------------------------
def test_no_runtime_dir_warning_without_xdg_runtime_dir(tmp_path, monkeypatch):
    """Every command printed platformdirs' RuntimeDirWarning when XDG_RUNTIME_DIR was unset (ssh, su, containers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "ENGRAM_"))}
    env |= {"HOME": str(tmp_path), "ENGRAM_NO_AUTOSTART": "1", "PYTHONWARNINGS": "default"}
    code = "from engramctl.cli import main; import sys; sys.argv = ['engramctl'] + sys.argv[1:]; main()"
    for args in (["ps"], ["daemon", "status"]):
        cmd = [sys.executable, "-c", code, *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 3), proc.stderr
        assert "RuntimeDirWarning" not in proc.stderr and "XDG_RUNTIME_DIR" not in proc.stderr, proc.stderr
    monkeypatch.setenv("HOME", str(tmp_path))  # platformdirs reads os.environ
    for k in [k for k in os.environ if k.startswith("XDG_")]:
        monkeypatch.delenv(k)
    run_dir = Paths.from_env(env).run_dir
    if not Path(f"/run/user/{os.geteuid()}").is_dir():
        assert run_dir == tmp_path / ".local" / "state" / "engramctl" / "run"
    Paths.from_env(env).ensure()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


@pytest.mark.skipif(sys.platform in ("darwin", "win32"), reason="XDG rules apply on Linux and the BSDs")
def test_run_dir_uses_a_private_xdg_runtime_dir_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    assert Paths.from_env({"XDG_RUNTIME_DIR": str(xdg)}).run_dir == xdg / "engramctl"
    xdg.chmod(0o755)  # others could enter it: not a runtime dir by the XDG rules
    assert Paths.from_env({"XDG_RUNTIME_DIR": str(xdg)}).run_dir != xdg / "engramctl"
    assert Paths.from_env({"XDG_RUNTIME_DIR": "relative/dir"}).run_dir != Path("relative/dir/engramctl")
    old = tmp_path / ".local" / "state" / "engramctl" / "run"
    old.mkdir(parents=True, mode=0o755)  # made by an older version, or by hand
    if not Path(f"/run/user/{os.geteuid()}").is_dir():
        paths = Paths.from_env({}).ensure()
        assert paths.run_dir == old and stat.S_IMODE(old.stat().st_mode) == 0o700
