"""The shared-prefix translation traces (paper Fig. 16): one fixed prefix of the paper's length in
every prompt, outputs by the documented ratio, rebuildable byte for byte."""

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.builders import TRANSLATION_OUTPUT_RATIO, english_sentences
from pagesim.workload.trace import load_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.mark.parametrize("shots, prefix_len", [(1, 80), (5, 341)])
def test_every_prompt_starts_with_the_one_prefix(shots, prefix_len):
    trace = load_trace(TRACES / f"translation_{shots}shot.json")
    assert len(trace) == 2000
    prefix = trace.requests[0].prompt_token_ids[:prefix_len]
    tails = set()
    for r in trace.requests:
        assert r.prompt_token_ids[:prefix_len] == prefix
        assert (r.prefix_group, r.shared_prefix_len) == (0, prefix_len)
        tail = r.prompt_len - prefix_len
        assert tail >= 1 and r.output_len == max(1, round(TRANSLATION_OUTPUT_RATIO * tail))
        tails.add(tuple(r.prompt_token_ids[prefix_len:]))
    assert len(tails) > 1900  # the per-request parts are (nearly all) different sentences
    meta = trace.metadata
    assert meta["prefix"]["len"] == prefix_len
    assert meta["command"] == f"pagesim trace build translation-{shots}shot --num 2000 --seed 0 --out traces/translation_{shots}shot.json"




def test_sentence_rule():
    text = "Short one. This sentence has enough words in it to count! lower case start is not kept here.\nNor this"
    assert english_sentences([text]) == ["This sentence has enough words in it to count!"]
    assert all(re.match(r"[A-Z]", s) for s in english_sentences(["A b c d e. F g h i j?"]))


@pytest.mark.skipif(not os.environ.get("PAGESIM_SLOW_TESTS"), reason="loads the tokenizer (10-20 s); set PAGESIM_SLOW_TESTS=1")
@pytest.mark.parametrize("shots", [1, 5])
def test_translation_rebuild_is_byte_identical(tmp_path, monkeypatch, shots):
    monkeypatch.chdir(tmp_path)
    name = f"translation_{shots}shot.json"
    result = CliRunner().invoke(app, ["trace", "build", f"translation-{shots}shot", "--out", f"traces/{name}"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "traces" / name).read_bytes() == (TRACES / name).read_bytes()
