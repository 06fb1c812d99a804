"""Files kvbudget reads and writes. Reading: text streamed lazily, a file that cannot be read named in one line; a
JSON or YAML document read whole only within MAX_DOCUMENT_BYTES and MAX_NESTING, and only if it is UTF-8 text.
Writing: whole or not at all, and readable as any file the user creates (0666 less the umask: 0644 by default), so
that a Prometheus or a web server running as another user can read the rules and pictures."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from kvbudget.errors import KVBudgetError, TokenizerError

MAX_DOCUMENT_BYTES = 16 << 20  # 16 MiB: a config.json is under 20 KB, a guard YAML, calibration or report under 1 MB
MAX_NESTING = 64  # levels of [ and {: a config nests 3 (rope_scaling in text_config), a guard YAML 4
_JSON_STRINGS = r'"(?:[^"\\]|\\.)*"'  # compiled (and cached) by re on first use


def umask_mode() -> int:
    """0o666 less the process's umask (read and restored: os.umask has no read-only form)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def publish(tmp: str, target: str) -> None:
    """Give the finished temporary file the mode a new file would get, then rename it over `target`."""
    os.chmod(tmp, umask_mode())
    os.replace(tmp, target)


def iter_lines(path: str) -> Iterator[str]:
    """Lines of a (possibly huge) file, read lazily."""
    try:
        with open(path, encoding="utf-8", errors="strict") as fh:
            yield from fh
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def check_readable(*paths: str) -> None:
    """Fail as reading would (one line naming the file), before a tokenizer takes seconds to load."""
    for path in paths:
        if path == "-":
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TokenizerError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def too_deep(text: str, limit: int = MAX_NESTING) -> bool:
    """Whether [ and { (outside double-quoted strings) nest deeper than `limit`: JSON's parser, and YAML's for flow
    collections, recurse once per level (100,000 of them were a RecursionError)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = re.sub(r"[^\[\]{}]", "", re.sub(_JSON_STRINGS, "", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0) > limit


def read_document(path: str | os.PathLike[str], param: str, kind: str = "JSON",
                  error: type[KVBudgetError] = KVBudgetError) -> str:
    """The whole text of a document file: at most MAX_DOCUMENT_BYTES (checked before reading), UTF-8, no NUL bytes
    (a binary file), nested at most MAX_NESTING deep; else an `error` naming the file and `param`."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_DOCUMENT_BYTES:
                raise error(f"{path}: {size:,} bytes; kvbudget reads {kind} files of up to "
                                    f"{MAX_DOCUMENT_BYTES:,} bytes (16 MiB)", param=param)
            raw = fh.read(MAX_DOCUMENT_BYTES + 1)  # a file that grows while read stops here too
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc}); check the path and "
                            "permissions", param=param) from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise error(f"{path}: over {MAX_DOCUMENT_BYTES:,} bytes (16 MiB)", param=param)
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, "NUL byte")
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text (a binary file?); give a {kind} file",
                            param=param) from None
    if too_deep(text):
        raise error(f"{path}: nests [ and {{ more than {MAX_NESTING} levels deep; no {kind} file "
                            "kvbudget reads needs that many", param=param)
    return text


def read_json(path: str | os.PathLike[str], param: str, error: type[KVBudgetError] = KVBudgetError) -> Any:
    """A JSON document from a file (read_document's bounds), its errors naming the file and `param`."""
    text = read_document(path, param, error=error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                    param=param) from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise error(f"{path}: invalid JSON ({exc})".splitlines()[0], param=param) from None
    except RecursionError:  # nesting the bracket count cannot see; never expected after too_deep
        raise error(f"{path}: nests too deep to read", param=param) from None


def read_yaml(path: str | os.PathLike[str], param: str) -> Any:
    """A YAML document from a file (read_document's bounds; safe_load: no Python objects)."""
    import yaml

    text = read_document(path, param, "YAML")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KVBudgetError(f"{path}: invalid YAML: {exc}".splitlines()[0], param=param) from None
    except RecursionError:  # block nesting by indentation, which too_deep does not count
        raise KVBudgetError(f"{path}: nests too deep to read; no YAML file kvbudget reads needs more than "
                            f"{MAX_NESTING} levels", param=param) from None
