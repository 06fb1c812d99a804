"""Rerun the console examples of the README and the docs and write what each command prints now under it, for a
change that moves figures on purpose. Review the diff before committing: the pages are what users read, and
tests/contract/test_docs.py then holds them. Outputs that elide lines with `...` are kept as they are and listed
for a person to redo.

    python scripts/refresh_docs.py [PAGE ...]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "contract"))
from test_docs import ALL, commands, environment, shows  # noqa: E402


def refreshed(body: str, cwd: Path) -> tuple[str, list[str]]:
    """The block's body with each command's output as it prints now, and the commands left for a person."""
    out: list[str] = []
    left: list[str] = []
    raw = body.rstrip("\n").split("\n")
    i = 0
    for command, expected in commands(body):
        while not raw[i].startswith("$ "):
            i += 1
        start = i
        i += 1
        while raw[start].rstrip().endswith("\\") and i < len(raw) and not raw[i].startswith("$ "):
            i += 1  # the command's continuation lines
        while i < len(raw) and not raw[i].startswith("$ "):
            i += 1
        shown = raw[start:start + (len(raw[start:i]) - len(expected))]
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=environment(cwd), capture_output=True,
                              text=True, timeout=300)
        actual = [line.rstrip() for line in (done.stdout + done.stderr).rstrip("\n").split("\n")]
        status = [f"(exit status {done.returncode})"] if done.returncode else []
        wanted = expected[:-1] if expected and re.fullmatch(r"\(exit status \d+\)", expected[-1]) else expected
        if shows(wanted, actual) is None:
            out += shown + expected
        elif any(line.strip() == "..." for line in expected):
            out += shown + expected
            left.append(command)
        else:
            out += shown + actual + status
    return "\n".join(out) + "\n", left


def main(pages: list[str]) -> None:
    chosen = {(REPO / p).resolve() for p in pages}
    for page in sorted({e.page for e in ALL if e.lang == "console" and not e.kind}):
        if chosen and page not in chosen:
            continue
        text = page.read_text(encoding="utf-8")
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            for name in ("docs", "tests"):
                (cwd / name).symlink_to(REPO / name)
            for example in [e for e in ALL if e.page == page and e.lang == "console" and not e.kind]:
                body, left = refreshed(example.body, cwd)
                text = text.replace(example.body, body, 1)
                for command in left:
                    print(f"{page.relative_to(REPO)}:{example.line}: redo by hand (it elides lines): {command}")
        page.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
