"""A large JSON answer (a listing of thousands of snapshots or sessions), encoded in one call.

A route that returns a dict has FastAPI's jsonable_encoder walk every value in Python before the JSON is
written: 1.6 s of a 10,000-snapshot /list_snapshots on the 2-core VM, three times the listing itself. A
Response is sent as it is, so these routes hand over orjson's bytes: the same JSON (compact, UTF-8 as is).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def bulk_json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")
