"""The BLIS sim-to-real replay format (inference-sim/training `replay_data/`), recorded with the
inference-perf load generator:

    replay_data/<run>.json[.gz]               config, model_config, requests (index, arrival_time_us,
                                              input_tokens, output_tokens, has_error)
    replay_data/<run>_ground_truth.json[.gz]  per request index: has_error, e2e_s, ttft_s
    default_args/<run>/exp-config.yaml        the vLLM arguments          (optional)
    default_args/<run>/profile.yaml           the load generator's config (optional)
    default_args/<run>/results/config.yaml    its resolved config          (optional)

What the files leave out is rebuilt from the load generator's rules and said in the run's
assumptions (docs/validate.md, "Formats").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.realruns.fields import (
    RealRunError, Record, find_model_config, parse_json, plain_columns, read_json, read_text,
)
from pagesim.realruns.shared_prefix import (
    FIRST_ID, PromptBook, PromptRule, assign_prompts, repeat_rate, slot_lengths,
)
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

FORMAT = "inference-perf"
GT_SUFFIX = "_ground_truth"
STAGE_GAP_S = 1.0  # a stage starts after every request of the previous one finished (+ about 2 s)
# inference-perf e8e0aa99's shared_prefix defaults, used when results/config.yaml is missing
DEFAULT_GROUPS, DEFAULT_PER_GROUP = 10, 10
# a recorded output count within this share of max_tokens is the client's recount of the streamed
# text (noise); below it, the client lost part of the stream (the request still took the full time)
RECOUNT_TOLERANCE = 0.05
REQUEST_FIELDS = ("index", "arrival_time_us", "input_tokens", "output_tokens", "has_error")
REQUEST_KINDS = (int, float, int, int, bool)
TRUTH_FIELDS = ("index", "has_error", "e2e_s", "ttft_s")
TRUTH_KINDS = (int, bool, float, float)  # ttft_s may be missing where has_error


def looks_like(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("requests"), list) and isinstance(doc.get("config"), dict)
            and (not doc["requests"] or isinstance(doc["requests"][0], dict) and "arrival_time_us" in doc["requests"][0]))


def run_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def json_file(folder: Path, name: str) -> Path | None:
    """folder/name.json.gz or folder/name.json, whichever exists."""
    for candidate in (folder / f"{name}.json.gz", folder / f"{name}.json"):
        if candidate.is_file():
            return candidate
    return None


def _yaml(path: Path) -> dict | None:
    if not path.is_file():
        return None
    text = read_text(path)
    if text.lstrip().startswith("{"):  # the campaign's profile.yaml is JSON
        doc = parse_json(text, path)
    else:
        import yaml

        try:  # (libyaml's loader where PyYAML has it: the same documents, several times faster)
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise RealRunError(path, f"invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise RealRunError(path, f"must be a mapping, got {type(doc).__name__}")
    return doc


@dataclass
class Profile:
    """What the run's profile.yaml says, checked: the stages and the shared_prefix data."""

    stages: list[tuple[float, float]]  # (rate, duration) of each constant-rate stage; [] if not constant
    shared_prefix: bool
    system_prompt_len: int | None
    output_len: int | None
    ignore_eos: bool | None


def _profile(path: Path, doc: dict | None) -> Profile | None:
    if doc is None:
        return None
    top = Record(path, None, doc)
    load = top.obj("load", optional=True) or Record(path, None, {})
    stages = []
    if load.str("type", optional=True) == "constant":
        for k, raw in enumerate(load.list("stages", optional=True) or ()):
            stage = Record(path, f"load.stages[{k}]", raw)
            stages.append((stage.num("rate", minimum=0), stage.num("duration", minimum=0)))
    data = top.obj("data", optional=True) or Record(path, None, {})
    sp = data.obj("shared_prefix", optional=True) if data.str("type", optional=True) == "shared_prefix" else None
    server = top.obj("server", optional=True) or Record(path, None, {})
    return Profile(stages, sp is not None, sp.int("system_prompt_len", minimum=0) if sp else None,
                   sp.int("output_len", optional=True, minimum=1) if sp else None,
                   server.bool("ignore_eos", optional=True))


