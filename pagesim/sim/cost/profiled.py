"""The `profiled` cost model: step times fitted to the executor's own measurements.

`executor/profiler.py` (`pagesim profile`) runs the real engine over a grid of iteration shapes
and writes a JSON profile: each measured step as the BatchShape the simulator would build for it
(pagesim.sim.engine.batch_shape) and its median duration, plus timed swap and copy-on-write
block moves. This module reads that file with the standard library (no torch) and fits, with
pagesim.sim.cost.lsq (numpy),

    step = c_step + c_ptok * prefill tokens + c_pair * prefill attention pairs
           + c_pseq * prefill seqs + c_dseq * decode seqs + c_ctx * decode context tokens
           + sum over k in (2, 4, 8, 16) of c_k * min(tokens, k)      (tokens = prefill + decode)
    swap = (s_call + s_block * blocks)  if blocks else 0     (one term per step)
    copy = (k_call + k_block * blocks)  if blocks else 0

The min(tokens, k) terms make the cost of a step's token count a concave piecewise-linear
function (knots at 2, 4, 8, 16 tokens): on a CPU the linear layers of a step with a handful of
rows cost nearly as much as one row (weight reads dominate), and the cost per row falls as rows
are added; measured on SmolLM2-135M, decode steps of 1, 4 and 32 sequences took 0.18, 0.34 and
0.59 s, which no single slope fits (held-out error 15 % without these terms, 6 % with them).

The coefficients are fitted by non-negative least squares on relative error (a step of 5 ms matters as much, relatively, as
one of 500 ms; negative coefficients would let a step get faster as it grows). A fitted model is
used rather than interpolation in a table: the simulator asks for shapes far outside any grid
(hundreds of combinations of prefill and decode counts), and a linear model in these features
extrapolates the way the hardware does (matmul and attention work grow linearly in them).

The grid is split deterministically: every `HOLDOUT_EVERY`-th step shape is held out, the
coefficients are fitted on the rest, and the relative error on the held-out shapes is stated in
`describe()` (and printed by `pagesim profile`). The model the simulator uses is that fit, so the
stated held-out error is the error of the model in use.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, fields
from pathlib import Path

from pagesim.inputs import STEP_SECONDS, InputValueError, read_json
from pagesim.sim.cost.base import BatchShape, CostModel
from pagesim.sim.run_times import linear_context_durations
from pagesim.sim.cost.lsq import fit_relative

PROFILE_FORMAT = "pagesim-profile/1"
TOKEN_KNOTS = (2, 4, 8, 16)
STEP_FEATURES = ("const", "num_prefill_tokens", "prefill_attn_pairs", "num_prefill_seqs", "num_decode_seqs",
                 "decode_context_tokens") + tuple(f"min_tokens_{k}" for k in TOKEN_KNOTS)
MIN_STEPS = len(STEP_FEATURES) + 4  # so that the training part (3 in 4) has more rows than features
HOLDOUT_EVERY = 4  # every 4th step shape (in file order) is held out of the fit
SHAPE_FIELDS = {f.name for f in fields(BatchShape)}


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file, record and field."""


# ----------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class Measurement:
    shape: BatchShape
    seconds: float


@dataclass
class Profile:
    path: str
    meta: dict  # model, hardware, clock, command, ... as written by the profiler
    steps: list[Measurement]
    swaps: list[Measurement]
    copies: list[Measurement]

    @property
    def block_size(self) -> int:
        return int(self.meta["block_size"])


def _seconds(value, where: str) -> float:
    """A measured duration: STEP_SECONDS (a step of 0 s never advances the simulated clock; one
    of 1e308 s overflows it)."""
    problem = STEP_SECONDS.problem(value)
    if problem:
        raise ProfileError(f"{where} {problem}")
    return float(value)


