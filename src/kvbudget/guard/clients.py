"""Fairness between clients: who a request comes from, and how many of its requests may be in flight at once.

A client is its API key where the guard has keys, else the header a trusted proxy names it by (`client_header`,
read only on connections from `trusted_proxies`), else its address. A client at its cap of requests in flight
is answered at once with 429 and Retry-After; the others are served as before. (Open connections per client are
capped in the HTTP protocol, by address: `ConnectionLimits.max_connections_per_client`.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvbudget.errors import UpstreamConfigError, spelled


@dataclass(frozen=True, kw_only=True)
class ClientLimits:
    max_in_flight: int | None = None  # requests in flight per client (None: no cap)
    header: str | None = None  # a request header naming the client, trusted only from `trusted`
    trusted: frozenset[str] = frozenset()  # addresses of proxies whose `header` is believed

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ClientLimits:
        cap = config.get("max_in_flight_per_client")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
            raise UpstreamConfigError(f"max_in_flight_per_client: must be a positive whole number (got {cap!r})",
                                      param="max_in_flight_per_client")
        header = config.get("client_header")
        trusted = config.get("trusted_proxies") or []
        if not isinstance(trusted, list | tuple) or not all(isinstance(t, str) for t in trusted):
            raise UpstreamConfigError("trusted_proxies: must be a list of addresses", param="trusted_proxies")
        if header is not None and (not isinstance(header, str) or not header.strip()):
            raise UpstreamConfigError("client_header: must be a header name", param="client_header")
        if header and not trusted:
            proxies = spelled("trusted_proxies", "--trusted-proxy ADDR")
            raise UpstreamConfigError(f"client_header: a header names a client only from a trusted proxy; give "
                                      f"{proxies} too (a client could name itself anything)", param="client_header")
        return cls(max_in_flight=cap, header=header.strip().lower() if header else None, trusted=frozenset(trusted))


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
