"""One frozen Settings object, built once: defaults < config.toml < ENGRAM_* env < flags."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from engramctl.errors import UsageError
from engramctl.units import parse_bytes

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

APP = "engramctl"
DEFAULT_PORT = 11535


@dataclass(frozen=True)
class Paths:
    data_dir: Path  # snapshots, index
    config_dir: Path  # config.toml, token
    log_dir: Path
    run_dir: Path  # pid/lock/port files
    cache_dir: Path  # converted model weights (GGUF -> safetensors)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Paths":
        home = env.get("ENGRAM_HOME")
        if home:
            root = Path(home).expanduser().resolve()
            return cls(root, root / "config", root / "logs", root / "run", root / "cache")
        import platformdirs

        return cls(
            Path(platformdirs.user_data_dir(APP)),
            Path(platformdirs.user_config_dir(APP)),
            Path(platformdirs.user_log_dir(APP)),
            Path(platformdirs.user_runtime_dir(APP)),
            Path(platformdirs.user_cache_dir(APP)),
        )

    def ensure(self) -> "Paths":
        for p in dataclasses.astuple(self):
            Path(p).mkdir(parents=True, exist_ok=True, mode=0o700)
        return self


@dataclass(frozen=True)
class Settings:
    paths: Paths
    model: str | None = None  # hub id, local directory or GGUF file; None = the default model
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    allow_remote: bool = False  # a non-loopback host needs this
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    api_key: str | None = None  # overrides the generated token
    tier_vram_bytes: int | None = None  # None = planned from the hardware
    tier_ram_bytes: int | None = None
    tier_disk_bytes: int | None = None
    keep_last: int = 8  # snapshots kept per session besides pinned/labelled ones
    session_ttl_s: float | None = None  # drop unpinned snapshots of sessions idle this long
    max_queue: int = 8  # queued generation requests before 429
    no_autostart: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # config keys kept for later layers


_FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name not in ("paths", "extra")}
_SIZE_FIELDS = {"tier_vram_bytes", "tier_ram_bytes", "tier_disk_bytes"}


def _coerce(name: str, value: Any, source: str) -> Any:
    if value is None:
        return None
    kind = _FIELDS[name].type
    try:
        if name in _SIZE_FIELDS:
            return parse_bytes(value, what=name)
        if "bool" in kind:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(value)
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise UsageError(f"{source}: {name} has an invalid value {value!r}.") from None


def load_settings(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    paths = Paths.from_env(env)
    values: dict[str, Any] = {}
    cfg_file = paths.config_dir / "config.toml"
    extra: dict[str, Any] = {}
    if cfg_file.is_file():
        try:
            cfg = tomllib.loads(cfg_file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{cfg_file} is not valid TOML ({e}).") from None
        for key, value in cfg.items():
            if key in _FIELDS:
                values[key] = _coerce(key, value, str(cfg_file))
            else:
                extra[key] = value
    for name in _FIELDS:
        raw = env.get(f"ENGRAM_{name.upper()}")
        if raw is not None:
            values[name] = _coerce(name, raw, f"ENGRAM_{name.upper()}")
    for name, value in (flags or {}).items():
        if value is not None:
            values[name] = _coerce(name, value, f"--{name.replace('_', '-')}")
    return Settings(paths=paths, extra=extra, **values)
