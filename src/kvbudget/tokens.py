"""Exact prompt lengths with the model's own tokenizer and chat template (`kvbudget tokens`).

The prompt an engine caches is the rendered chat template, tokenized: vLLM renders it with transformers'
`apply_chat_template` and tokenizes the text without adding special tokens again (the template carries them);
llama-server renders the GGUF's copy of the same template and adds a BOS only when the vocabulary asks for
one. transformers and tokenizers are an optional extra (kvbudget[tokens]).
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbudget import catalog, errors, hub
from kvbudget.engines import Engine, get_engine
from kvbudget.engines.scheduling.workload import MAX_TRACE_TOKENS
from kvbudget.errors import TokenizerError
from kvbudget.files import check_readable, parse_json_text, read_lines, read_text

CHARS_PER_TOKEN = 4.0  # --approximate only, and labelled as such
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "config.json"]


@dataclass(frozen=True)
class Part:
    name: str  # "system", "document 1", "question", "message 2 (assistant)", "template"
    tokens: int


@dataclass(frozen=True)
class PromptCount:
    prompt_tokens: int
    parts: tuple[Part, ...]
    max_tokens: int | None
    approximate: bool = False
    templated: bool = True

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
                "total_tokens": self.prompt_tokens + (self.max_tokens or 0),
                "parts": [{"name": p.name, "tokens": p.tokens} for p in self.parts],
                "approximate": self.approximate, "templated": self.templated}


@dataclass(frozen=True, kw_only=True)
class Distribution:
    count: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int

    def to_dict(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max}


SKIPPED_SHOWN = 10  # bad lines of a request log named in full; the rest are counted


@dataclass(frozen=True)
class LogStats:
    count: int
    prompt_tokens: Distribution
    total_tokens: Distribution  # prompt + max_tokens
    approximate: bool = False
    skipped: tuple[tuple[int, str], ...] = ()  # (line number, why) of lines that are not a chat request

    def to_dict(self) -> dict:
        return {"count": self.count, "prompt_tokens": self.prompt_tokens.to_dict(),
                "prompt_plus_max_tokens": self.total_tokens.to_dict(), "approximate": self.approximate,
                "skipped_lines": len(self.skipped),
                "skipped": [{"line": n, "why": why} for n, why in self.skipped[:SKIPPED_SHOWN]]}


def distribution(values: array) -> Distribution:
    """Count, mean and nearest-rank percentiles of token counts."""
    if not len(values):
        raise TokenizerError("no requests to count")
    ordered = sorted(values)
    n = len(ordered)

    def rank(p: float) -> int:
        return ordered[max(0, math.ceil(p * n) - 1)]

    return Distribution(count=n, mean=sum(ordered) / n, p50=rank(0.50), p90=rank(0.90), p99=rank(0.99), max=ordered[-1])


class PromptCounter:
    """A model's tokenizer and chat template, or the character estimate with `approximate=True`.

    `engine` (a registered name or an Engine) decides how the rendered prompt is tokenized: llama-server adds
    the vocabulary's BOS in front of it when the vocabulary asks for one; the others count the template as is."""

    def __init__(self, source: str | os.PathLike[str] | None, approximate: bool = False,
                 engine: str | Engine = "vllm"):
        self.approximate = approximate
        self.engine = get_engine(engine)
        self.tokenizer: Any = None if approximate else load_tokenizer(source)

    # --- counting ---------------------------------------------------------------------------------
    def count_texts(self, texts: list[str]) -> list[int]:
        """Tokens of plain texts (no special tokens added)."""
        if self.approximate:
            return [math.ceil(len(t) / CHARS_PER_TOKEN) for t in texts]
        if not texts:
            return []
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer directly: batched, parallel, no Python id lists
            # encode_batch_fast (tokenizers >= 0.20) skips the character offsets; the ids, so the counts, are the same
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
            return [len(e) for e in encode(texts, add_special_tokens=False)]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def render(self, messages: list[dict], template: bool = True) -> str:
        if not template:
            return "\n\n".join(str(m.get("content", "")) for m in messages)
        if self.tokenizer.chat_template is None:
            raise TokenizerError(f"the tokenizer has no chat template; count the raw text instead "
                                 f"({errors.named('template', value=False)})")
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja errors, raise_exception() in templates
            raise TokenizerError(f"the chat template failed on these messages: {exc}".splitlines()[0]) from None

    def render_many(self, conversations: list[list[dict]], template: bool = True) -> list[str]:
        """`render` of each conversation, the template applied to them as one batch (less overhead per request);
        when the batch fails, one by one, so the error is the failing request's."""
        if template and conversations and self.tokenizer.chat_template is not None:
            try:
                rendered = self.tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True)
                if isinstance(rendered, list) and len(rendered) == len(conversations):
                    return rendered
            except Exception:  # rendered again one by one below, which names the error
                pass
        return [self.render(messages, template) for messages in conversations]

    def _bos_extra(self) -> int:
        """One token when the engine adds the vocabulary's BOS in front of the rendered prompt and it asks for one."""
        if not self.engine.prompt_adds_bos or self.approximate:
            return 0
        add_bos = getattr(self.tokenizer, "add_bos_token", False)
        return 1 if add_bos and self.tokenizer.bos_token_id is not None else 0

    def count_rendered(self, prompts: list[str]) -> list[int]:
        extra = self._bos_extra()
        return [n + extra for n in self.count_texts(prompts)]

    def count_request(self, messages: list[dict], max_tokens: int | None = None, template: bool = True,
                      names: list[str] | None = None) -> PromptCount:
        """One chat request with the breakdown by message and the template's own overhead."""
        _check_messages(messages, "request")
        contents = [_content_text(m) for m in messages]
        per_part = self.count_texts(contents)
        if self.approximate:
            total = sum(per_part)
            parts = [Part(n, c) for n, c in zip(names or _names(messages), per_part, strict=True)]
            return PromptCount(total, tuple(parts), max_tokens, approximate=True, templated=False)
        rendered = self.render([{**m, "content": c} for m, c in zip(messages, contents, strict=True)], template)
        total = self.count_rendered([rendered])[0]
        parts = [Part(n, c) for n, c in zip(names or _names(messages), per_part, strict=True)]
        parts.append(Part("template" if template else "separators", total - sum(per_part)))
        return PromptCount(total, tuple(parts), max_tokens, templated=template)

    def count_documents(self, documents: list[tuple[str, str]], question: str | None, system: str | None,
                        template: bool = True) -> PromptCount:
        """A RAG prompt: system message, documents joined into the user message, then the question."""
        pieces = [text for _, text in documents] + ([question] if question else [])
        messages = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": "\n\n".join(pieces)}]
        counts = self.count_texts(([system] if system else []) + pieces)
        names = (["system"] if system else []) + [name for name, _ in documents] + (["question"] if question else [])
        if self.approximate:
            parts = [Part(n, c) for n, c in zip(names, counts, strict=True)]
            return PromptCount(sum(counts), tuple(parts), None, approximate=True,
                               templated=False)
        rendered = self.render(messages, template)
        total = self.count_rendered([rendered])[0]
        parts = [Part(n, c) for n, c in zip(names, counts, strict=True)]
        parts.append(Part("template and separators", total - sum(counts)))
        return PromptCount(total, tuple(parts), None, templated=template)

    def count_lines(self, lines: Iterable[str], template: bool = True, batch: int = 256,
                    progress: Callable[[int], object] | None = None,
                    skipped: list[tuple[int, str]] | None = None) -> Iterator[tuple[int, int | None, dict]]:
        """Streams JSON Lines of chat requests: (prompt tokens, max_tokens, the request) per request, counted in
        batches. A bad line is an error naming its number, or, given a `skipped` list, is recorded there (number,
        why) and passed over."""
        pending: list[tuple[list[dict], int | None, dict]] = []
        # A pipeline of two: while the tokenizer encodes one batch (in Rust, on its own threads, without the GIL)
        # this thread reads and renders the next. Results come out in the input's order.
        encoding: tuple[Future[list[int]], list[tuple[list[dict], int | None, dict]]] | None = None
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvbudget-tokens")

        def drain() -> Iterator[tuple[int, int | None, dict]]:
            nonlocal encoding
            if encoding is not None:
                future, batch_of = encoding
                encoding = None
                for n, (_, max_tokens, request) in zip(future.result(), batch_of, strict=True):
                    yield n, max_tokens, request

        def flush() -> Iterator[tuple[int, int | None, dict]]:
            nonlocal encoding
            batch_of = list(pending)
            pending.clear()
            conversations = [msgs for msgs, _, _ in batch_of]
            if self.approximate:
                job = worker.submit(lambda: [sum(self.count_texts([_content_text(m) for m in msgs]))
                                             for msgs in conversations])
            else:  # rendered while the last batch encodes; queued behind it on the one worker
                job = worker.submit(self.count_rendered, self.render_many(conversations, template))
            yield from drain()
            encoding = (job, batch_of)

        try:
            for number, line in enumerate(lines, 1):
                if progress is not None:
                    progress(len(line))
                line = line.strip()
                if not line:
                    continue
                try:
                    request = parse_json_text(line, f"line {number}", kind="chat request", error=TokenizerError)
                    messages, max_tokens = _request_fields(request, f"line {number}")
                    parts = [m if isinstance(m.get("content"), str) else {**m, "content": _content_text(m)}
                             for m in messages]
                except TokenizerError as exc:
                    if skipped is None:
                        raise
                    skipped.append((number, str(exc).removeprefix(f"line {number}: ")))
                    continue
                pending.append((parts, max_tokens, request))
                if len(pending) >= batch:
                    yield from flush()
            if pending:
                yield from flush()
            yield from drain()
        finally:
            worker.shutdown(wait=True, cancel_futures=True)

    def count_jsonl(self, lines: Iterable[str], template: bool = True, batch: int = 256,
                    progress: Callable[[int], object] | None = None) -> LogStats:
        """Streams JSON Lines of chat requests: only token counts are kept, never the texts."""
        prompts, totals = array("q"), array("q")
        skipped: list[tuple[int, str]] = []
        for n, max_tokens, _ in self.count_lines(lines, template, batch, progress, skipped):
            prompts.append(n)
            totals.append(n + (max_tokens or 0))
        if not len(prompts):
            first = f" ({len(skipped)} bad line(s); line {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
            raise TokenizerError(f"the JSON Lines input holds no requests{first}")
        return LogStats(len(prompts), distribution(prompts), distribution(totals), self.approximate, tuple(skipped))


