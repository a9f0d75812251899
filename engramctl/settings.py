"""One frozen Settings object, built once: defaults < config.toml < ENGRAM_* env < flags.

Every setting is declared once, as a field of Settings with its metadata (`setting(...)`: help, flag,
choices, kind). Everything else is derived from that declaration: the config-file key (the field
name), the ENGRAM_* variable, the daemon's flags (`python -m engramctl.daemon`), the options of
`engramctl serve` / `engramctl daemon start`, the env a background daemon is started with, the env help
of `engramctl --help` and the README's table (scripts/gen_settings_docs.py). Adding a setting is one edit.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from engramctl.errors import UsageError
from engramctl.paths import HOME_ENV, Paths
from engramctl.units import parse_bytes

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_PORT = 11535
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_EXPECTED = {"int": "a whole number", "float": "a number", "bool": "one of 1/0, true/false, yes/no, on/off"}


def setting(
    default: Any,
    help: str,
    *,
    kind: str | None = None,
    choices: tuple[str, ...] = (),
    flag: str | None = "",
    short: str | None = None,
    off_flag: str | None = None,
    metavar: str | None = None,
    shown_default: str | None = None,
    bounds: tuple[int, int] | None = None,
    daemon: bool = True,
) -> Any:
    """A Settings field and everything derived from it.

    help: one line (flag help, env help, README); kind: str|int|float|bool|bytes (default: from the
    type); choices: the accepted values; flag: the option name ("" = --name-with-dashes, None = env and
    config file only, e.g. secrets, which a command line would show in `ps`); short/off_flag: "-p",
    "--loopback-only"; shown_default: the default as documented when the value alone says too little;
    bounds: the smallest and largest accepted number; daemon: the daemon reads it, so `serve` and
    `daemon start` take it as a flag and a background daemon inherits it."""
    meta = {"help": help, "kind": kind, "choices": tuple(choices), "flag": flag, "short": short}
    meta.update(off_flag=off_flag, metavar=metavar, shown_default=shown_default, bounds=bounds, daemon=daemon)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """Every setting (`setting(...)` fields: their help, flag and kind), built once by load_settings."""

    paths: Paths
    model: str | None = setting(
        None,
        "hub id, local directory or GGUF file to serve",
        short="-m",
        metavar="MODEL",
        shown_default="granite-4.0-h-350m, else SmolLM2",
    )
    backend: str = setting(
        "auto",
        "what runs the model; auto: llama.cpp for a GGUF file, else transformers",
        choices=("auto", "transformers", "llama.cpp"),
    )
    host: str = setting("127.0.0.1", "address the daemon listens on", metavar="HOST")
    port: int = setting(
        DEFAULT_PORT, "port the daemon listens on; 0 picks a free one", short="-p", metavar="PORT", bounds=(0, 65535)
    )
    allow_remote: bool = setting(
        False, "allow a non-loopback host: token auth only, no TLS", off_flag="--loopback-only"
    )
    ollama_no_token: bool = setting(
        False,
        "let loopback clients use the Ollama routes (/api/*) without the token; refused with allow_remote",
    )
    device: str = setting("auto", "where the model runs", choices=("auto", "cpu", "cuda"))
    dtype: str = setting(
        "auto", "model dtype on the transformers backend", choices=("auto", "float32", "bfloat16", "float16")
    )
    threads: int | None = setting(
        None,
        "CPU threads that run the model (llama.cpp's threads; torch's on transformers)",
        metavar="N",
        shown_default="the cores it may use",
        bounds=(1, 4096),
    )
    # None: the backend derives it (llama_context.default_sequences): 2 per core, 4 to 16, fewer where their
    # recurrent states (one cell each, allocated with the context) would take over 1/8 of the available RAM
    sequences: int | None = setting(
        None,
        "conversations the llama.cpp backend steps together in one batch (on an attention-only model each "
        "holds 1/N of the 512 MiB KV cache); 1 serves turns one at a time, each reply bitwise what it is alone "
        "(a batched one may differ in its last bits); transformers: always 1",
        metavar="N",
        shown_default="2 per core, 4-16, fewer if their states would take over 1/8 of free RAM",
        bounds=(1, 64),
    )
    api_key: str | None = setting(
        None, "bearer token instead of the one generated in the config dir", flag=None, shown_default="generated"
    )
    tier_vram_bytes: int | None = setting(
        None, "VRAM tier budget: 512MB, 2GiB, ...", kind="bytes", metavar="SIZE", shown_default="planned"
    )
    tier_ram_bytes: int | None = setting(None, "RAM tier budget", kind="bytes", metavar="SIZE", shown_default="planned")
    tier_disk_bytes: int | None = setting(
        None, "disk tier budget", kind="bytes", metavar="SIZE", shown_default="planned"
    )
    prefix_state_bytes: int | None = setting(
        None,
        "bytes of prefix states (shared prompt beginnings kept for new conversations), least recently used "
        "evicted first; 0 keeps none (nothing is captured)",
        kind="bytes",
        metavar="SIZE",
        shown_default="1/4 of the disk tier, at most 2 GiB",
    )
    ngram_layers: str | None = setting(
        None,
        "give a transformers model Engram (N-gram memory) layers before these 0-based blocks, e.g. 1 or 1,15; "
        "random-initialised, seeded as the official demo; other fields are the demo's",
        metavar="LIST",
        shown_default="none",
    )
    ngram_table_rows: int = setting(
        646400,
        "rows per n-gram order and head in each N-gram table (the demo's engram_vocab_size)",
        metavar="N",
        bounds=(2, 2**31 - 1),
    )
    ngram_table_tier: str = setting(
        "auto",
        "where the N-gram tables live; auto: RAM if they fit its budget, else disk (read with prefetch)",
        choices=("auto", "ram", "disk"),
    )
    keep_last: int = setting(8, "snapshots kept per session besides pinned and labelled ones", metavar="N")
    session_ttl_s: float | None = setting(
        None, "drop unpinned snapshots of sessions idle this many seconds", metavar="SECONDS", shown_default="off"
    )
    max_queue: int = setting(
        256,
        "requests that may wait for the model before 429: a bound on memory, not on ordinary bursts (they queue "
        "and are served in arrival order)",
        metavar="N",
    )
    serial_turns: bool = setting(
        False,
        "serve one turn at a time, so that every reply is bitwise what it is alone (under concurrency a reply "
        "may differ in its last bits: the batch shape picks the kernels)",
    )
    no_autostart: bool = setting(False, "commands never start the daemon themselves", flag=None, daemon=False)
    extra: dict[str, Any] = field(default_factory=dict)  # config keys kept for later layers


@dataclass(frozen=True)
class Spec:
    """One setting as the derived interfaces see it."""

    name: str  # the field, and the config-file key
    kind: str  # str | int | float | bool | bytes
    default: Any
    help: str
    choices: tuple[str, ...]
    flag: str | None  # --name, or None when only env and config set it
    short: str | None
    off_flag: str | None
    metavar: str | None
    shown_default: str
    bounds: tuple[int, int] | None
    daemon: bool

    @property
    def env(self) -> str:
        return f"ENGRAM_{self.name.upper()}"

    def parse(self, value: Any, source: str) -> Any:
        """`value` (TOML, env text or flag) as this setting's type; UsageError naming `source` if it is not one."""
        if value is None:
            return None
        try:
            value = self._convert(value)
        except UsageError as e:  # parse_bytes's own sentence
            raise UsageError(f"{source}: {e.message}", hint=self.hint) from None
        except (TypeError, ValueError):
            expected = _EXPECTED.get(self.kind, "text")
            raise UsageError(f"{source}: {self.name} {value!r} is not {expected}.", hint=self.hint) from None
        if self.choices and value not in self.choices:
            choices = ", ".join(self.choices)
            raise UsageError(f"{source}: {self.name} {value!r} is not one of {choices}.", hint=self.hint)
        if self.bounds and not self.bounds[0] <= value <= self.bounds[1]:
            low, high = self.bounds
            raise UsageError(f"{source}: {self.name} {value} is not between {low} and {high}.", hint=self.hint)
        return value

    def _convert(self, value: Any) -> Any:
        if self.kind == "bytes":
            return parse_bytes(value, what=self.name)
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() not in _TRUE + _FALSE:
                raise ValueError(value)
            return str(value).lower() in _TRUE
        if self.kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)  # TOML `keep_last = 2.5` or `= true` is a mistake, not 2 or 1
            return int(value)
        if self.kind == "float":
            return float(value)
        return str(value)

    @property
    def hint(self) -> str:
        where = f"{self.flag} or " if self.flag else ""
        return f"set it with {where}{self.env}, or `{self.name} = ...` in config.toml"

    def to_env(self, value: Any) -> str:
        """The text `parse` reads back as `value` (for the env of a background daemon)."""
        if isinstance(value, bool):
            return "1" if value else "0"
        return str(value)


