"""Beam search one step at a time over the core's sequences, selecting candidates exactly as
transformers 5.24 does (GenerationMixin._beam_search with do_sample=False).

Each step, every live beam's next-token log-probabilities (log_softmax of its fp32 logits) are
added to its cumulative score; the best 2 * width candidates over all beams are taken with one
torch.topk over the flattened [beam, token] scores, and the first width of them become the new
beams, best first. The first step has a single live sequence (the prompt): as in transformers,
it is laid out as width identical rows of which all but row 0 carry a score of -1e9, so the
candidates, and the order of equal scores, come out of the same topk call.

EOS: with ignore_eos every beam runs exactly max_tokens tokens and EOS is never a candidate (its
log-probability is set to -inf after the log_softmax, the others are not renormalised), which
is what transformers' min_new_tokens = max_new_tokens does. All beams then end together with
the same length, so length_penalty and early_stopping cannot change the result: the returned
beams are the last step's width best candidates, best first. Beam search without ignore_eos
(beams ending at EOS at different lengths) is not implemented.

The core does the memory side: the samples handed back name each candidate's parent sequence;
a parent with several candidates is forked, a beam no candidate names is dropped, and the core
records which sequence each candidate went into (SequenceGroup.sample_seq_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagesim.core import Sample, SequenceGroup

# transformers' score for the not-yet-live beams at the first step
_DEAD_BEAM_SCORE = -1e9


@dataclass
class BeamSearch:
    """One request's beams. seq_ids and scores are in transformers' beam order (best first)."""

    width: int
    exclude_token: int | None  # EOS under ignore_eos: never a candidate
    seq_ids: list[int] = field(default_factory=list)
    scores: torch.Tensor | None = None  # fp32 cumulative log-probs, as transformers keeps them
    # per step after the first: parent_ranks[t][i] = rank (before step t) of the parent of the
    # beam ranked i after step t
    parent_ranks: list[list[int]] = field(default_factory=list)
    pending: torch.Tensor | None = None  # scores of the samples handed to the core this step

    def step(self, group: SequenceGroup, logits: dict[int, torch.Tensor]) -> list[Sample]:
        """Candidates for one step, as Samples, from each live beam's logits (by seq id)."""
        first = self.scores is None
        if first:
            (seq_id,) = logits  # the prompt's sequence, before it forks into the beams
            self.seq_ids = [seq_id]
            rows = logits[seq_id].float().cpu().expand(self.width, -1)
            scores = torch.full((self.width,), _DEAD_BEAM_SCORE, dtype=torch.float32)
            scores[0] = 0.0
        else:
            if set(logits) != set(self.seq_ids):
                raise ValueError(f"request {group.request_id}: beam search needs every live beam due a token in the "
                                 f"same step (due {sorted(logits)}, live {self.seq_ids}); chunked prefill split a "
                                 "recomputed beam group")
            rows = torch.stack([logits[i].float().cpu() for i in self.seq_ids])
            scores = self.scores
        logprobs = torch.log_softmax(rows, dim=-1)
        if self.exclude_token is not None:
            logprobs[:, self.exclude_token] = float("-inf")
        vocab = logprobs.shape[-1]
        total = (logprobs + scores[:, None]).reshape(-1)
        # transformers keeps 2 * width candidates (room for EOS hypotheses) and continues with the
        # first width of them
        values, index = torch.topk(total, k=min(2 * self.width, total.numel()))
        values, index = values[:self.width], index[:self.width]
        ranks = (index // vocab).tolist()
        tokens = (index % vocab).tolist()
        if max(ranks) >= len(self.seq_ids):  # only a vocabulary smaller than the width can do this
            raise ValueError(f"request {group.request_id}: beam width {self.width} needs at least that many candidate tokens")
        samples = [Sample(self.seq_ids[r], t, float(logprobs[r, t])) for r, t in zip(ranks, tokens)]
        if not first:
            self.parent_ranks.append(ranks)
        self.pending = values
        return samples

    def after_update(self, group: SequenceGroup) -> None:
        """Learn which sequence each new beam became."""
        self.seq_ids = list(group.sample_seq_ids)  # the core's record of where each sample went
        self.scores = self.pending
        self.pending = None

    def outputs(self, group: SequenceGroup) -> list[list[int]]:
        """The finished beams' output tokens, best first (transformers' order)."""
        by_id = {seq.seq_id: seq for seq in group.finished_seqs}
        return [by_id[i].output_token_ids for i in self.seq_ids]
