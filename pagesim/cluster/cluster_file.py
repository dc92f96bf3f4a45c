"""`--cluster FILE`: a cluster described in TOML or YAML (docs/cluster.md), checked key by key:
a bad file is one line naming the file and the key (ClusterFileError, a ValueError).

    lockstep = false           # true: the replicas are DP ranks of a MoE with EP, stepping together
    [router]
    name = "round-robin"       # a router (pagesim.cluster.routers); default round-robin
    staleness_s = 0.0          # how often the router's view of the loads is refreshed
    [router.params]            # the router's own parameters

    [[groups]]                 # one or more replica groups
    name = "prefill"
    role = "prefill"           # mixed (default), prefill or decode
    count = 2
    model = "llama-2-7b"       # and any other ReplayConfig field of the hardware and the serving
    gpu = "h100-80gb"          # system (gpu, tp, engine, policy, max_num_seqs, ...): they override
    tp = 1                     # the command line's options for this group

    [[links]]                  # P/D: how KV moves from a prefill group to a decode group
    from = "prefill"
    to = "decode"
    kind = "infiniband"        # nvlink, infiniband, infiniband-hdr, pcie (pagesim.cluster.links)
    bandwidth_gb_s = 50        # per GPU and direction (default: the kind's)
    latency_s = 1e-5           # (default: the kind's)

    [autoscale]                # optional: a replica count that follows load (one mixed group;
    metric = "queue"           # its count: the replicas serving at t = 0); the keys of --autoscale:
    up_at = 4                  # metric, up_at, down_at, min, max, startup, cooldown, interval
    max = 8

The workload (trace, rate, number of requests, seed, warm-up) is the command line's, the same
for the whole cluster, so a group cannot set it.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

from pagesim.cluster.autoscale import policy_from_mapping
from pagesim.cluster.links import LINK_KINDS
from pagesim.cluster.routers import ROUTERS, make_router
from pagesim.cluster.spec import ROLES, ClusterSpec, LinkSpec, ReplicaGroup
from pagesim.inputs import SECONDS, InputValueError, NumberRule, regular_file
from pagesim.models import get_model
from pagesim.workload.requests import WorkloadConfig

TOP_KEYS = ("lockstep", "router", "groups", "links", "autoscale")
ROUTER_KEYS = ("name", "staleness_s", "params")
GROUP_KEYS = ("name", "role", "count")
LINK_KEYS = ("from", "to", "kind", "bandwidth_gb_s", "latency_s")
WORKLOAD_KEYS = tuple(f.name for f in fields(WorkloadConfig)) + ("warmup",)
# a link's numbers: a KV transfer takes latency + bytes / bandwidth, which must stay a finite time
LINK_RULES = {"bandwidth_gb_s": NumberRule(lo=0, lo_open=True, hi=1e6, tiny=1e-3, why="GB/s per GPU and direction"),
              "latency_s": SECONDS}


class ClusterFileError(ValueError):
    pass


def read_cluster_file(path: Path, make_config: Callable[[dict], Any]) -> ClusterSpec:
    """The ClusterSpec a file describes. make_config(options) -> ReplayConfig: the command line's
    options with a group's keys over them (raises ValueError / TypeError / KeyError on a bad one)."""
    doc = _load(path)

    def bad(key: str, message: str) -> ClusterFileError:
        return ClusterFileError(f"{path}: {key}: {message}")

    if not isinstance(doc, dict):
        raise ClusterFileError(f"{path}: a cluster file holds a mapping (router, groups, links), got "
                               f"{type(doc).__name__}")
    for key in doc:
        if key not in TOP_KEYS:
            raise bad(key, f"unknown key; a cluster file has {', '.join(TOP_KEYS)}")
    router = _table(doc.get("router", {}), "router", bad)
    _known(router, ROUTER_KEYS, "router", bad)
    name = router.get("name", "round-robin")
    params = _table(router.get("params", {}), "router.params", bad)
    staleness = router.get("staleness_s", 0.0)
    if problem := SECONDS.problem(staleness):
        raise bad("router.staleness_s", problem)
    if name not in ROUTERS:
        raise bad("router.name", f"unknown router {name!r}; one of: {', '.join(sorted(ROUTERS))}")
    try:
        make_router(name, **params)
    except (ValueError, TypeError) as e:
        raise bad("router.params", str(e)) from None

    groups_doc = doc.get("groups")
    if not isinstance(groups_doc, list) or not groups_doc:
        raise bad("groups", "a list of one or more replica groups ([[groups]] tables) is needed")
    groups = [_group(g, f"groups[{i}]", make_config, bad) for i, g in enumerate(groups_doc)]
    links_doc = doc.get("links", [])
    if not isinstance(links_doc, list):
        raise bad("links", "a list of [[links]] tables")
    links = [_link(link, f"links[{i}]", bad) for i, link in enumerate(links_doc)]
    autoscale = None
    if "autoscale" in doc:
        try:
            autoscale = policy_from_mapping(_table(doc["autoscale"], "autoscale", bad), "autoscale")
        except ClusterFileError:
            raise
        except ValueError as e:
            raise ClusterFileError(f"{path}: {e}") from None
    lockstep = doc.get("lockstep", False)
    if not isinstance(lockstep, bool):
        raise bad("lockstep", f"true or false, got {lockstep!r}")
    spec = ClusterSpec(groups, name, params, float(staleness), links, autoscale, lockstep)
    try:
        spec.check()
    except ValueError as e:
        key = next((k for k in ("links", "autoscale", "lockstep") if str(e).startswith(k.rstrip("s"))), "groups")
        raise bad(key, str(e).removeprefix(f"{key}: ")) from None
    return spec