def _spec(f: dataclasses.Field) -> Spec:
    m = dict(f.metadata)
    kind = m.pop("kind") or next(k for k in ("bool", "int", "float", "str") if str(f.type).startswith(k))
    flag = m.pop("flag")
    flag = "--" + f.name.replace("_", "-") if flag == "" else flag
    shown = m.pop("shown_default")
    if shown is None and kind == "bool":
        shown = "on" if f.default else "off"
    elif shown is None:
        shown = "-" if f.default is None else str(f.default)
    return Spec(name=f.name, kind=kind, default=f.default, flag=flag, shown_default=shown, **m)


SPECS: tuple[Spec, ...] = tuple(_spec(f) for f in dataclasses.fields(Settings) if "help" in f.metadata)
_BY_NAME = MappingProxyType({s.name: s for s in SPECS})


def spec(name: str) -> Spec:
    return _BY_NAME[name]


def load_settings(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    paths = Paths.from_env(env)
    values: dict[str, Any] = {}
    cfg_file = paths.config_dir / "config.toml"
    extra: dict[str, Any] = {}
    if cfg_file.is_file():
        try:  # imported here: most commands run without a config file, and tomllib costs an import of its own
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            cfg = tomllib.loads(cfg_file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{cfg_file} is not valid TOML ({e}).") from None
        for key, value in cfg.items():
            if key in _BY_NAME:
                values[key] = _BY_NAME[key].parse(value, str(cfg_file))
            else:
                extra[key] = value
    for s in SPECS:
        raw = env.get(s.env)
        if raw is not None:
            values[s.name] = s.parse(raw, s.env)
    for name, value in (flags or {}).items():
        if value is not None:
            s = _BY_NAME[name]
            values[name] = s.parse(value, s.flag or f"--{name.replace('_', '-')}")
    return Settings(paths=paths, extra=extra, **values)


def settings_env(settings: Settings) -> dict[str, str]:
    """ENGRAM_* variables that give a daemon process these settings (what flags and config.toml said
    included): how `daemon start` and autostart hand them to the daemon they spawn."""
    return {s.env: s.to_env(v) for s in SPECS if s.daemon and (v := getattr(settings, s.name)) is not None}


def env_help() -> str:
    """The environment paragraph of `engramctl --help`."""
    names = [HOME_ENV] + [s.env + ("=1" if s.kind == "bool" else "") for s in SPECS]
    return "Environment (overrides config.toml; flags override both): " + ", ".join(names) + "."