def _measurement(path: str, section: str, i: int, rec, block_size: int) -> Measurement:
    where = f"{path}: {section}[{i}]"
    if not isinstance(rec, dict):
        raise ProfileError(f"{where}: expected an object, got {type(rec).__name__}")
    for key in ("shape", "seconds"):
        if key not in rec:
            raise ProfileError(f"{where}: missing field {key!r}")
    shape = rec["shape"]
    if not isinstance(shape, dict):
        raise ProfileError(f"{where}.shape: expected an object")
    unknown = set(shape) - SHAPE_FIELDS
    if unknown:
        raise ProfileError(f"{where}.shape: unknown field(s) {sorted(unknown)}; known: {sorted(SHAPE_FIELDS)}")
    for key, value in shape.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProfileError(f"{where}.shape.{key}: expected a non-negative integer, got {value!r}")
    if shape.get("block_size", block_size) != block_size:
        raise ProfileError(f"{where}.shape.block_size: {shape['block_size']} differs from the profile's {block_size}")
    return Measurement(BatchShape(**{**shape, "block_size": block_size}),
                       _seconds(rec["seconds"], f"{where}.seconds"))


def load_profile(path: str | Path) -> Profile:
    path = str(path)
    if not Path(path).exists():
        raise ProfileError(f"{path}: no such profile file (make one with `pagesim profile`)")
    try:
        data = read_json(path, "profile file")
    except InputValueError as e:
        raise ProfileError(str(e)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a JSON object at the top level")
    if data.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"{path}: field 'format' is {data.get('format')!r}, expected {PROFILE_FORMAT!r}")
    bs = data.get("block_size")
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise ProfileError(f"{path}: field 'block_size' must be a positive integer, got {bs!r}")
    lists = {}
    for section in ("steps", "swaps", "copies"):
        recs = data.get(section, [])
        if not isinstance(recs, list):
            raise ProfileError(f"{path}: field {section!r} must be a list")
        lists[section] = [_measurement(path, section, i, r, bs) for i, r in enumerate(recs)]
    if len(lists["steps"]) < MIN_STEPS:
        raise ProfileError(f"{path}: 'steps' holds {len(lists['steps'])} measurements; the fit needs at least {MIN_STEPS}")
    meta = {k: v for k, v in data.items() if k not in lists}
    return Profile(path, meta, lists["steps"], lists["swaps"], lists["copies"])


# ----------------------------------------------------------------------------- fitting

def step_features(s: BatchShape) -> list[float]:
    tokens = s.num_prefill_tokens + s.num_decode_seqs
    return [1.0, s.num_prefill_tokens, s.prefill_attn_pairs, s.num_prefill_seqs, s.num_decode_seqs,
            s.decode_context_tokens] + [min(tokens, k) for k in TOKEN_KNOTS]


def _block_move_fit(moves: list[Measurement], field: str) -> tuple[float, float]:
    """(seconds per call, seconds per block) from timed swaps or copies; zeros when none."""
    if not moves:
        return 0.0, 0.0
    rows = [[1.0, getattr(m.shape, field)] for m in moves]
    if len({r[1] for r in rows}) < 2:  # one size measured: all of it per block
        per_block = sum(m.seconds for m in moves) / sum(r[1] for r in rows)
        return 0.0, per_block
    c = fit_relative(rows, [m.seconds for m in moves])
    return float(c[0]), float(c[1])


def _rel_errors(predict, ms: list[Measurement]) -> list[float]:
    return [predict(m.shape) / m.seconds - 1.0 for m in ms if m.seconds > 0]


def _by_kind(predict, ms: list[Measurement]) -> dict[str, list[float]]:
    errors: dict[str, list[float]] = {}
    for m in ms:
        if m.seconds > 0:
            errors.setdefault(m.shape.kind, []).append(predict(m.shape) / m.seconds - 1.0)
    return errors


def _fold(steps: list[Measurement], held: int) -> tuple[list[Measurement], list[Measurement]]:
    """(training, held-out) for fold `held` of HOLDOUT_EVERY: every HOLDOUT_EVERY-th shape from `held`."""
    return ([m for i, m in enumerate(steps) if i % HOLDOUT_EVERY != held],
            [m for i, m in enumerate(steps) if i % HOLDOUT_EVERY == held])


def _fit_steps(train: list[Measurement]):
    return fit_relative([step_features(m.shape) for m in train], [m.seconds for m in train])


def _error_stats(errors: list[float]) -> dict:
    if not errors:
        return {"count": 0, "mean_abs": None, "median_abs": None, "p90_abs": None, "max_abs": None}
    a = sorted(abs(e) for e in errors)
    return {"count": len(a), "mean_abs": sum(a) / len(a), "median_abs": statistics.median(a),
            "p90_abs": a[math.ceil(0.9 * len(a)) - 1], "max_abs": a[-1]}  # p90: nearest rank


