"""What every hybrid (state-layer) family's cost test checks of the CLI: a replay of ShareGPT
requests on one H100 finishes them all, and --enable-prefix-caching is refused with its reason."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pagesim.cli import app

TRACE = Path(__file__).parents[2] / "traces" / "sharegpt.json"


def replays_and_refuses_prefix_caching(config: Path, *extra: str, block_note: str | None = None) -> None:
    """200 requests all finish (the raised block size said in a note, where block_note is given);
    the same run with prefix caching is refused, not run."""
    runner = CliRunner()
    args = ["replay", str(TRACE), "--model", str(config), "--gpu", "h100-80gb", "--num-requests", "200", *extra]
    result = runner.invoke(app, args + ["--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["completed"] == 200
    if block_note is not None:
        assert any(block_note in note for note in out["notes"])
    refused = runner.invoke(app, args + ["--enable-prefix-caching"])
    assert refused.exit_code != 0
    assert "prefix caching is not modelled for models with linear-attention/state layers" in refused.output