def _names(messages: list[dict]) -> list[str]:
    return [f"message {i} ({m.get('role', '?')})" for i, m in enumerate(messages, 1)]


def _content_text(message: dict) -> str:
    """A message's text: a string, or the text parts of an OpenAI content list."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise TokenizerError(f"a message's content must be a string or a list of parts, not {type(content).__name__}")


def _check_messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise TokenizerError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or "role" not in m:
            raise TokenizerError(f"{where}: message {i} needs a 'role' (system, user, assistant)")


def _request_fields(request, where: str) -> tuple[list[dict], int | None]:
    if not isinstance(request, dict) or "messages" not in request:
        raise TokenizerError(f"{where}: expected an OpenAI chat request object with 'messages'")
    _check_messages(request["messages"], where)
    max_tokens = request.get("max_tokens", request.get("max_completion_tokens"))
    if max_tokens is not None and (type(max_tokens) is not int or not 0 <= max_tokens <= MAX_TRACE_TOKENS):
        raise TokenizerError(f"{where}: 'max_tokens' must be a whole number from 0 to {MAX_TRACE_TOKENS:,} (the "
                             "longest context any model takes)")
    return request["messages"], max_tokens


def read_request(path: str, text: str) -> tuple[list[dict], int | None]:
    """A chat request's messages and max_tokens from its JSON text; `path` names it in errors (a file, or its line)."""
    return _request_fields(parse_json_text(text, path, kind="chat request", error=TokenizerError), path)