def read(path: Path, doc: dict | None = None) -> RealRun:
    doc = read_json(path) if doc is None else doc
    name = run_name(path)
    top = Record(path, None, doc)
    config = top.obj("config")
    records = top.list("requests")
    gt_path = json_file(path.parent, name + GT_SUFFIX)
    if gt_path is None:
        raise RealRunError(path, f"no ground truth beside it ({name}{GT_SUFFIX}.json[.gz]): the measured latencies")
    truth = _ground_truth(gt_path)
    args_dir = path.parent.parent / "default_args" / name
    exp = Record(args_dir / "exp-config.yaml", None, _yaml(args_dir / "exp-config.yaml") or {})
    profile = _profile(args_dir / "profile.yaml", _yaml(args_dir / "profile.yaml"))
    resolved_path = args_dir / "results" / "config.yaml"
    resolved = _yaml(resolved_path)
    assumptions: list[str] = []
    if profile is None:
        assumptions.append(f"no load-generator profile at {args_dir}/profile.yaml: stages split at idle gaps, "
                           "max_tokens and prompt sharing unknown")

    rows = _rows(path, records, gt_path, truth)
    rows.sort(key=lambda row: (row[1], row[0]))
    first = rows[0][1]

    ignore_eos = profile.ignore_eos if profile else None
    max_tokens = profile.output_len if profile else None
    max_model_len = exp.int("max_model_len", optional=True, minimum=1)
    stage_of, stages = _stages(rows, first, profile, assumptions)

    requests = []
    for (index, arrival, prompt_len, output_len, has_error, measured), stage in zip(rows, stage_of):
        generated = output_len
        if ignore_eos and max_tokens:  # the server stops at max_tokens only (or the model's length)
            generated = max_tokens if not max_model_len else min(max_tokens, max(1, max_model_len - prompt_len))
        requests.append(RealRequest(
            index=index, arrival_s=arrival - first, prompt_len=prompt_len, output_len=output_len,
            generated_len=max(generated, 1), ok=not has_error,
            error=f"has_error after {measured[1]:.1f} s (no reason recorded)" if has_error else "",
            ttft_s=measured[2], e2e_s=measured[1] if not has_error else None, stage=stage, max_tokens=max_tokens,
            abandoned_after_s=measured[1] if has_error else None))
    _note_output_counts(requests, ignore_eos, max_tokens, assumptions)
    _note_errors(requests, assumptions)
    if profile is not None and profile.shared_prefix:
        _rebuild_prompts(requests, stages, profile, Record(resolved_path, None, resolved or {}), doc, path,
                         assumptions)
    else:
        if any(r.prompt_len == 0 for r in requests):
            raise RealRunError(path, "requests without a recorded input length and no prompt rule to rebuild it",
                               field="input_tokens")
        assumptions.append("prompt contents not recorded: replayed without prefix sharing")

    model = top.str("model_id", optional=True) or exp.str("model", optional=True)

    def setting(name: str) -> int | None:  # exp-config.yaml (the vLLM arguments) first, then the run's config
        value = exp.int(name, optional=True, minimum=1)
        return value if value is not None else config.int(name, optional=True, minimum=1)

    server = ServerConfig(
        model=model, model_config=find_model_config(path, model), tensor_parallel_size=setting("tensor_parallelism"),
        max_num_seqs=setting("max_num_seqs"), max_num_batched_tokens=setting("max_num_batched_tokens"),
        num_gpu_blocks=config.int("kv_blocks_total_gpu", optional=True, minimum=1),
        block_size=config.int("block_size", optional=True, minimum=1), max_model_len=max_model_len)
    return RealRun(name, FORMAT, str(path), server, requests, stages, assumptions)


def _rows(path: Path, records: list, gt_path: Path, truth: dict) -> list[tuple]:
    """(index, arrival s, input tokens, output tokens, has_error, (has_error, e2e_s, ttft_s)) per
    request, joined with its ground truth by index."""
    columns = plain_columns(records, REQUEST_FIELDS, REQUEST_KINDS)
    if columns is None:  # the checks that name what is wrong
        columns = list(zip(*[_request_values(Record(path, i, raw)) for i, raw in enumerate(records)])) or [[]] * 5
    rows, seen = [], set()
    for i, (index, arrival_us, prompt_len, output_len, has_error) in enumerate(zip(*columns)):
        if index in seen:
            raise RealRunError(path, f"{index} appears twice", record=i, field="index")
        seen.add(index)
        measured = truth.get(index)
        if measured is None:
            raise RealRunError(gt_path, f"has no record for request index {index}", record=index)
        if has_error != measured[0]:
            raise RealRunError(gt_path, f"has_error is {measured[0]} but the run says {has_error}",
                               record=index, field="has_error")
        rows.append((index, arrival_us / 1e6, prompt_len, output_len, has_error, measured))
    if not rows:
        raise RealRunError(path, "has no requests", field="requests")
    if len(truth) != len(rows):
        raise RealRunError(gt_path, f"has {len(truth)} records but the run has {len(rows)} requests")
    return rows


