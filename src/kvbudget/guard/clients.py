"""Fairness between clients: who a request comes from, and how many of its requests may be in flight at once.

A client is its API key where the guard has keys, else the header a trusted proxy names it by (`client_header`,
read only on connections from `trusted_proxies`), else its address. A client at its cap of requests in flight
is answered at once with 429 and Retry-After; the others are served as before. (Open connections per client are
capped in the HTTP protocol, by address: `ConnectionLimits.max_connections_per_client`.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from kvbudget.guard.config import ClientLimits


class Clients:
    """Requests in flight per client."""

    def __init__(self, limits: ClientLimits):
        self.limits = limits
        self.in_flight: dict[str, int] = {}

    def identify(self, headers: Mapping[str, str], peer: str, key: str | None) -> str:
        """The client a request comes from, as logs may show it (a key by a digest of it, never the key)."""
        if key is not None:
            return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]
        if self.limits.header and peer in self.limits.trusted:
            named = headers.get(self.limits.header, "").strip()
            if named:
                return "id:" + named[:128]
        return "addr:" + peer

    def enter(self, client: str) -> Callable[[], None] | None:
        """One more request of `client` in flight, and its release (which runs once); None at the cap."""
        cap = self.limits.max_in_flight
        held = self.in_flight.get(client, 0)
        if cap is not None and held >= cap:
            return None
        self.in_flight[client] = held + 1
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self.in_flight[client] - 1
            if left:
                self.in_flight[client] = left
            else:
                del self.in_flight[client]

        return release
