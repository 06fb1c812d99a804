"""The guard side by side with another build of it, and with nginx: alternating saturation bursts through each,
in front of one upstream stub.

    python benchmarks/ab_guard.py [--base /tmp/old/src] [--nginx] [--rounds 10] [--seconds 3] [--concurrency 32]

`--base` is the `src` folder of another checkout (for example `git worktree add /tmp/old <commit>`); `--nginx`
adds nginx (one process, keep-alive to the upstream, no access log) as a plain reverse proxy. All run at once;
each round sends a closed-loop burst through each in turn (the order rotating every round), so drift in the
machine's speed falls on all. Prints, per proxy, the median and range of requests/s and of its CPU time per
request, and the ratios of the medians to this checkout's guard; asserts nothing. A single burst varies by 15-30%
on a 2-core machine: use 10 rounds or more.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_guard import HERE, closed_loop, cpu_seconds, free_port, start_guard, wait

SRC = HERE.parent / "src"


NGINX = """worker_processes 1; master_process off; daemon off; pid {dir}/nginx.pid; error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream stub {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://stub; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
}}
"""


def start_nginx(upstream: int, port: int, folder: Path) -> subprocess.Popen:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        sys.exit("--nginx: no nginx on PATH or in /usr/sbin (apt-get install nginx-light)")
    config = folder / "nginx.conf"
    config.write_text(NGINX.format(dir=folder, upstream=upstream, port=port))
    return subprocess.Popen([binary, "-c", str(config), "-p", str(folder)], stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, help="the src folder of another build of the guard to compare with")
    parser.add_argument("--nginx", action="store_true", help="add nginx as a plain reverse proxy")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if args.base is not None and not (args.base / "kvbudget").is_dir():
        sys.exit(f"--base {args.base}: no kvbudget package there; give a checkout's src folder")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(HERE / "upstream_stub.py"), str(up_port)])
    builds = {"this": SRC, **({"base": args.base.resolve()} if args.base else {})}
    names = [*builds, *(["nginx"] if args.nginx else [])]
    ports = {name: free_port() for name in names}
    procs = {name: start_guard(f"http://127.0.0.1:{up_port}", ports[name], src) for name, src in builds.items()}
    folder = Path(tempfile.mkdtemp(prefix="ab-nginx-"))
    folder.chmod(0o755)
    if args.nginx:
        procs["nginx"] = start_nginx(up_port, ports["nginx"], folder)
    rps: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    errors: dict[str, collections.Counter] = {name: collections.Counter() for name in names}
    try:
        wait(f"http://127.0.0.1:{up_port}/v1/models")
        for name in names:
            wait(f"http://127.0.0.1:{ports[name]}/{'healthz' if name in builds else 'v1/models'}")
            asyncio.run(closed_loop(f"http://127.0.0.1:{ports[name]}", args.concurrency, 1))  # warm up
        for i in range(args.rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                before = cpu_seconds(procs[name].pid)
                rate = asyncio.run(closed_loop(f"http://127.0.0.1:{ports[name]}", args.concurrency, args.seconds,
                                               errors=errors[name]))
                rps[name].append(rate)
                cpu[name].append((cpu_seconds(procs[name].pid) - before) / (rate * args.seconds) * 1e6)
        print(f"{args.rounds} rotating rounds of {args.seconds:g} s at concurrency {args.concurrency}, "
              f"{os.cpu_count()} CPUs; " + ", ".join(f"{name}: {src}" for name, src in builds.items()))
        for name in names:
            print(f"{name:5s}: {statistics.median(rps[name]):,.0f} requests/s (range {min(rps[name]):,.0f}-"
                  f"{max(rps[name]):,.0f}); CPU {statistics.median(cpu[name]):.0f} us a request (range "
                  f"{min(cpu[name]):.0f}-{max(cpu[name]):.0f})"
                  + (f"; not 200: {dict(errors[name])}" if errors[name] else ""))
        for name in names[1:]:
            wins = sum(t > b for t, b in zip(rps["this"], rps[name]))
            print(f"this / {name}: throughput {statistics.median(rps['this']) / statistics.median(rps[name]):.2f}, "
                  f"CPU a request {statistics.median(cpu['this']) / statistics.median(cpu[name]):.2f}; "
                  f"this faster in {wins} of {args.rounds} rounds")
    finally:
        for proc in (*procs.values(), upstream):
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
