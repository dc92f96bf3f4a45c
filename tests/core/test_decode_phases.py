"""DecodeBatch files its sequences by the phase of the steps at which they take blocks; a run's
new blocks (blocks_taken) must be those single steps take, in their order. Checked against the
step-by-step rule itself: a sequence with r steps of room takes a block at steps r, r + bs, ...
(counted from the batch's clock), and within one step the sequences go in batch order."""

import math
import random

import pytest

from pagesim.core.decode_batch import DecodeBatch


def stepwise(seqs, rooms, num_steps, bs):
    """The sequences taking a block at each of num_steps single steps, in order (brute force)."""
    taking, counts = [], []
    for step in range(num_steps):
        now = [seq for seq, room in zip(seqs, rooms) if room != math.inf and step >= room and (step - room) % bs == 0]
        taking += now
        counts.append(len(now))
    return taking, counts


def filed(seqs, rooms, clock, bs):
    batch = DecodeBatch([], list(seqs), [], [], 0, clock, [], [[] for _ in range(bs)], bs)
    batch.file_due(seqs, rooms)
    return batch


@pytest.mark.parametrize("seed", range(40))
def test_blocks_taken_is_the_stepwise_order(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    seqs = [object() for _ in range(rng.randint(1, 30))]
    rooms = [math.inf if rng.random() < 0.1 else rng.randrange(bs) for _ in seqs]
    batch = filed(seqs, rooms, rng.randrange(1000), bs)
    for num_steps in (1, 2, bs - 1, bs, bs + 1, 3 * bs + rng.randrange(bs), 200):
        if num_steps >= 1:
            assert batch.blocks_taken(num_steps) == stepwise(seqs, rooms, num_steps, bs)


def test_phases_hold_after_the_clock_moves_and_sequences_leave():
    rng = random.Random(7)
    bs = 16
    seqs = [object() for _ in range(25)]
    rooms = [rng.randrange(bs) for _ in seqs]
    batch = filed(seqs, rooms, 5, bs)
    batch.move_on(37)  # every room is 37 steps less, modulo the blocks taken meanwhile
    rooms = [(room - 37) % bs for room in rooms]
    gone = set(rng.sample(range(len(seqs)), 8))
    batch.drop_due([seqs[i] for i in sorted(gone)])
    kept = [i for i in range(len(seqs)) if i not in gone]
    expected = stepwise([seqs[i] for i in kept], [rooms[i] for i in kept], 50, bs)
    assert batch.blocks_taken(50) == expected
    # a later sequence (appended at the batch's end) goes after the others of its phase
    late = object()
    batch.file_due([late], [3])
    seqs_now = [seqs[i] for i in kept] + [late]
    assert batch.blocks_taken(50) == stepwise(seqs_now, [rooms[i] for i in kept] + [3], 50, bs)


def test_a_room_of_a_block_or_more_keeps_no_phases():
    batch = filed([object(), object()], [3, 16], 0, 16)
    assert batch.due is None  # (plan_decode then asks the KV manager for rooms every run)
