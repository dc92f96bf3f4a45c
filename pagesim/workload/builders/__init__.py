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

from pathlib import Path
from typing import Callable

from pagesim.workload.builders.chat import ROLE_SPEAKER, build_sharegpt_chat, chat_turns
from pagesim.workload.builders.common import (DEFAULT_NUM, DEFAULT_SEED, KINDS, PAPER_MEANS, build_command,
                                              default_data_dir, length_stats, percentile, read_json_array_prefix,
                                              repo_root, seeded_order, seeded_sample, sha256_of, trace_stats)
from pagesim.workload.builders.paper import alpaca_prompt, build_alpaca, build_sharegpt
from pagesim.workload.builders.sessions import (build_agent_sessions, build_mooncake_sessions,
                                                build_sharegpt_sessions, conversation_chains)
from pagesim.workload.builders.translation import TRANSLATION_OUTPUT_RATIO, build_translation, english_sentences
from pagesim.workload.trace import Trace

__all__ = ["BUILDERS", "DEFAULT_NUM", "DEFAULT_SEED", "KINDS", "PAPER_MEANS", "ROLE_SPEAKER", "TRANSLATION_OUTPUT_RATIO",
           "alpaca_prompt", "build_alpaca", "build_command", "build_sharegpt", "build_sharegpt_chat", "build_translation",
           "build_agent_sessions", "build_mooncake_sessions", "build_sharegpt_sessions", "conversation_chains",
           "chat_turns", "default_data_dir", "english_sentences", "length_stats", "percentile", "read_json_array_prefix",
           "repo_root", "seeded_order", "seeded_sample", "sha256_of", "trace_stats"]


def _translation(shots: int) -> Callable[..., Trace]:
    def build(data_dir: Path, num: int | None = 2000, seed: int = DEFAULT_SEED, command: str = "") -> Trace:
        return build_translation(data_dir, num=num, seed=seed, command=command, shots=shots)
    return build


BUILDERS = {"sharegpt": build_sharegpt, "alpaca": build_alpaca, "sharegpt-chat": build_sharegpt_chat,
            "translation-1shot": _translation(1), "translation-5shot": _translation(5),
            "sharegpt-sessions": build_sharegpt_sessions, "mooncake-sessions": build_mooncake_sessions,
            "agent-sessions": build_agent_sessions}
