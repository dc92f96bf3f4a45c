"""`pagesim route` in front of three real `pagesim serve` processes, driven by the openai client:
its round-robin and prefix-affinity decisions are the ones the same router object makes when
the same requests are replayed through choose() in order; streams pass through chunk by chunk; a
client that leaves cancels the backend's request; a backend killed mid-run loses no request and
duplicates none, and a stream it cuts ends with an error event and `data: [DONE]`. The kill test
runs last: it leaves one backend dead."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter, defaultdict

import httpx
import openai

from pagesim.cluster.routers import ReplicaLoad, RoutedRequest, make_router, prefix_keys
from pagesim.route.prompts import prompt_of
from tests.route.conftest import decisions, finished_by_reason, router_metric, running_router
from tests.serve.conftest import MODEL



def client(router) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.base}/v1", api_key="none", max_retries=0, timeout=120)


def replay(router_name: str, events: list[dict], bodies: list[tuple[dict, bool]], logged_loads: bool, **params):
    """The choices the router object makes for the logged requests, in order, through choose()
    and its hooks: with the loads the proxy logged, or (logged_loads False) with idle replicas."""
    router = make_router(router_name, **params)
    chosen = []
    for e in events:
        if e["event"] == "ended":
            router.on_finished(e["request"], e["backend"], 0.0)
            continue
        body, chat = bodies[e["request"]]
        prompt = prompt_of(body, chat)
        request = RoutedRequest(e["request"], len(prompt), prefix_keys(prompt), e["session"])
        loads = [ReplicaLoad(index=i, outstanding=o, waiting=w, running=r, kv_usage=kv, accepting=a)
                 if logged_loads else ReplicaLoad(index=i) for i, (o, w, r, kv, a) in enumerate(e["loads"])]
        index = router.choose(request, [loads[i] for i in e["among"]], 0.0)
        router.on_routed(request, index, 0.0)
        chosen.append(index)
    return chosen


def send(api: openai.OpenAI, body: dict, chat: bool) -> str:
    params = {k: v for k, v in body.items() if k not in ("prompt", "messages")}
    if chat:
        answer = api.chat.completions.create(model=MODEL, messages=body["messages"], **params)
        return answer.choices[0].message.content
    return api.completions.create(model=MODEL, prompt=body["prompt"], **params).choices[0].text


def test_round_robin_decisions_replay_and_reach_the_backends(backends, tmp_path):
    before = [finished_by_reason(s, "length") for s in backends]
    bodies = []
    for i in range(7):
        if i % 3 == 2:
            body, chat = {"messages": [{"role": "user", "content": f"hello {i}"}]}, True
        else:
            body, chat = {"prompt": [(i * 7 + k) % 100 for k in range(20)]}, False
        bodies.append((dict(body, max_tokens=3, extra_body={"ignore_eos": True}), chat))  # all end by length
    with running_router(backends, tmp_path, "--router", "round-robin") as router:
        api = client(router)
        for body, chat in bodies:
            send(api, body, chat)
        events = decisions(tmp_path)
    routed = [e["backend"] for e in events if e["event"] == "routed"]
    assert routed == [0, 1, 2, 0, 1, 2, 0]
    assert routed == replay("round-robin", events, bodies, logged_loads=True)
    assert routed == replay("round-robin", events, bodies, logged_loads=False)
    # each backend finished exactly the requests the router says it sent there
    after = [finished_by_reason(s, "length") for s in backends]
    assert [a - b for a, b in zip(after, before)] == [Counter(routed)[i] for i in range(3)]


def test_prefix_affinity_keeps_each_prefix_on_one_backend_and_replays(backends, tmp_path):
    stems = [[(g * 31 + k) % 97 + 1 for k in range(48)] for g in range(3)]  # 3 blocks each, distinct
    bodies = []
    for turn in range(3):
        for g in range(3):
            prompt = stems[g] + [(turn * 11 + g + k) % 90 for k in range(turn + 3)]
            bodies.append(({"prompt": prompt, "max_tokens": 2, "stream": turn == 1}, False))
    with running_router(backends, tmp_path, "--router", "prefix-affinity", "--router-param", "kv_weight=0") as router:
        api = client(router)
        for body, chat in bodies:
            if body["stream"]:
                params = {k: v for k, v in body.items() if k != "prompt"}
                assert list(api.completions.create(model=MODEL, prompt=body["prompt"], **params))
            else:
                send(api, body, chat)
        events = decisions(tmp_path)
    routed = [e["backend"] for e in events if e["event"] == "routed"]
    groups = defaultdict(set)
    for i, backend in enumerate(routed):
        groups[i % 3].add(backend)
    # new prefixes spread (ties go to the backend holding the fewest blocks), then each stays put
    assert routed[:3] == [0, 1, 2] and all(len(g) == 1 for g in groups.values())
    # no load or KV term decides here (kv_weight 0, requests one at a time): idle loads replay it too
    assert routed == replay("prefix-affinity", events, bodies, logged_loads=True, kv_weight=0)
    assert routed == replay("prefix-affinity", events, bodies, logged_loads=False, kv_weight=0)


def test_streams_pass_through_and_a_client_that_leaves_cancels_the_backend_request(backends, tmp_path):
    body = {"prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
    direct = openai.OpenAI(base_url=f"{backends[0].base}/v1", api_key="none", max_retries=0, timeout=120)
    want = [c.choices[0].text for c in direct.completions.create(model=MODEL, stream=True, **body)]
    with running_router(backends, tmp_path, "--router", "round-robin") as router:
        api = client(router)
        got = [c.choices[0].text for c in api.completions.create(model=MODEL, stream=True, **body)]
        assert got == want and len(got) == 12  # chunk by chunk, as the backend sent them
        aborted = finished_by_reason(backends[1], "abort")  # round-robin: the next request goes to backend 1
        long = dict(body, max_tokens=240)
        stream = api.completions.create(model=MODEL, stream=True, **long)
        for _, _ in zip(range(2), stream):
            pass
        stream.close()  # the client leaves after two chunks
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (finished_by_reason(backends[1], "abort") == aborted or
                                               router_metric(router, "pagesim:router_requests_total",
                                                             'outcome="cancelled"') < 1):
            time.sleep(0.2)
        assert finished_by_reason(backends[1], "abort") == aborted + 1, "the backend did not abort the request"
        assert router_metric(router, "pagesim:router_requests_total", 'outcome="cancelled"') == 1
        assert router_metric(router, "pagesim:router_outstanding", f'backend="{backends[1].base}"') == 0
        events = decisions(tmp_path)
    assert [e["backend"] for e in events if e["event"] == "routed"] == [0, 1]
    assert [e["outcome"] for e in events if e["event"] == "ended"] == ["ok", "cancelled"]


def test_health_answers_head_as_it_answers_get(backends, tmp_path):
    """Load balancers, k8s httpGet probes and `curl -I` check health with HEAD (it was a 405)."""
    with running_router(backends, tmp_path) as router:
        for method in ("HEAD", "GET"):
            resp = httpx.request(method, f"{router.base}/health", timeout=10)
            assert (resp.status_code, resp.content) == (200, b""), (method, resp.status_code, resp.text)


def test_a_backend_killed_mid_run_loses_no_request_and_duplicates_none(backends, tmp_path):
    count, max_tokens = 12, 200
    before = [finished_by_reason(s, "length") for s in backends]
    results: dict[int, str] = {}

    def one(i: int) -> None:
        api = client(router)
        prompt = [(i + k) % 100 for k in range(5)]
        try:
            if i % 2:
                chunks = api.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                extra_body={"ignore_eos": True})
                n = sum(1 for _ in chunks)
                results[i] = f"ok {n}"
            else:
                answer = api.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                                extra_body={"ignore_eos": True})
                results[i] = f"ok {answer.usage.completion_tokens}"
        except openai.APIError as e:
            results[i] = f"failed {e}"

    raw, first_event = {"events": []}, threading.Event()

    def raw_stream() -> None:
        """One more stream, read as raw server-sent events: the openai client stops at an error
        event, other clients (guidellm) read on to the end marker."""
        body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{router.base}/v1/completions", json=body, timeout=120) as resp:
                for line in resp.iter_lines():
                    raw["events"] += [line] if line else []
                    first_event.set()
        except httpx.HTTPError as e:
            raw["raised"] = repr(e)
        first_event.set()

    with running_router(backends, tmp_path, "--router", "round-robin") as router:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(e["event"] == "routed" for e in decisions(tmp_path)) < count:
            time.sleep(0.05)
        threads.append(threading.Thread(target=raw_stream))  # request `count`: round-robin sends it to backend 0
        threads[-1].start()
        first_event.wait(60)
        backends[0].proc.send_signal(signal.SIGKILL)  # every request is in flight: none of 200 tokens is done
        for t in threads:
            t.join(180)
        events = decisions(tmp_path)
        retries = router_metric(router, "pagesim:router_retries_total", f'backend="{backends[0].base}"')
        assert router_metric(router, "pagesim:router_backend_up", f'backend="{backends[0].base}"') == 0
    assert sorted(results) == list(range(count)), "a request got no answer at all"
    ended = defaultdict(list)
    for e in events:
        if e["event"] == "ended":
            ended[e["request"]].append(e["outcome"])
    assert sorted(ended) == list(range(count + 1))
    # the raw stream, cut on backend 0 after its first token, ends as vLLM ends a failed stream: its error
    # event, then the end marker
    assert [e["backend"] for e in events if e["event"] == "routed" and e["request"] == count] == [0]
    assert "raised" not in raw and ended[count] == ["failed"], (raw, ended[count])
    *chunks, error, done = raw["events"]
    assert done == "data: [DONE]" and 1 <= len(chunks) < max_tokens, raw["events"][-3:]
    message = json.loads(error.removeprefix("data: "))["error"]["message"]
    assert "failed mid-stream" in message and backends[0].base in message, message
    for request, outcomes in ended.items():  # attempts: retried ..., then exactly one last outcome
        assert all(o == "retried" for o in outcomes[:-1]) and outcomes[-1] in ("ok", "failed"), (request, outcomes)
    ok = [i for i, r in results.items() if r.startswith("ok")]
    failed = {i: r for i, r in results.items() if r.startswith("failed")}
    for i in ok:  # a whole answer: every token (a stream: one chunk per token)
        assert results[i] == f"ok {max_tokens}", (i, results[i])
    for i, reason in failed.items():  # only streams that had begun on the killed backend, with the reason
        assert i % 2 and "failed mid-stream" in reason and backends[0].base in reason, (i, reason)
    assert sum(o[-1] == "ok" for o in ended.values()) == len(ok)
    # on backends 0's requests: the non-streamed ones moved to another backend (retries), none was lost
    first_on_dead = [e["request"] for e in events if e["event"] == "routed" and e["attempt"] == 0 and e["backend"] == 0]
    assert first_on_dead and retries == sum(1 for i in first_on_dead if len(ended[i]) > 1)
    assert all(i in ok for i in first_on_dead if i % 2 == 0 and i < count)
    # the surviving backends finished each answered request once: no duplicate anywhere
    after = [finished_by_reason(s, "length") for s in backends[1:]]
    assert sum(a - b for a, b in zip(after, before[1:])) == len(ok)
