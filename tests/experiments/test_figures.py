"""Each figure script's main(--smoke) writes its .png/.csv/.md with the paper's numbers and verdicts."""

from __future__ import annotations

import importlib

import pytest

from pagesim.experiments import paper
from pagesim.experiments.figures import read_verdicts


def _paper_numbers(name: str) -> list[float]:
    if name == "fig11_lengths":
        return [v for m in paper.FIG11_MEANS.values() for v in (m.prompt_len, m.output_len)]
    if name == "fig13_batched_requests":
        return [v for ref in paper.FIG13_BATCHED.values() for v in ref.values.values()]
    return [v for shares in paper.FIG02_SHARES.values() for v in shares.values() if v is not None]


CASES = {
    "fig11_lengths": ["trace", "kind", "bin_lo", "bin_hi", "count", "share"],
    "fig13_batched_requests": ["trace", "rate", "policy", "paper_mean_batched", "mean_batched_requests",
                               "request_throughput", "mean_step_ms"],
    "fig02_memory_waste": ["policy", "token_states_pct", "reserved_pct", "internal_fragmentation_pct",
                           "external_and_other_pct", "paper_token_states_pct", "free_pct"],
}
DIGITS = {"fig11_lengths": 2, "fig13_batched_requests": 2, "fig02_memory_waste": 1}


@pytest.mark.parametrize("name", list(CASES))
def test_smoke_outputs(name, tmp_path, smoke):
    run = smoke(name, tmp_path, CASES[name])
    result, md = run.result, run.md
    assert "| quantity | paper | ours |" in md
    for number in _paper_numbers(name):
        assert f"| {number:.{DIGITS[name]}f} |" in md, number
    # one verdict row per paper number
    assert len(result["rows"]) >= len(_paper_numbers(name))
    verdicts = [line for line in md.splitlines() if "**within**" in line or "**NOT within**" in line]
    assert len(verdicts) == len(result["rows"])


def test_policies_cover_fig13_and_fig02():
    for ref in paper.FIG13_BATCHED.values():
        assert set(ref.values) == set(paper.POLICIES)
    assert set(paper.FIG02_SHARES) == set(paper.POLICIES)


# -- Figs. 12, 18, 19 and the runner -------------------------------------------------------------

MY_CASES = {
    "fig12_latency_vs_rate": ["model", "trace", "system", "rate", "mean_normalized_latency", "aborted", "num_measured"],
    "fig18_block_size": ["part", "device", "batch_size", "context_len", "paged_ms", "contiguous_ms", "trace",
                         "block_size", "mean_normalized_latency"],
    "fig19_swap_recompute": ["part", "device", "block_size", "swap_ms", "recompute_ms", "preemption",
                             "mean_normalized_latency"],
}


def _band_text(lo: float, hi: float) -> str:
    return f"| {lo:.2f}-{hi:.2f} |"


@pytest.mark.parametrize("name", list(MY_CASES))
def test_smoke_outputs_fig12_18_19(name, tmp_path, smoke):
    run = smoke(name, tmp_path, MY_CASES[name])
    result, md = run.result, run.md
    verdicts = read_verdicts(tmp_path / f"{name}.md")
    assert verdicts.num_rows == len(result["rows"]) > 0
    assert verdicts.num_within == sum(r.ok for r in result["rows"])
    if name == "fig12_latency_vs_rate":
        for lo, hi in paper.FIG12_SHAREGPT_RATIO_BANDS.values():
            assert _band_text(lo, hi) in md
        assert f"| {paper.FIG12_FT_MAX_RATIO:.2f} |" in md
        # every verdict is recomputed from the sustainable rates in the rates table
        for s in result["searches"]:
            for t, (ok_rate, fail_rate) in s.rates.items():
                assert fail_rate > ok_rate
                assert ok_rate == 0 or s.latency(ok_rate) < t <= s.latency(fail_rate)
    if name == "fig18_block_size":
        assert _band_text(*paper.FIG18A_OVERHEAD_BAND) in md
        for lo, hi in paper.FIG18_BEST_BLOCKS.values():
            assert _band_text(lo, hi) in md
    if name == "fig19_swap_recompute":
        assert f"| {paper.FIG19_RECOMPUTE_MAX_OVER_SWAP:.2f} |" in md