def _request_values(rec: Record) -> tuple:
    return (rec.int("index", minimum=0), rec.num("arrival_time_us", minimum=0), rec.int("input_tokens", minimum=0),
            rec.int("output_tokens", minimum=0), rec.bool("has_error"))


def _truth_values(rec: Record) -> tuple:
    has_error = rec.bool("has_error")
    return (rec.int("index", minimum=0), has_error, rec.num("e2e_s", minimum=0),
            rec.num("ttft_s", optional=has_error, minimum=0))


def _ground_truth(path: Path) -> dict:
    doc = read_json(path)
    if not isinstance(doc, list):
        raise RealRunError(path, f"must be a JSON list of per-request records, got {type(doc).__name__}")
    columns = plain_columns(doc, TRUTH_FIELDS, TRUTH_KINDS, optional=("ttft_s",))
    if columns is not None and any(t is None and not e for e, t in zip(columns[1], columns[3])):
        columns = None  # a successful request without a ttft_s: let the checks name it
    if columns is None:
        columns = list(zip(*[_truth_values(Record(path, i, raw)) for i, raw in enumerate(doc)])) or [[]] * 4
    out: dict = {}
    for i, (index, has_error, e2e, ttft) in enumerate(zip(*columns)):
        if index in out:
            raise RealRunError(path, f"{index} appears twice", record=i, field="index")
        out[index] = (has_error, e2e, ttft)
    return out


def _stages(rows: list, first: float, profile: Profile | None, assumptions: list[str]) -> tuple[list[int], list[Stage]]:
    """Each request's stage, and the stages: the profile's (n = rate x duration requests each,
    in arrival order) when its counts add up, else split where the load stopped."""
    spec = profile.stages if profile else []
    counts = [round(rate * duration) for rate, duration in spec]
    if counts and sum(counts) == len(rows):
        stage_of = [k for k, c in enumerate(counts) for _ in range(c)]
    else:
        stage_of, k, busy_until = [], 0, None
        for _, arrival, _, _, _, measured in rows:
            if busy_until is not None and arrival > busy_until + STAGE_GAP_S:
                k += 1
            stage_of.append(k)
            busy_until = max(busy_until or arrival, arrival + measured[1])  # (e2e, or when a failed one gave up)
        if spec:
            assumptions.append(f"the profile's stages give {sum(counts)} requests, the run has {len(rows)}: "
                               f"stages split where every request had finished ({k + 1} found)")
        spec = spec if len(spec) == k + 1 else []
    stages = []
    for k in range(max(stage_of) + 1):
        times = [row[1] - first for row, s in zip(rows, stage_of) if s == k]
        rate, duration = spec[k] if k < len(spec) else (None, None)
        start = times[0]
        span = times[-1] - start
        rate = rate or (len(times) / span if span > 0 else None)
        stages.append(Stage(k, start, start + duration if duration else times[-1], len(times), rate=rate))
    return stage_of, stages


def _note_output_counts(requests: list[RealRequest], ignore_eos, max_tokens, assumptions: list[str]) -> None:
    ok = [r for r in requests if r.ok]
    if not (ignore_eos and max_tokens):
        assumptions.append("max_tokens / ignore_eos not recorded: each request generates its recorded output count")
        return
    low = (1 - RECOUNT_TOLERANCE) * max_tokens
    under = [r for r in ok if r.output_len < low]
    below_100 = sum(r.output_len < 100 for r in ok)
    recount = sum(r.output_len >= low and r.output_len != max_tokens for r in ok)
    share = 100 / max(len(ok), 1)
    assumptions.append(
        f"every request generates max_tokens={max_tokens} (the profile sent ignore_eos, so the server stops at "
        f"max_tokens only; capped at max_model_len), and ITL = (E2E - TTFT) / ({max_tokens} - 1). Recorded counts "
        f"disagree: {len(under)} of {len(ok)} successful requests ({len(under) * share:.1f} %) report fewer than "
        f"{1 - RECOUNT_TOLERANCE:.0%} of it ({below_100}, {below_100 * share:.1f} %, fewer than 100): the client "
        f"under-counted, they take as long as the others; {recount} report within {RECOUNT_TOLERANCE:.0%} of it "
        "(the client's recount of the streamed text)")


def _note_errors(requests: list[RealRequest], assumptions: list[str]) -> None:
    failed = [r for r in requests if not r.ok]
    if not failed:
        return
    times = sorted(r.abandoned_after_s for r in failed)
    assumptions.append(
        f"{len(failed)} requests have has_error (no reason recorded; the client gave up after {times[0]:.0f}-"
        f"{times[-1]:.0f} s, likely its timeout): kept in the replay, generating max_tokens as if never cancelled "
        "(the server loaded them; abandoned_after_s says when the client left), left out of the measured metrics")


