"""A step's samples taken into a sequence group (Scheduler.update): each due sequence takes its
own, a parent with several forks a child per extra sample (the executor's parallel samples and
beams), and a beam no sample names is dropped."""

from __future__ import annotations

from typing import Iterator

from pagesim.core.kv_manager import KVCacheManager
from pagesim.core.request import Sequence, SequenceGroup, SequenceStatus
from pagesim.core.step import Sample


def apply_samples(kv: KVCacheManager, seq_ids: Iterator[int], group: SequenceGroup, due: list[Sequence],
                  samples: list[Sample]) -> None:
    """Append each sample to its parent (the parent keeps its first sample, a further one
    forks a child), drop the due sequences no sample names, and record in
    group.sample_seq_ids the sequence each sample went into, so a driver can follow it."""
    if len(samples) == len(due):
        for sample, seq in zip(samples, due):
            if sample.parent_seq_id != seq.seq_id:
                break
        else:  # the common step: each due sequence takes one sample of its own, nothing forks or drops
            for seq, sample in zip(due, samples):
                seq.append_token(sample.token_id, sample.logprob)
            group.sample_seq_ids = [seq.seq_id for seq in due]
            return
    by_parent: dict[int, list[int]] = {}  # parent seq id -> indices of its samples
    for i, sample in enumerate(samples):
        by_parent.setdefault(sample.parent_seq_id, []).append(i)
    # Beams that lost are freed before any fork: a manager that forks by copying (the
    # reservation baselines) hands the child the range a lost beam gives back.
    for seq in due:
        if seq.seq_id not in by_parent:
            seq.status = SequenceStatus.DROPPED
            kv.free(seq)
    placed = [0] * len(samples)
    new_seqs = []
    for seq in group.seqs:
        if seq not in due:
            new_seqs.append(seq)
            continue
        mine = by_parent.get(seq.seq_id)
        if not mine:  # a beam that lost (freed above)
            continue
        for i in mine[1:]:  # fork before the parent appends its own token
            child = seq.copy_as(next(seq_ids))
            kv.fork(seq, child)
            child.append_token(samples[i].token_id, samples[i].logprob)
            new_seqs.append(child)
            placed[i] = child.seq_id
        seq.append_token(samples[mine[0]].token_id, samples[mine[0]].logprob)
        new_seqs.append(seq)
        placed[mine[0]] = seq.seq_id
    group.seqs = new_seqs
    group.sample_seq_ids = placed
