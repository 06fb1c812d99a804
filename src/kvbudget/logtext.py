"""A pasted engine log made plain again, whatever engine wrote it: what terminals, log collectors and issue trackers
add to its lines taken off, lines they folded joined back, and Ray's deduplicated lines counted out again. The
engines' readers (check-log) read what this returns; each bound below keeps the work linear in the input."""

from __future__ import annotations

import html
import re

from kvbudget.errors import KVBudgetError

MAX_LOG_CHARS = 8 * 1024 * 1024  # of a log read: its start-up section is a few hundred KB
MAX_LINE_CHARS = 16 * 1024  # of one line read (the longest real ones, SGLang's server_args, are under 10 KB)
MAX_REPEATS = 1024  # ranks one Ray '[repeated Nx across cluster]' line may stand for
WRAP_WIDTH = 60  # a line this long or longer may have been folded by a terminal or a tracker

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\n]{0,256}\x07|\^\[\[[0-9;]*[A-Za-z]"
                   r"|\[[0-9]{1,3}(?:;[0-9]{1,3}){0,4}m")  # the last: a colour code whose escape byte was lost
# What a collector writes before each line, taken off in turn (each bounded, anchored at the line's start).
_PREFIXES = tuple(re.compile(p) for p in (
    r"[>▎│|]\s?",  # a Markdown quote or a table/box-drawing border
    r"`+",  # a line pasted in backticks
    r"\d{4}-\d\d-\d\dT[\d:.]{8,18}(?:Z|[+-]\d\d:?\d\d)\s+(?:stdout|stderr)\s+[FP]\s",  # Kubernetes (CRI)
    r"(?:(?:[^\W\d_]{2,9}\.?|\d{1,2}月)\s+\d{1,2}日?\s+|\d{4}-\d\d-\d\dT)?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
    r"(?:Z|[+-]\d\d:?\d\d)?\s+\S{1,64}\s+[\w.@/-]{1,64}\[\d{1,10}\]:\s",  # journald: 'Dec 05 10:00:01 host vllm[123]: '
    # (the month in the locale's words: 'дек 05', 'déc. 05', '12月 05')
    r"[A-Za-z0-9][\w.-]{0,63}\s+\|\s",  # docker compose: 'vllm-1  | '
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,9})?\s+\|\s",  # a viewer's time column: '2026-05-01 18:50:31.934 | '
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)\s",  # docker logs -t, kubectl --timestamps
    r"\[pod/[\w.-]{1,253}/[\w.-]{1,63}\]\s",  # kubectl logs --prefix: '[pod/vllm-0/vllm] '
    r"\((?:[\w=.,:-]{1,40}\s+){0,5}?pid=\d{1,10}(?:,\s*ip=[\w.:-]{1,64})?\)\s?",  # Ray and vLLM's processes
    r"(?:\[\d{1,10}\]\s+)?\d{1,4}\.\d\d\.\d{3}\.\d{3}\s+[DIWE]\s",  # llama.cpp's timestamped log
    r"\[(?:rank|default)\d{1,6}\]:\s?",  # torchrun's per-rank tee (torch.distributed.elastic): '[rank0]: '
))
_BOX = ("│", "┃", "║")  # box-drawing verticals a terminal pane draws on both sides of each line
# Ray's deduplication: the line stands for N lines of other processes ('(Ray deduplicates logs ...)' after it once)
_REPEATED = re.compile(r"\s*\[repeated (\d{1,9})x across cluster\](?:\s*\(Ray deduplicates[^)\n]{0,400}\))?\s*$")
# The folded tail of a line starts inside a word or a number, or with the unit of the figure the cut left behind
# ('K size: 27.79' / 'GB, V size: ...'), and never as a record of its own would; after a comma, anything but a record.
_TAIL = re.compile(r"[a-z0-9_]|[KMGTP]i?B\b")
# A line cut after its colon: the tail is the figure with its unit ('Available KV cache memory:' / '20.50 GiB')
_FIGURE = re.compile(r"-?\d[\d.,]{0,20}\s?(?:[KMGTP]i?B|tokens)\b")
# What a web page or a word processor puts in place of plain characters: no-break and thin spaces, zero-width marks,
# curly quotes ('the model’s max seq len'); and the HTML entities of a page's source copied as text.
_PLAIN = str.maketrans({"\xa0": " ", "\u2007": " ", "\u2009": " ", "\u202f": " ", "\u3000": " ", "\u200b": None,
                        "\ufeff": None, "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_ENTITY = re.compile(r"&(?:#\d{1,7}|#x[0-9a-fA-F]{1,6}|quot|apos|amp|lt|gt);")
# A logfmt record (Go's log/slog TextHandler: Ollama's `time=... level=INFO source=server.go:168 msg=offload ...`)
# and a run of its key=value pairs on the next line, indented or not: the record hard-wrapped by a tracker or an
# editor.
_LOGFMT = re.compile(r"(?:^|\s)level=[A-Z]{3,5}\s(?:[^\n]{0,400}\s)?msg=")
_LOGFMT_TAIL = re.compile(r"\s*(?!time=|level=)[A-Za-z_][\w.]{0,63}=\S")  # indented or not; a new record starts time=
_UNIT = re.compile(r"[KMGTP]i?B\b")
_RECORD = re.compile(r"[a-z_][\w.]{0,63}(?::\s|\s{2}|=)"
                     r"|\d{1,4}[-/:.]\d\d[-/:.]\d\d")  # a date or a time: a line of its own, timestamped


def clean(text: str) -> str:
    """`text` with the characters of web pages made plain, colour codes, quote marks and the prefixes of Ray,
    journald, docker compose, Kubernetes and llama.cpp's timestamps taken off each line; a line a terminal or tracker
    folded joined back to the line it was cut from; each Ray line deduplicated as '[repeated Nx across cluster]'
    counted N times. At most MAX_LOG_CHARS of it are read and MAX_LINE_CHARS of each line."""
    lines: list[str] = []
    folded = False  # whether the last line kept could have been cut by a terminal or tracker
    cut = ""  # how the last line kept ends where it could have been cut: ',' or ':' (else '')
    record = False  # whether the last line kept is a logfmt record (its wrapped pairs join it)
    for raw in text[:MAX_LOG_CHARS].translate(_PLAIN).splitlines():
        if _ENTITY.search(raw):  # an entity never makes a line of its own
            raw = " ".join(html.unescape(raw[:MAX_LINE_CHARS]).splitlines())
        line = _ANSI.sub("", raw[:MAX_LINE_CHARS])
        stripped = _strip_prefixes(line)
        repeat = _REPEATED.search(stripped)
        count = 1
        if repeat:
            count = int(repeat.group(1))
            if count > MAX_REPEATS:
                raise KVBudgetError(f"check-log: a Ray line stands for {count} lines ('[repeated {count}x across "
                                    f"cluster]'); kvbudget reads at most {MAX_REPEATS} ranks of one line")
            stripped = stripped[:repeat.start()]
        if record and count == 1 and _LOGFMT_TAIL.match(raw):  # a wrapped logfmt record's pairs
            if len(lines[-1]) < MAX_LINE_CHARS:  # past the bound, the rest of the record is dropped
                lines[-1] = (lines[-1] + " " + stripped)[:MAX_LINE_CHARS]
            continue
        tail = (_FIGURE.match(stripped) if cut == ":" else
                folded and (cut == "," or _TAIL.match(stripped) or _closes(lines[-1], stripped)))
        continues = tail and stripped == line.strip() and not _RECORD.match(stripped)
        if continues:  # a tail without a prefix of its own, after a line cut at the terminal's width
            blank = cut or line[:1].isspace() or _UNIT.match(stripped)  # a unit follows its figure after a blank
            lines[-1] = (lines[-1] + (" " if blank else "") + stripped)[:MAX_LINE_CHARS]
            folded, cut = len(raw) >= WRAP_WIDTH, _cut(stripped, raw)  # cut again at the same width
            continue
        lines.extend([stripped] * count)
        record = bool(_LOGFMT.search(stripped))
        folded = len(raw) >= WRAP_WIDTH and not stripped.endswith((".", ":", "}", ")", "]"))
        cut = _cut(stripped, raw)
    return "\n".join(lines) + ("\n" if lines else "")


def _closes(kept: str, tail: str) -> bool:
    """Whether `tail` starts by closing a bracket `kept` left open ('... K (f16' / '):  224.00 MiB'): a line cut
    inside parentheses."""
    return tail[:1] in ")]" and kept.count("(") + kept.count("[") > kept.count(")") + kept.count("]")


def _cut(stripped: str, raw: str) -> str:
    """',' or ':' where a line at the wrap width ends in one (a record never ends in a comma; a colon ends a header
    too, so only a figure with its unit joins it), else ''."""
    return stripped[-1] if len(raw) >= WRAP_WIDTH and stripped.endswith((",", ":")) else ""


def _strip_prefixes(line: str) -> str:
    """The line without the prefixes collectors add, in any order, and its surrounding blanks and backticks."""
    line = line.strip()
    if line[:1] in _BOX and line.endswith(line[0]):  # a log pane (k9s, lazydocker) boxes each line: '│ ... │'
        line = line[1:-1].strip()
    for _ in range(4):  # a compose prefix before a Ray one before a quote mark, at most
        before = line
        for prefix in _PREFIXES:
            line = prefix.sub("", line, count=1).lstrip() if prefix.match(line) else line
        if line == before:
            break
    return line.rstrip("` \t")