def test_sustainable_rate_search_against_a_known_curve():
    """The search on a made-up latency curve with a known knee finds it within the resolution,
    and never probes above a failing rate."""
    fig12 = importlib.import_module("pagesim.experiments.fig12_latency_vs_rate")
    knee = 37.3
    search = fig12.Search(paper.FIG12_SETUPS[0], "sharegpt", "paged")
    probed = []

    def run(rate):
        probed.append(rate)
        return {"mean_normalized_latency": 0.05 if rate <= knee else 5.0}

    lo, hi = fig12.sustainable_rate(search, run, 1.0, start=1.0, resolution=0.05)
    assert lo <= knee < hi and hi / lo <= 1.05
    assert max(probed) <= 2 * knee
    # a second threshold reuses the probes: nothing new below an already-bracketed knee
    n = len(probed)
    assert fig12.sustainable_rate(search, run, 0.5, start=1.0, resolution=0.05) == (lo, hi)
    assert len(probed) == n
    # a system that cannot sustain even the smallest rate gets 0
    none = fig12.Search(paper.FIG12_SETUPS[0], "sharegpt", "static")
    assert fig12.sustainable_rate(none, lambda r: {"mean_normalized_latency": 9.0}, 1.0, start=1.0)[0] == 0.0


def test_fig12_verdict_rows_use_the_paper_bands():
    """Ratios inside / outside the ShareGPT bands give within / NOT within, from paper.py's numbers."""
    fig12 = importlib.import_module("pagesim.experiments.fig12_latency_vs_rate")
    setup = paper.FIG12_SETUPS[0]
    lo_o, hi_o = paper.FIG12_SHAREGPT_RATIO_BANDS["orca-oracle"]
    lo_m, hi_m = paper.FIG12_SHAREGPT_RATIO_BANDS["orca-max"]
    vllm = 10.0
    rates = {"paged": vllm, "orca-oracle": vllm / ((lo_o + hi_o) / 2), "orca-max": vllm / (hi_m * 1.5),
             "orca-pow2": vllm / 3, "static": vllm / 20}
    searches = []
    for system, r in rates.items():
        s = fig12.Search(setup, "sharegpt", system)
        s.probes = {r: {"mean_normalized_latency": 0.1, "mean_batched_requests": 1.0, "num_preemptions": 0}}
        s.rates = {1.0: (r, r * 1.1)}
        searches.append(s)
    rows = {r.quantity: r for r in fig12.build_rows(searches, (1.0,))}
    oracle = next(r for q, r in rows.items() if "Orca (Oracle)" in q)
    orca_max = next(r for q, r in rows.items() if "Orca (Max)" in q)
    ft = next(r for q, r in rows.items() if "FasterTransformer" in q)
    assert oracle.ok and (oracle.paper, oracle.paper_hi) == (lo_o, hi_o)
    assert not orca_max.ok and orca_max.ours == pytest.approx(hi_m * 1.5)
    assert ft.ours == pytest.approx(20.0) and ft.paper == paper.FIG12_FT_MAX_RATIO


def test_runner_discovers_scripts_and_writes_paper_md(tmp_path):
    """Discovery picks up any figNN_*.py with a main(); paper.md gets one row per figure with its
    verdict count and links, and a failing script is reported as failed."""
    from pagesim.experiments import run_all
    exp = tmp_path / "experiments"
    exp.mkdir()
    out = tmp_path / "reports" / "figures"
    (exp / "fig98_good.py").write_text(
        "from pagesim.experiments.figures import Row, outputs, write_report, base_parser\n"
          "def main(argv=None):\n"
          "    a = base_parser('t').parse_args(argv)\n"
          "    f = outputs(a.out_dir, 'fig98_good')\n"
          "    f['png'].write_bytes(b'x'); f['csv'].write_text('a\\n1\\n')\n"
          "    write_report(f['md'], 't', 'cmd', [Row('q1', 1.0, 1.0, 't', True), Row('q2', 2.0, 3.0, 't', False, 'why')])\n"
          "if __name__ == '__main__':\n    main()\n")
    (exp / "fig99_bad.py").write_text("def main(argv=None):\n    raise SystemExit(3)\nif __name__ == '__main__':\n    main()\n")
    (exp / "fig97_nomain.py").write_text("x = 1\n")
    (exp / "helper.py").write_text("def main(argv=None):\n    pass\n")
    figures = run_all.discover(None, exp)
    assert [f.key for f in figures] == ["fig98", "fig99"]
    assert [f.key for f in run_all.discover(["fig98"], exp)] == ["fig98"]
    with pytest.raises(ValueError, match="fig42"):
        run_all.discover(["fig42"], exp)
    md_path = run_all.run(figures, jobs=2, smoke=True, out_dir=out, progress=False)
    md = md_path.read_text()
    assert md_path == out / "paper.md"  # a folder of its own: nothing written outside it
    assert sorted(p.name for p in tmp_path.joinpath("reports").iterdir()) == ["figures"]
    assert run_all.default_paper_md(run_all.DEFAULT_OUT_DIR) == run_all.DEFAULT_OUT_DIR.parent / "paper.md"
    good = next(line for line in md.splitlines() if line.startswith("| fig98 "))
    assert "1 of 2 within" in good and "q2" in good and "(fig98_good.png)" in good
    bad = next(line for line in md.splitlines() if line.startswith("| fig99 "))
    assert "FAILED (exit 3" in bad
    assert "pagesim.experiments.run_all" in md and "--smoke" in md


