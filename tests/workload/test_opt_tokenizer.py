"""The OPT tokenizer the builders build directly (pagesim.workload.builders.common.opt_backend)
against the reference: what transformers' AutoTokenizer loads from the same files."""

import json

import pytest

from pagesim.workload.builders import default_data_dir
from pagesim.workload.builders.common import load_opt_tokenizer, opt_backend

DATA = default_data_dir()
OPT_DIR = DATA / "tokenizers" / "opt"
pytestmark = pytest.mark.skipif(not OPT_DIR.exists(), reason=f"OPT tokenizer not at {OPT_DIR}")

# Texts that reach every rule: leading/trailing spaces, newlines, the special tokens written in the
# text (matched whole), unicode, digits, code, and an empty string.
TEXTS = ["hello world", " The cat", "User:", "Assistant:", "\n", " \n\n  x  ", "</s> and <pad> inside</s>",
         "<s>not special</s>", " naïve café 東京 🙂", "x = f(1234567) + 0.5e-3", "", "  ", "a" * 300,
         " def f():\n\treturn {'k': [1, 2]}\n", "It's we'll they're I'M"]


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(OPT_DIR))


def test_backend_is_transformers_tokenizer_part_by_part(reference):
    ours = json.loads(opt_backend(OPT_DIR).to_str())
    theirs = json.loads(reference._tokenizer.to_str())
    # the post-processor adds the BOS only with add_special_tokens=True, which no builder asks for
    for part in ("model", "added_tokens", "normalizer", "pre_tokenizer", "decoder"):
        assert ours[part] == theirs[part], part


def test_ids_equal_the_reference(reference):
    tok = load_opt_tokenizer(DATA)
    expected = reference(TEXTS, add_special_tokens=False)["input_ids"]
    assert tok.encode_many(TEXTS) == expected
    assert tok.encode_many(["</s>"]) == [[2]] and tok.encode_many(["<pad>"]) == [[1]]  # whole special tokens
    assert tok.info["vocab_size"] == len(reference) == 50262
