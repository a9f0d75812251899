"""The bearer token: created on first start in the config dir (mode 0600), overridden by
ENGRAM_API_KEY (Settings.api_key) for daemon and client alike, compared in constant time.

Every route but GET /health needs `Authorization: Bearer <token>`; unknown paths too, so an
unauthenticated caller learns nothing about the API.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import stat
from pathlib import Path

from engramctl.daemon.engram_api import answers
from engramctl.daemon.errors import error_body
from engramctl.errors import EngramError, UsageError
from engramctl.settings import Settings

log = logging.getLogger("engramctl.daemon")

TOKEN_FILE = "token"
PUBLIC_PATHS = frozenset({"/health"})
# Ollama's API: what the ollama_no_token setting opens to loopback clients (many Ollama clients cannot send a token)
OLLAMA_PATHS = frozenset({"/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version"})


def token_path(settings: Settings) -> Path:
    return settings.paths.config_dir / TOKEN_FILE


def read_token(settings: Settings) -> str | None:
    """The token a client should send: ENGRAM_API_KEY if set, else the token file, else None."""
    if settings.api_key:
        return settings.api_key
    try:
        text = token_path(settings).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise EngramError(f"cannot read the API token {token_path(settings)}: {e}") from None
    return text or None


def ensure_token(settings: Settings) -> str:
    """The daemon's token: ENGRAM_API_KEY if set, else the token file, created (0600) if missing."""
    if settings.api_key:
        return settings.api_key
    path = token_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("API token %s was readable by others (mode %o); setting it to 0600", path, mode)
            os.chmod(path, 0o600)
        token = read_token(settings)
        if token:
            return token
        # an empty file (a crash mid-write): replace it
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC, 0o600)
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    log.info("created the API token in %s", path)
    return token


def token_matches(header_value: str | None, token: str) -> bool:
    """Constant-time check of an Authorization header against the token."""
    if not header_value:
        return False
    scheme, _, given = header_value.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def check_open_routes(settings: Settings) -> None:
    """The Ollama routes go without a token only where every client is on this machine."""
    if settings.ollama_no_token and settings.allow_remote:
        raise UsageError(
            "ollama_no_token lets loopback clients use the Ollama routes without the token; it cannot be "
            "combined with allow_remote.",
            hint="drop --allow-remote (or ENGRAM_ALLOW_REMOTE), or drop --ollama-no-token and send the token",
        )


def _from_loopback(scope) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0]).removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


class AuthMiddleware:
    """Pure ASGI (no response buffering, so streaming and disconnects pass straight through).
    `loopback_paths` need no token from a loopback client (the ollama_no_token setting)."""

    def __init__(
        self, app, token: str, public_paths: frozenset[str] = PUBLIC_PATHS, loopback_paths: frozenset[str] = frozenset()
    ):
        self.app, self.token, self.public, self.loopback = app, token, public_paths, loopback_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.public:
            return await self.app(scope, receive, send)
        if scope.get("path") in self.loopback and _from_loopback(scope):
            return await self.app(scope, receive, send)
        header = None
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                header = value.decode("latin-1")
                break
        if token_matches(header, self.token):
            return await self.app(scope, receive, send)
        msg = "missing API token" if header is None else "invalid API token"
        body = json.dumps(
            answers.failure(
                scope.get("path", ""),
                error_body(
                    f"{msg}: send 'Authorization: Bearer <token>'.",
                    401,
                    "authentication_error",
                    hint="the token is in the engramctl config dir (file 'token'), or set ENGRAM_API_KEY",
                ),
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
