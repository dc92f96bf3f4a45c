"""The shipped vllm-0.15 engine profile is what `pagesim calibrate engine` makes of the shared H100
runs: replayed at the shipped parameters, one more iteration of the fit leaves them (nearly) where
they are, and it was fitted on exactly the runs whose server kept up."""

from __future__ import annotations

import pytest

from pagesim.engine_fit import DAMPING, PARAMS, PRIORS, replay_with, solve
from pagesim.sim.cost.engine import load_engine_profile
from pagesim.workload.builders import default_data_dir

BLIS = default_data_dir() / "real_vllm" / "blis-h100-vllm0.15" / "replay_data"


@pytest.mark.slow
@pytest.mark.skipif(not BLIS.exists(), reason=f"needs the shared real runs ({BLIS}; set PAGESIM_DATA_DIR)")
def test_shipped_vllm_015_is_the_fits_fixed_point():
    from pagesim.realruns import load_real_run
    from pagesim.validate import fit_run, kept_up

    profile = load_engine_profile("vllm-0.15")
    runs = [load_real_run(p) for p in sorted(BLIS.glob("*.json.gz")) if not p.name.endswith("_ground_truth.json.gz")]
    fit_set = [r for r in runs if kept_up(r)]
    assert sorted(r.name for r in fit_set) == sorted(profile.provenance["runs"])
    windows = [replay_with(fit_run(r, gpu="h100-80gb", engine="vllm-0.15"), profile.params, profile) for r in fit_set]
    theta = solve(windows)
    for name, value in zip(PARAMS, theta):
        # one more (damped) iteration of the fit moves no parameter by more than a fifth of its prior
        # spread: the fit stopped at its iteration limit, near its fixed point
        assert DAMPING * abs(value - getattr(profile.params, name)) <= 0.2 * PRIORS[name][1], name
