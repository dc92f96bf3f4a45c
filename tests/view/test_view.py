"""pagesim view: the page's panels and numbers against the run's own files and hand-computed
values, the readers' one-line errors, cluster and overlaid runs, and the CLI."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.metrics import REQUEST_FIELDS
from pagesim.view import ViewError, build_report, load_runs
from pagesim.view.charts import BINS, MAX_RAW_POINTS, over_time
from pagesim.view.cluster import in_flight
from pagesim.view.panels import step_gaps
from tests.view.common import SHAREGPT, cluster_run, replay_run, write_csv


class Page(HTMLParser):
    """The parts of a page the tests read: headings, table cells, svg elements, every load-like attribute."""

    def __init__(self, html: str):
        super().__init__()
        self.headings, self.cells, self.links, self.metas, self.svgs, self.images = [], [], [], [], 0, 0
        self._text: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.svgs += tag == "svg"
        self.images += tag == "image"
        self.metas += [attrs] if tag == "meta" else []
        self.links += [v for k, v in attrs.items() if k in ("src", "href", "xlink:href", "srcset", "action") and v]
        if tag in ("h3", "td", "th"):
            self._text = []

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag in ("h3", "td", "th") and self._text is not None:
            (self.headings if tag == "h3" else self.cells).append("".join(self._text).strip())
            self._text = None


@pytest.fixture(scope="module")
def swapping_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run") / "swapping"
    replay_run(folder)
    return folder


def test_a_replay_page_has_every_panel_and_the_summary_numbers(swapping_run):
    summary = json.loads((swapping_run / "summary.json").read_text())
    assert summary["num_preemptions"] > 0 and summary["num_swapped_blocks"] > 0  # the panels have something to show
    page = Page(build_report([swapping_run]))
    assert {"Batch size", "KV cache use", "Queues", "Preemptions and swaps", "KV cache waste: swapping",
            "Time to first token", "Time per output token", "End-to-end latency", "Inter-token latency"} <= set(page.headings)
    assert page.svgs == 9  # one plot per panel above, none left out
    for expected in (f"{summary['request_throughput']:.3f} req/s", f"{summary['num_preemptions']:,}",
                     f"{summary['num_swapped_blocks']:,}", f"{summary['ttft_p99']:.3f} s",
                     f"{summary['duration_s']:.1f} s simulated", f"{summary['mean_kv_utilization'] * 100:.1f} %"):
        assert expected in page.cells, expected
    # the config's values, one row each
    assert "num_gpu_blocks" in page.cells and "300" in page.cells and "waste_interval_s" in page.cells


def test_the_page_loads_nothing(swapping_run):
    html = build_report([swapping_run])
    page = Page(html)
    csp = [m["content"] for m in page.metas if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]
    assert all(link.startswith(("#", "data:")) for link in page.links), [l[:40] for l in page.links]
    assert "<script" not in html and "url(" not in html.replace("url(#", "")


@pytest.mark.parametrize("chunked", [False, True])
def test_the_itl_estimate_from_steps_equals_the_summary_from_every_token(tmp_path, chunked):
    """Without preemption every gap is seen: one per output token after each request's first,
    and their mean is summary.json's mean ITL (which pagesim computes from every token's time)."""
    summary = replay_run(tmp_path, num_gpu_blocks=None, rate=1.5, preemption="recompute", waste_interval_s=None,
                         chunked_prefill=chunked)
    run = load_runs([tmp_path])[0]
    assert summary["num_preemptions"] == 0
    gaps, weights = step_gaps(run)
    assert sum(weights) == summary["total_output_tokens"] - summary["num_finished"]
    mean_ms = sum(g * w for g, w in zip(gaps, weights)) / sum(weights) * 1e3
    assert mean_ms == pytest.approx(summary["mean_itl_ms"], rel=1e-9)


def test_many_steps_are_drawn_as_time_weighted_bins():
    # steps alternate 10 (lasting 3 s) and 0 (lasting 1 s); each 20 s bin holds five such pairs
    # whole (their end times, from the origin, are 2.5, 3.5, 6.5, ...), so its time-weighted mean is 7.5
    n = 2 * MAX_RAW_POINTS
    durations = [3.0 if k % 2 == 0 else 1.0 for k in range(n)]
    ends, t = [], 0.0
    for d in durations:
        t += d
        ends.append(t)
    values = [10 if k % 2 == 0 else 0 for k in range(n)]
    series = over_time(ends, durations, values, origin=0.5, span=8000.0)
    assert len(series.x) == BINS and series.x[0] == 20.0
    assert series.y == pytest.approx([7.5] * BINS)
    assert set(series.lo) == {0.0} and set(series.hi) == {10.0}
    few = over_time(ends[:5], durations[:5], values[:5], origin=1.0, span=ends[4])
    assert few.x == [2.0, 3.0, 6.0, 7.0, 10.0] and few.y == [10, 0, 10, 0, 10] and few.lo is None


def test_missing_optional_files_leave_their_panels_out_with_the_reason(swapping_run, tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "requests.csv").write_bytes((swapping_run / "requests.csv").read_bytes())
    summary = json.loads((swapping_run / "summary.json").read_text())
    del summary["cost_model"]
    summary["num_kv_blocks"] = None  # as bench writes it: the pool is the server's
    (bench / "summary.json").write_text(json.dumps(summary))
    html = build_report([bench])
    assert "No step panels: bench: measured over HTTP (pagesim bench), which sees no engine steps." in html
    assert "No ITL distribution: bench: no steps.csv, and requests.csv holds no per-token times." in html
    assert "No waste samples for bench" in html
    assert f"{summary['duration_s']:.1f} s measured" in Page(html).cells
    only_summary = tmp_path / "only"
    only_summary.mkdir()
    (only_summary / "summary.json").write_text(json.dumps(summary))
    assert "No latency panels: no run has a requests.csv" in build_report([only_summary])


@pytest.mark.parametrize("damage, message", [
    (lambda lines: lines[:3] + [lines[3].replace(lines[3].split(",")[3], "soon", 1)] + lines[4:],
     "requests.csv: row 3, column arrival_time: 'soon' is not a number"),
    (lambda lines: lines[:2] + [",".join(lines[2].split(",")[:-2])] + lines[3:],
     f"requests.csv: row 2: {len(REQUEST_FIELDS) - 2} cells where the header has {len(REQUEST_FIELDS)}"),
    (lambda lines: [lines[0].replace("finish_time", "end_time")] + lines[1:], "requests.csv: column finish_time is missing"),
    (lambda lines: lines[:1] + [lines[1].replace(lines[1].split(",")[3], "nan", 1)] + lines[2:],
     "requests.csv: row 1, column arrival_time: 'nan' is not a finite number"),
])
def test_a_malformed_csv_is_one_line_naming_file_row_and_column(swapping_run, tmp_path, damage, message):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("summary.json", "steps.csv"):
        (run / name).write_bytes((swapping_run / name).read_bytes())
    lines = (swapping_run / "requests.csv").read_text().splitlines()
    (run / "requests.csv").write_text("\n".join(damage(lines)) + "\n")
    with pytest.raises(ViewError, match=re.escape(message)):
        load_runs([run])
    result = CliRunner().invoke(app, ["view", str(run)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and message in result.output and str(run) in result.output


def test_a_malformed_summary_names_its_line_and_column(tmp_path):
    (tmp_path / "summary.json").write_text('{\n  "num_requests": 3,\n  "x": oops\n}\n')
    with pytest.raises(ViewError, match=re.escape(f"{tmp_path / 'summary.json'}: line 3, column 8: not valid JSON")):
        load_runs([tmp_path])
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ViewError, match="must hold a JSON object, not list"):
        load_runs([tmp_path])
    (tmp_path / "summary.json").write_text('{"ttft_mean": NaN}')
    with pytest.raises(ViewError, match="NaN in a result file"):
        load_runs([tmp_path])


def _summary(folder: Path, **fields) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"num_requests": 0, **fields}))


def test_runs_below_a_folder_are_found_as_compare_writes_them(tmp_path):
    for part in ("paged-swap/executor/run1", "paged-swap/executor/run2", "paged-swap/simulator"):
        _summary(tmp_path / part)
    runs = load_runs([tmp_path])
    assert [r.label for r in runs] == ["paged-swap/executor/run1", "paged-swap/executor/run2", "paged-swap/simulator"]
    assert [r.label for r in load_runs([tmp_path / "paged-swap/simulator", tmp_path / "paged-swap"])] == [
        "1: simulator", "2: executor/run1", "3: executor/run2", "4: simulator"]
    with pytest.raises(ViewError, match="2 --label given for 3 runs"):
        load_runs([tmp_path], labels=["a", "b"])
    for k in range(3, 9):
        _summary(tmp_path / "paged-swap" / "executor" / f"run{k}")
    with pytest.raises(ViewError, match="9 runs found .* at most 8; name the run folders themselves"):
        load_runs([tmp_path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ViewError, match="empty: no summary.json here or in its sub-folders"):
        load_runs([tmp_path / "empty"])


def test_two_runs_are_overlaid_in_every_panel(swapping_run, tmp_path):
    other = tmp_path / "bigger-pool"
    replay_run(other, num_gpu_blocks=600)
    page = Page(build_report([swapping_run, other], labels=["small pool", "big pool"]))
    assert page.svgs == 10  # one waste panel per run, the rest shared
    html = build_report([swapping_run, other], labels=["small pool", "big pool"])
    for panel in re.findall(r"<section class='panel'>.*?</section>", html, flags=re.S):
        if "KV cache waste" not in panel:
            assert "small pool" in panel and "big pool" in panel, panel[:80]


def test_a_cluster_run_gets_per_replica_panels_with_the_load_counted_by_hand(tmp_path):
    cluster_run(tmp_path / "c")
    run = load_runs([tmp_path / "c"])[0]
    grid, counts = in_flight(run)
    at = {t: min(range(len(grid)), key=lambda k: abs(grid[k] - t)) for t in (0.25, 1.2, 2.2, 2.7, 3.5, 5.0)}
    # replica 0: request 0 over [0, 4], request 2's prefill over [2, 2.5]; replica 1: request 1 over
    # [1, 3] (request 3 was rejected); replica 2: request 2's decode over [2.5, 6]
    expected = {0.25: (1, 0, 0), 1.2: (1, 1, 0), 2.2: (2, 1, 0), 2.7: (1, 1, 1), 3.5: (1, 0, 1), 5.0: (0, 0, 1)}
    for t, loads in expected.items():
        assert tuple(counts[r][at[t]] for r in (0, 1, 2)) == loads, t
    html = build_report([tmp_path / "c"])
    page = Page(html)
    assert {"Load per replica: c", "Latency per replica: c", "Batch size per replica: c"} <= set(page.headings)
    assert "then on its decode replica" in html and page.images == 0  # three replicas: lines, not a heat map
    cluster_run(tmp_path / "no-steps", with_replica_steps=False)
    assert "No steps_replica&lt;K&gt;.csv files" in build_report([tmp_path / "no-steps"])


def test_many_replicas_are_a_heat_map(tmp_path):
    folder = tmp_path / "wide"
    cluster_run(folder, with_replica_steps=False)
    lines = (folder / "requests.csv").read_text().splitlines()
    header, row = lines[0], lines[1].split(",")
    rows = [row[:-2] + [str(k), ""] for k in range(10)]
    write_csv(folder / "requests.csv", header.split(","), rows)
    page = Page(build_report([folder]))
    assert page.images >= 1 and "Load per replica: wide" in page.headings  # (the map and its colour bar)


def test_validate_json_is_a_measured_against_predicted_table(swapping_run, tmp_path):
    folder = tmp_path / "validated"
    folder.mkdir()
    for name in ("summary.json", "requests.csv"):
        (folder / name).write_bytes((swapping_run / name).read_bytes())
    overall = {"ttft_mean": {"measured": 0.2, "predicted": 0.25, "error": 0.25},
               "output_throughput": {"measured": 100.0, "predicted": 90.0, "error": -0.1}}
    (folder / "validate.json").write_text(json.dumps({"run": "real.json", "overall": overall}))
    cells = Page(build_report([folder])).cells
    at = cells.index("ttft_mean")
    assert cells[at:at + 4] == ["ttft_mean", "200.0 ms", "250.0 ms", "+25.0 %"]
    at = cells.index("output_throughput")
    assert cells[at:at + 4] == ["output_throughput", "100.0", "90.0", "-10.0 %"]


def test_the_page_is_the_same_bytes_for_the_same_run(swapping_run):
    assert build_report([swapping_run]) == build_report([swapping_run])


def test_cli_view_and_replay_html(tmp_path, swapping_run):
    result = CliRunner().invoke(app, ["view", str(swapping_run), "--out", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "page.html").read_text() == build_report([swapping_run])
    result = CliRunner().invoke(app, ["view", str(swapping_run), str(swapping_run)])
    assert result.exit_code == 2 and "--out: name the page to write" in result.output
    args = ["replay", str(SHAREGPT), "--num-requests", "20", "--rate", "4"]
    plain, with_html = tmp_path / "plain", tmp_path / "html"
    assert CliRunner().invoke(app, args + ["--out", str(plain)]).exit_code == 0
    result = CliRunner().invoke(app, args + ["--out", str(with_html), "--html", "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # --json: stdout is the summary alone
    assert sorted(p.name for p in with_html.iterdir()) == ["report.html", "requests.csv", "steps.csv", "summary.json"]
    for name in ("requests.csv", "steps.csv"):
        assert (plain / name).read_bytes() == (with_html / name).read_bytes()
    assert (with_html / "report.html").read_text() == build_report([with_html])
    result = CliRunner().invoke(app, args + ["--html"])
    assert result.exit_code == 2 and "--html writes report.html into the --out folder" in result.output
