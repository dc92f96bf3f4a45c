"""Build the project's traces from the public data (see docs/traces.md).

Every builder is deterministic: the same data, arguments and tokenizer give the same Trace, and
`save_trace` turns that into the same bytes. To keep it so, the metadata holds no timestamps
and no absolute paths (data files are named relative to the data dir and identified by
sha256), and sampling uses a keyed hash rather than a library RNG whose stream could change
between numpy versions.

transformers and the ShareGPT package are imported inside the builders that need them, so
`import pagesim.workload` stays light.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from pagesim.workload.builders.azure import AZURE_FILES, build_azure
from pagesim.workload.builders.chat import ROLE_SPEAKER, build_sharegpt_chat, chat_turns
from pagesim.workload.builders.common import (DEFAULT_NUM, DEFAULT_SEED, KINDS, PAPER_MEANS, build_command,
                                              default_data_dir, length_stats, percentile, read_json_array_prefix,
                                              repo_root, seeded_order, seeded_sample, sha256_of, trace_stats)
from pagesim.workload.builders.mooncake import HASH_BLOCK_TOKENS, MOONCAKE_FILES, build_mooncake, prefix_block_reuse
from pagesim.workload.builders.paper import alpaca_prompt, build_alpaca, build_sharegpt
from pagesim.workload.builders.sessions import (build_agent_sessions, build_mooncake_sessions,
                                                build_sharegpt_sessions, conversation_chains)
from pagesim.workload.builders.timeline import Shaping, SourceError, production_command
from pagesim.workload.builders.translation import TRANSLATION_OUTPUT_RATIO, build_translation, english_sentences
from pagesim.workload.trace import Trace

__all__ = ["AZURE_FILES", "BUILDERS", "DEFAULT_NUM", "DEFAULT_SEED", "HASH_BLOCK_TOKENS", "KINDS", "MOONCAKE_FILES",
           "PAPER_MEANS", "PRODUCTION_KINDS", "ROLE_SPEAKER", "Shaping", "SourceError", "TRANSLATION_OUTPUT_RATIO",
           "build_azure", "build_mooncake", "prefix_block_reuse", "production_command",
           "alpaca_prompt", "build_alpaca", "build_command", "build_sharegpt", "build_sharegpt_chat", "build_translation",
           "build_agent_sessions", "build_mooncake_sessions", "build_sharegpt_sessions", "conversation_chains",
           "chat_turns", "default_data_dir", "english_sentences", "length_stats", "percentile", "read_json_array_prefix",
           "repo_root", "seeded_order", "seeded_sample", "sha256_of", "trace_stats"]


def _translation(shots: int) -> Callable[..., Trace]:
    def build(data_dir: Path, num: int | None = 2000, seed: int = DEFAULT_SEED, command: str = "") -> Trace:
        return build_translation(data_dir, num=num, seed=seed, command=command, shots=shots)
    return build


def _production(kind: str, build: Callable[..., Trace]) -> Callable[..., Trace]:
    """A production trace (Azure, Mooncake): no sampling, so no seed; --num keeps the first
    requests; the shaping options (window, time scale, duration, context cap) go in `shaping`."""
    def build_kind(data_dir: Path, num: int | None = None, seed: int = DEFAULT_SEED, command: str = "",
                   shaping: Shaping | None = None) -> Trace:
        if num is not None:
            shaping = dataclasses.replace(shaping or Shaping(), num=num)
        return build(kind, data_dir, shaping=shaping, command=command)
    return build_kind


PRODUCTION_KINDS = (*AZURE_FILES, *MOONCAKE_FILES)

BUILDERS = {"sharegpt": build_sharegpt, "alpaca": build_alpaca, "sharegpt-chat": build_sharegpt_chat,
            "translation-1shot": _translation(1), "translation-5shot": _translation(5),
            "sharegpt-sessions": build_sharegpt_sessions, "mooncake-sessions": build_mooncake_sessions,
            "agent-sessions": build_agent_sessions,
            **{kind: _production(kind, build_azure) for kind in AZURE_FILES},
            **{kind: _production(kind, build_mooncake) for kind in MOONCAKE_FILES}}
