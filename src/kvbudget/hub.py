"""Whether the Hugging Face Hub can be reached, found once per process, so that offline machines fail in well under
a second instead of waiting through huggingface_hub's retries (its cache is still read)."""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from urllib.parse import urlparse

CONNECT_TIMEOUT = 1.5  # seconds for one TCP connection to the Hub's endpoint


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@lru_cache(maxsize=1)
def offline_reason() -> str | None:
    """None when the Hub answers; else why it is taken as unreachable (HF_HUB_OFFLINE, or no connection)."""
    if _truthy(os.environ.get("HF_HUB_OFFLINE")):
        return "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        return f"{host} did not answer: {exc.strerror or type(exc).__name__}"
    return None
