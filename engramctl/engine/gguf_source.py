"""Where a GGUF model comes from: a local file, or one file of a Hugging Face hub repo.

Hub forms, as llama-server and Ollama users write them:
    owner/name/file.gguf     that file
    owner/name:Q8_0          the repo's one .gguf whose name carries that quantization tag
    owner/name-GGUF          a GGUF repo without a tag: the first of PREFERRED_TAGS it has
The local Hugging Face cache is looked at first; the hub only when the file is not there, with the same
fail-fast probe as safetensors repos (engine/loading.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from engramctl.errors import ModelNotFound

_REPO = r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}"
_FILE_REF = re.compile(rf"(?P<repo>{_REPO})/(?P<file>[\w./-]+\.gguf)", re.IGNORECASE)
_TAG_REF = re.compile(rf"(?P<repo>{_REPO}):(?P<tag>[\w.-]+)")
_GGUF_REPO = re.compile(rf"(?P<repo>{_REPO}-gguf)", re.IGNORECASE)
PREFERRED_TAGS = ("Q8_0", "Q4_K_M", "Q6_K", "Q5_K_M", "Q4_0", "F16", "BF16")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


def is_gguf_ref(ref: str) -> bool:
    """A local .gguf path or one of the hub forms above."""
    if Path(ref).expanduser().suffix.lower() == ".gguf":
        return True
    return bool(_TAG_REF.fullmatch(ref) or _GGUF_REPO.fullmatch(ref)) and ".." not in ref


def resolve_gguf(ref: str, say: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """(local GGUF path, model id) for `ref`; ModelNotFound when it cannot be had."""
    say = say or (lambda _msg: None)
    path = Path(ref).expanduser()
    if path.suffix.lower() == ".gguf" and (path.exists() or not _FILE_REF.fullmatch(ref)):
        if not path.is_file():
            raise ModelNotFound(f"GGUF file {path} does not exist.")
        return path.resolve(), path.name
    if ".." in ref:
        raise ModelNotFound(f"model {ref!r} is not a valid hub reference.")
    if m := _FILE_REF.fullmatch(ref):
        return _download(m["repo"], lambda files: m["file"], ref, say), ref
    m = _TAG_REF.fullmatch(ref) or _GGUF_REPO.fullmatch(ref)
    if not m:
        raise ModelNotFound(f"model {ref!r} is neither a .gguf file nor a hub GGUF reference (owner/name:Q8_0).")
    tag = m.groupdict().get("tag")
    return _download(m["repo"], lambda files: pick_file(files, tag, m["repo"]), ref, say), ref


def pick_file(files: list[str], tag: str | None, repo: str) -> str:
    """The .gguf among `files` for `tag` (case-insensitive, delimited), or the first preferred tag present."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and not _SPLIT.search(f))
    for want in (tag,) if tag else PREFERRED_TAGS:
        pattern = re.compile(rf"(^|[-_.]){re.escape(want)}([-_.]|$)", re.IGNORECASE)
        hits = [f for f in ggufs if pattern.search(Path(f).name.removesuffix(".gguf").removesuffix(".GGUF"))]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ModelNotFound(
                f"hub repo {repo!r} has several GGUF files for {want!r}: {', '.join(hits[:4])}.",
                hint=f"name one: --model {repo}/{hits[0]}",
            )
    listing = ", ".join(Path(f).name for f in ggufs[:6]) or "none"
    want = f"tag {tag!r}" if tag else f"any of {', '.join(PREFERRED_TAGS)}"
    raise ModelNotFound(f"hub repo {repo!r} has no single-file GGUF for {want} (GGUF files: {listing}).")


def _cached_files(cache: str, repo: str) -> dict[str, Path]:
    """Files of `repo` already in the hub cache (any snapshot), by their path inside the repo."""
    snaps = Path(cache) / f"models--{repo.replace('/', '--')}" / "snapshots"
    found: dict[str, Path] = {}
    for snap in sorted(snaps.glob("*"), key=lambda p: p.stat().st_mtime) if snaps.is_dir() else []:
        for f in snap.rglob("*.gguf"):
            if f.is_file():  # a dangling link is a download that never finished
                found[f.relative_to(snap).as_posix()] = f
    return found


def _download(repo: str, choose: Callable[[list[str]], str], ref: str, say: Callable[[str], None]) -> Path:
    from engramctl.engine.hub import HUB_TIMEOUT_S, LOCAL_HINT, hub_env

    cache, offline = hub_env()
    cached = _cached_files(cache, repo)
    if cached:
        try:
            return cached[choose(sorted(cached))]
        except (ModelNotFound, KeyError):
            pass  # not among the cached files: ask the hub
    unreachable = ModelNotFound(
        f"GGUF model {ref!r} is not in the local Hugging Face cache and the hub cannot be reached.",
        hint=LOCAL_HINT.replace("a local directory", "a local .gguf file"),
    )
    if offline:
        raise unreachable
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = HfApi().model_info(repo, timeout=HUB_TIMEOUT_S)
    except (RepositoryNotFoundError, GatedRepoError) as e:
        raise ModelNotFound(f"GGUF repo {repo!r} is not on the Hugging Face hub, or needs a login: {e}") from e
    except Exception as e:
        raise unreachable from e
    name = choose([s.rfilename for s in info.siblings or []])
    say(f"downloading {repo}/{name} from the Hugging Face hub")
    try:
        return Path(hf_hub_download(repo, name, revision=info.sha, cache_dir=cache))
    except Exception as e:  # network drop, disk full...: say which
        raise ModelNotFound(f"downloading {repo}/{name} from the Hugging Face hub failed: {e}") from e