def _load(path: Path) -> Any:
    try:
        regular_file(path, "cluster file")  # a FIFO would block the read forever
    except InputValueError as e:
        raise ClusterFileError(str(e)) from None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterFileError(f"{path}: cannot read the cluster file ({(e.strerror or str(e)).lower()})") from None
    except UnicodeDecodeError as e:
        raise ClusterFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ClusterFileError(f"{path}: not valid TOML ({e})") from None
        except RecursionError:
            raise ClusterFileError(f"{path}: nested too deep to be a cluster file") from None
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ClusterFileError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
        except RecursionError:
            raise ClusterFileError(f"{path}: nested too deep to be a cluster file") from None
    raise ClusterFileError(f"{path}: a cluster file is .toml, .yaml or .yml")


def _table(value, key: str, bad) -> dict:
    if not isinstance(value, dict):
        raise bad(key, f"a table of keys, got {type(value).__name__}")
    return value


def _known(table: dict, allowed: tuple[str, ...], where: str, bad) -> None:
    for key in table:
        if key not in allowed:
            raise bad(f"{where}.{key}", f"unknown key; one of {', '.join(allowed)}")


def _group(doc, where: str, make_config, bad) -> ReplicaGroup:
    doc = _table(doc, where, bad)
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"{where}.name", "every group needs a name (a string)")
    count = doc.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise bad(f"{where}.count", f"a whole number of replicas >= 1, got {count!r}")
    role = doc.get("role", "mixed")
    if role not in ROLES:
        raise bad(f"{where}.role", f"one of {', '.join(ROLES)}, got {role!r}")
    options = {k: v for k, v in doc.items() if k not in GROUP_KEYS}
    model = {"model": options["model"]} if "model" in options else {}
    for key, value in sorted(options.items(), key=lambda item: item[0] != "model"):
        if key in WORKLOAD_KEYS:
            raise bad(f"{where}.{key}", "the workload is the command line's, the same for every group")
        try:  # the group's model first, then each key with it (max_model_len is judged against its length)
            make_config({**model, key: value})
            if key == "model":
                get_model(value)
        except (ValueError, TypeError, KeyError) as e:
            raise bad(f"{where}.{key}", _message(e)) from None
    try:
        cfg = make_config(options)
        _check_hardware(cfg)
    except (ValueError, TypeError, KeyError) as e:
        raise bad(where, _message(e)) from None
    if "profile" in options and cfg.profile is not None and cfg.cost_model.lower() != "profiled":
        # (as --profile on the command line: a profile no cost model reads would be ignored silently)
        raise bad(f"{where}.profile", f"is read only by cost_model = \"profiled\" (this group uses {cfg.cost_model})")
    return ReplicaGroup(name, cfg, count, role)


def _check_hardware(cfg) -> None:
    from pagesim.sim.specs import get_gpu, get_model

    get_model(cfg.model)
    get_gpu(cfg.gpu)


def _link(doc, where: str, bad) -> LinkSpec:
    doc = _table(doc, where, bad)
    _known(doc, LINK_KEYS, where, bad)
    for end in ("from", "to"):
        if not isinstance(doc.get(end), str):
            raise bad(f"{where}.{end}", "the name of a group")
    kind = doc.get("kind", "infiniband")
    if kind not in LINK_KINDS:
        raise bad(f"{where}.kind", f"one of {', '.join(LINK_KINDS)}, got {kind!r}")
    numbers = {}
    for key, rule in LINK_RULES.items():
        value = doc.get(key)
        if value is not None and (problem := rule.problem(value)):
            raise bad(f"{where}.{key}", problem)
        numbers[key] = value
    bandwidth = None if numbers["bandwidth_gb_s"] is None else numbers["bandwidth_gb_s"] * 1e9
    return LinkSpec(doc["from"], doc["to"], kind, bandwidth, numbers["latency_s"])


def _message(e: Exception) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
