import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from pagesim.cli import app

TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_inspect_prints_the_table():
    result = CliRunner().invoke(app, ["trace", "inspect", str(TRACES / "sharegpt.json")], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for word in ("prompt_len", "output_len", "p50", "p90", "p99", "max", "10000", "161.31"):
        assert word in result.output


def test_inspect_json_and_plot(tmp_path):
    png = tmp_path / "fig11.png"
    result = CliRunner().invoke(app, ["trace", "inspect", str(TRACES / "alpaca.json"), "--json", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)["stats"]
    assert stats["prompt_len"]["count"] == 4998
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_malformed_file_exits_with_the_message(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "pagesim-trace/1", "metadata": {}, "requests": [{"prompt_len": 3}]}')
    result = CliRunner().invoke(app, ["trace", "inspect", str(bad)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "bad.json" in result.output and "request 0" in result.output and "output_len" in result.output


def test_a_nan_in_a_trace_is_one_line_naming_the_file_the_request_and_the_field(tmp_path):
    bad = tmp_path / "nan.json"
    bad.write_text('{"format": "pagesim-trace/1", "metadata": {}, "requests": [{"prompt_len": 3, "output_len": 4},\n'
                   '{"prompt_len": 3, "output_len": NaN}]}')
    result = CliRunner().invoke(app, ["trace", "inspect", str(bad)], env={"COLUMNS": "200"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0] == f"error: {bad}: request 1: field 'output_len': NaN is not a JSON number"


def test_an_integer_too_long_for_python_in_a_trace_is_one_line_naming_the_request_and_the_field(tmp_path):
    bad = tmp_path / "long.json"
    bad.write_text('{"format": "pagesim-trace/1", "metadata": {}, "requests": [{"prompt_len": 3, "output_len": 4},\n'
                   '{"prompt_len": 3, "output_len": %s}]}' % ("7" * 4400))
    for command in (["trace", "inspect", str(bad)], ["replay", str(bad)]):
        result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0] == (f"error: {bad}: request 1: field 'output_len': an integer of 4,400 digits, more than the "
                            "4,300 Python reads as a number")


def test_imports_stay_light():
    code = "import sys, pagesim, pagesim.workload, pagesim.cli; print(sorted(m for m in ('torch', 'transformers', 'matplotlib', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
