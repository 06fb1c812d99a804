"""Running independent simulations side by side: in this process, in a process pool (the default for sweeps), or
as Ray tasks on a local or remote Ray cluster. Every backend returns the results in the order of the inputs, so
a sweep's answer does not depend on where it ran."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from kvbudget.errors import KVBudgetError

T = TypeVar("T")


def check_backend(text: str) -> tuple[str, str | None]:
    """'process' | 'serial' | 'ray' | 'ray=ADDRESS' -> (kind, address)."""
    kind, eq, address = text.partition("=")
    if kind not in ("process", "serial", "ray") or (eq and (kind != "ray" or not address.strip())):
        raise KVBudgetError(f"backend {text!r}: choose process (the default), serial, ray (a local Ray) or "
                            "ray=ADDRESS (e.g. ray=auto, ray=10.0.0.5:6379)", param="backend")
    return kind, address.strip() or None


def run_all(task: Callable[..., T], calls: Sequence[tuple[Any, ...]], backend: str = "process",
            progress: Callable[[int, int], None] | None = None) -> list[T]:
    """`task(*call)` for every call, on `backend`; results in the order of `calls`. `task` and its arguments must
    pickle (a module-level function, plain data) for the process pool and Ray. `progress(done, total)` after each."""
    kind, address = check_backend(backend)
    total = len(calls)
    if kind == "ray":
        return _on_ray(task, calls, address, progress)
    if kind == "serial" or total <= 1:
        results = []
        for i, call in enumerate(calls, 1):
            results.append(task(*call))
            if progress is not None:
                progress(i, total)
        return results
    out: list[Any] = [None] * total
    with ProcessPoolExecutor(max_workers=min(total, os.cpu_count() or 1)) as pool:
        futures = {pool.submit(task, *call): i for i, call in enumerate(calls)}
        for done, future in enumerate(as_completed(futures), 1):
            out[futures[future]] = future.result()
            if progress is not None:
                progress(done, total)
    return out


def _on_ray(task: Callable[..., T], calls: Sequence[tuple[Any, ...]], address: str | None,
            progress: Callable[[int, int], None] | None) -> list[T]:
    try:
        import ray
    except ImportError:
        raise KVBudgetError("backend ray: Ray is not installed here: pip install 'kvbudget[ray]'",
                            param="backend") from None
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # Ray raises plain Exception when its node does not come up
            where = f"at {address}" if address else "on this machine"
            raise KVBudgetError(f"backend ray: cannot start or reach Ray {where}: {str(exc).splitlines()[0]}",
                                param="backend") from None
        started = True
    try:
        remote = ray.remote(task)
        refs = [remote.remote(*call) for call in calls]
        index = {ref: i for i, ref in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                out[index[ref]] = ray.get(ref)
                done += 1
                if progress is not None:
                    progress(done, len(refs))
        return out
    finally:
        if started:
            ray.shutdown()
