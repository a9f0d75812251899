"""Where engramctl keeps what it keeps: Paths, from ENGRAM_HOME, else the platform's user dirs.

Not a setting (settings.py): these decide where config.toml itself is, so they come from the environment alone.
Their own module, importing neither dataclasses nor the settings: `snapshots ls` of the index alone needs only the
data and run dirs, and the settings' definitions cost it ~5% of its instructions at 10,000 snapshots (issue 46);
the table, which imports no orjson (orjson imports dataclasses itself), also skips dataclasses' inspect.
"""

from __future__ import annotations

import os
import sys
from collections import namedtuple
from pathlib import Path

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from collections.abc import Mapping

APP = "engramctl"
HOME_ENV = "ENGRAM_HOME"
HOME_HELP = "keep data, config, logs and caches under this one directory"

# data_dir: snapshots, index; config_dir: config.toml, token; run_dir: pid/lock/port files; cache_dir: converted
# model weights (GGUF -> safetensors). A named tuple: immutable, compared by value, made without dataclasses.
_Fields = namedtuple("_Fields", "data_dir config_dir log_dir run_dir cache_dir")


class Paths(_Fields):
    """Where engramctl keeps what it keeps (from ENGRAM_HOME, else the platform's user dirs)."""

    __slots__ = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Paths:
        home = env.get(HOME_ENV)
        if home:
            root = Path(home).expanduser().resolve()
            return cls(root, root / "config", root / "logs", root / "run", root / "cache")
        import platformdirs

        return cls(
            Path(platformdirs.user_data_dir(APP)),
            Path(platformdirs.user_config_dir(APP)),
            Path(platformdirs.user_log_dir(APP)),
            _run_dir(env),
            Path(platformdirs.user_cache_dir(APP)),
        )

    def ensure(self) -> Paths:
        from engramctl.errors import EngramError

        try:
            for p in self:
                Path(p).mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.run_dir, 0o700)  # mkdir's mode does not apply to a directory that already existed
        except OSError as e:  # read-only, someone else's, not a directory: say which, not a traceback
            raise EngramError(
                f"cannot create or use {e.filename or 'the engramctl directories'}: {e.strerror or e}.",
                hint="point ENGRAM_HOME at a writable directory you own",
            ) from None
        return self


def _run_dir(env: Mapping[str, str]) -> Path:
    """Where the pid lock and daemon.json live. The session's runtime dir when it has a usable one: the
    XDG one, or /run/user/<uid> (what logind sets it to, so a shell without the variable, e.g. su or
    cron, still finds a daemon started from a desktop). Otherwise a private dir under the user state
    dir, not platformdirs' own fallback: that one warns (RuntimeDirWarning) on every command and lives
    under a predictable /tmp name another user can create first."""
    import platformdirs

    if sys.platform in ("darwin", "win32"):  # no XDG rules there; platformdirs picks a per-user dir quietly
        return Path(platformdirs.user_runtime_dir(APP))
    for base in (env.get("XDG_RUNTIME_DIR"), f"/run/user/{os.geteuid()}"):
        if base and os.path.isabs(base) and _private_dir(Path(base)):
            return Path(base) / APP
    return Path(platformdirs.user_state_dir(APP)) / "run"


def _private_dir(path: Path) -> bool:
    """A real directory (not a symlink) that this user owns and nobody else can enter, as XDG requires."""
    try:
        st = path.lstat()
    except OSError:
        return False
    import stat

    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0
