"""API fuzz, long run (issue 12 item 1; the bounded run is tests/daemon/test_fuzz_api.py).

    nice -n 19 .venv/bin/python scripts/fuzz_api.py [--per-operation 160] [--garbage-rounds 2] \
        [--imports 1000] [--ws-rounds 10] [--seed 0] [--json out.json]

Starts a real daemon (`python -m engramctl.daemon`, a tiny random granitemoehybrid in float32, a temporary
ENGRAM_HOME), stores two sessions, a pinned save and a branch, then sends (tests/api_fuzz.py):
schemathesis cases of every operation in the daemon's /openapi.json (positive and negative, with the
token), raw garbage bodies to every POST route, damaged snapshot files to /import_snapshot and malformed
WebSocket frames. Reports cases, status counts, responses >= 500, answers that break the ErrorBody shape,
whether the daemon still serves and whether every snapshot stored before is listed and verifies.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests import api_fuzz  # noqa: E402
from tests.daemon.conftest import start_daemon  # noqa: E402
from tests.factory import save_family  # noqa: E402

SEEDED = ["keep-fuzz-7c1e", "keep-fuzz-7c1e-b"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-operation", type=int, default=160, help="schemathesis cases per operation and mode")
    ap.add_argument("--garbage-rounds", type=int, default=2)
    ap.add_argument("--imports", type=int, default=1000)
    ap.add_argument("--ws-rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="engram-fuzz-api-"))
    model = tmp / "model"
    save_family("granitemoehybrid", model, seed=0, template="chatml")
    d = start_daemon(model, tmp / "home")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    stages: dict[str, dict] = {}
    findings = api_fuzz.Findings()
    try:
        with d.http() as c:
            for text in ("one", "two"):
                c.post(
                    "/v1/chat/completions",
                    json={"session": SEEDED[0], "max_tokens": 3, "messages": [{"role": "user", "content": text}]},
                ).raise_for_status()
            c.post("/save_snapshot", json={"session": SEEDED[0], "label": "kept"}).raise_for_status()
            c.post("/branch_snapshot", json={"source": SEEDED[0], "new_session": SEEDED[1]}).raise_for_status()
            head = c.get(f"/v1/sessions/{SEEDED[0]}").json()["head"]
        before = api_fuzz.Stored.read(d.url, d.token, d.home, SEEDED)
        base = (d.home / "snapshots" / f"{head}.safetensors").read_bytes()

        def stage(name, fn):
            n0, t0 = findings.cases, time.perf_counter()
            out = fn()
            stages[name] = {"cases": findings.cases - n0, "wall_s": round(time.perf_counter() - t0, 1)}
            print(f"{name}: {stages[name]} problems so far {len(findings.problems)}", flush=True)
            return out

        stage("schema", lambda: api_fuzz.schema_cases(d.url, d.token, findings, args.per_operation, args.seed))
        stage("garbage", lambda: api_fuzz.garbage_requests(d.url, d.token, findings, args.garbage_rounds))
        imports = stage(
            "import", lambda: api_fuzz.import_cases(d.url, d.token, findings, base, args.imports, args.seed)
        )
        stage("websocket", lambda: api_fuzz.ws_cases(d.url, d.token, findings, args.ws_rounds))

        serving = httpx.get(f"{d.url}/health", timeout=10).status_code == 200 and d.proc.poll() is None
        after = api_fuzz.Stored.read(d.url, d.token, d.home, SEEDED)
        lost = sorted(set(before.snapshots) - set(after.snapshots))
        damaged = after.verify(d.home)
        daemon_cpu = None
        try:
            import psutil

            t = psutil.Process(d.proc.pid).cpu_times()
            daemon_cpu = round(t.user + t.system, 1)
        except Exception:  # noqa: BLE001 - a figure, not a check
            pass
    finally:
        d.stop()
    summary = findings.summary()
    report = {
        **summary,
        "stages": stages,
        "import_outcomes": {f"{k} -> {s}": n for (k, s), n in sorted(imports.items(), key=str)},
        "still_serving": serving,
        "snapshots_before": len(before.snapshots),
        "snapshots_after": len(after.snapshots),
        "seeded_snapshots_lost": lost,
        "transcripts_unchanged": after.transcripts == before.transcripts,
        "snapshots_failing_verification": damaged,
        "wall_s": round(time.perf_counter() - wall0, 1),
        "client_cpu_s": round(time.process_time() - cpu0, 1),
        "daemon_cpu_s": daemon_cpu,
        "python": platform.python_version(),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    ok = serving and not summary["responses_5xx"] and not findings.problems and not lost and not damaged
    return 0 if ok and report["transcripts_unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())
