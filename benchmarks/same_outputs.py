"""Do two source trees replay the reference cases to the same bytes? For changes meant to leave
every output as it is (speed work, refactors): each case runs `pagesim replay ... --out DIR
--json` once under this tree and once under the base tree, and every file it writes (and the
printed summary) is compared by digest.

    git worktree add --detach /tmp/base REV
    python -m benchmarks.same_outputs --base /tmp/base [--cases 1,5,9] [--out reports/x.md]

Each command runs from its own tree's root with PYTHONPATH set to it: `python -m` puts the current
folder first on the path, so a command started elsewhere would import that folder's pagesim
whatever PYTHONPATH says. Exit status 1 where any case differs or fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100, A100 = "--gpu h100-80gb", "--gpu a100-80gb"
# what a step can do, case by case: the policies, swap and recompute, parallel samples and beams,
# chunked prefill, prefix caching (and its evictions on a small pool), sliding windows, MoE, MLA,
# FP8 KV, sampled steps, concurrency-released traces
CASES = [
    "traces/sharegpt.json --rate 2.0 --num-requests 3000",
    "traces/sharegpt.json --rate 1.0 --num-requests 2000 --preemption swap",
    "traces/sharegpt.json --rate 3.0 --num-requests 1500 --preemption swap",
    "traces/alpaca.json --rate 20 --num-requests 2000 --n 4",
    "traces/alpaca.json --rate 10 --num-requests 800 --beam-width 4",
    f"traces/sharegpt.json --rate 2.0 --num-requests 2000 --model llama-2-7b {A100} --chunked-prefill",
    f"traces/sharegpt.json --rate 6.0 --num-requests 2000 --model llama-2-7b {A100} --policy vllm-v1",
    f"traces/sharegpt_chat.json --rate 2.0 --num-requests 1500 --model llama-2-7b {A100} --prefix-caching",
    f"traces/sharegpt_chat.json --rate 6 --num-requests 2000 --model llama-2-7b {A100} --prefix-caching "
    "--num-gpu-blocks 400 --preemption swap",
    "traces/sharegpt.json --rate 1.5 --num-requests 1500 --policy orca-oracle",
    "traces/sharegpt.json --rate 1.5 --num-requests 1500 --policy orca-max",
    "traces/sharegpt.json --rate 0.5 --num-requests 500 --policy static",
    f"traces/sharegpt.json --rate 2.0 --num-requests 1000 --model mistral-7b {A100}",
    f"traces/sharegpt.json --rate 3.0 --num-requests 1000 --model gemma-2-9b {H100}",
    f"traces/sharegpt.json --rate 2.0 --num-requests 1000 --model mixtral-8x7b {H100} --tp 2 --engine vllm-0.15",
    f"traces/sharegpt.json --rate 2 --num-requests 800 --model deepseek-v2-lite {H100}",
    "traces/sharegpt.json --rate 2.0 --num-requests 1000 --block-size 32 --kv-cache-dtype fp8 --model llama-3.1-8b "
    "--gpu a100-40gb",
    "traces/sharegpt.json --rate 2.0 --num-requests 1500 --steps sampled",
    f"traces/azure_conv.json --rate 0 --num-requests 1500 --model llama-3.1-8b {H100}",
    "traces/sharegpt.json --rate 8 --num-requests 1500 --replicas 4",
]


def digests(tree: Path, args: str, folder: Path) -> dict[str, str]:
    """Digest of every file the replay writes, and of what it prints (or of its error)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", "replay", *args.split(), "--out", str(folder), "--json"],
                          cwd=tree, env=env, capture_output=True)
    found = {"(printed)": hashlib.md5(done.stdout).hexdigest(), "(exit)": str(done.returncode)}
    if done.returncode:
        found["(error)"] = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
    for path in sorted(folder.glob("*")):
        found[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other source tree (e.g. a git worktree)")
    parser.add_argument("--cases", help="comma-separated case numbers (from 1; default: all)")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    chosen = [int(k) for k in args.cases.split(",")] if args.cases else range(1, len(CASES) + 1)
    lines = ["| case | command (`pagesim replay ...`) | files | verdict |", "|---|---|---|---|"]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in chosen:
            case = CASES[k - 1]
            ours = digests(ROOT, case, Path(tmp) / f"{k}-this")
            theirs = digests(args.base.resolve(), case, Path(tmp) / f"{k}-base")
            same = ours == theirs and ours["(exit)"] == "0"
            bad += not same
            lines.append(f"| {k} | `{case}` | {len(ours) - 2} | {'same bytes' if same else '**differs**'} |")
            print(lines[-1], flush=True)
    if args.out:
        args.out.write_text(f"Command: `python -m benchmarks.same_outputs --base {args.base}`\n\n" + "\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
