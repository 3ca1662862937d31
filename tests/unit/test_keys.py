"""job_lock_key: FNV-1a 64 as a signed int64, identical to Go's int64(fnv.New64a().Sum64())."""

from __future__ import annotations

import pytest

from replicron import InvalidJobNameError, ReplicronError, check_job_name, job_lock_key

# Printed by Go 1.19's hash/fnv (`int64(h.Sum64())` after `h.Write([]byte(s))`); the first
# four also match the FNV reference test suite.
GO_VECTORS = [
    ("", 14695981039346656037, -3750763034362895579),
    ("a", 12638187200555641996, -5808556873153909620),
    ("b", 12638190499090526629, -5808553574619024987),
    ("foobar", 9625390261332436968, -8821353812377114648),
    ("fo", 619342838404076354, 619342838404076354),
    ("nightly-report", 4417635575514249131, 4417635575514249131),
    ("billing:invoices", 4090374556999641110, 4090374556999641110),
    ("cleanup", 12418740963103222451, -6028003110606329165),
    ("ключ", 2981718160205118081, 2981718160205118081),
    ("日本語ジョブ", 28816547800643507, 28816547800643507),
    ("job-42", 9959384804527333285, -8487359269182218331),
    ("replicron", 7263977266545953827, 7263977266545953827),
]


@pytest.mark.parametrize(("name", "unsigned", "signed"), GO_VECTORS)
def test_matches_go(name: str, unsigned: int, signed: int) -> None:
    key = job_lock_key(name)
    assert key == signed
    assert key % 2**64 == unsigned
    assert -(2**63) <= key < 2**63


def test_vectors_cover_both_signs() -> None:
    assert any(u >= 2**63 for _, u, _ in GO_VECTORS)
    assert any(u < 2**63 for _, u, _ in GO_VECTORS)


def test_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        job_lock_key(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        (" padded", "leading or trailing whitespace"),
        ("a" * 201, "longer than 200"),
        ("tab\there", "control characters"),
        ("line\nbreak", "control characters"),
        (42, "must be a str"),
    ],
)
def test_bad_job_names(name: object, message: str) -> None:
    with pytest.raises(InvalidJobNameError, match=message) as info:
        check_job_name(name)
    assert isinstance(info.value, ReplicronError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["report", "billing:invoices/daily", "ключ", "a" * 200])
def test_good_job_names(name: str) -> None:
    assert check_job_name(name) == name


def test_the_lock_key_registry_refuses_a_second_name_on_one_key() -> None:
    from replicron import LockKeyCollisionError
    from replicron.keys import LockKeyRegistry

    # No two real names with one FNV-1a 64 key are known: the key function is given.
    registry = LockKeyRegistry(lambda name: 42)
    assert registry.register("cleanup") == 42
    registry.register("cleanup")  # the same name again is no collision
    with pytest.raises(LockKeyCollisionError, match="'job-42' has the same lock key"):
        registry.register("job-42")
    registry.unregister("job-42")  # not registered: the key stays with cleanup
    with pytest.raises(LockKeyCollisionError):
        registry.register("job-42")
    registry.unregister("cleanup")
    registry.register("job-42")
