"""A batch with a tick asked for twice: handled once, every item answered."""

from __future__ import annotations

from datetime import timedelta, timezone

from replicron.backends.base import (
    ClaimRequest,
    ClaimStatus,
    answer_each,
    once_per_tick,
    taken_repeat,
)
from tests.helpers import z

T = z(2026, 1, 1)


def test_the_first_mention_of_each_tick_is_kept_and_repeats_get_the_repeat_answer() -> None:
    elsewhere = T.astimezone(timezone(timedelta(hours=2)))  # the same instant, another offset
    batch = [
        ClaimRequest("a", T, True),
        ClaimRequest("b", T, True),
        ClaimRequest("a", elsewhere, False),
        ClaimRequest("a", T + timedelta(seconds=1), True),
    ]
    unique, where = once_per_tick(batch)
    assert unique == [batch[0], batch[1], batch[3]]
    assert where == [0, 1, -1, 2]
    answers = answer_each(batch, ["first a", "b", "second a"], where, lambda item: "repeat")
    assert answers == ["first a", "b", "repeat", "second a"]
    assert taken_repeat(batch[2]).status is ClaimStatus.TAKEN