# ----------------------------------------------------------------------------- the model

class ProfiledCostModel(CostModel):
    """Step time = fitted linear model of the BatchShape (see the module docstring)."""

    name = "profiled"

    def __init__(self, step_coef, swap_coef=(0.0, 0.0), copy_coef=(0.0, 0.0), block_size: int = 16,
                 info: dict | None = None) -> None:
        if len(step_coef) != len(STEP_FEATURES):
            raise ValueError(f"step_coef needs {len(STEP_FEATURES)} values ({', '.join(STEP_FEATURES)})")
        if any(c < 0 for c in (*step_coef, *swap_coef, *copy_coef)):
            raise ValueError("coefficients must be non-negative")
        (self._c0, self._c_ptok, self._c_pair, self._c_pseq, self._c_dseq, self._c_ctx, self._c_k2, self._c_k4,
         self._c_k8, self._c_k16) = map(float, step_coef)
        self._swap_call, self._swap_block = map(float, swap_coef)
        self._copy_call, self._copy_block = map(float, copy_coef)
        self.block_size = block_size
        self.info = dict(info or {})

    @classmethod
    def from_profile(cls, profile: Profile | str | Path) -> "ProfiledCostModel":
        p = profile if isinstance(profile, Profile) else load_profile(profile)
        train, held_out = _fold(p.steps, HOLDOUT_EVERY - 1)
        moves = _block_move_fit(p.swaps, "num_swap_blocks"), _block_move_fit(p.copies, "num_copy_blocks")
        model = cls(_fit_steps(train), *moves, p.block_size)
        # cross-validated: every shape predicted by the fit that left its fold out (the last
        # fold's fit is the model in use), so each kind has a held-out error for all its shapes
        cross: dict[str, list[float]] = {}
        for held in range(HOLDOUT_EVERY):
            fold_train, fold_held = _fold(p.steps, held)
            fold_model = model if held == HOLDOUT_EVERY - 1 else cls(_fit_steps(fold_train), *moves, p.block_size)
            for kind, errs in _by_kind(fold_model.iteration_time, fold_held).items():
                cross.setdefault(kind, []).extend(errs)
        # block moves were timed alone: compared with the move term alone
        move_errors = {"swap": _rel_errors(model.block_move_time, p.swaps),
                       "copy": _rel_errors(model.block_move_time, p.copies)}
        train_kinds, held_kinds = _by_kind(model.iteration_time, train), _by_kind(model.iteration_time, held_out)
        by_kind = {}
        for kind in ("prefill", "decode", "mixed", "swap", "copy"):
            if kind in move_errors:
                stats = _error_stats(move_errors[kind])
                by_kind[kind] = {"train": stats, "held_out": stats, "cross_validated": stats,
                                 "note": "the block-move term against block moves timed alone"}
            else:
                by_kind[kind] = {"train": _error_stats(train_kinds.get(kind, [])),
                                 "held_out": _error_stats(held_kinds.get(kind, [])),
                                 "cross_validated": _error_stats(cross.get(kind, []))}
        model.info = {
            "profile": p.path,
            "model": p.meta.get("model", {}),
            "hardware": p.meta.get("hardware", {}),
            "clock": p.meta.get("clock"),
            "block_size": p.block_size,
            "fit": "non-negative least squares on relative error; every "
                   f"{HOLDOUT_EVERY}th step shape held out",
            "train_error": _error_stats(_rel_errors(model.iteration_time, train)),
            "held_out_error": _error_stats(_rel_errors(model.iteration_time, held_out)),
            "swap_error": _error_stats(move_errors["swap"]),
            "copy_error": _error_stats(move_errors["copy"]),
            "error_by_kind": by_kind,
        }
        return model

    @property
    def coefficients(self) -> dict[str, float]:
        return {
            **dict(zip(STEP_FEATURES, (self._c0, self._c_ptok, self._c_pair, self._c_pseq, self._c_dseq, self._c_ctx,
                                       self._c_k2, self._c_k4, self._c_k8, self._c_k16))),
            "swap_call": self._swap_call, "swap_block": self._swap_block,
            "copy_call": self._copy_call, "copy_block": self._copy_block,
        }

    def iteration_time(self, shape: BatchShape) -> float:
        if shape.block_size != self.block_size:
            raise ValueError(f"profiled cost model: the profile was measured at block size {self.block_size}, "
                             f"the simulation asks for {shape.block_size}")
        n = shape.num_prefill_tokens + shape.num_decode_seqs
        t = (self._c0 + self._c_ptok * shape.num_prefill_tokens + self._c_pair * shape.prefill_attn_pairs
             + self._c_pseq * shape.num_prefill_seqs + self._c_dseq * shape.num_decode_seqs
             + self._c_k2 * (n if n < 2 else 2) + self._c_k4 * (n if n < 4 else 4)
             + self._c_k8 * (n if n < 8 else 8) + self._c_k16 * (n if n < 16 else 16))
        if shape.num_swap_blocks:
            t += self._swap_call + self._swap_block * shape.num_swap_blocks
        if shape.num_copy_blocks:
            t += self._copy_call + self._copy_block * shape.num_copy_blocks
        # the context read last: decode_run_times adds only this term to a fixed base
        return t + self._c_ctx * shape.decode_context_tokens

    def block_move_time(self, shape: BatchShape) -> float:
        """The swap and copy-on-write part of iteration_time."""
        t = 0.0
        if shape.num_swap_blocks:
            t += self._swap_call + self._swap_block * shape.num_swap_blocks
        if shape.num_copy_blocks:
            t += self._copy_call + self._copy_block * shape.num_copy_blocks
        return t

    def decode_run_durations(self, num_seqs: int, context_tokens: int, num_steps: int, block_size: int = 16) -> list[float]:
        # the base is iteration_time's sum before its last term, so every float equals it
        base = self.plain_decode_base(num_seqs, block_size)
        return linear_context_durations(base, self._c_ctx, num_seqs, context_tokens, num_steps)

    def describe(self) -> dict:
        return {"name": self.name, **self.info, "coefficients": self.coefficients}


