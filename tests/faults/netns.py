"""A network namespace for one replica, and a kernel-level partition of it.

The namespace is joined to the host by a veth pair in a /30 of 10.213.0.0/16 that no
interface of the machine has yet, chosen as the session starts (:meth:`NetworkNamespace.
create`): the host side is its first address (the session's PostgreSQL and pgbouncers
listen there too), the namespace side its second. A replica started with
:meth:`NetworkNamespace.command` reaches the cluster only through that link. Names and
addresses are the session's own, so two sessions can run side by side.

:meth:`partition` loads an nftables table *inside the namespace* whose input and output
chains drop everything but loopback. Packets vanish in both directions, so neither end sees
a FIN or an RST: established connections just stop moving, as on a cut cable or a dead
switch, and only timeouts (TCP keepalives, ``tcp_user_timeout``) can notice. :meth:`heal`
removes the table and the very same connections carry on.
"""

from __future__ import annotations

import fcntl
import ipaddress
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["NetworkNamespace", "NetworkNamespaceError", "destroy_namespace"]

#: The addresses sessions choose their links in, one /30 each.
_SUBNETS = ipaddress.ip_network("10.213.0.0/16")
#: Held while a session chooses and takes its /30, so that two starting at once cannot both
#: find the same one free.
_CHOOSING_LOCK = Path(tempfile.gettempdir()) / "replicron-faults-netns.lock"

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


def _host_link(name: str) -> str:
    return f"{name}h"  # interface names have at most 15 characters


def destroy_namespace(name: str) -> None:
    """Remove the namespace ``name`` and its link (idempotent: missing pieces are fine).
    Deleting the host end of a veth pair deletes both ends, and the namespace's nft table
    goes with the namespace."""
    if not name:
        return
    if _host_link(name) in _run(["ip", "-o", "link", "show"], check=False):
        _run(["ip", "link", "del", _host_link(name)], check=False)
    if name in _run(["ip", "netns", "list"], check=False).split():
        _run(["ip", "netns", "del", name], check=False)


def _addresses_in_use() -> set[ipaddress.IPv4Address]:
    listing = _run(["ip", "-o", "-4", "addr", "show"], check=False)
    return {
        ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).ip
        for fields in (line.split() for line in listing.splitlines())
        if "inet" in fields
    }


class NetworkNamespace:
    """A namespace named after ``tag`` (a few letters or digits, the session's own) with a
    veth link to the host in a /30 nobody uses, chosen by :meth:`create`."""

    def __init__(self, tag: str, *, prefix_length: int = 30) -> None:
        self.name = f"rcf{tag}"
        self.host_link = _host_link(self.name)
        self.namespace_link = f"{self.name}n"
        self.prefix_length = prefix_length
        self.host_address = ""
        self.namespace_address = ""
        self.partitioned = False

    # ---- life cycle ------------------------------------------------------------------------

    def create(self) -> None:
        """Create the namespace and its link in a free /30."""
        destroy_namespace(self.name)
        with _CHOOSING_LOCK.open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            in_use = _addresses_in_use()
            subnet = next(
                (
                    net
                    for net in _SUBNETS.subnets(new_prefix=self.prefix_length)
                    if not in_use.intersection(net)
                ),
                None,
            )
            if subnet is None:
                raise NetworkNamespaceError(f"no free /{self.prefix_length} in {_SUBNETS}")
            host, inside = list(subnet.hosts())[:2]
            self.host_address, self.namespace_address = str(host), str(inside)
            try:
                self._create_link()
            except BaseException:
                self.destroy()
                raise

    def _create_link(self) -> None:
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

    def destroy(self) -> None:
        """Remove the namespace and the link (idempotent)."""
        self.partitioned = False
        destroy_namespace(self.name)

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
