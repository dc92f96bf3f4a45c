"""What a server says about itself in /v1/models, checked: the model to request, and (where the
server says them, as `pagesim serve` and vLLM do) its `max_model_len` and vocabulary size.
A list of an unexpected shape is an error only when bench needs it to pick the model; an
optional field of the wrong type or range is ignored with a warning."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagesim.bench.stream import kind_of, short

MAX_CONTEXT = 2**31  # a longer "max_model_len" or vocabulary is not one


class BenchError(Exception):
    """The benchmark cannot start (server unreachable, no model, no vocabulary)."""


@dataclass
class ServedModel:
    id: str
    max_model_len: int | None = None
    vocab_size: int | None = None
    warnings: list[str] = field(default_factory=list)


def _positive_int(entry: dict, name: str, warnings: list[str]) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONTEXT:
        return value
    shown = short(str(value), 40) if isinstance(value, int) and not isinstance(value, bool) else kind_of(value)
    warnings.append(f"/v1/models: {name} is {shown}, not a positive integer; ignored")
    return None


def pick_model(body, wanted: str | None, where: str) -> ServedModel:
    """The model entry to benchmark from a /v1/models answer (already JSON-decoded, or None if the
    request failed). With `wanted` given, an unusable answer only costs the optional fields."""
    warnings: list[str] = []
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        problem = f"{where}/v1/models did not answer an OpenAI model list ({{'data': [...]}})"
        if wanted is None:
            raise BenchError(f"{problem}: pass --model to name the model to request")
        return ServedModel(wanted, warnings=[f"{problem}; requesting --model {wanted!r} without its max_model_len"])
    models = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
    if len(models) < len(data):
        warnings.append(f"/v1/models: {len(data) - len(models)} of {len(data)} entries have no model id; ignored")
    if wanted is None:
        if not models:
            raise BenchError(f"{where}/v1/models lists no model")
        entry = models[0]
    else:
        entry = next((m for m in models if m["id"] == wanted), None)
        if entry is None:
            if models:
                names = ", ".join(short(m["id"], 60) for m in models[:10])
                raise BenchError(f"the server has no model {wanted!r}; it has {names}")
            return ServedModel(wanted, warnings=warnings + [f"{where}/v1/models lists no model; requesting {wanted!r}"])
    return ServedModel(entry["id"], _positive_int(entry, "max_model_len", warnings),
                       _positive_int(entry, "vocab_size", warnings), warnings)
