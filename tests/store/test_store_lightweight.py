"""Listing snapshots must not cost a torch import (~1-2 s): read commands open the store directly."""

import subprocess
import sys


def test_opening_and_listing_the_store_does_not_import_torch(engram_home):
    code = (
        "import sys\n"
        "from engramctl.settings import load_settings\n"
        "from engramctl.store.store import Store\n"
        "from engramctl.tiers.planner import TierPlanner\n"
        "s = Store.open(load_settings())\n"
        "s.snapshots.list(); s.sessions.list(); TierPlanner.start(s.settings, s.retention).plan_json(); s.close()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'safetensors.torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
