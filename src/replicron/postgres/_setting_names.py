"""How the surface that builds a backend spells its settings, so that a refusal tells the
user what to write where they configure replicron: a keyword argument in Python, a key of a
daemon's TOML config, a key of a Django project's ``REPLICRON`` setting."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PYTHON_NAMES", "SettingNames"]


@dataclass(frozen=True)
class SettingNames:
    """The settings a transaction-pooler refusal names, as the user sets them; the defaults
    are :class:`PostgresBackend`'s keyword arguments. The daemon and the Django app pass
    their own spellings."""

    #: Row-lease coordination, which works through any pooler.
    lease: str = 'PostgresBackend(..., coordination="lease")'
    #: Advisory coordination through a pooler that runs in session mode.
    session_pooler: str = "PostgresBackend(..., session_pooler=True)"

    def behind_a_pooler(self) -> str:
        """What to do about a transaction pooler, the fix first."""
        return (
            f"Behind a transaction pooler use row-lease coordination: {self.lease}; or connect "
            "replicron directly to PostgreSQL"
        )


#: The settings as Python code passes them to :class:`PostgresBackend`.
PYTHON_NAMES = SettingNames()
