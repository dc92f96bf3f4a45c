"""pagesim.experiments.route_check with small bounded counts: two real `pagesim serve` processes
behind `pagesim route`, against the simulated cluster, and both against choice sequences worked
out by hand."""

from __future__ import annotations

from pagesim.experiments import route_check


def test_prefixes_of_the_synthetic_trace():
    trace = route_check.shared_prefix_trace(8)
    prefixes = [tuple(r.prompt_token_ids[:3 * route_check.BLOCK]) for r in trace.requests]
    distinct = list(dict.fromkeys(prefixes))
    # request i takes prefix (7i + i // 3) mod 3: 0 1 2 1 2 0 2 0
    assert [distinct.index(p) for p in prefixes] == [0, 1, 2, 1, 2, 0, 2, 0]
    assert all(max(r.prompt_token_ids) < route_check.VOCAB for r in trace.requests)
    assert [r.arrival_time for r in trace.requests] == [i * route_check.GAP_S for i in range(8)]


def test_real_router_and_simulated_cluster_decide_alike(tmp_path):
    # By hand, 2 backends. round-robin: 0 1 0 1 0 1 0 1. prefix-affinity (weights 0 but the
    # prefix's; each prompt 3 full blocks): r0 prefix 0 -> 0 (a tie: the lowest index); r1 prefix 1,
    # unmatched -> 1 (the backend holding fewer blocks); r2 prefix 2, unmatched, both hold 3 blocks
    # -> 0; r3 prefix 1 -> 1; r4 prefix 2 -> 0; r5 prefix 0 -> 0; r6 -> 0; r7 -> 0.
    out = tmp_path / "route_check.md"
    assert route_check.main(["--replicas", "2", "--num-requests", "8", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| round-robin | 8 | 8 | none | [4, 4] | [4, 4] | 01010101 |" in text
    assert "| prefix-affinity | 8 | 8 | none | [6, 2] | [6, 2] | 01010000 |" in text
    assert "nan" not in text.lower()
