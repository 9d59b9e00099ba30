"""How loudly the Kafka listener says it refused a connection: the first refusal of
each kind from a client host is a WARNING, the rest are counted.

A client that cannot speak to the listener (a bad frame, no SASL first, a broken or
hostile client) tends to reconnect and fail again many times a second, and one warning
a connection buries the log. So, per (client host, kind of refusal): the first one is
warned of; those after it within warn_interval_s are logged at debug and counted; the
first one after that window is warned of again, saying how many were counted since the
last warning. The kinds are the REFUSED_* names below. At most hosts_max hosts are
remembered; past that every window starts afresh (a few more warnings, never unbounded
memory). Time is passed in: no clock here.
"""

from __future__ import annotations

from typing import Final

from msgspec import Struct

REFUSED_TOO_LARGE: Final = "frame_too_large"  # a frame over the frame limit
REFUSED_MALFORMED: Final = "malformed"  # bytes that are no request, or break its spec
REFUSED_UNAUTHENTICATED: Final = "unauthenticated"  # a request before SASL
REFUSED_FULL: Final = "connections_max"  # the listener holds its limit of connections
REFUSED_AUTH_FAILED: Final = "sasl_failed"  # SASL/PLAIN with a wrong password


class Verdict(Struct, frozen=True):
    """What to do with one refusal: warn (else log at debug), and how many refusals of
    its kind from its host went unwarned since the last warning (when warn)."""

    warn: bool
    unwarned: int


class _Seen(Struct):
    warned_at: float
    unwarned: int


class Refusals:
    def __init__(self, warn_interval_s: float, hosts_max: int) -> None:
        self.warn_interval_s = warn_interval_s
        self.hosts_max = hosts_max
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._hosts: set[str] = set()

    def refused(self, host: str, kind: str, now: float) -> Verdict:
        """Note one refusal of kind from host at now (seconds, any monotonic clock)."""
        seen = self._seen.get((host, kind))
        if seen is not None and now - seen.warned_at < self.warn_interval_s:
            seen.unwarned += 1
            return Verdict(False, 0)
        if seen is None and host not in self._hosts and len(self._hosts) >= self.hosts_max:
            self._seen.clear()  # many hosts: every window starts afresh
            self._hosts.clear()
        unwarned = seen.unwarned if seen is not None else 0
        self._seen[(host, kind)] = _Seen(now, 0)
        self._hosts.add(host)
        return Verdict(True, unwarned)

    def __len__(self) -> int:
        """The hosts remembered."""
        return len(self._hosts)


def host_of(peer: str) -> str:
    """The host of a peer "HOST:PORT" ("[::1]:PORT" too), as refusals are counted."""
    return peer.rpartition(":")[0] or peer
