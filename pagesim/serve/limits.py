"""The HTTP limits of `pagesim serve` (enforced by pagesim.serve.http_guard); light to import, so
the CLI's flags take their defaults from here without loading the server's libraries."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_body_bytes: int = 16 * 2**20
    max_header_bytes: int = 16 * 2**10  # h11 and uvicorn default: a request line and headers, at most
    max_connections: int = 1024
    keep_alive_s: float = 5.0  # an idle connection between requests (uvicorn's timeout_keep_alive)
    drain_s: float = 5.0  # on SIGTERM / Ctrl-C: how long open requests may still run

    def __post_init__(self):
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "drain_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        for name in ("max_body_bytes", "max_header_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