# what a profile's "model" must agree on with the simulated model (they size every step's work)
MODEL_SHAPE_FIELDS = ("num_layers", "num_kv_heads", "head_dim")


def profile_mismatch(profile: Profile, model=None, gpu=None) -> str | None:
    """Why `profile` does not price `model` (a ModelSpec) on `gpu` (a GPUSpec), or None. The model
    must have the profiled one's shape; a GPU profile must come from the same GPU family (a CPU
    profile is its own hardware: the GPU then names nothing)."""
    measured = profile.meta.get("model") if isinstance(profile.meta.get("model"), dict) else {}
    if model is not None:
        differ = [f for f in MODEL_SHAPE_FIELDS if f in measured and measured[f] != getattr(model, f)]
        if differ:
            theirs = ", ".join(f"{f} {measured[f]}" for f in differ)
            ours = ", ".join(f"{f} {getattr(model, f)}" for f in differ)
            return (f"{profile.path}: measured on {measured.get('spec') or measured.get('name') or 'another model'} "
                    f"({theirs}), not on {model.name} ({ours})")
    hardware = profile.meta.get("hardware") if isinstance(profile.meta.get("hardware"), dict) else {}
    if gpu is not None and str(hardware.get("device", "")).startswith("cuda"):
        family = gpu.name.split("-")[0].lower()
        device_name = str(hardware.get("device_name", ""))
        if family not in device_name.lower().replace(" ", ""):
            return f"{profile.path}: measured on {device_name or 'another GPU'}, not on {gpu.name}"
    return None


def make_profiled(model=None, gpu=None, tp: int = 1, profile_path=None, force: bool = False,
                  **kwargs) -> ProfiledCostModel:
    """The registry's factory. The profile must have been measured on this model (and, for a GPU
    profile, on this GPU's family): a mismatch is a ProfileError unless force."""
    if kwargs:
        raise ValueError(f"profiled cost model: unexpected options {sorted(kwargs)}")
    if not profile_path:
        raise ValueError("the 'profiled' cost model needs a profile file (--profile PROFILE, made by `pagesim profile`)")
    if tp != 1:
        raise ValueError("profiled cost model: profiles are measured on one device (tp=1)")
    profile = load_profile(profile_path)
    problem = profile_mismatch(profile, model, gpu)
    if problem and not force:
        raise ProfileError(f"{problem}: its step times would price another system (give --force to use it anyway)")
    return ProfiledCostModel.from_profile(profile)
