"""On-disk cache of simulated runs, so a re-run (or a wider grid) reuses every finished run.

Key: sha256 of what a run's outcome depends on, by content, never by a file's name:
- the ReplayConfig, with the model replaced by its resolved ModelSpec (a config.json edited into
  another model is another key) and the GPU by its GPUSpec;
- the content of every file the run reads: the trace (its canonical serialization), the profile
  of a `profiled` cost model, a beam-ancestry file;
- a code tag: the source of everything a run's outcome depends on (pagesim.core, pagesim.sim,
  pagesim.workload, pagesim.models, pagesim.metrics, the number rules and this package's run
  code), so an edit to the simulator invalidates old entries instead of silently reusing them.
Entries are JSON (floats round-trip exactly), written atomically, one file each, so parallel
workers share a cache directory safely. An entry that cannot be read, or that is not a run record
of the expected shape (pagesim.plan.run.record_problem), is simulated again and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import pagesim
from pagesim.sim.engine import ReplayConfig
from pagesim.sim.specs import get_gpu, get_model
from pagesim.workload.trace import Trace, dumps_trace

CACHE_FORMAT = 3  # bump when the stored record's layout or the key's makeup changes
DEFAULT_CACHE_DIR = Path(".pagesim-cache") / "plan"
_CODE_DIRS = ("core", "sim", "workload", "models", "metrics")
_CODE_FILES = ("inputs.py", "plan/run.py", "plan/steady.py", "plan/cache.py", "plan/continued.py")


@lru_cache(maxsize=None)
def code_tag(dirs: tuple[str, ...] = _CODE_DIRS, extra_files: tuple[str, ...] = _CODE_FILES) -> str:
    """Hash of the simulator's source (see module docstring); a fleet's runs add the cluster's
    code (pagesim.plan.fleet)."""
    root = Path(pagesim.__file__).parent
    files = sorted(p for d in dirs if (root / d).is_dir() for p in (root / d).rglob("*.py"))
    files += [root / f for f in extra_files]
    h = hashlib.sha256(f"pagesim {pagesim.__version__} format {CACHE_FORMAT}".encode())
    for path in files:
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def trace_hash(trace: Trace) -> str:
    """Content hash of a trace (its canonical serialization, independent of file formatting)."""
    return hashlib.sha256(dumps_trace(trace).encode()).hexdigest()


def _file_hash(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None  # the run itself reports the missing file


def run_key(cfg: ReplayConfig, trace_digest: str) -> str:
    config = asdict(cfg)
    config["model"] = asdict(get_model(cfg.model))  # what the name or config.json resolves to now
    config["gpu"] = asdict(get_gpu(cfg.gpu))
    config["profile"] = _file_hash(cfg.profile)
    config["beam_ancestry"] = _file_hash(cfg.beam_ancestry)
    payload = {"config": config, "trace": trace_digest, "code": code_tag()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def checkpoint_key(cfg: ReplayConfig, trace_digest: str, num_requests: int) -> str:
    """The key of the first num_requests of a continued replay of cfg (pagesim.plan.continued):
    another record than a whole run of num_requests (later arrivals kept coming)."""
    return hashlib.sha256(f"{run_key(cfg, trace_digest)} checkpoint {num_requests}".encode()).hexdigest()


class RunCache:
    """get/put JSON records by key under `root` (None: a cache that stores nothing)."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = Path(root) if root is not None else None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if self.root is None:
            return None
        try:
            record = json.loads(self._path(key).read_text())
        except (OSError, ValueError, RecursionError):
            return None  # missing, half-written by a killed run, or not JSON: simulate again
        return record if isinstance(record, dict) else None

    def put(self, key: str, record: dict) -> None:
        if self.root is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
