"""The page in a real browser: headless Chromium loads it from a file with its network logged,
and the rendered DOM holds every panel's plot and summary.json's numbers, with no request made.
Runs where Chromium is installed (Debian's `chromium`; .ci/run installs it where that is quick)
and is skipped, saying so, where it is not."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pagesim.view import build_report, write_report
from tests.view.common import cluster_run, replay_run
from tests.view.test_view import Page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
                                "the page was not checked in a browser")
# a browser that starts nothing of its own on a machine without a network (see .ci/run)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def chromium(page: Path, tmp: Path, *extra: str) -> tuple[str, list[str]]:
    """(the rendered DOM, the URLs the page itself asked the network for): from Chromium's net
    log, the requests made on behalf of a file:// page (the browser's own background requests,
    which the flags above mostly stop, are made for no page and are not counted)."""
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    log = tmp / f"{profile.name}.netlog.json"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--log-net-log={log}", *extra,
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    events = json.loads(log.read_text())["events"]
    requested = [e["params"]["url"] for e in events
                 if "file://" in str(e.get("params", {}).get("network_isolation_key", "")) and "url" in e["params"]]
    return done.stdout, requested


def test_the_net_log_sees_a_page_that_loads_something(tmp_path):
    """The check below could not fail if a page's requests never reached the log: this one does."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><img src='http://127.0.0.1:9/plot.png'><p>x</p></body></html>")
    _, requested = chromium(bad, tmp_path)
    assert "http://127.0.0.1:9/plot.png" in requested


def test_the_page_renders_offline_with_its_plots_and_numbers(tmp_path):
    run = tmp_path / "run"
    summary = replay_run(run)
    write_report([run], run / "report.html")
    dom, requested = chromium(run / "report.html", tmp_path)
    assert requested == []
    page = Page(dom)
    expected = Page(build_report([run]))
    assert page.svgs == expected.svgs == 9
    assert {"Batch size", "KV cache use", "Queues", "Preemptions and swaps", "Time to first token",
            "End-to-end latency", "Inter-token latency"} <= set(page.headings)
    for value in (f"{summary['request_throughput']:.3f} req/s", f"{summary['num_preemptions']:,}",
                  f"{summary['mean_batched_requests']:.2f}", f"{summary['duration_s']:.1f} s simulated"):
        assert value in page.cells, value


def test_the_screenshot_is_a_drawn_page(tmp_path):
    """Pixels, not only a DOM: a cluster page's screenshot holds plots in colour."""
    import matplotlib.image

    cluster_run(tmp_path / "cluster")
    write_report([tmp_path / "cluster"], tmp_path / "cluster" / "report.html")
    shot = tmp_path / "shot.png"
    chromium(tmp_path / "cluster" / "report.html", tmp_path, "--window-size=1000,2400", f"--screenshot={shot}")
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1000)
    spread = pixels.max(axis=2) - pixels.min(axis=2)  # grey text and axes: 0; the replicas' line colours: large
    assert (spread > 0.3).mean() > 0.001
    assert (pixels.min(axis=2) < 0.5).mean() > 0.005  # text and axes drawn
