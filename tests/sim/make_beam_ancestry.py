"""Write tests/sim/data/beam_ancestry_synthetic.json: a SYNTHETIC beam-ancestry file in the
format the executor's SmolLM2 measurement writes (pagesim-beam-ancestry/1), for the simulator's
tests only. The ancestry comes from a plain beam search (written here, independent of
pagesim) over random next-token log-probabilities, so it has the structure of real beam
search (parents ranked by cumulative log-prob, the best k of k x vocab candidates kept) but no
language in it. Never use it for numbers in a report.

    .venv/bin/python tests/sim/make_beam_ancestry.py
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

OUT = Path(__file__).parent / "data" / "beam_ancestry_synthetic.json"
COMMAND = ".venv/bin/python tests/sim/make_beam_ancestry.py"


def log_softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    z = m + math.log(sum(math.exp(x - m) for x in xs))
    return [x - z for x in xs]


def beam_search_ancestry(rng: random.Random, k: int, steps: int, vocab: int = 40, peak: float = 3.0) -> list[list[int]]:
    """Parent ranks per step after the first token. Next-token scores are Gaussian with a few
    tokens lifted by `peak`, so some beams are much likelier than others, as with a real model."""

    def next_logprobs() -> list[float]:
        scores = [rng.gauss(0.0, 1.0) for _ in range(vocab)]
        for t in rng.sample(range(vocab), 3):
            scores[t] += peak
        return log_softmax(scores)

    first = sorted(next_logprobs(), reverse=True)[:k]  # the prompt forks into the best k tokens
    beams = first  # cumulative log-probs, best first
    out = []
    for _ in range(steps):
        candidates = []
        for rank, cum in enumerate(beams):
            for lp in next_logprobs():
                candidates.append((cum + lp, rank))
        candidates.sort(key=lambda c: -c[0])
        kept = candidates[:k]
        out.append([rank for _, rank in kept])
        beams = [score for score, _ in kept]
    return out


def main() -> None:
    rng = random.Random(1234)
    runs = []
    for k in (2, 4, 6):
        for _ in range(6):
            runs.append({"beam_width": k, "prompt_len": rng.randint(8, 60), "steps": beam_search_ancestry(rng, k, 31)})
    data = {"format": "pagesim-beam-ancestry/1", "model": "synthetic (random log-probs)", "source": "tests only",
            "command": COMMAND, "max_tokens": 32, "runs": runs}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
