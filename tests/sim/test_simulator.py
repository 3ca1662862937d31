"""The simulator runs the real engine and backend on virtual time, the same seed gives the
same trace, seeds of the generic fault generator keep every invariant, and a fault fixed
before, put back, is found."""

from __future__ import annotations

import pytest

from tests.sim.replica import Mode
from tests.sim.simulation import simulate

#: Seeds run here, in both modes; ``bash scripts/simulate`` runs thousands.
SEEDS = range(6)


@pytest.mark.parametrize("mode", ["advisory", "lease"])
def test_seeds_of_faulted_replicas_keep_every_invariant(mode: Mode) -> None:
    failures = [o.report() for seed in SEEDS if not (o := simulate(seed, mode)).ok]
    assert failures == []


def test_a_seed_gives_the_same_trace_every_time() -> None:
    first, again = simulate(3, "lease"), simulate(3, "lease")
    assert first.trace == again.trace
    assert len(first.trace) > 50  # the replicas did run: starts, faults


def test_a_release_that_forgets_its_outcomes_is_found() -> None:
    # Seed 9 is the first of the generic generator's seeds to find it.
    outcome = simulate(9, "advisory", "release_loses_outcomes")
    assert any("never reached the server" in v for v in outcome.violations), outcome.report()
    assert simulate(9, "advisory").ok
