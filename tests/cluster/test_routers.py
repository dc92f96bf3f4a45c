"""Each router against a hand-computed sequence of choices; the load board's staleness; the
registry's checks."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pagesim.cluster.routers import Gauges, LoadBoard, ReplicaLoad, RoutedRequest, make_router, prefix_keys


def loads(*outstanding, down=(), kv=None):
    return [ReplicaLoad(index=i, outstanding=n, accepting=i not in down, kv_usage=(kv or {}).get(i, 0.0))
            for i, n in enumerate(outstanding)]


def request(i=0, keys=(), session=None):
    return RoutedRequest(request_id=i, prompt_len=16 * len(keys), prefix_keys=tuple(keys), session_id=session)


def test_round_robin_turns_and_skips_a_replica_that_is_not_accepting():
    router = make_router("round-robin")
    seen = [router.choose(request(i), loads(0, 0, 0), 0.0) for i in range(4)]
    assert seen == [0, 1, 2, 0]
    # replica 1 goes down: the turn (now at 1) moves past it to 2, then wraps to 0
    seen = [router.choose(request(i), loads(0, 0, 0, down={1}), 0.0) for i in range(3)]
    assert seen == [2, 0, 2]
    assert router.choose(request(), loads(0, 0, 0), 0.0) == 0  # after 2: position 0 again


def test_a_router_given_no_accepting_replica_says_so():
    for name in ("round-robin", "random", "least-outstanding", "least-kv", "power-of-two", "prefix-affinity",
                 "cache-aware", "session-affinity"):
        with pytest.raises(RuntimeError, match="no replica is accepting"):
            make_router(name).choose(request(), loads(0, 0, down={0, 1}), 0.0)


def test_random_is_seeded_uniform_and_only_picks_accepting_replicas():
    router = make_router("random", seed=7)
    again = make_router("random", seed=7)
    view = loads(0, 0, 0, 0, down={2})
    first = [router.choose(request(), view, 0.0) for _ in range(3000)]
    assert first == [again.choose(request(), view, 0.0) for _ in range(3000)]
    other = make_router("random", seed=8)
    assert first != [other.choose(request(), view, 0.0) for _ in range(3000)]
    counts = Counter(first)
    assert set(counts) == {0, 1, 3}
    # uniform over 3: chi-square with 2 degrees of freedom, 13.8 is its 0.999 quantile
    assert sum((c - 1000) ** 2 / 1000 for c in counts.values()) < 13.8


def test_least_outstanding_by_hand_through_the_board():
    router, board = make_router("least-outstanding"), LoadBoard(3)
    chosen = [board.route(router, request(i), 0.0) for i in range(4)]
    assert chosen == [0, 1, 2, 0]  # all at 0: lowest index; then the one with fewest
    board.finished(router, 1, 1, 1.0)  # replica 1 now has 0 outstanding, 0 has 2, 2 has 1
    assert board.route(router, request(4), 1.0) == 1
    assert [r.outstanding for r in board.loads] == [2, 1, 1]
    board.set_accepting(1, False)
    assert board.route(router, request(5), 1.0) == 2  # 1 and 2 tie at 1; 1 is not accepting
    board.finished(router, 4, 1, 2.0)  # replica 1: 1 -> 0
    with pytest.raises(RuntimeError, match="not outstanding"):
        board.finished(router, 4, 1, 2.0)  # ended twice: the caller's bug, named


def test_least_kv_uses_usage_then_outstanding():
    router = make_router("least-kv")
    assert router.choose(request(), loads(3, 0, 1, kv={0: 0.1, 1: 0.5, 2: 0.2}), 0.0) == 0
    assert router.choose(request(), loads(3, 0, 1, kv={0: 0.2, 1: 0.5, 2: 0.2}), 0.0) == 2  # tie: fewer outstanding
    assert router.choose(request(), loads(3, 0, 1, kv={0: 0.2, 1: 0.5, 2: 0.2}, down={2}), 0.0) == 0


def test_power_of_two_never_picks_the_most_loaded_and_halves_the_middle():
    router = make_router("power-of-two", seed=3)
    view = loads(5, 0, 9)
    counts = Counter(router.choose(request(), view, 0.0) for _ in range(3000))
    # pairs drawn uniformly: {0,1} -> 1, {0,2} -> 0, {1,2} -> 1, so 1 two thirds of the time, 0 a third, 2 never
    assert counts[2] == 0
    assert abs(counts[1] / 3000 - 2 / 3) < 0.04 and abs(counts[0] / 3000 - 1 / 3) < 0.04
    assert make_router("power-of-two").choose(request(), loads(5, 9, down={1}), 0.0) == 0  # one left: that one
    kv = make_router("power-of-two", load="kv")
    assert kv.choose(request(), loads(0, 9, kv={0: 0.9, 1: 0.1}), 0.0) == 1  # two replicas: both drawn
    with pytest.raises(ValueError, match="load must be one of"):
        make_router("power-of-two", load="tokens")


def keys_of(*blocks):
    """Keys of a prompt made of the given block labels (each label: 16 equal tokens)."""
    return prefix_keys([t for label in blocks for t in [label] * 16])


def test_prefix_affinity_by_hand():
    router = make_router("prefix-affinity")  # weights 3 (prefix), 2 (load), 2 (kv); load = outstanding
    a, b = keys_of(1, 2, 3, 4), keys_of(5, 6, 7, 8)
    # nothing cached, equal loads: every score 2 + 2 = 4; ties -> fewest cached blocks -> lowest index
    assert router.choose(request(0, a), loads(0, 0), 0.0) == 0
    router.on_routed(request(0, a), 0, 0.0)
    # b: no match anywhere, replica 1 holds fewer blocks
    assert router.choose(request(1, b), loads(0, 0), 0.0) == 1
    router.on_routed(request(1, b), 1, 0.0)
    # a's first 2 blocks then new ones: replica 0 matches 2/4 -> 3 * 0.5 + 2 + 2 = 5.5 against 4
    half = keys_of(1, 2, 9, 9)
    assert router.scores(request(2, half), loads(0, 0)) == {0: 5.5, 1: 4.0}
    # the same with replica 0 busier (outstanding 1 against 0): 1.5 + 0 + 2 = 3.5 < 4, load wins
    assert router.choose(request(2, half), loads(1, 0), 0.0) == 1
    # a whole match outweighs the load: 3 + 0 + 2 = 5 > 4
    assert router.choose(request(3, a), loads(1, 0), 0.0) == 0
    # KV usage: replica 0 at 0.9 -> 3 + 2 + 0.2 = 5.2 against replica 1's 0 + 2 + 2 = 4
    assert router.scores(request(3, a), loads(0, 0, kv={0: 0.9}))[0] == pytest.approx(5.2)
    # no full block: prefix term 0 for all
    assert router.scores(request(4, ()), loads(0, 0)) == {0: 4.0, 1: 4.0}


def test_prefix_affinity_forgets_the_least_recent_blocks_beyond_capacity():
    router = make_router("prefix-affinity", capacity_blocks=4, load_weight=0.0, kv_weight=0.0)
    router.on_routed(request(0, keys_of(1, 2, 3)), 0, 0.0)
    router.on_routed(request(1, keys_of(7, 8)), 0, 0.0)  # 5 blocks > 4: the key of block "1" goes
    # the chain breaks at its first block: nothing of prompt (1, 2, 3) can be matched any more
    assert router.scores(request(2, keys_of(1, 2, 3)), loads(0)) == {0: 0.0}
    assert router.scores(request(3, keys_of(7, 8)), loads(0)) == {0: 3.0}


def test_cache_aware_by_hand():
    router = make_router("cache-aware", balance_abs_threshold=2, balance_rel_threshold=1.5)
    a = keys_of(1, 2, 3, 4)
    assert router.choose(request(0, a), loads(0, 0, 0), 0.0) == 0  # no tree: smallest (all 0) -> lowest
    router.on_routed(request(0, a), 0, 0.0)
    assert router.choose(request(1, keys_of(1, 2, 9, 9)), loads(2, 0, 0), 0.0) == 0  # 2/4 > 0.3; 2 - 0 not > 2
    assert router.choose(request(1, keys_of(1, 9, 9, 9)), loads(0, 0, 0), 0.0) == 1  # 1/4 <= 0.3: smallest tree
    assert router.choose(request(2, a), loads(3, 0, 1), 0.0) == 1  # imbalanced (3 - 0 > 2, 3 > 0): least loaded
    assert router.choose(request(2, a), loads(3, 2, 1), 0.0) == 0  # 3 - 1 = 2, not > 2: balanced, the match


def test_session_affinity_pins_a_session_and_falls_back():
    router, board = make_router("session-affinity"), LoadBoard(3)
    s = lambda i, sid: request(i, session=sid)
    assert board.route(router, s(0, "a"), 0.0) == 0  # fallback: least outstanding
    assert board.route(router, s(1, "b"), 0.0) == 1
    assert board.route(router, s(2, "a"), 0.0) == 0  # pinned, though 2 is idle
    assert board.route(router, s(3, None), 0.0) == 2  # no session: fallback
    board.set_accepting(0, False)
    # its replica is down: fallback, where 1 and 2 tie at 1 outstanding -> the lower index
    assert board.route(router, s(4, "a"), 0.0) == 1
    board.set_accepting(0, True)
    assert board.route(router, s(5, "a"), 0.0) == 1  # the session moved with it
    rr = make_router("session-affinity", fallback="round-robin")
    assert [rr.choose(s(i, None), loads(0, 0), 0.0) for i in range(3)] == [0, 1, 0]
    with pytest.raises(ValueError, match="fallback must be another router"):
        make_router("session-affinity", fallback="session-affinity")


def test_session_affinity_forgets_the_least_recent_session():
    router = make_router("session-affinity", max_sessions=2)
    for i, (sid, index) in enumerate([("a", 1), ("b", 0), ("c", 0)]):
        router.on_routed(request(i, session=sid), index, 0.0)
    assert router.choose(request(3, session="b"), loads(5, 0), 0.0) == 0  # remembered
    assert router.choose(request(4, session="a"), loads(5, 0), 0.0) == 1  # forgotten: fallback (least outstanding)
    assert router.choose(request(5, session="a"), loads(0, 5), 0.0) == 0  # and again: not pinned to 1


def test_the_board_keeps_gauges_stale_and_outstanding_current():
    state = {"waiting": 0}
    reads = []

    def read(index):
        reads.append(index)
        return Gauges(waiting=state["waiting"] + index, running=1, kv_usage=0.5)

    board, router = LoadBoard(2, staleness_s=1.0), make_router("least-outstanding")
    assert [r.waiting for r in board.view(0.0, read)] == [0, 1]
    state["waiting"] = 10
    assert board.route(router, request(0), 0.5, read) == 0
    seen = board.view(0.99, read)
    assert [r.waiting for r in seen] == [0, 1] and [r.info_time for r in seen] == [0.0, 0.0]  # stale
    assert [r.outstanding for r in seen] == [1, 0]  # current
    seen = board.view(1.0, read)  # a second old: read again
    assert [r.waiting for r in seen] == [10, 11] and [r.info_time for r in seen] == [1.0, 1.0]
    assert reads == [0, 1, 0, 1]  # two full reads, none between
    fresh = LoadBoard(1)  # staleness 0: every view reads
    fresh.view(0.0, read), fresh.view(0.0, read)
    assert len(reads) == 6
    board.report(1, Gauges(3, 4, 0.25), 1.5)  # a push (a scrape's answer) for one replica
    assert (board.loads[1].waiting, board.loads[1].running, board.loads[1].kv_usage, board.loads[1].info_time) == \
        (3, 4, 0.25, 1.5)
    with pytest.raises(ValueError, match="staleness_s"):
        LoadBoard(2, staleness_s=-1)


def test_the_board_routes_among_a_subset():
    board, router = LoadBoard(4), make_router("round-robin")
    assert [board.route(router, request(i), 0.0, among=[1, 3]) for i in range(3)] == [1, 3, 1]
    assert [r.outstanding for r in board.loads] == [0, 2, 0, 1]
    assert board.add_replica() == 4 and len(board.loads) == 5


def test_make_router_names_what_is_wrong():
    with pytest.raises(ValueError, match="unknown router 'nope'; one of: cache-aware"):
        make_router("nope")
    with pytest.raises(ValueError, match="router 'random' has no parameter 'sed'; its parameters: seed"):
        make_router("random", sed=1)
    with pytest.raises(ValueError, match="prefix_weight must be a finite number >= 0"):
        make_router("prefix-affinity", prefix_weight=float("nan"))
    with pytest.raises(ValueError, match="capacity_blocks must be an integer >= 1"):
        make_router("cache-aware", capacity_blocks=0)
    assert make_router("power-of-two", seed=4, load="queue").params == {"seed": 4, "load": "queue"}


def test_random_replay_is_independent_of_other_routers():
    # two seeded routers in one process do not share a generator (the global one is untouched)
    random.seed(0)
    before = random.random()
    random.seed(0)
    make_router("random", seed=1).choose(request(), loads(0, 0), 0.0)
    assert random.random() == before
