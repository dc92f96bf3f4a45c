"""guidellm 0.8.1 (a third-party load generator) drives `pagesim serve` with its default request
format (issue 27): streamed chat completions whose `content` is a list of text parts, the model
named from /v1/models. Every request must succeed, as guidellm's own JSON report counts them.

guidellm lives in its own virtual environment (it pins its own dependencies), created once under
/tmp (about a minute) or named by $GUIDELLM_VENV; the test is skipped, with the reason, when it
cannot be installed. Its synthetic prompts need a tokenizer: the OPT tokenizer from the shared
data folder (nothing is downloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagesim.workload.builders import default_data_dir

from .conftest import MODEL

VERSION = "0.8.1"
NUM_REQUESTS = 8


def guidellm_venv() -> Path:
    venv = Path(os.environ.get("GUIDELLM_VENV", "/tmp/guidellm-venv"))
    exe = venv / "bin" / "guidellm"
    if exe.exists():
        version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120).stdout
        if VERSION in version:
            return exe
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"guidellm=={VERSION}"], check=True,
                       capture_output=True, text=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"guidellm=={VERSION} could not be installed into {venv}: {str(getattr(e, 'stderr', e))[-300:]}")
    return exe


def test_guidellm_default_run_succeeds_on_every_request(server, tmp_path):
    tokenizer = default_data_dir() / "tokenizers" / "opt"
    if not (tokenizer / "vocab.json").exists():
        pytest.skip(f"the OPT tokenizer is not at {tokenizer} (set PAGESIM_DATA_DIR to the shared data folder)")
    exe = guidellm_venv()
    out = tmp_path / "guidellm.json"
    # 16 prompt tokens of OPT's vocabulary are about 80 bytes, i.e. 80 tokens of llama-tiny's byte
    # tokenizer, plus the chat transcript: well inside its 256-token context with 8 output tokens
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={server.base}",
           "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=8",
           "--tokenizer", f"kind=hf_auto,model={tokenizer}",
           "--profile", "kind=synchronous",
           "--constraint", f"kind=max_requests,count={NUM_REQUESTS}", "--constraint", "kind=max_duration,seconds=120",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # guidellm's own environment, not this checkout
    log_start = len(server.lines)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    [benchmark] = json.loads(out.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals == {"successful": NUM_REQUESTS, "errored": 0, "incomplete": 0, "total": NUM_REQUESTS}, totals
    assert f"validated with model {MODEL}" in done.stdout, "guidellm took the model's name from /v1/models"
    served = [line for line in server.lines[log_start:] if '"POST /v1/chat/completions" 200' in line]
    assert len(served) == NUM_REQUESTS, "its default format: chat completions (content as a list of parts)"
    outputs = benchmark["metrics"]["output_token_count"]["successful"]
    assert outputs["total_sum"] == 8 * NUM_REQUESTS, outputs  # it sends ignore_eos with its output length
