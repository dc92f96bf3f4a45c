"""The wheel: built from the project's files as a fresh clone has them, it holds every data file
the code opens (found by scanning the sources for file names, so a new data file without a
package-data entry fails here), installs without setuptools warnings, carries the SPDX license,
and runs `pagesim replay --beam-width 4` (which reads the measured beam ancestry) from the wheel
alone. It ships the small traces (`traces/sharegpt.json` works in any folder), no top-level
`experiments` package, and its `pagesim figures` writes into the current folder and says why a
figure failed."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pagesim", "executor")
DATA_SUFFIXES = (".json", ".csv", ".txt", ".yaml", ".yml", ".toml", ".gguf", ".safetensors")


def package_files() -> list[Path]:
    """Non-Python files inside the packages (what package-data must cover), less a mypyc build's
    (scripts/compile.py: extensions for this machine, and their manifest; the wheel is pure Python)."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc", ".so") and "__pycache__" not in p.parts
                  and p.name != "_compiled.json")


def files_the_code_names() -> set[Path]:
    """Files inside the packages whose names appear as string literals in the package sources."""
    by_name: dict[str, list[Path]] = {}
    for path in package_files():
        by_name.setdefault(path.name, []).append(path)
    named = set()
    for pkg in PACKAGES:
        for source in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(), str(source))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(DATA_SUFFIXES):
                    named.update(by_name.get(Path(node.value).name, []))
    return named


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # build from a copy holding only what setuptools reads, so the checkout gets no build/ dir
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", str(src),
                           "-w", str(out)], capture_output=True, text=True, cwd=src)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines()
                if "deprecat" in line.lower() or "SetuptoolsWarning" in line]
    assert warnings == []
    (built,) = out.glob("pagesim-*.whl")
    return built


def test_the_scan_finds_the_known_data_files():
    names = {p.relative_to(ROOT).as_posix() for p in files_the_code_names()}
    assert {"pagesim/sim/data/beam_ancestry_smollm2.json", "pagesim/plan/gpu_prices.json"} <= names


def test_wheel_holds_every_data_file(wheel):
    listed = set(zipfile.ZipFile(wheel).namelist())
    wanted = {p.relative_to(ROOT).as_posix() for p in set(package_files()) | files_the_code_names()}
    assert sorted(wanted - listed) == []
    metadata = zipfile.ZipFile(wheel).read(next(n for n in listed if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in listed)


def test_wheel_alone_runs_beam_search(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    trace = shutil.copy(ROOT / "traces" / "alpaca.json", tmp_path / "alpaca.json")
    # cwd and PYTHONPATH hold the unpacked wheel only: nothing is read from the checkout
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "pagesim.cli", "replay", str(trace), "--num-requests", "8", "--rate", "4",
                           "--beam-width", "4", "--json"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"num_finished": 8' in proc.stdout and "beam_ancestry_smollm2.json" in proc.stdout
    assert str(site) in subprocess.run([sys.executable, "-c", "import pagesim; print(pagesim.__file__)"],
                                       capture_output=True, text=True, cwd=tmp_path, env=env).stdout


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    zipfile.ZipFile(wheel).extractall(site)
    return site


def from_wheel(site: Path, cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m pagesim ARGS` with the unpacked wheel alone on the path, in `cwd`."""
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-m", "pagesim", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def test_wheel_ships_the_small_traces_and_no_top_level_experiments(wheel):
    listed = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in listed if n.startswith("experiments/")]  # (issue 27: a top-level package of that name)
    assert "pagesim/experiments/fig12_latency_vs_rate.py" in listed
    for name in ("sharegpt.json", "alpaca.json"):
        shipped = zipfile.ZipFile(wheel).read(f"pagesim/workload/traces/{name}")
        assert shipped == (ROOT / "traces" / name).read_bytes(), name  # the committed trace, not a link


def test_a_trace_path_resolves_to_the_shipped_trace_in_an_empty_folder(site, tmp_path):
    proc = from_wheel(site, tmp_path, "replay", "traces/sharegpt.json", "--num-requests", "20", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"num_finished": 20' in proc.stdout and '"trace": "traces/sharegpt.json"' in proc.stdout
    missing = from_wheel(site, tmp_path, "replay", "traces/translation_5shot.json", "--num-requests", "20")
    assert missing.returncode == 2 and "traces/translation_5shot.json: no such trace file" in missing.stderr


def test_figures_from_the_wheel_write_into_the_current_folder(site, tmp_path):
    proc = from_wheel(site, tmp_path, "figures", "--only", "fig11,fig17", "--smoke", "--jobs", "1")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # fig17 needs a trace the wheel lacks
    assert (tmp_path / "reports" / "figures" / "fig11_lengths.png").stat().st_size > 1000
    assert (tmp_path / "reports" / "paper.md").exists()
    assert not (site / "reports").exists()  # nothing written beside the installed package
    assert "fig11_lengths: ok" in proc.stdout and "fig17_chatbot: FAILED" in proc.stdout
    why = next(line for line in proc.stdout.splitlines() if line.startswith("fig17_chatbot failed: "))
    assert "traces/sharegpt_chat.json: not in this folder and not shipped with pagesim" in why, proc.stdout  # the reason
    paper = (tmp_path / "reports" / "paper.md").read_text()
    assert "| fig17 |" in paper and "not shipped with pagesim" in paper
