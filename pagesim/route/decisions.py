"""The decision log: one JSON line per routing decision and per end, in the order they happened,
so a run can be replayed through choose() (tests/route does) or set beside the simulator's.

    {"event": "routed", "request": 3, "attempt": 0, "backend": 1, "among": [0, 1],
     "loads": [[outstanding, waiting, running, kv_usage, accepting], ...], "prompt_len": 40,
     "session": null, "client_request_id": "..." (the x-request-id header, when sent)}
    {"event": "ended", "request": 3, "backend": 1, "outcome": "ok" | "failed" | "retried" | "cancelled"}
"""

from __future__ import annotations

import json
from typing import IO

from pagesim.cluster.routers import ReplicaLoad, RoutedRequest


class DecisionLog:
    def __init__(self, path: str | None):
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path else None

    def routed(self, request: RoutedRequest, attempt: int, backend: int, among: list[int],
               loads: list[ReplicaLoad], client_id: str | None) -> None:
        self._write({"event": "routed", "request": request.request_id, "attempt": attempt, "backend": backend,
                     "among": among,
                     "loads": [[r.outstanding, r.waiting, r.running, r.kv_usage, r.accepting] for r in loads],
                     "prompt_len": request.prompt_len, "session": request.session_id,
                     "client_request_id": client_id})

    def ended(self, request_id: int, backend: int, outcome: str) -> None:
        self._write({"event": "ended", "request": request_id, "backend": backend, "outcome": outcome})

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
