"""GPU prices ($ per GPU-hour): the documented defaults in gpu_prices.json, or a user's file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pagesim.inputs import PRICE, read_json
from pagesim.sim.specs import get_gpu

DEFAULT_PRICES_FILE = Path(__file__).with_name("gpu_prices.json")


@dataclass(frozen=True)
class PriceTable:
    path: str
    retrieved: str
    usd_per_gpu_hour: dict[str, float]  # canonical GPU name -> price
    sources: dict[str, str]

    def price(self, gpu: str) -> float | None:
        return self.usd_per_gpu_hour.get(get_gpu(gpu).name)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """Read a prices file; raises ValueError naming the file and the bad entry."""
    shown = str(path) if path is not None else "pagesim/plan/gpu_prices.json (default)"
    path = Path(path) if path is not None else DEFAULT_PRICES_FILE
    data = read_json(path, "prices file")  # InputValueError (a ValueError): one line naming the file
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict) or not gpus:
        raise ValueError(f'{path}: expected an object with "gpus": {{"<gpu>": {{"usd_per_gpu_hour": <number>}}}}')
    prices, sources = {}, {}
    for name, entry in gpus.items():
        try:
            canonical = get_gpu(name).name
        except KeyError as e:
            raise ValueError(f"{path}: gpus.{name}: {e.args[0]}") from None
        value = entry.get("usd_per_gpu_hour") if isinstance(entry, dict) else None
        problem = PRICE.problem(value)
        if problem:
            raise ValueError(f"{path}: gpus.{name}.usd_per_gpu_hour {problem}")
        prices[canonical] = float(value)
        sources[canonical] = str(entry.get("source", ""))
    return PriceTable(shown, str(data.get("retrieved", "")), prices, sources)
