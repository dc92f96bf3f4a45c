"""Beam ancestry for the simulator: which parent each surviving beam descends from, step by step.

In the executor the ancestry comes from real log-probabilities; the simulator has none, so it
draws the ancestry from a model measured on the executor's own beam-search runs (SmolLM2-135M
on real text, pagesim/sim/data/beam_ancestry_smollm2.json, written by the executor's
measurement script). The core does every fork, free and copy-on-write from the samples built
here, exactly as it does for the executor's.

Measurement format ("pagesim-beam-ancestry/1"): per run (one prompt, one beam width k),
steps[t][i] = the rank (0 = best cumulative log-prob) among the k beams alive before step t of
the parent of the beam ranked i after step t. The first output token (one prompt forking into
k beams) is not listed.

The model (BeamAncestryModel): for each measured width, the empirical distribution of the whole
parent-rank vector, pooled over all steps of all runs of that width, drawn i.i.d. per step from
a seeded generator. Ranks carry the state between steps (the best beam after step t is the best
before step t+1), so the drawn vectors still build a genealogy: a beam that keeps being chosen
keeps its blocks shared. What i.i.d. leaves out is any dependence on the step position or on
earlier vectors; `validate` measures what that costs, on runs held out of the fit, by the
memory saving each ancestry gives when replayed through the real core. A width that was not
measured is an error (no extrapolation): measure it.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pagesim.core.request import Sequence, SequenceGroup
from pagesim.core.step import Sample

FORMAT = "pagesim-beam-ancestry/1"
DEFAULT_PATH = Path(__file__).parent / "data" / "beam_ancestry_smollm2.json"


class AncestryError(ValueError):
    """A measurement file breaks the format; the message names file, run, step and field."""


@dataclass
class AncestryRun:
    beam_width: int
    prompt_len: int
    steps: list[tuple[int, ...]]  # parent ranks per step (after the first token)

    @property
    def output_len(self) -> int:
        return len(self.steps) + 1


@dataclass
class AncestryData:
    path: str
    metadata: dict
    runs: list[AncestryRun] = field(default_factory=list)

    @property
    def widths(self) -> list[int]:
        return sorted({r.beam_width for r in self.runs})


def load_ancestry(path: str | Path = DEFAULT_PATH) -> AncestryData:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no beam-ancestry measurements; the simulator's beam search is fitted from "
                                f"them (the executor's beam-search measurement writes this file, see docs/sharing.md)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise AncestryError(f"{path}: not JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise AncestryError(f"{path}: field 'format' must be {FORMAT!r}")
    if not isinstance(raw.get("runs"), list) or not raw["runs"]:
        raise AncestryError(f"{path}: field 'runs' must be a non-empty list")
    runs = []
    for r, run in enumerate(raw["runs"]):
        where = f"{path}: run {r}"
        if not isinstance(run, dict):
            raise AncestryError(f"{where}: not an object")
        for name in ("beam_width", "prompt_len"):
            if not isinstance(run.get(name), int) or isinstance(run.get(name), bool) or run[name] < 1:
                raise AncestryError(f"{where}: field '{name}' must be a positive integer")
        k = run["beam_width"]
        if k < 2:
            raise AncestryError(f"{where}: field 'beam_width' must be >= 2, got {k}")
        steps = run.get("steps")
        if not isinstance(steps, list):
            raise AncestryError(f"{where}: field 'steps' must be a list")
        parsed = []
        for t, vector in enumerate(steps):
            if (not isinstance(vector, list) or len(vector) != k
                    or not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < k for p in vector)):
                raise AncestryError(f"{where}: field 'steps' step {t}: must be {k} parent ranks in [0, {k}), got {vector!r}")
            parsed.append(tuple(vector))
        runs.append(AncestryRun(k, run["prompt_len"], parsed))
    metadata = {key: value for key, value in raw.items() if key != "runs"}
    return AncestryData(str(path), metadata, runs)


class BeamAncestryModel:
    """Empirical parent-rank vectors per beam width, drawn i.i.d. per step."""

    def __init__(self, vectors: dict[int, list[tuple[int, ...]]], source: str = ""):
        self.vectors = {k: list(v) for k, v in vectors.items() if v}
        self.source = source

    @classmethod
    def fit(cls, runs: list[AncestryRun], source: str = "") -> "BeamAncestryModel":
        vectors: dict[int, list[tuple[int, ...]]] = {}
        for run in runs:
            vectors.setdefault(run.beam_width, []).extend(run.steps)
        return cls(vectors, source)

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PATH) -> "BeamAncestryModel":
        data = load_ancestry(path)
        # the built-in file is named the same wherever the package is installed
        source = "pagesim/sim/data/" + DEFAULT_PATH.name if Path(path).resolve() == DEFAULT_PATH.resolve() else data.path
        return cls.fit(data.runs, source)

    @property
    def widths(self) -> list[int]:
        return sorted(self.vectors)

    def check_width(self, width: int) -> None:
        if width not in self.vectors:
            raise ValueError(f"beam width {width} was not measured in {self.source or 'the ancestry data'} "
                             f"(measured widths: {', '.join(map(str, self.widths)) or 'none'}); measure it with the executor")

    def draw(self, width: int, rng: random.Random) -> tuple[int, ...]:
        vectors = self.vectors.get(width)
        if vectors is None:
            self.check_width(width)
        return vectors[rng.randrange(len(vectors))]


# -- from a drawn vector to the core's samples ------------------------------------------------
def first_samples(seq: Sequence, width: int, token_id: int) -> list[Sample]:
    """The prompt's single sequence forks into width beams, ranked in the order given."""
    return [Sample(seq.seq_id, token_id, -1.0 - i) for i in range(width)]