def _rebuild_prompts(requests: list[RealRequest], stages: list[Stage], profile: Profile, resolved: Record, doc: dict,
                     path: Path, assumptions: list[str]) -> None:
    data = resolved.obj("data", optional=True)
    resolved_sp = (data.obj("shared_prefix", optional=True) if data else None) or Record(resolved.path, None, {})
    groups = resolved_sp.int("num_groups", optional=True, minimum=1)
    per_group = resolved_sp.int("num_prompts_per_group", optional=True, minimum=1)
    if not (groups and per_group):
        groups, per_group = DEFAULT_GROUPS, DEFAULT_PER_GROUP
        assumptions.append(f"no resolved load-generator config (results/config.yaml): {groups} groups of {per_group} "
                           "prompts assumed (inference-perf's shared_prefix defaults)")
    system_len = profile.system_prompt_len or 0
    model_config = Record(path, None, doc).obj("model_config", optional=True)
    vocab = (model_config.int("vocab_size", optional=True, minimum=FIRST_ID + 1) if model_config else None) or 32000
    rule = PromptRule(groups, per_group, system_len, vocab)
    n = rule.num_prompts
    by_stage = [[r for r in requests if r.stage == s.index] for s in stages]
    lengths = [[r.prompt_len for r in rs] for rs in by_stage]
    oks = [[r.ok for r in rs] for rs in by_stage]
    slots = [slot_lengths(ls, ok, n) for ls, ok in zip(lengths, oks)]
    common = set.intersection(*(set(s) for s in slots)) if slots else set()
    agree = sum(all(s[k] == slots[0][k] for s in slots) for k in common)
    same = len(slots) > 1 and agree == len(common)
    merged: dict[int, int] = {}
    if same:  # one list of prompts for the run: merge the stages' evidence
        merged = slot_lengths([x for ls in lengths for x in _padded(ls, n)], [x for ok in oks for x in _padded(ok, n, False)], n)
    neighbour = own = unrecorded = 0
    # one PromptBook per list of prompts: equal prompts are one shared list of ids
    books: dict[int, PromptBook] = {}
    for k, rs in enumerate(by_stage):
        key = 0 if same else k
        book = books.setdefault(key, PromptBook(rule, f"{path.name}:{key}"))
        got = assign_prompts(book, lengths[k], oks[k], merged if same else slots[k], k)
        neighbour, own, unrecorded = neighbour + got.num_neighbour, own + got.num_own, unrecorded + got.num_unrecorded
        for r, ids, group, length in zip(rs, got.token_ids, got.groups, got.lengths):
            r.prompt_len, r.prompt_token_ids, r.prefix_group = length, ids, group
            r.shared_prefix_len = min(system_len, length - 1)
    equal = pairs = 0
    for ls, ok in zip(lengths, oks):
        e, p = repeat_rate(ls, ok, n)
        equal, pairs = equal + e, pairs + p
    assumptions.append(
        f"prompts not recorded: rebuilt from the load generator's rule ({groups} groups of {per_group}: a group's "
        f"{system_len}-token system prompt then the prompt's own tokens; request j of a stage sends prompt j % {n}); "
        f"checked: {equal} of {pairs} successful requests ({100 * equal / max(pairs, 1):.1f} %) have the input length "
        f"of request j - {n} of their stage")
    if len(slots) > 1:
        assumptions.append(f"the {n} prompts are {'the same in every stage' if same else 'different per stage'} "
                           f"(slot lengths agree in {agree} of {len(common)} slots)")
    assumptions.append(f"which prompts share a system prompt was not recorded (the list was shuffled, unseeded): "
                       f"prompt slot s is put in group s // {per_group}; shared prefix = the profile's "
                       f"system_prompt_len ({system_len} tokens)")
    if neighbour:
        assumptions.append(f"{neighbour} requests have the length of a neighbouring prompt slot (sent out of order by "
                           "the client's workers): given that slot's prompt")
    if own:
        assumptions.append(f"{own} requests match no prompt of the rule: given a prompt of their own")
    if unrecorded:
        assumptions.append(f"{unrecorded} failed requests recorded no input length: given their slot's prompt")


def _padded(values: list, n: int, fill: Any = 0) -> list:
    """values padded to a multiple of n, so stages concatenate with their slots aligned."""
    return values + [fill] * (-len(values) % n)
