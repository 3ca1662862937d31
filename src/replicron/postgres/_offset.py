"""The offset of this replica's clock from the database's, measured on round trips.

Each round trip that returns the database's ``clock_timestamp()`` is a sample: the database
read its clock somewhere between our send and our receipt, so the offset is estimated from
the midpoint, with an error of at most half the round trip (NTP's reasoning). The sample with
the shortest round trip among the recent ones is the best estimate.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta
from typing import NamedTuple

__all__ = ["STEP_TOLERANCE", "ClockSample", "OffsetEstimator"]

#: Seconds two samples may disagree beyond their round trips' error bounds before the clock is
#: taken to have stepped (slack for both clocks' rates between samples).
STEP_TOLERANCE = 0.05


class ClockSample(NamedTuple):
    #: Seconds the database's clock is ahead of ours (negative: ours is ahead).
    offset: float
    #: The round trip, in seconds: twice the bound on this sample's error.
    round_trip: float
    #: When it was taken (monotonic seconds).
    taken_at: float


class OffsetEstimator:
    """Keeps the last ``keep`` samples; the estimate is the offset of the sample with the
    shortest round trip among those younger than ``window`` seconds (the newest one if all
    are older), so a slow round trip never moves it much and a drifting clock is followed. A
    sample that contradicts the estimate beyond both error bounds means a clock stepped: the
    older samples are dropped and the estimate follows at once."""

    def __init__(self, keep: int = 16, window: float = 300.0) -> None:
        self._samples: deque[ClockSample] = deque(maxlen=keep)
        self._window = window
        # The estimate as of the last sample, one reference: read from any thread.
        self.current: timedelta | None = None

    def add(
        self,
        database_time: datetime,
        sent_wall: float,
        received_wall: float,
        sent_mono: float,
        received_mono: float,
    ) -> ClockSample:
        """Add a sample: the database's clock as it answered, our wall clock (Unix seconds)
        and monotonic clock when the request was sent and the answer received."""
        round_trip = max(0.0, received_mono - sent_mono)
        midpoint = sent_wall + (received_wall - sent_wall) / 2
        sample = ClockSample(database_time.timestamp() - midpoint, round_trip, received_mono)
        best = self.best(received_mono)
        if best is not None and abs(sample.offset - best.offset) > (
            (sample.round_trip + best.round_trip) / 2 + STEP_TOLERANCE
        ):
            # The two cannot both be right: a clock stepped (NTP, a suspend, an operator).
            # The older samples describe a clock that no longer exists.
            self._samples.clear()
        self._samples.append(sample)
        best = self.best(received_mono)
        self.current = None if best is None else timedelta(seconds=best.offset)
        return sample

    def best(self, now_mono: float) -> ClockSample | None:
        if not self._samples:
            return None
        recent = [s for s in self._samples if now_mono - s.taken_at <= self._window]
        if not recent:
            return self._samples[-1]
        return min(recent, key=lambda s: s.round_trip)
