"""The sampler with the parameter values that used to kill a server's engine thread (issue 26):
every finite value gives a token, non-finite ones are refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from executor.sampler import SAMPLING_EPS, check_sampling, filter_logits, make_generator, sample
from pagesim.core import SamplingParams

LOGITS = torch.tensor([0.5, 2.0, -1.0, 1.5, 1.9])  # argmax 1, runner-up 4 (0.1 below)


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-30, SAMPLING_EPS / 2])
def test_a_temperature_below_the_floor_is_greedy(temperature):
    tokens, logprobs = sample(LOGITS, SamplingParams(temperature=temperature), make_generator(0), num=4)
    assert tokens == [1, 1, 1, 1]
    expected = 2.0 - math.log(sum(math.exp(v) for v in LOGITS.tolist()))  # log-softmax by hand
    assert logprobs[0] == pytest.approx(expected, rel=1e-6)


def test_the_smallest_sampled_temperature_does_not_overflow():
    # logits / 1e-5 in float32 would reach 3e38 for logits of 3e33; float64 keeps them finite
    big = LOGITS * 1e33
    tokens, logprobs = sample(big, SamplingParams(temperature=SAMPLING_EPS), make_generator(0), num=8)
    assert tokens == [1] * 8 and all(math.isfinite(lp) for lp in logprobs)


@pytest.mark.parametrize("top_p", [1e-320, 5e-324, 1e-9])
def test_a_tiny_top_p_keeps_the_most_likely_token(top_p):
    tokens, _ = sample(LOGITS, SamplingParams(temperature=1.0, top_p=top_p), make_generator(3), num=64)
    assert set(tokens) == {1}


def test_filtering_matches_the_definition():
    # temperature 0.5, top-p 0.6: probabilities by hand, then the smallest prefix reaching 0.6
    scaled = [v / 0.5 for v in LOGITS.tolist()]
    z = sum(math.exp(v) for v in scaled)
    probs = sorted(((math.exp(v) / z, i) for i, v in enumerate(scaled)), reverse=True)
    kept, total = set(), 0.0
    for p, i in probs:
        if total >= 0.6:
            break
        kept.add(i)
        total += p
    out = filter_logits(LOGITS, SamplingParams(temperature=0.5, top_p=0.6))
    assert {i for i, v in enumerate(out.tolist()) if v != float("-inf")} == kept == {1, 4}


@pytest.mark.parametrize("field, value", [("temperature", float("nan")), ("temperature", float("inf")),
                                          ("top_p", float("nan"))])
def test_non_finite_parameters_are_refused_by_name(field, value):
    params = SamplingParams()
    object.__setattr__(params, field, value)  # the core's own check lets NaN through (NaN < 0 is False)
    with pytest.raises(ValueError, match=field):
        check_sampling(params)
    with pytest.raises(ValueError, match=field):
        sample(LOGITS, params, make_generator(0))


def test_nan_logits_raise_instead_of_giving_a_token():
    with pytest.raises(ValueError, match="NaN"):
        sample(torch.tensor([0.0, float("nan"), 1.0]), SamplingParams(temperature=0.0), None)
    with pytest.raises(ValueError, match="NaN"):
        sample(torch.tensor([0.0, float("nan"), 1.0]), SamplingParams(temperature=1.0), make_generator(0))
