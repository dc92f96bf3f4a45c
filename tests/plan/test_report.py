"""`pagesim plan` end to end: the report files, their content, the economics against hand
arithmetic, an impossible SLO, and bad input."""

from __future__ import annotations

import base64
import json
import math
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.trace import save_trace
from tests.plan.common import SMALL_TRACE

COMMON = ["--model", "llama-2-7b", "--tp", "1", "--block-size", "16", "--num-requests", "80", "--min-duration", "0",
          "--tolerance", "0.05", "--jobs", "1", "--no-cache", "--start-rate", "32", "--min-measured", "50",
          "--max-requests", "1280", "--seeds", "1", "--check-longer", "0"]


class Page(HTMLParser):
    """Collects what a browser would load: images, and any external reference."""

    def __init__(self):
        super().__init__()
        self.images: dict[str, bytes] = {}
        self.figure = None
        self.external: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure":
            self.figure = a.get("id")
        if tag == "img":
            src = a["src"]
            assert src.startswith("data:image/png;base64,"), src[:40]
            self.images[self.figure] = base64.b64decode(src.split(",", 1)[1], validate=True)
        for key in ("src", "href"):
            if key in a and not str(a[key]).startswith("data:") and a[key] != "report.csv":  # the CSV lies beside it
                self.external.append(a[key])
        if tag in ("link", "iframe") or (tag == "script" and "src" in a):
            self.external.append(tag)
        if tag == "a":
            self.links.append(a["href"])

    def handle_data(self, data):
        self.text.append(data)


def parse_html(path) -> Page:
    page = Page()
    page.feed(path.read_text())
    page.close()
    return page


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "small.json"
    save_trace(SMALL_TRACE, path)
    return path


def run(args):
    result = CliRunner().invoke(app, ["plan", *args])
    return result


def test_feasible_plan_report(tmp_path, trace_file):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"retrieved": "test", "gpus": {"a100-40gb": {"usd_per_gpu_hour": 1.5},
                                                                  "h100": {"usd_per_gpu_hour": 4.0}}}))
    out = tmp_path / "plan"
    slos = ["ttft_p99", "tpot_p99", "goodput"]
    result = run(COMMON + ["--trace", str(trace_file), "--target-rate", "100", "--slo",
                           "ttft_p99=0.5,tpot_p99=0.05,goodput=0.9", "--gpus", "a100-40gb,h100", "--preemption",
                           "recompute,swap", "--prices", str(prices), "--out", str(out)])
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    plan = json.loads((out / "plan.json").read_text())
    # inputs and the exact command first, then the recommendation, then the table and plots
    order = [md.index(s) for s in ("## Inputs", "Reproduce with: `pagesim plan --model llama-2-7b", "## Recommendation",
                                   "Cheapest meeting the target", "Runner-up", "## All configurations",
                                   "## Cost against latency", "## Latency against rate", "## Cost against capacity",
                                   "## Sensitivity")]
    assert order == sorted(order)
    assert plan["command"] in md and "--prices" in plan["command"]
    # every plot, embedded in the HTML and written beside the markdown
    expected = ["pareto"] + [f"latency_{s}" for s in slos] + ["cost_capacity", "sensitivity"]
    page = parse_html(out / "report.html")
    assert sorted(page.images) == sorted(expected)
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in page.images.values())
    assert page.external == []
    for name in expected:
        assert f"](plots/{name}.png)" in md and (out / "plots" / f"{name}.png").read_bytes() == page.images[name]
    # economics by hand, from the capacities found and the trace itself
    price = {"a100-40gb": 1.5, "h100-80gb": 4.0}
    for row, res in zip(plan["table"], plan["results"]):
        assert row["capacity_rps"] and row["replicas"] == math.ceil(100 / row["capacity_rps"])
        assert row["headroom"] == pytest.approx(1 - 100 / (row["replicas"] * row["capacity_rps"]))
        assert row["cost_per_hour"] == pytest.approx(row["replicas"] * price[row["gpu"]])
        n = res["operating"]["stats"]["num_requests"]
        mean_out = sum(SMALL_TRACE.requests[i % len(SMALL_TRACE)].output_len for i in range(n)) / n
        assert row["cost_per_m_output_tokens"] == pytest.approx(row["cost_per_hour"] / (100 * mean_out * 3600) * 1e6)
        assert res["operating"]["rate"] == pytest.approx(100 / row["replicas"])
    cheapest = min(plan["table"], key=lambda r: r["cost_per_hour"])
    assert plan["recommendation"].startswith(f"{cheapest['gpu']} x1 b16")
    # block size: the replays run the current-vLLM engine profile, whose attention no block measurement prices
    assert "block size is not modelled in the step time on a100-40gb, h100-80gb (engine profile vllm-0.19:" in md
    assert "| block size in step time |" in md and "| yes |" not in md


def test_impossible_slo_gives_a_clear_report(tmp_path, trace_file):
    out = tmp_path / "plan"
    result = run(COMMON + ["--trace", str(trace_file), "--target-rate", "20", "--slo", "ttft_p99=0.0001",
                           "--gpus", "a100-40gb,h200", "--min-rate", "0.2", "--start-rate", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no configuration meets ttft_p99 <= 0.0001 s" in result.output
    md = (out / "report.md").read_text()
    assert "**No configuration meets ttft_p99 <= 0.0001 s**" in md
    assert "a100-40gb x1 b16 auto s256 | ttft_p99 " in md  # the closest each came, with its value
    page = parse_html(out / "report.html")
    assert "No configuration meets ttft_p99 <= 0.0001 s" in "".join(page.text)
    assert sorted(page.images) == ["cost_capacity", "latency_ttft_p99", "pareto", "sensitivity"]
    assert json.loads((out / "plan.json").read_text())["recommendation"] is None


@pytest.mark.parametrize("args, words", [
    (["--slo", "ttft_p42x=1"], "unknown SLO 'ttft_p42x=1'; valid SLO names: ttft_<stat>"),
    (["--gpus", "a100,tpu-v5"], "unknown GPU 'a100'"),
    (["--preemption", "pause"], "unknown preemption mode 'pause'"),
    (["--tp", "1,two"], "--tp: expected comma-separated integers"),
    (["--backend", "spark"], "--backend must be one of local, ray"),
    (["--cost-model", "guess"], "unknown cost model 'guess'; known: "),
])
def test_bad_input_is_named(tmp_path, trace_file, args, words):
    base = {"--slo": "ttft_p99=1", "--gpus": "a100-40gb", "--preemption": "recompute", "--tp": "1", "--backend": "local",
            "--cost-model": "roofline"}
    base.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in base.items() for x in kv]
    result = run(["--model", "llama-2-7b", "--trace", str(trace_file), "--target-rate", "5", "--out",
                  str(tmp_path / "o"), *flat])
    assert result.exit_code == 2
    assert words in result.output


def test_bad_prices_file_is_named(tmp_path, trace_file):
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"gpus": {"h100": {"usd_per_gpu_hour": "cheap"}}}))
    result = run(["--model", "llama-2-7b", "--trace", str(trace_file), "--target-rate", "5", "--slo", "ttft_p99=1",
                  "--prices", str(prices), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"{prices}: gpus.h100.usd_per_gpu_hour must be a finite number in (0, 1e+06]" in result.output
    assert "got 'cheap'" in result.output
