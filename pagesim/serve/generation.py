"""From an OpenAI request body to engine tokens and back: the prompt's ids, the sampling
parameters (checked against what the model and the sampler can do), and one generation's
samples as the client sees them (decoded text, cut at a stop string).

A request becomes one engine request of n samples. Text is decoded here, not in the engine
thread; a stop string ends a sample here (its later tokens are dropped) and, once every sample
has ended, aborts the engine request so its blocks are freed at once. A client that goes away
aborts its request the same way."""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.engine import EngineConfig, LLMEngine
from executor.sampler import check_sampling
from pagesim.core import SamplingParams
from pagesim.serve.bodies import ApiError, BadRequest
from pagesim.serve.engine_loop import EngineLoop, RequestUpdate
from pagesim.serve.metrics import ServerStats
from pagesim.serve.protocol import ChatRequest, CompletionRequest, SamplingFields
from pagesim.serve.tokenizer import PromptError, server_tokenizer


class ModelNotFound(ApiError):
    status = 404


class StepFailed(ApiError):
    """An engine step this request was in raised; the engine goes on."""

    status, kind = 500, "server_error"


class EngineUnavailable(ApiError):
    """The engine stopped: the server is shutting down (it exits with status 1)."""

    status, kind = 503, "server_error"


_ERRORS = {"refused": BadRequest, "step_failed": StepFailed, "engine_failed": EngineUnavailable}


@dataclass
class SampleState:
    """One sample's output as the client sees it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""  # decoded, cut at a stop string
    sent: int = 0  # characters of text already streamed
    finish_reason: str | None = None
    stopped_by_string: bool = False


@dataclass
class Server:
    lm: object
    engine_cfg: EngineConfig
    model_name: str

    def __post_init__(self):
        self.tokenizer = server_tokenizer(self.lm)
        self.engine = LLMEngine(self.lm, self.engine_cfg, isolate_failures=True)  # one request's failure is its own
        self.max_model_len = self.engine.scheduler.config.max_model_len
        self.stats = ServerStats(self.model_name, self.engine_cfg.num_gpu_blocks)
        self.loop = EngineLoop(self.engine, self.stats)

    # -- requests -> engine requests ---------------------------------------------------------
    def prompt_ids(self, body: CompletionRequest | ChatRequest) -> list[int]:
        if body.model is not None and body.model != self.model_name:
            raise ModelNotFound(f"The model `{body.model}` does not exist; this server serves `{self.model_name}`.",
                                "model", "model_not_found")
        try:
            if isinstance(body, ChatRequest):
                try:
                    messages = [{"role": m.role, "content": m.text(i)} for i, m in enumerate(body.messages)]
                except ValueError as e:
                    raise BadRequest(str(e), "messages") from None
                return self.tokenizer.chat_prompt(messages)
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise BadRequest(f"a list of {len(prompt)} prompts: this server takes one prompt per request", "prompt")
                prompt = prompt[0]
            if isinstance(prompt, str):
                return self.tokenizer.encode(prompt)
            bad = [t for t in prompt if not 0 <= t < self.lm.vocab_size]
            if bad:
                raise BadRequest(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.lm.vocab_size - 1})", "prompt")
            return list(prompt)
        except PromptError as e:
            raise BadRequest(str(e), "messages" if isinstance(body, ChatRequest) else "prompt") from None

    def sampling(self, body: SamplingFields, prompt_len: int, default_max: int | None) -> SamplingParams:
        if prompt_len == 0:
            raise BadRequest("the prompt is empty", "prompt")
        # max_completion_tokens supersedes max_tokens (which OpenAI deprecated): a client that sends
        # both means the new one, as vLLM reads them
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or default_max
        if max_tokens is None:  # the rest of the context; a prompt that fills it is refused below
            max_tokens = max(1, self.max_model_len - prompt_len)
        if prompt_len + max_tokens > self.max_model_len:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                             f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} in the completion).",
                             "max_tokens", "context_length_exceeded")
        if body.n > self.engine_cfg.max_num_seqs:
            raise BadRequest(f"n={body.n} exceeds the server's max_num_seqs {self.engine_cfg.max_num_seqs}", "n")
        params = SamplingParams(n=body.n, max_tokens=max_tokens, ignore_eos=body.ignore_eos, temperature=body.temperature,
                                top_p=body.top_p, top_k=max(0, body.top_k), seed=body.seed)
        try:  # what the sampler can work with (the protocol's bounds should have said so already)
            check_sampling(params)
        except ValueError as e:
            raise BadRequest(str(e), str(e).split()[0]) from None
        return params

    # -- one generation ---------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, stops: list[str], samples: list[SampleState]):
        """Yields the indices of the samples that changed after each engine step, until every
        sample has ended. Aborts the engine request if it is left early (stop string, client
        gone). An engine refusal or failure raises an ApiError."""
        try:
            request_id, updates = self.loop.submit(prompt_ids, params)
        except RuntimeError as e:
            raise EngineUnavailable(str(e)) from None
        engine_done = False
        try:
            while True:
                update: RequestUpdate = await updates.get()
                if update.error is not None:
                    engine_done = True  # the loop has forgotten the request
                    raise _ERRORS[update.error_kind](update.error)
                engine_done = update.finished
                changed = [d.index for d in update.samples if self._apply(samples[d.index], d, stops)]
                if changed or engine_done:
                    yield changed
                if engine_done or all(s.finish_reason for s in samples):
                    return
        finally:
            if not engine_done:
                ended = all(s.finish_reason for s in samples) and any(s.stopped_by_string for s in samples)
                self.loop.abort(request_id, "stop" if ended else "abort")

    def _apply(self, state: SampleState, delta, stops: list[str]) -> bool:
        if state.finish_reason is not None:
            return False  # ended at a stop string: tokens still in flight are dropped
        state.token_ids += delta.token_ids
        state.logprobs += delta.logprobs
        text = self.tokenizer.decode(state.token_ids)
        for stop in stops:
            at = text.find(stop, max(0, len(state.text) - len(stop)))
            if at >= 0:
                text, state.finish_reason, state.stopped_by_string = text[:at], "stop", True
        state.text = text
        if state.finish_reason is None:
            state.finish_reason = delta.finish_reason
        return True

    @staticmethod
    def streamable(state: SampleState, stops: list[str]) -> str:
        """Text not yet streamed that no later token can change: a trailing partial UTF-8
        character, or a tail that may begin a stop string, waits for the next token."""
        end = len(state.text)
        if state.finish_reason is None:
            while end > state.sent and state.text[end - 1] == "\ufffd":
                end -= 1
            for stop in stops:
                for k in range(min(len(stop) - 1, end - state.sent), 0, -1):
                    if state.text[end - k:end] == stop[:k]:
                        end -= k
                        break
        delta = state.text[state.sent:end]
        state.sent = max(state.sent, end)
        return delta
