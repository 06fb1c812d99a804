"""Extract the command-line flags each vLLM release's `vllm serve` defines, from its own source, into
src/kvbudget/engines/vllm/flags.json (the launcher's emitted flags are checked against it in the default tests).

    python scripts/vllm_flags.py RELEASE=PATH [RELEASE=PATH ...]

PATH is a release's sdist (vllm-X.tar.gz) or an unpacked vllm package folder (a wheel's site-packages/vllm). The
flags are every quoted "--flag" literal in vllm/engine/arg_utils.py (EngineArgs.add_cli_args and
AsyncEngineArgs.add_cli_args) and in the OpenAI server's cli_args.py (vllm/entrypoints/openai/cli_args.py, from
0.32 vllm/entrypoints/launchers/cli_args.py, from 0.33 vllm/entrypoints/common/cli_args.py), and from 0.10 the
fields of that file's FrontendArgs dataclass. A boolean field's `--no-` form (argparse.BooleanOptionalAction, made
by get_kwargs for `bool | None` fields from 0.8.5) is recorded under "negatable" where the launcher emits it;
--kv-cache-dtype's choices are the CacheDType literal of vllm/config.py (vllm/config/cache.py from 0.10).
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

FILES = ("vllm/engine/arg_utils.py", "vllm/config.py", "vllm/config/cache.py", "vllm/entrypoints/openai/cli_args.py",
         "vllm/entrypoints/launchers/cli_args.py", "vllm/entrypoints/common/cli_args.py")
FLAG = re.compile(r"""["'](--[a-z0-9][a-z0-9-]*)["']""")
# from 0.10 the server's own flags are the fields of cli_args.py's FrontendArgs dataclass (--port is `port: int`)
FRONTEND = re.compile(r"^class (?:Base)?FrontendArgs\b.*?(?=^\S)", re.M | re.S)
CACHE_DTYPES = re.compile(r"^CacheDType = Literal\[(.*?)\]", re.M | re.S)
FIELD = re.compile(r"^    ([a-z][a-z0-9_]*): ", re.M)
NEGATABLE = ("--enable-prefix-caching", "--enable-extensible-kv-cache")  # bool | None fields the launcher turns off
# with --no- (the extensible KV cache from 0.34)


def sources(path: Path) -> dict[str, str]:
    """The text of each of FILES the release has."""
    found: dict[str, str] = {}
    if path.is_file():
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                tail = member.name.split("/", 1)[-1]
                if tail in FILES and (fh := tar.extractfile(member)) is not None:
                    found[tail] = fh.read().decode()
    else:
        for name in FILES:
            file = path.parent / name
            if file.exists():
                found[name] = file.read_text()
    return found


def main(argv: list[str]) -> None:
    out = Path(__file__).resolve().parent.parent / "src/kvbudget/engines/vllm/flags.json"
    data = json.loads(out.read_text()) if out.exists() else {"releases": {}}
    for arg in argv:
        release, _, where = arg.partition("=")
        texts = sources(Path(where))
        flags = sorted({f for text in texts.values() for f in FLAG.findall(text)}
                       | {"--" + name.replace("_", "-") for text in texts.values() for block in FRONTEND.findall(text)
                          for name in FIELD.findall(block)})
        dtypes = [d for text in texts.values() for block in CACHE_DTYPES.findall(text)
                  for d in re.findall(r'"([a-z0-9_]+)"', block)]
        wheel = sorted(Path(where).parent.glob("vllm*.dist-info"))  # an installed package: its distribution
        origin = Path(where).name if Path(where).is_file() else (wheel[0].name.removesuffix(".dist-info") + " wheel"
                                                                 if wheel else "an installed vllm")
        data["releases"][release] = {"source": f"{origin}: " + ", ".join(sorted(texts)), "flags": flags,
                                     "kv_cache_dtypes": dtypes,
                                     "negatable": [f for f in NEGATABLE if f in flags]}
    data["releases"] = dict(sorted(data["releases"].items(), key=lambda kv: tuple(map(int, kv[0].split(".")))))
    data["about"] = __doc__.strip().splitlines()[0] + " Written by scripts/vllm_flags.py."
    data["licence"] = "the flag names are read from vLLM's source (github.com/vllm-project/vllm), Apache-2.0"
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
