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
    # Seed 0 is the first of the generic generator's seeds to find it.
    outcome = simulate(0, "lease", "release_loses_outcomes")
    assert any("never reached the server" in v for v in outcome.violations), outcome.report()
    assert simulate(0, "lease").ok


@pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/protocol.md): a run whose lock was taken over is not counted "
    "against max_runs until a janitor writes it off",
)
def test_a_run_whose_lock_was_taken_over_still_counts_against_max_runs() -> None:
    outcome = simulate(56, "lease")
    assert not [v for v in outcome.violations if v.startswith("max_runs")], outcome.report()


@pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/protocol.md): the ticks of a limited job missed before its last "
    "run go unrecorded when the claim of that run commits first",
)
def test_the_ticks_a_limited_job_missed_before_its_last_run_are_recorded() -> None:
    outcome = simulate(167, "advisory")
    assert not [v for v in outcome.violations if v.startswith("I6")], outcome.report()