def read_log(path: str, param: str = "files") -> Iterator[str]:
    """A request log's lines (JSON Lines of chat requests), each within the bounds of a document (16 MiB, UTF-8)."""
    return read_lines(path, param, error=TokenizerError)


def load_tokenizer(source: str | os.PathLike | None):
    """A fast tokenizer from a model folder, a Hub id (tokenizer files only) or a catalog name's Hub id."""
    if source is None:
        raise TokenizerError(f"name a model whose tokenizer to use, or estimate from characters "
                             f"({errors.named('approximate', value=True)})")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TokenizerError("counting tokens needs transformers: pip install 'kvbudget[tokens]'") from None
    import transformers

    transformers.logging.set_verbosity_error()
    text = str(source)
    path = Path(text).expanduser()
    from kvbudget.bundled import BUNDLED, bundled_gguf  # the test model `quality` takes by name

    if text.strip().lower() == BUNDLED and not path.exists():
        path = bundled_gguf()
    if path.is_file() and path.suffix.lower() == ".gguf":  # the tokenizer and chat template the file carries
        try:
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, use_fast=True)
        except Exception as exc:
            raise TokenizerError(f"{path}: could not load the tokenizer it carries: {exc}".splitlines()[0]) from None
        return tok
    if path.is_file():
        path = path.parent
    if path.is_dir():
        if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise TokenizerError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json) in this folder")
        folder = path
    else:
        entry = catalog.find(text)
        repo = entry.hf_id if entry else text
        if repo.count("/") != 1:
            raise TokenizerError(f"{text!r} is not a model folder, a catalog name or a Hub id for a tokenizer"
                                 f"{catalog.did_you_mean(text)}")
        folder = _hub_tokenizer(repo, text if entry else None)
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    except Exception as exc:
        raise TokenizerError(f"{folder}: could not load its tokenizer: {exc}".splitlines()[0]) from None
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(f"{folder}: only a slow tokenizer is available; kvbudget needs tokenizer.json")
    return tok