def step_samples(seqs: list[Sequence], parent_ranks: tuple[int, ...], token_id: int) -> list[Sample]:
    """Samples that make the beam ranked i after the step a child of the beam ranked
    parent_ranks[i] before it. Ranks come from cumulative log-probs (ties: order in seqs); the
    log-probs given make the new cumulative values fall in exactly the drawn order, each below
    every value before the step (a log-prob is never positive)."""
    ranked = sorted(seqs, key=lambda s: -s.cumulative_logprob)  # stable: ties keep seqs order
    floor = ranked[-1].cumulative_logprob
    samples = []
    for i, p in enumerate(parent_ranks):
        parent = ranked[p]
        samples.append(Sample(parent.seq_id, token_id, (floor - 1.0 - i) - parent.cumulative_logprob))
    return samples


def group_samples(group: SequenceGroup, due: list[Sequence], model: BeamAncestryModel, rng: random.Random,
                  token_id: int) -> list[Sample]:
    """A beam group's samples for one step. due: its sequences that reach their end this step."""
    width = group.sampling.beam_width
    if len(group.seqs) == 1 and due and due[0].num_output_tokens == 0:
        return first_samples(due[0], width, token_id)
    if len(due) != len(group.seqs) or len(due) != width:
        # (only a chunked re-prefill after a recompute lets some beams lag: each due beam keeps
        # its own line this step, so the group still holds width beams)
        return [Sample(seq.seq_id, token_id, -1.0) for seq in due]
    return step_samples(due, model.draw(width, rng), token_id)


# -- validation --------------------------------------------------------------------------------
def replay_ancestry(run: AncestryRun, steps: list[tuple[int, ...]], block_size: int = 16) -> dict:
    """Run one beam request through the real core (a scheduler over a paged pool large enough
    that nothing is preempted) with the given ancestry; returns the memory saving it shows:
    saving (mean over steps of 1 - used / logical blocks) and the number of distinct
    parents per step."""
    from pagesim.core import PoolConfig, Request, SamplingParams, SchedulerConfig, StepResult, make_scheduler

    k = run.beam_width
    total = run.prompt_len + len(steps) + 1
    blocks = k * (-(-total // block_size)) + 8
    scheduler = make_scheduler("paged", PoolConfig(blocks, 0, block_size),
                               SchedulerConfig(max_num_seqs=k, max_num_batched_tokens=max(total, 2048), max_model_len=total))
    group = scheduler.add_request(Request(0, run.prompt_len, SamplingParams(beam_width=k, max_tokens=len(steps) + 1, ignore_eos=True)))
    if group.reject_reason:
        raise ValueError(group.reject_reason)
    kv = scheduler.kv
    savings = []
    t = 0
    while scheduler.has_unfinished:
        out = scheduler.schedule(float(t))
        if len(group.seqs) == 1:
            samples = first_samples(group.seqs[0], k, 0)
        else:
            samples = step_samples(group.seqs, steps[t], 0)
            t += 1
        scheduler.update(out, StepResult(samples={0: samples}), float(t))
        if kv.num_logical_blocks:  # measured after the step, as the drivers' metrics are
            savings.append(1 - kv.num_used_blocks / kv.num_logical_blocks)
    return {"saving": sum(savings) / len(savings) if savings else 0.0,
            "distinct_parents": [len(set(v)) for v in steps]}


def validate(data: AncestryData, block_size: int = 16, seed: int = 0, draws: int = 5) -> dict:
    """Fit on the even-numbered runs of each width, test on the odd-numbered ones: for every
    held-out run, its measured ancestry against `draws` ancestries drawn from the model for the
    same prompt and output length, both replayed through the core. Returns per width the mean
    memory saving (measured vs model) and the mean number of distinct parents per step."""
    by_width: dict[int, list[AncestryRun]] = {}
    for run in data.runs:
        by_width.setdefault(run.beam_width, []).append(run)
    rng = random.Random(seed)
    result = {}
    for k, runs in sorted(by_width.items()):
        train, test = runs[0::2], runs[1::2]
        if not test or not any(r.steps for r in train):
            result[k] = {"runs": len(runs), "note": "too few runs to hold any out"}
            continue
        model = BeamAncestryModel.fit(train)
        measured, modelled, parents_measured, parents_model = [], [], Counter(), Counter()
        for run in test:
            if not run.steps:
                continue
            m = replay_ancestry(run, run.steps, block_size)
            measured.append(m["saving"])
            parents_measured.update(m["distinct_parents"])
            for _ in range(draws):
                drawn = [model.draw(k, rng) for _ in run.steps]
                d = replay_ancestry(run, drawn, block_size)
                modelled.append(d["saving"])
                parents_model.update(d["distinct_parents"])
        result[k] = {
            "train_runs": len(train), "test_runs": len(measured),
            "saving_measured": sum(measured) / len(measured),
            "saving_model": sum(modelled) / len(modelled),
            "distinct_parents_measured": _mean_of(parents_measured),
            "distinct_parents_model": _mean_of(parents_model),
        }
    return result


def _mean_of(counts: Counter) -> float:
    total = sum(counts.values())
    return sum(v * c for v, c in counts.items()) / total if total else 0.0
