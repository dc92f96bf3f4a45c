"""prefix_keys, and the prefix-affinity scorer against a brute-force longest-prefix search over the
token lists routed to each replica."""

from __future__ import annotations

import random

import pytest

from pagesim.cluster.routers import LoadBoard, RoutedRequest, make_router, prefix_keys
from pagesim.core.paged import sha256_block_key


def test_prefix_keys_share_exactly_the_shared_full_blocks():
    a = list(range(40))
    b = list(range(20)) + [999] * 20
    ka, kb = prefix_keys(a), prefix_keys(b)
    assert len(ka) == len(kb) == 2  # 40 tokens: 2 full blocks of 16, the last 8 have no key
    assert ka[0] == kb[0] and ka[1] != kb[1]  # they share tokens 0..19: one full block
    assert prefix_keys(a[:15]) == ()
    assert prefix_keys(a, block_size=4)[:5] == prefix_keys(b, block_size=4)[:5]  # 20 shared tokens = 5 blocks of 4
    assert prefix_keys(a, block_size=4)[5] != prefix_keys(b, block_size=4)[5]
    # a text prompt is keyed by its characters
    assert prefix_keys("hello world, hello!", block_size=4) == prefix_keys([ord(c) for c in "hello world, hello!"], 4)
    assert prefix_keys("x" * 32, key=sha256_block_key)[0] == sha256_block_key(b"", tuple([ord("x")] * 16))
    with pytest.raises(ValueError, match="block_size"):
        prefix_keys(a, block_size=0)


def brute_force_matched(prompt: list[int], routed: list[list[int]], block_size: int) -> int:
    """The most leading full blocks the prompt shares with any prompt routed to a replica."""
    best = 0
    for other in routed:
        common = 0
        while common < min(len(prompt), len(other)) and prompt[common] == other[common]:
            common += 1
        best = max(best, common // block_size)
    return best


def brute_force_size(routed: list[list[int]], block_size: int) -> int:
    """Distinct full-block prefixes among the prompts routed to a replica."""
    return len({tuple(p[:k * block_size]) for p in routed for k in range(1, len(p) // block_size + 1)})


@pytest.mark.parametrize("seed", range(6))
def test_prefix_affinity_scores_equal_a_brute_force_longest_prefix_search(seed):
    rng = random.Random(seed)
    block = rng.choice([4, 8, 16])
    replicas = rng.choice([2, 3, 5])
    stems = [[rng.randrange(50) for _ in range(rng.randrange(1, 12) * block)] for _ in range(4)]
    # only the prefix term, so a score is the matched share; unbounded index, so nothing is forgotten
    router = make_router("prefix-affinity", prefix_weight=1.0, load_weight=0.0, kv_weight=0.0,
                         capacity_blocks=10**9, max_blocks_to_match=10**9)
    board = LoadBoard(replicas)
    routed: list[list[list[int]]] = [[] for _ in range(replicas)]
    for i in range(120):
        stem = rng.choice(stems)
        prompt = stem[:rng.randrange(len(stem) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(3 * block))]
        req = RoutedRequest(i, len(prompt), prefix_keys(prompt, block))
        full = len(prompt) // block
        scores = router.scores(req, board.view(0.0))
        expected = {r: brute_force_matched(prompt, routed[r], block) / full if full else 0.0 for r in range(replicas)}
        assert scores == pytest.approx(expected), f"request {i}"
        # the choice: the best share, then the fewest blocks held, then the lowest index
        sizes = [brute_force_size(routed[r], block) for r in range(replicas)]
        want = min(range(replicas), key=lambda r: (-expected[r], sizes[r], r))
        assert board.route(router, req, 0.0) == want, f"request {i}"
        routed[want].append(prompt)
    assert sum(1 for r in routed if r) > 1, "every prompt went to one replica: the test saw no spreading"


def test_matching_is_capped_at_max_blocks_to_match():
    router = make_router("prefix-affinity", prefix_weight=1.0, load_weight=0.0, kv_weight=0.0, max_blocks_to_match=2)
    prompt = list(range(64))  # 4 blocks
    router.on_routed(RoutedRequest(0, 64, prefix_keys(prompt)), 0, 0.0)
    other = prompt[:16] + [99] * 48  # shares 1 block; of the 2 looked at: 0.5
    board = LoadBoard(1)
    assert router.scores(RoutedRequest(1, 64, prefix_keys(other)), board.view(0.0)) == {0: 0.5}
    assert router.scores(RoutedRequest(2, 64, prefix_keys(prompt)), board.view(0.0)) == {0: 1.0}
