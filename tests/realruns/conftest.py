"""Small recorded runs of every format, written into tmp_path by the tests (never copies of the
shared data), and where the shared real runs are."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pagesim.workload.builders import default_data_dir

# $PAGESIM_DATA_DIR/real_vllm, else ../shared/data/real_vllm beside the repo
REAL = default_data_dir() / "real_vllm"
needs_real_runs = pytest.mark.skipif(not REAL.exists(), reason=f"needs the shared real runs ({REAL}; set PAGESIM_DATA_DIR)")


def write_json(path: Path, doc, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def blis_run(root: Path, requests: list[dict], truth: list[dict], *, name: str = "run-a", profile: dict | None = None,
             resolved: str | None = None, exp: str | None = None, gz: bool = True) -> Path:
    """replay_data/<name>.json[.gz] + its ground truth, and default_args/<name>/ when given."""
    ext = ".json.gz" if gz else ".json"
    doc = {"experiment": name, "model_id": "meta-llama/Llama-2-7b-hf",
           "config": {"tensor_parallelism": 1, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
                      "kv_blocks_total_gpu": 7462, "block_size": 16},
           "model_config": {"vocab_size": 32000}, "requests": requests}
    path = write_json(root / "replay_data" / f"{name}{ext}", doc, gz)
    write_json(root / "replay_data" / f"{name}_ground_truth{ext}", truth, gz)
    args = root / "default_args" / name
    if profile is not None:
        write_json(args / "profile.yaml", profile)  # the campaign's profile.yaml is JSON
    if resolved is not None:
        (args / "results").mkdir(parents=True, exist_ok=True)
        (args / "results" / "config.yaml").write_text(resolved)
    if exp is not None:
        args.mkdir(parents=True, exist_ok=True)
        (args / "exp-config.yaml").write_text(exp)
    return path


def shared_prefix_profile(stages, *, system_prompt_len=4, question_len=6, output_len=5, ignore_eos=True) -> dict:
    return {"data": {"type": "shared_prefix",
                     "shared_prefix": {"num_unique_system_prompts": 9, "num_users_per_system_prompt": 5,
                                       "system_prompt_len": system_prompt_len, "question_len": question_len,
                                       "output_len": output_len, "enable_multi_turn_chat": True}},
            "load": {"type": "constant", "stages": [{"rate": r, "duration": d} for r, d in stages]},
            "server": {"ignore_eos": ignore_eos, "type": "vllm"}}


RESOLVED_2x2 = """data:
  type: shared_prefix
  shared_prefix:
    num_groups: 2
    num_prompts_per_group: 2
    system_prompt_len: 4
"""
