"""`engramctl ps` (what the daemon has loaded, and the sessions) and `engramctl tiers` (the tier plan)."""

from __future__ import annotations

from typing import Any

from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.output import Column, ago, count, render_fields, render_table, size
from engramctl.units import human_duration


def _session_tiers(s: dict) -> str:
    return ",".join(s.get("head_tiers") or []) or ("transcript" if s.get("n_messages") else "-")


SESSION_COLUMNS = [
    Column("SESSION", "name"),
    Column("SNAPSHOTS", "n_snapshots", ">", count),
    Column("TOKENS", "head_tokens", ">", count),
    Column("SIZE", "nbytes", ">", size),
    Column("STATE IN", _session_tiers),
    Column("LAST USED", "last_used", fmt=ago),
]


def daemon_fields(d: dict) -> list[tuple[str, Any]]:
    """The daemon's status (runner.daemon_status) as KEY value lines."""
    fields: list[tuple[str, Any]] = [("model", d.get("model") or "-")]
    if d.get("family"):
        fields.append(("family", d["family"]))
    if d.get("backend"):
        fields.append(("backend", d["backend"]))
    if d.get("build"):  # which llama.cpp build (CPU, or CUDA and its architectures) or torch computes
        fields.append(("build", d["build"]))
    # llama.cpp's dtype is its weight type, which the memory line shows: say it once
    dtype = d.get("dtype") if d.get("dtype") != d.get("weight_type") else None
    fields.append(("device", ", ".join(str(x) for x in (d.get("device"), dtype) if x) or "-"))
    mem = []
    if d.get("weights_bytes") is not None:
        mem.append(" ".join(x for x in (f"weights {size(d['weights_bytes'])}", d.get("weight_type")) if x))
    if d.get("rss_bytes") is not None:
        mem.append(f"process {size(d['rss_bytes'])}")
    fields.append(("memory", ", ".join(mem) or "-"))
    if d.get("context_length"):
        fields.append(("context", f"{count(d['context_length'])} tokens"))
    hot = d.get("hot")
    if isinstance(hot, dict) and hot.get("session"):
        fields.append(("loaded", f"session {hot['session']} ({count(hot.get('tokens'))} tokens in memory, last used)"))
    serves = serving_line(d.get("serving"))
    if serves:
        fields.append(("serves", serves))
    prefetched = prefetch_line(d.get("prefetched"))
    if prefetched:
        fields.append(("preload", prefetched))  # 7 letters: the column stays as wide
    if d.get("warmup_ms") is not None:
        fields.append(("warm-up", f"{d['warmup_ms']:.0f} ms before it was ready (one tiny prompt and decode)"))
    where = d.get("url") or (f"http://{d.get('host')}:{d.get('port')}" if d.get("port") else None)
    state = d.get("state") or ("running" if d.get("ready") else "starting")
    up = d.get("uptime_s")
    daemon = ", ".join(
        x
        for x in (
            state,
            f"pid {d['pid']}" if d.get("pid") else None,
            where,
            f"up {human_duration(up)}" if up is not None else None,
        )
        if x
    )
    fields.append(("daemon", daemon))
    return fields


def serving_line(serving: Any) -> str | None:
    """How many conversations the daemon steps at once (its sequences), and how many run and wait now."""
    if not isinstance(serving, dict) or not serving.get("at_once"):
        return None
    n = serving["at_once"]
    at_once = "one turn at a time" if n == 1 else f"{count(n)} conversations at once"
    names = serving.get("sessions") or []
    running = f"{serving.get('running', 0)} running" + (f": {', '.join(names)}" if names else "")
    return f"{at_once} ({running}; {serving.get('waiting', 0)} waiting)"