def test_real_scripts_are_discovered():
    from pagesim.experiments import run_all
    keys = {f.key for f in run_all.discover()}
    assert {"fig02", "fig11", "fig12", "fig13", "fig18", "fig19"} <= keys


def test_committed_figures_are_never_replaced_with_less(tmp_path):
    """Issue 26/27: `--only ""` ran nothing and emptied reports/paper.md; a smoke run or a subset
    overwrote the committed results. Each is refused (exit 2) before any script runs."""
    from typer.testing import CliRunner

    from pagesim.experiments import run_all
    from pagesim.cli import app

    with pytest.raises(ValueError, match="names no figure"):
        run_all.discover([""])
    with pytest.raises(ValueError, match="names no figure"):
        run_all.discover([" , "])
    figures = run_all.discover()
    listed = run_all.listed_figures(run_all.default_paper_md(run_all.DEFAULT_OUT_DIR))
    assert listed == {f.key for f in figures}  # the committed paper.md lists every figure script
    run_all.check_default_target(figures, smoke=False)  # a full run may replace it
    with pytest.raises(ValueError, match="--smoke results would replace"):
        run_all.check_default_target(figures, smoke=True)
    with pytest.raises(ValueError, match="fig02, fig11, fig14"):
        run_all.check_default_target(run_all.discover(["fig12,fig13,fig15,fig16,fig17,fig18,fig19"]), smoke=False)
    before = run_all.default_paper_md(run_all.DEFAULT_OUT_DIR).read_bytes()
    for args in (["--only", ""], ["--only", "fig12,fig13", "--smoke"], ["--only", "fig12"]):
        result = CliRunner().invoke(app, ["figures", *args])
        assert result.exit_code == 2 and result.output.startswith("error: "), result.output
    assert run_all.default_paper_md(run_all.DEFAULT_OUT_DIR).read_bytes() == before


def test_figure_scripts_end_with_the_runner(tmp_path):
    """SIGTERM or SIGHUP to the runner (`pagesim figures`) while a figure script runs: the runner
    exits and the script, with its own children, is gone within seconds."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    exp = tmp_path / "experiments"
    exp.mkdir()
    pids = tmp_path / "pids"
    # a figure script that starts a child of its own and then works for a minute
    (exp / "fig96_slow.py").write_text(
        "import subprocess, sys, time\n"
        "def main(argv=None):\n"
        f"    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"    open({str(pids)!r}, 'w').write(f'{{__import__(\"os\").getpid()}} {{child.pid}}')\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n    main()\n")
    runner = ("from pathlib import Path\nfrom pagesim.experiments import run_all\n"
              f"run_all.run(run_all.discover(None, Path({str(exp)!r})), out_dir=Path({str(tmp_path / 'out')!r}), "
              "progress=False)\n")
    for signame in ("SIGTERM", "SIGHUP"):
        pids.unlink(missing_ok=True)
        parent = subprocess.Popen([sys.executable, "-c", runner], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
                time.sleep(0.1)
            started = [int(p) for p in pids.read_text().split()]
            parent.send_signal(getattr(signal, signame))
            assert parent.wait(timeout=30) == 128 + getattr(signal, signame)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(_running(p) for p in started):
                time.sleep(0.1)
            assert not [p for p in started if _running(p)], f"{signame}: figure processes outlived the runner"
        finally:
            if parent.poll() is None:
                parent.kill()


def _running(pid: int) -> bool:
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
