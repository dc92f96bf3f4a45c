"""benchmarks/profile_prefix.py on a short run: every timed function has its row, the functions
that exist only for prefix caching are never called without it, and the key count is consistent
(blocks hashed <= blocks asked for, both > 0, on a trace of token ids)."""

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.profile_prefix import TIMED

ROOT = Path(__file__).resolve().parents[1]


def test_short_profile_reports_every_row_and_counts_keys(tmp_path):
    out = tmp_path / "profile.md"
    run = subprocess.run([sys.executable, "-m", "benchmarks.profile_prefix", "--num-requests", "60", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = out.read_text()
    rows = {m.group(1): (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
            for m in re.finditer(r"^\| `(.+?)` \| ([\d,]+) / ([\d,]+) \|", report, re.M)}
    assert set(rows) == {label for label, *_ in TIMED}
    for label in ("PagedKVManager.on_computed (registering filled prompt blocks)",
                  "  _cache_generated (registering the output's blocks)"):
        without, with_caching = rows[label]
        assert without == 0 and with_caching > 0, (label, rows[label])
    asked, hashed = (int(x.replace(",", "")) for x in
                     re.search(r"Block keys: ([\d,]+) asked for, ([\d,]+) hashed", report).groups())
    assert 0 < hashed <= asked
