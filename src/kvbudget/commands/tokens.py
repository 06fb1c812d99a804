"""`tokens`: exact prompt lengths with the model's tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbudget.commands.options import option
from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.tokens import LogStats, PromptCount


def _engine_help() -> str:
    from kvbudget.engines import ENGINES

    return (f"whose prompt handling to follow: one of {', '.join(ENGINES)} (llamacpp adds the vocabulary's BOS) "
            "(default vllm)")


@dataclass(frozen=True, kw_only=True)
class TokensRequest:
    """What `tokens` is asked, as given."""

    model: str = option("a .gguf file, a model folder, a Hub id, or a catalog name (its Hub id) for the tokenizer",
                        "", positional=True)
    files: Sequence[str] = option("text files (documents), a chat request .json, a .jsonl log, or - for stdin", (),
                                  positional=True, many=True, nargs="*", web=False)
    question: str | None = option("the question after the documents")
    system: str | None = option("system message (text, or @FILE)", web=False)
    no_template: bool = option("count the raw text without the chat template", False)
    engine: str = option(_engine_help, "vllm")
    approximate: bool = option("no tokenizer: estimate from characters (4 per token), labelled as an estimate", False)
    json: bool = option("print JSON", False, web=False)


def _check(ask: TokensRequest, files: list[str]) -> None:
    """Refuse a bad engine, an unreadable file or files that are not counted together, before the tokenizer loads
    (seconds)."""
    from kvbudget.engines import get_engine
    from kvbudget.tokens import check_readable

    get_engine(ask.engine)
    check_readable(*files, *([ask.system[1:]] if ask.system and ask.system.startswith("@") else []))
    if any(f.endswith(".jsonl") for f in files) and len(files) != 1:
        raise KVBudgetError("a .jsonl request log is counted on its own; pass it alone", param="files")
    if len(files) != 1 and any(f.endswith(".json") for f in files):
        raise KVBudgetError("a chat request .json is counted on its own; pass it alone", param="files")


def answer(ask: TokensRequest, loading: Callable[[str], None] | None = None,
           log_lines: Callable[[str], Iterable[str]] | None = None) -> PromptCount | LogStats:
    """The prompt's count, or a request log's length distribution (a .jsonl file); `to_dict()` is what --json
    prints. `loading(model)` is called before a tokenizer loads (seconds); `log_lines(path)` reads a request log's
    lines (default: lazily, as they are counted)."""
    from kvbudget.files import read_text
    from kvbudget.tokens import PromptCounter, read_log, read_request

    files = list(ask.files) or ["-"]
    _check(ask, files)
    if loading is not None and not ask.approximate:
        loading(ask.model)
    counter = PromptCounter(ask.model, approximate=ask.approximate, engine=ask.engine)
    template = not ask.no_template
    if files[0].endswith(".jsonl"):
        return counter.count_jsonl((log_lines or read_log)(files[0]), template)
    system = ask.system
    if system and system.startswith("@"):
        system = read_text(system[1:], "a system prompt")
    if len(files) == 1 and (files[0].endswith(".json") or files[0] == "-"):
        text = read_text(files[0], "a prompt")
        if files[0].endswith(".json") or text.lstrip().startswith("{"):
            messages, max_tokens = read_request(files[0], text)
            return counter.count_request(messages, max_tokens, template)
        return counter.count_documents([("stdin", text)], ask.question, system, template)
    docs = [(("stdin" if f == "-" else f), read_text(f, "a document")) for f in files]
    return counter.count_documents(docs, ask.question, system, template)