def _hub_tokenizer(repo: str, catalog_name: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    named = f"{catalog_name} ({repo})" if catalog_name else repo
    offline = hub.offline_reason()
    try:
        return Path(snapshot_download(repo, allow_patterns=TOKENIZER_FILES, local_files_only=offline is not None))
    except GatedRepoError:
        raise TokenizerError(f"{named}: the tokenizer is in a gated repository; accept its licence on the Hub and "
                            "set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise TokenizerError(f"{named}: no such repository on the Hub (if it is private, set HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        meant = "" if catalog_name else catalog.did_you_mean(repo)
        raise TokenizerError(f"{named}: the tokenizer is not in the local Hugging Face cache and the Hub cannot be "
                            f"reached ({offline or 'no network'}){meant}; download it once online, pass a local "
                            f"folder, or use a labelled character estimate "
                            f"({errors.named('approximate', value=True)})") from None
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{named}: could not fetch the tokenizer: {exc}".splitlines()[0]) from None


def count_file(counter: PromptCounter, path: str, template: bool = True) -> PromptCount:
    """One prompt file: a chat request (.json) or a plain text document."""
    text = read_text(path, "a prompt")
    if path.endswith(".json"):
        messages, max_tokens = read_request(path, text)
        return counter.count_request(messages, max_tokens, template)
    return counter.count_documents([(Path(path).name, text)], None, None, template)


def prompt_context(tokenizer_source: str | None, path: str, max_new_tokens: int | None, approximate: bool = False,
                   engine: str | Engine = "vllm") -> tuple[int, str]:
    """T for estimate/plan from a prompt file: its exact length plus the tokens to generate."""
    check_readable(path)
    counter = PromptCounter(tokenizer_source, approximate, engine)
    count = count_file(counter, path)
    new = count.max_tokens if count.max_tokens is not None and max_new_tokens is None else (max_new_tokens or 0)
    label = "approximate " if approximate else ""
    return count.prompt_tokens + new, f"context from {path}: {count.prompt_tokens:,} {label}prompt tokens + {new:,} new"


def lengths_context(tokenizer_source: str | None, path: str, approximate: bool = False,
                    engine: str | Engine = "vllm") -> tuple[int, str]:
    """T for estimate/plan from a request log: the p99 of prompt + max_tokens (the mean is reported)."""
    check_readable(path)
    stats = PromptCounter(tokenizer_source, approximate, engine).count_jsonl(read_log(path, "lengths_from"))
    t = stats.total_tokens
    label = " (approximate)" if approximate else ""
    return t.p99, (f"context from {path}{label}: p99 of prompt + max_tokens over {stats.count:,} requests = {t.p99:,} "
                   f"(mean {t.mean:,.0f}, max {t.max:,})")


def count_prompt(tokenizer: str | os.PathLike[str] | None, messages: list[dict[str, Any]] | str,
                 max_tokens: int | None = None, engine: str | Engine = "vllm", template: bool = True,
                 approximate: bool = False) -> PromptCount:
    """Tokens of one prompt as `engine` caches it: chat `messages` rendered with the tokenizer's template, or a
    plain string. `tokenizer` is a model folder, a Hub id or a catalog name; `approximate=True` estimates from
    characters instead (4 per token) and says so in the result."""
    counter = PromptCounter(tokenizer, approximate=approximate, engine=engine)
    if isinstance(messages, str):
        return counter.count_documents([("text", messages)], None, None, template)
    return counter.count_request(messages, max_tokens, template)