def prefetch_line(p: Any) -> str | None:
    """The states loaded into memory at start (daemon/prefetch.py): how many, their bytes, what is left."""
    if not isinstance(p, dict) or "states" not in p:
        return None
    n = p["states"]
    line = f"{count(n)} recent state{'' if n == 1 else 's'} in memory ({size(p.get('bytes') or 0)})"
    if not p.get("done"):
        line += f"; {count(p.get('loading') or 0)} loading"
    elif p.get("ms") is not None:
        line += f", in {human_duration(p['ms'] / 1000)}"
    extra = [f"{count(p[k])} {why}" for k, why in (("skipped", "did not fit"), ("failed", "unusable")) if p.get(k)]
    return line + (f" ({', '.join(extra)})" if extra else "")


def model_line(m: dict | None) -> str:
    """The served model as one line: what runs it and what its weights take (the tiers share that memory)."""
    if not m:
        return "none loaded (no daemon running)"
    weights = " ".join(x for x in (size(m.get("weights_bytes")), m.get("weight_type")) if x)
    line = f"{m.get('model')}: {m.get('backend')}, weights {weights} on {m.get('device')}"
    return f"{line}; build {m['build']}" if m.get("build") else line


def ps(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Show the running daemon (model, device, dtype, memory) and the sessions: where their state
    is and when they were last used. Works without a daemon (sessions from the local index)."""
    from engramctl.cli import connect
    from engramctl.cli.listing import open_listing

    out = common.output(json_, quiet)
    st = common.settings()
    info = connect.running(st)
    with open_listing(st, out, read_only=True) as listing:
        sessions = listing.sessions()
    if out.json:
        out.emit_json({"daemon": info, "sessions": sessions})
        return
    if out.human:
        if info is None:
            out.note("No daemon is running; sessions below are from the local index. Start one: engramctl daemon start")
        else:
            out.line(render_fields(daemon_fields(info)))
            out.line()
    out.table(
        sessions,
        SESSION_COLUMNS,
        quiet_key="name",
        empty="No sessions yet. Start one with: engramctl chat --session NAME",
    )


def sessions(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """List the sessions: snapshots, messages, tokens in the latest state, where it is, last use."""
    from engramctl.cli.listing import open_listing

    out = common.output(json_, quiet)
    with open_listing(common.settings(), out, read_only=True) as listing:
        rows = listing.sessions()
    cols = SESSION_COLUMNS[:2] + [Column("MESSAGES", "n_messages", ">", count)] + SESSION_COLUMNS[2:]
    cols.insert(len(cols) - 1, Column("BRANCHED FROM", lambda s: (s.get("base") or "")[:12]))
    out.table(rows, cols, quiet_key="name", empty="No sessions yet. Start one with: engramctl chat --session NAME")


def tiers(json_: bool = JsonOpt) -> None:
    """Show the tier plan: the detected hardware, the budget of each tier and the rule behind it,
    what each tier holds now, and the retention rules."""
    from engramctl.cli.listing import open_listing

    out = common.output(json_, False)
    st = common.settings()
    with open_listing(st, out) as listing:
        plan = listing.tiers()
    retention = {
        "keep_last": st.keep_last,
        "session_ttl_s": st.session_ttl_s,
        "pins": "pinned snapshots are never evicted",
        "write_through": "every snapshot is persisted to disk; vram/ram hold hot copies",
    }
    # serving: the daemon's sequences (None without a daemon: no model is loaded to derive them from)
    plan = {
        **plan,
        "model": plan.get("model"),
        "serving": plan.get("serving"),
        "offload": plan.get("offload"),  # which layers run on the GPU (llama.cpp; None on transformers, no daemon)
        "device_copies": plan.get("device_copies"),  # llama.cpp's VRAM tier (None on transformers, no daemon)
        "retention": plan.get("retention") or retention,
    }
    if out.json:
        out.emit_json(plan)
        return
    hw = plan.get("hardware") or {}
    hw_fields = [("cpu", hw.get("cpu") or "-")]
    ram = f"{size(hw.get('ram_total_bytes'))} total, {size(hw.get('ram_available_bytes'))} available"
    hw_fields.append(("ram", ram))
    gpu = hw.get("gpu")
    hw_fields.append(
        ("gpu", f"{gpu} ({size(hw.get('vram_total_bytes'))})" if gpu else "none (no CUDA in this process)")
    )
    hw_fields.append(("disk", f"{size(hw.get('disk_free_bytes'))} free under {st.paths.data_dir}"))
    hw_fields.append(("model", model_line(plan.get("model"))))
    serves = serving_line(plan.get("serving"))
    if serves:
        hw_fields.append(("serves", serves))
    out.line(render_fields(hw_fields))
    out.line()
    offload = offload_fields(plan.get("offload")) + copies_fields(plan.get("device_copies"))
    if offload:  # a block of its own: where the model's layers run, and why
        out.line(render_fields(offload))
        out.line()
    rows = plan.get("tiers") or []
    tables = plan.get("tables") or []
    columns = [
        Column("TIER", "name"),
        Column("BUDGET", lambda t: size(t["budget_bytes"]) if t.get("budget_bytes") else "off", ">"),
        Column("USED", "used_bytes", ">", size),
        Column("SNAPSHOTS", "snapshots", ">", count),
        Column("RULE", "rule"),
    ]
    if tables:  # BUDGET is then what the tables leave to snapshots
        columns.insert(
            4, Column("N-GRAM TABLES", lambda t: size(t["table_bytes"]) if t.get("table_bytes") else "-", ">")
        )
    out.line(render_table(rows, columns))
    out.line()
    if tables:
        cols = [Column("N-GRAM TABLE", "name"), Column("SIZE", "size_bytes", ">", size), Column("TIER", "tier")]
        out.line(render_table(tables, cols))
        out.line()
    r = plan["retention"]
    ttl = r.get("session_ttl_s")
    out.line(
        render_fields(
            [
                (
                    "keep last",
                    f"{r.get('keep_last')} snapshots per session (pinned, labelled and in-use ones are extra)",
                ),
                (
                    "session ttl",
                    "none" if not ttl else f"unpinned snapshots of sessions idle over {human_duration(ttl)} go",
                ),
                ("pins", "never evicted"),
                ("prefix states", prefix_line(plan.get("prefix_states"))),
            ]
        )
    )


def offload_fields(o: Any) -> list[tuple[str, str]]:
    """Where the llama.cpp model's layers run (tiers/offload.py's plan) as KEY value lines: none without one."""
    if not isinstance(o, dict) or not o.get("layers"):
        return []
    on_gpu = o.get("layers_on_gpu") or 0
    where = f"{on_gpu}/{o['layers']} layers on the GPU" + (f" ({o['gpu']})" if o.get("gpu") and on_gpu else "")
    parts = []
    if on_gpu:
        parts.append(f"GPU: weights {size(o.get('weights_gpu_bytes'))}, state {size(o.get('state_gpu_bytes'))}")
    parts.append(f"CPU: weights {size(o.get('weights_cpu_bytes'))}, state {size(o.get('state_cpu_bytes'))}")
    fields = [("offload", f"{where}; {'; '.join(parts)}"), ("offload rule", o.get("rule") or "-")]
    if o.get("sequences_rule"):
        fields.append(("at once", o["sequences_rule"]))
    return fields


def copies_fields(c: Any) -> list[tuple[str, str]]:
    """llama.cpp's VRAM tier (device copies of parked conversations' states) as KEY value lines."""
    if not isinstance(c, dict) or "rule" not in c:
        return []
    if not c.get("slots"):
        return [("vram copies", c["rule"])]
    line = (
        f"{count(c['held'])} of {count(c['slots'])} parked conversations, {size(c['used_bytes'])} of "
        f"{size(c['budget_bytes'])}; {count(c['restores'])} resumed from a copy since the daemon started"
    )
    return [("vram copies", line), ("vram rule", c["rule"])]


def prefix_line(p: dict | None) -> str:
    """The states kept where conversations diverge: how many, their bytes within their own budget."""
    if not p:
        return "-"
    line = f"{count(p['count'])} kept, {size(p['used_bytes'])} of their own {size(p['budget_bytes'])}"
    line += " (the least recently used go first)"
    if "restored" in p:
        line += f"; since the daemon started: {count(p['kept_since_start'])} kept, {count(p['restored'])} restored from"
    return line
