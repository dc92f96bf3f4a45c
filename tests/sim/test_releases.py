"""releases.event_at against SimPy's own timeout: it fires at exactly the time asked for, where
now + (t - now) rounds elsewhere (the tie documented at pagesim.sim.run_times.delay_to), so two
clocks reaching t by different paths read the same."""

import simpy

from pagesim.sim.releases import event_at

NOW, TARGET = 0.2576791932492309, 0.955369406414677  # no delay d has NOW + d == TARGET


def fired_at(make) -> float:
    env, seen = simpy.Environment(), []

    def process():
        yield env.timeout(NOW)
        assert env.now == NOW
        yield make(env)
        seen.append(env.now)

    env.process(process())
    env.run()
    return seen[0]


def test_a_timeout_misses_the_time_event_at_hits_it():
    assert NOW + (TARGET - NOW) != TARGET  # the premise: the plain timeout cannot land there
    assert fired_at(lambda env: env.timeout(TARGET - env.now)) != TARGET
    assert fired_at(lambda env: event_at(env, TARGET)) == TARGET


def test_a_time_already_past_fires_now():
    assert fired_at(lambda env: event_at(env, NOW / 2)) == NOW


def test_events_at_one_time_fire_in_the_order_they_were_made():
    env, order = simpy.Environment(), []
    for k in range(3):
        event_at(env, 1.0).callbacks.append(lambda _e, k=k: order.append((env.now, k)))
    env.timeout(1.0).callbacks.append(lambda _e: order.append((env.now, "timeout")))
    env.run()
    assert order == [(1.0, 0), (1.0, 1), (1.0, 2), (1.0, "timeout")]
