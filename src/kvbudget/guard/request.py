"""What a client's request asks of the KV cache. The fields the guard acts on are checked for their types first,
so a malformed request is answered 400 with the field named, before anything is predicted or forwarded; then the
prompts and samples are read the way the engine runs them (a batch of prompts is one sequence each, token-id
prompts count their ids)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kvbudget.errors import KVBudgetError

# integer fields the guard reads or rewrites, with the least each may be (llama.cpp's n_predict -1: no limit)
INT_FIELDS = {"max_tokens": 0, "max_completion_tokens": 0, "n_predict": -1, "n": 1, "best_of": 1}
MOST = 2**31 - 1  # the most any of them may be: the engines read them as 32-bit integers (llama.cpp's n_predict)
BOOL_FIELDS = ("stream", "use_beam_search")


class BadRequest(KVBudgetError):
    """A request field the guard cannot act on; `param` names it (OpenAI's error `param`)."""


@dataclass(frozen=True)
class Asked:
    chat: bool  # /v1/chat/completions: its messages are one prompt
    prompts: tuple[str | int, ...] = ()  # /v1/completions: per prompt, its text (to count) or its token-id count


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; NaN and Infinity, which JSON does not have, are refused, and so is a number of
    more digits than Python reads (its ValueError) or nesting deeper than its parser goes."""
    def constant(name: str) -> Any:
        raise BadRequest(f"the request body is not valid JSON: {name} is not a JSON number")

    try:
        body = json.loads(raw, parse_constant=constant)
    except BadRequest:
        raise
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def read_request(body: dict[str, Any], chat: bool) -> Asked:
    """Check the fields the guard acts on and read what the request asks for."""
    for name, least in INT_FIELDS.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"{name} must be an integer, not {_kind(value)}", param=name)
        if not least <= value <= MOST:
            shown = value if abs(value) < 10**30 else f"a number of {len(str(abs(value)))} digits"
            raise BadRequest(f"{name} must be from {least} to {MOST:,} (got {shown})", param=name)
    for name in BOOL_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise BadRequest(f"{name} must be true or false, not {_kind(value)}", param=name)
    if chat:
        _check_messages(body)
        return Asked(True)
    return Asked(False, _prompts(body))


def samples(body: dict[str, Any]) -> int:
    """Sequences per prompt of a (validated) body: n, best_of or the beam width, whichever is larger."""
    return max(body.get("n") or 1, body.get("best_of") or 1)


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of message objects", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object with a role and content", param="messages")
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}].role must be a string (system, user, assistant, tool), not "
                             f"{_kind(m.get('role'))}", param="messages")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts, not {_kind(content)}",
                             param="messages")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict):
                raise BadRequest(f"messages[{i}].content[{j}] must be an object, not {_kind(part)}",
                                 param="messages")
            for key in ("type", "text"):  # what the prompt is counted from
                if key in part and not isinstance(part[key], str):
                    raise BadRequest(f"messages[{i}].content[{j}].{key} must be a string, not {_kind(part[key])}",
                                     param="messages")


def _prompts(body: dict[str, Any]) -> tuple[str | int, ...]:
    """One entry per prompt: a string (to count) or the number of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(_token_ids(p) for p in prompt):
            return (len(prompt),)
        if all(isinstance(p, list) and p and all(_token_ids(t) for t in p) for p in prompt):
            return tuple(len(p) for p in prompt)
    raise BadRequest("prompt must be a string, a list of strings, a list of token ids or a list of such lists",
                     param="prompt")


def _token_ids(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return {str: "a string", bool: "a boolean", float: "a number with a fraction", list: "a list",
            dict: "an object", int: "a number", type(None): "missing or null"}.get(type(value), type(value).__name__)


__all__ = ["Asked", "BadRequest", "parse_json", "read_request", "samples"]
