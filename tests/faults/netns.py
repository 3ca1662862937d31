"""A network namespace for one replica, and a kernel-level partition of it.

The namespace is joined to the host by a veth pair in 10.213.0.0/30: the host side is
10.213.0.1 (the suite's PostgreSQL and pgbouncers listen there too), the namespace side
10.213.0.2. A replica started with :meth:`NetworkNamespace.command` reaches the cluster at
10.213.0.1 only through that link.

:meth:`partition` loads an nftables table *inside the namespace* whose input and output
chains drop everything but loopback. Packets vanish in both directions, so neither end sees
a FIN or an RST: established connections just stop moving, as on a cut cable or a dead
switch, and only timeouts (TCP keepalives, ``tcp_user_timeout``) can notice. :meth:`heal`
removes the table and the very same connections carry on.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

__all__ = ["NetworkNamespace", "NetworkNamespaceError"]

_PARTITION_TABLE = "replicron_partition"
_INPUT_CHAIN = """
    chain input {
        type filter hook input priority 0; policy drop;
        iif "lo" accept
    }"""
_OUTPUT_CHAIN = """
    chain output {
        type filter hook output priority 0; policy drop;
        oif "lo" accept
    }"""
_PARTITION_RULES = f"table inet {_PARTITION_TABLE} {{{_INPUT_CHAIN}{_OUTPUT_CHAIN}\n}}\n"
#: Only what comes in is dropped: requests reach the server and are carried out, their
#: answers are lost (a claim committed whose claimant never learns it won).
_ANSWERS_LOST_RULES = f"table inet {_PARTITION_TABLE} {{{_INPUT_CHAIN}\n}}\n"


class NetworkNamespaceError(RuntimeError):
    """An ``ip`` or ``nft`` command failed."""


def _run(command: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        list(command), input=stdin, capture_output=True, text=True, check=False, timeout=30
    )
    if check and result.returncode != 0:
        raise NetworkNamespaceError(
            f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


class NetworkNamespace:
    """The namespace ``name`` with a veth link to the host. Fixed names and addresses: one
    suite per machine at a time (the suite lock in :mod:`tests.faults.workdir` sees to it)."""

    def __init__(
        self,
        name: str = "replicron-faults",
        *,
        host_link: str = "rcfaults-host",
        namespace_link: str = "rcfaults-ns",
        host_address: str = "10.213.0.1",
        namespace_address: str = "10.213.0.2",
        prefix_length: int = 30,
    ) -> None:
        self.name = name
        self.host_link = host_link
        self.namespace_link = namespace_link
        self.host_address = host_address
        self.namespace_address = namespace_address
        self.prefix_length = prefix_length
        self.partitioned = False

    # ---- life cycle ------------------------------------------------------------------------

    def create(self) -> None:
        """Create the namespace and its link, removing leftovers of a crashed run first."""
        self.destroy()
        try:
            _run(["ip", "netns", "add", self.name])
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    self.host_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    self.namespace_link,
                    "netns",
                    self.name,
                ]
            )
            _run(
                [
                    "ip",
                    "addr",
                    "add",
                    f"{self.host_address}/{self.prefix_length}",
                    "dev",
                    self.host_link,
                ]
            )
            _run(["ip", "link", "set", self.host_link, "up"])
            self.exec(
                [
                    "ip",
                    "addr",
                    "add",
                    f"{self.namespace_address}/{self.prefix_length}",
                    "dev",
                    self.namespace_link,
                ]
            )
            self.exec(["ip", "link", "set", self.namespace_link, "up"])
            self.exec(["ip", "link", "set", "lo", "up"])
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        """Remove the namespace and the link (idempotent: missing pieces are fine). Deleting
        the host end of a veth pair deletes both ends, and the namespace's nft table goes
        with the namespace."""
        self.partitioned = False
        if self.host_link in _run(["ip", "-o", "link", "show"], check=False):
            _run(["ip", "link", "del", self.host_link], check=False)
        if self.name in _run(["ip", "netns", "list"], check=False).split():
            _run(["ip", "netns", "del", self.name], check=False)

    # ---- running things inside -------------------------------------------------------------

    def command(self, command: Sequence[str]) -> list[str]:
        """``command`` wrapped to run inside the namespace. ``ip netns exec`` execs it in
        place (no fork), so the pid of the started process is the command's own and signals
        reach it directly."""
        return ["ip", "netns", "exec", self.name, *command]

    def exec(self, command: Sequence[str], *, stdin: str | None = None) -> str:
        """Run ``command`` inside the namespace and return its output; raise if it fails."""
        return _run(self.command(command), stdin=stdin)

    # ---- faults ----------------------------------------------------------------------------

    def partition(self, *, answers_only: bool = False) -> None:
        """Drop every packet into and out of the namespace (loopback excepted); with
        ``answers_only``, only those coming in."""
        if self.partitioned:
            return
        rules = _ANSWERS_LOST_RULES if answers_only else _PARTITION_RULES
        self.exec(["nft", "-f", "-"], stdin=rules)
        self.partitioned = True

    def heal(self) -> None:
        """Let packets through again; connections that survived carry on."""
        if not self.partitioned:
            return
        self.exec(["nft", "delete", "table", "inet", _PARTITION_TABLE])
        self.partitioned = False

    def __repr__(self) -> str:
        state = "partitioned" if self.partitioned else "connected"
        return f"NetworkNamespace({self.name!r}, {self.namespace_address}, {state})"
