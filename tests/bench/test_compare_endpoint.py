"""`pagesim compare --endpoint` against a fake server: a server that answers NaN or fails every
request gives a compare.json without NaN and a non-zero exit; an honest one exits 0."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pagesim.cli import app

from .conftest import assert_finite, strict_json
from .fake_server import FakeServer, Script, honest_stream, sse

NAN_USAGE = [sse({"choices": [{"text": "a"}]}),
             b'data: {"choices": [], "usage": {"prompt_tokens": NaN, "completion_tokens": NaN}}\n\n', b"data: [DONE]\n\n"]


def compare(trace, base, out, *flags):
    return CliRunner().invoke(app, ["compare", str(trace), "--endpoint", base, "--system", "paged-recompute",
                                    "--num-requests", "4", "--rate", "50", "--out", str(out), *flags])


@pytest.mark.parametrize("respond, reason", [
    (lambda payload, i: (200, NAN_USAGE), "failed: usage.prompt_tokens is NaN, not a token count"),
    (lambda payload, i: (500, [b"Internal Server Error"]), "failed: HTTP 500: Internal Server Error"),
])
def test_a_server_that_fails_every_request_fails_the_compare(small_trace, tmp_path, respond, reason):
    with FakeServer(Script(respond=respond)) as server:
        result = compare(small_trace, server.base, tmp_path / "cmp")
    assert result.exit_code == 3, result.output
    assert f"4 x {reason}" in result.output and "paged-recompute, served: 4 of 4 requests failed" in result.output
    data = strict_json((tmp_path / "cmp" / "compare.json").read_text())  # written, and without NaN
    assert_finite(data)
    served = data["systems"]["paged-recompute"]["executor"]
    assert served["num_failed"] == 4 and served["failure_reasons"] == {reason: 4}
    assert strict_json((tmp_path / "cmp" / "paged-recompute" / "served" / "summary.json").read_text())["num_finished"] == 0


def test_an_honest_server_passes(small_trace, tmp_path):
    with FakeServer(Script(respond=lambda payload, i: (200, honest_stream(payload)))) as server:
        result = compare(small_trace, server.base, tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    served = strict_json((tmp_path / "cmp" / "compare.json").read_text())["systems"]["paged-recompute"]["executor"]
    assert served["num_finished"] == 4 and served["mean_itl_ms"] is not None
