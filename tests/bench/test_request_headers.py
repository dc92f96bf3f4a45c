"""`pagesim bench` names each request by its trace id (x-request-id) and a session's turns by
their session (x-session-id), so a router's decision log pairs with the trace's requests."""

from __future__ import annotations

from pagesim.workload.trace import Trace, TraceRequest, save_trace

from .fake_server import FakeServer
from .test_time_origin import pagesim


def test_each_request_carries_its_trace_id_and_session(tmp_path):
    trace = tmp_path / "sessions.json"
    save_trace(Trace({"source": "tests/bench"}, [
        TraceRequest(6, 2, arrival_time=0.0, session_id="s1", turn=0),
        TraceRequest(5, 2, arrival_time=0.0),  # no session
        TraceRequest(12, 2, arrival_time=0.1, session_id="s1", turn=1, think_time=0.0),
    ]), trace)
    with FakeServer() as server:
        done, _ = pagesim("bench", str(trace), "--endpoint", server.base, "--rate", "0", "--num-requests", "3",
                          "--vocab-size", "100", timeout=60)
    assert done.returncode == 0, done.stderr
    sent = sorted((h["x-request-id"], h.get("x-session-id")) for h in server.headers)
    assert sent == [("0", "s1"), ("1", None), ("2", "s1")]
