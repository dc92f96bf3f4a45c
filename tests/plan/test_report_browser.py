"""The plan report in a real browser (headless Chromium, Debian's `chromium` package): every
embedded plot decodes, the sort script orders the table by a header click, and a screenshot
shows drawn plots. Skipped where no Chromium is installed (CI does not install it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest


BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (apt-get install chromium)")
HEADLESS = [BROWSER or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--virtual-time-budget=5000"]

# After load: how many images decoded, then click the capacity header twice and read the column.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images], table = document.querySelector("table.sortable");
  const th = [...table.tHead.rows[0].cells].find(c => c.textContent.startsWith("capacity"));
  const column = () => [...table.tBodies[0].rows].map(r => Number(r.cells[th.cellIndex].dataset.sort));
  th.click(); const up = column(); th.click(); const down = column();
  const probe = {images: images.length, decoded: images.filter(i => i.complete && i.naturalWidth > 0).length,
                 up: up, down: down};
  document.body.insertAdjacentHTML("beforeend", "<pre id=probe>" + JSON.stringify(probe) + "</pre>");
});
</script>"""


@pytest.fixture
def report(light_plan):
    """The shared light plan's page (tests/plan/conftest.py): capacities that differ across GPUs, and
    merged rows (identical swap and recompute results) among those the script sorts."""
    return light_plan[1] / "report.html"


def test_plots_decode_and_the_table_sorts(report, tmp_path):
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run(HEADLESS + ["--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120).stdout
    probe = json.loads(re.search(r"<pre id=\"probe\">(.*?)</pre>", dom).group(1))
    assert probe["images"] == 5 and probe["decoded"] == 5  # pareto, two latency, cost, sensitivity
    assert probe["up"] == sorted(probe["up"]) and probe["down"] == sorted(probe["down"], reverse=True)
    assert len(set(probe["up"])) > 1


def test_screenshot_shows_the_plots(report, tmp_path):
    import matplotlib.image

    shot = tmp_path / "report.png"
    subprocess.run(HEADLESS + ["--window-size=1280,3000", f"--screenshot={shot}", report.as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = matplotlib.image.imread(shot)[..., :3]
    # plots put colour on the page (text and tables are grey); the default matplotlib blue and orange
    blue = ((abs(pixels[..., 0] - 0.12) < 0.08) & (abs(pixels[..., 1] - 0.47) < 0.08) & (abs(pixels[..., 2] - 0.71) < 0.08))
    orange = ((pixels[..., 0] > 0.9) & (abs(pixels[..., 1] - 0.5) < 0.08) & (pixels[..., 2] < 0.2))
    assert blue.sum() > 200 and orange.sum() > 50
