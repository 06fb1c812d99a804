"""What a vLLM start-up log says it ran with: the settings it printed (or the user gave, or the release's defaults
where it says nothing), read once for check-log (`logs.py`) and the rows beside them (`budgetless.py`,
`memorylog.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvbudget.choices import Device
from kvbudget.engines.base import EngineOptions
from kvbudget.engines.vllm.releases import Release, batch_defaults, parse_release
from kvbudget.engines.vllm.sampler import FLASHINFER_RELEASES
from kvbudget.engines.vllm.speclog import read_speculative
from kvbudget.engines.vllm.speculative import MTP_FROM, SPECULATIVE_RELEASE
from kvbudget.engines.vllm.speculative import methods as speculative_methods
from kvbudget.errors import KVBudgetError, UnsupportedArchitectureError, named, spelled
from kvbudget.speculative import MAX_SPECULATIVE_TOKENS, SpecMethod, Speculative
from kvbudget.units import GIB, log_figure

# V0's device pool (engine/executor_base.py, initialize_cache: "# %s blocks: %d, # CPU blocks: %d" with the platform's
# dispatch key: CUDA on NVIDIA and ROCm, XPU, XLA on TPU, HPU; forks' MLU and PrivateUse1 (Ascend); earlier executors
# "# GPU blocks", some "# cuda blocks"; V1 0.7 "# GPU blocks: N" alone): the device and its blocks
DEVICE_BLOCKS = re.compile(r"\b(GPU|CUDA|cuda|[HNTX]PU|[hnx]pu|XLA|MLU|PrivateUse1) blocks: (\d{1,12})")
# HabanaAI's vllm-fork (worker/hpu_worker.py, determine_num_available_blocks): the usable share less the HPU-graph
# reserve, each size by format_bytes (four significant figures); group 1 the KV budget in GiB
GAUDI_BUDGET = r"reserved for HPUGraphs \([^)]{0,80}\), ([\d.]+) GiB reserved for KV cache"
def num(text: str) -> float:
    return float(text.replace(",", ""))


# --- startup logs ------------------------------------------------------------------------------------


NO_MAX_LEN = ("check-log: the vLLM log names no max_model_len ('Maximum concurrency for N tokens', 'max_seq_len=' "
              "or 'max_model_len'); " + spelled("give max_model_len", "pass --max-model-len"))


# vLLM's short flags (engine/arg_utils.py: "-tp" for --tensor-parallel-size, "-pp" for --pipeline-parallel-size)
_SHORT_FLAGS = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp"}


def setting(text: str, *names: str) -> str | None:
    """A setting as vLLM logs it: key=value in its config line, 'key': value in its non-default args, or a
    --key value flag on the command line."""
    for name in names:
        flag = name.replace("_", "-")
        short = (rf"(?<![\w-])-{_SHORT_FLAGS[name]}[ =](\d+)",) if name in _SHORT_FLAGS else ()
        for pattern in (rf"\b{name}=['\"]?([\w.\-]+)", rf"'{name}': '?([\w.\-]+)'?",  # a namespace quotes strings
                        rf"--(?:{flag}|{name})[ =]([\w.\-]+)", *short):
            if (m := re.search(pattern, text)) and m.group(1) != "None":  # None: left unset (the namespace's)
                return m.group(1).rstrip(".")  # "... with max_num_batched_tokens=512." ends a sentence
    return None


def whole(key: str, value: object) -> int:
    """A setting that must be a whole number, as the log (or the user) gave it."""
    try:
        return int(str(value).replace(",", ""))
    except ValueError:
        raise KVBudgetError(f"check-log: {key} reads {value!r}, not a whole number; give --{key.replace('_', '-')}",
                            param=key) from None


def _length(max_len: int, stated: bool) -> int:
    """max_model_len as read: 0 where the log does not state it (not known), never 0 where it does."""
    if max_len < 1 and stated:
        raise KVBudgetError(f"check-log: max_model_len reads {max_len}, not a length; give {named('max_model_len')} "
                            "(at least 1)", param="max_model_len")
    return max_len


def truthy(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


# The MLA backend a log names ("Using FlashMLA backend", "Forcing kv cache block size to 64 for FlashMLA
# backend", "Setting kv cache block size to 32 for FLASHINFER_MLA backend(s)").
_BACKEND_LINES = {"FLASHMLA": r"FlashMLA backend|FLASHMLA backend", "TRITON_MLA": r"Triton MLA backend|TRITON_MLA",
                  "CUTLASS_MLA": r"CUTLASS_?MLA backend", "FLASHINFER_MLA": r"FlashInfer ?MLA backend|FLASHINFER_MLA",
                  "FLASH_ATTN_MLA": r"FlashAttention ?MLA backend|FLASH_ATTN_MLA"}


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    max_len: int
    device: Device
    tp: int
    pp: int
    kv_dtype: str
    prefix: bool
    mnbt: int | None
    version: tuple[int, int] | None
    hybrid: bool
    partition: tuple[int, ...] | None = None
    backend: str | None = None
    spec_tokens: int = 0  # speculative decoding with the model's MTP layers: draft tokens per step
    drafting: Speculative | None = None  # what the log drafts with, as a command would ask for it
    max_num_seqs: int | None = None
    eager: bool = False
    flashinfer_sampler: bool = False  # 0.9-0.11 printed "Using FlashInfer for top-p & top-k sampling"
    stated: frozenset[str] = frozenset()  # the parallel sizes (tp, pp) the log itself prints: facts, never causes

    def options(self) -> EngineOptions:
        return EngineOptions(device=self.device, prefix_caching=self.prefix, max_num_batched_tokens=self.mnbt,
                             hybrid_allocator=self.hybrid, engine_version=self.version,
                             attention_backend=self.backend, pp_layer_partition=self.partition,
                             num_speculative_tokens=self.spec_tokens, max_num_seqs=self.max_num_seqs,
                             enforce_eager=self.eager, speculative=self.drafter,
                             flashinfer_sampler=self.flashinfer_sampler)

    @property
    def drafter(self) -> Speculative | None:
        """The drafter with a model of its own (an EAGLE or EAGLE-3 head, a draft model) the plan sizes; MTP goes as
        `spec_tokens`, and n-gram and suffix lookup add nothing to size."""
        d = self.drafting
        return d if d is not None and d.method.needs_draft_model else None

    def drafting_shown(self) -> dict:
        """The speculative settings as check-log shows them (the MTP draft tokens alone where only they are known)."""
        d = self.drafting
        if d is None:
            return {"num_speculative_tokens": self.spec_tokens} if self.spec_tokens else {}
        return {"speculative": str(d.method), "num_speculative_tokens": d.num_tokens,
                **({"draft_model": d.draft_id} if d.draft_id else {})}


def other_sizes(st: LogSettings, key: str, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The tensor or pipeline parallel sizes (`key` tp or pp) worth trying as a cause of a mismatch: none where the
    log prints the size (a size the user gave may be wrong; the log's is what the engine ran with)."""
    now = getattr(st, key)
    return () if key in st.stated else tuple(n for n in sizes if n != now)


def _stated(text: str) -> frozenset[str]:
    pairs = (("tp", "tensor_parallel_size"), ("pp", "pipeline_parallel_size"))
    return frozenset(key for key, name in pairs if setting(text, name) is not None)


def read_settings(text: str, given: dict, refused_len: str | None, conc: re.Match | None,
                   hybrid_model: bool = False, default_len: int = 0) -> tuple[LogSettings, dict, dict]:
    read: dict = {}
    assumed: dict = {}

    def pick(key: str, value: object, default: object) -> object:
        if key in given and given[key] is not None:
            read[key] = given[key]
            return given[key]
        if value is not None:
            read[key] = value
            return value
        assumed[key] = "the engine's default" if default is None else default
        return default

    max_len_text = (conc.group(1).replace(",", "") if conc else refused_len if refused_len else
                    setting(text, "max_seq_len", "max_model_len"))
    cpu_blocks = re.search(r"# CPU blocks: \d+", text)
    if max_len_text is None and given.get("max_model_len") is None and not cpu_blocks and not default_len:
        raise KVBudgetError(NO_MAX_LEN)
    max_len = _length(whole("max_model_len", pick("max_model_len", max_len_text, default_len)),
                      "max_model_len" in read)
    if max_len_text is None and given.get("max_model_len") is None and max_len:
        assumed["max_model_len"] = f"{max_len:,} (the model's own length: the log does not state it)"
    cpu = bool(re.search(r"CPU KV cache size|device_config=cpu|VLLM_CPU_KVCACHE_SPACE", text))
    read["device"] = Device.CPU if cpu else Device.CUDA
    tp = whole("tp", pick("tp", setting(text, "tensor_parallel_size"), 1))
    pp = whole("pp", pick("pp", setting(text, "pipeline_parallel_size"), 1))
    kv = str(pick("kv_cache_dtype", setting(text, "kv_cache_dtype"), "auto"))
    version = _version(text, given, read, assumed)
    prefix_text = setting(text, "enable_prefix_caching")
    no_prefix = re.search(r"--no-enable-prefix-caching\b", text)
    # hybrid models ran without prefix caching by default before 0.26
    prefix_default = not (hybrid_model and version is not None and not Release(version).hybrid_prefix_caching)
    prefix = pick("prefix_caching", False if no_prefix else None if prefix_text is None else truthy(prefix_text),
                  prefix_default)
    mnbt_text = setting(text, "max_num_batched_tokens", "max_num_batched_token")
    mnbt = pick("max_num_batched_tokens", mnbt_text, None)
    if mnbt is None and not cpu:
        mnbt = _default_mnbt(text, version, assumed)
    seqs = given.get("max_num_seqs") or setting(text, "max_num_seqs")  # the release's default where unsaid
    if seqs is not None:
        read["max_num_seqs"] = seqs
    # enforce_eager=True in the engine's config line, 'enforce_eager': True in its arguments, or the bare flag
    eager_text = setting(text, "enforce_eager")
    eager = truthy(eager_text) if eager_text and eager_text[0] != "-" else bool(
        re.search(r"--enforce-eager(?![ =]\w)", text))
    if eager:
        read["enforce_eager"] = True
    # the sampler vLLM 0.9-0.11 picks where FlashInfer is installed (engines/vllm/sampler.py)
    flashinfer = bool(version and FLASHINFER_RELEASES[0] <= version <= FLASHINFER_RELEASES[1] and re.search(
        r"Using FlashInfer for top-p & top-k sampling", text))
    if flashinfer:
        read["flashinfer_sampler"] = True
    partition = None
    if pp > 1:
        part_text = given.get("pp_layer_partition") or (
            m.group(1) if (m := re.search(r"VLLM_PP_LAYER_PARTITION=['\"]?([\d,]+)", text)) else None)
        if part_text:
            read["pp_layer_partition"] = part_text
            partition = tuple(int(x) for x in str(part_text).split(","))
        else:
            assumed["pp_layer_partition"] = "vLLM's even split"
    backend = given.get("attention_backend") or next(
        (name for name, pattern in _BACKEND_LINES.items() if re.search(pattern, text)), None)
    if backend:
        read["attention_backend"] = backend
    spec_tokens, drafting = _speculative(text, given, read, version)
    hybrid_off = setting(text, "disable_hybrid_kv_cache_manager")
    hybrid = not (hybrid_off is not None and truthy(hybrid_off)) and not (
        version and not Release(version).hybrid_allocator)
    settings = LogSettings(max_len=max_len, device=Device.CPU if cpu else Device.CUDA, tp=tp, pp=pp, kv_dtype=kv,
                            prefix=bool(prefix),
                            mnbt=whole("max_num_batched_tokens", mnbt) if mnbt is not None else None, version=version,
                            hybrid=hybrid,
                            partition=partition, backend=backend, spec_tokens=spec_tokens, drafting=drafting,
                            max_num_seqs=whole("max_num_seqs", seqs) if seqs is not None else None, eager=eager,
                            flashinfer_sampler=flashinfer, stated=_stated(text))
    return settings, read, assumed


def _default_mnbt(text: str, version: tuple[int, int] | None, assumed: dict) -> int | None:
    """The release's max_num_batched_tokens for the GPU memory a V1 log states (what its scheduler and its
    windowed layers' concurrency take), noted as assumed; None where the log gives neither."""
    total = log_total_memory(text)
    if total is None or version is None or Release(version).v0:
        return None
    mnbt = batch_defaults(int(total * GIB), "", Device.CUDA, Release(version))[0]
    assumed["max_num_batched_tokens"] = f"{mnbt}, the release's default for the log's {total:g} GiB GPU"
    return mnbt


def _version(text: str, given: dict, read: dict, assumed: dict) -> tuple[int, int] | None:
    """The vLLM release given or read from the log (its engine line or version line), noted in `read`; None, noted
    in `assumed`, where neither states one (a build from source without release tags calls itself 0.1.devN)."""
    version_text = (given.get("engine_version") or
                    (m.group(1) if (m := re.search(r"LLM engine \(v(\d+\.\d+(?:\.\d+)?)", text) or
                                    re.search(r"vLLM (?:API server )?version:? v?(\d+\.\d+[\d.]*)", text)) else None))
    source_build = not given.get("engine_version") and version_text == "0.1" and re.search(r"v?0\.1\.dev\d", text)
    if source_build:  # setuptools_scm's version of a checkout without release tags: no release to read
        version_text = None
    if version_text:
        read["engine_version"] = version_text
        return parse_release(str(version_text))
    assumed["engine_version"] = ("unknown (a build from source without release tags: v0.1.dev...)" if source_build
                                 else "unknown")
    return None


def _speculative(text: str, given: dict, read: dict, version: tuple[int, int] | None
                 ) -> tuple[int, Speculative | None]:
    """What the log drafts with: the draft tokens per step with the model's MTP layers (0 for every other method,
    and without a speculative config or with one naming neither a method nor a draft model), and the drafting as a
    command would ask for it (the method, k, and for EAGLE, EAGLE-3 and draft models the drafter, from `given`'s
    `draft`: loaded by check-log from the name the log gives or `draft_model`). A drafter kvbudget has no method
    for is refused, naming what the log says of it."""
    if given.get("num_speculative_tokens") is not None:
        read["num_speculative_tokens"] = given["num_speculative_tokens"]
        tokens: int | None = whole("num_speculative_tokens", given["num_speculative_tokens"])
    else:
        tokens = None
    logged = read_speculative(text)
    # a draft model named without a method (V0's --speculative-model, whose SpecDecodeWorker splits the blocks
    # between target and drafter: spec_decode_worker.py) is refused below, not checked as without a drafter
    if logged is None or not (logged.engine_method or logged.draft):
        return tokens or 0, None
    method = logged.method
    if method is None or (method.needs_draft_model and not logged.engine_method):
        said = ", ".join(part for part in (
            f"{logged.num_tokens} draft tokens per step" if logged.num_tokens is not None else "",
            f"draft model {logged.draft}" if logged.draft else "") if part)
        what = (f"speculative method {logged.engine_method!r}" if logged.engine_method else
                "a drafter whose method it does not name")
        raise UnsupportedArchitectureError(f"check-log: the log drafts with {what}" + (f" ({said})" if said else "")
                                           + ", whose caches kvbudget does not model (it models eagle, eagle3, "
                                           "draft_model, mtp, ngram and suffix)")
    if tokens is None:
        if logged.num_tokens is None:
            raise KVBudgetError(f"check-log: the log drafts with {method} but names no num_speculative_tokens; give "
                                "--num-speculative-tokens", param="num_speculative_tokens")
        if not 1 <= logged.num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise KVBudgetError(f"check-log: the log's num_speculative_tokens {logged.num_tokens} is out of range (1 "
                                f"to {MAX_SPECULATIVE_TOKENS}); give --num-speculative-tokens",
                                param="num_speculative_tokens")
        tokens = logged.num_tokens
        read["num_speculative_tokens"] = tokens
    if not tokens:  # 0 given: checked as without speculative decoding
        return 0, None
    read["speculative"] = str(method)
    if method in (SpecMethod.NGRAM, SpecMethod.SUFFIX):  # no drafter layers; V1 counts a request's blocks at
        return 0, Speculative(method=method, num_tokens=tokens)  # max_model_len whatever k is (kv_cache_interface.py)
    if version is not None and method not in speculative_methods(version, Release(version).v0):
        since = MTP_FROM if method is SpecMethod.MTP else SPECULATIVE_RELEASE
        raise UnsupportedArchitectureError(
            f"check-log: the log's vLLM {version[0]}.{version[1]} drafts with {method}, whose drafter kvbudget sizes "
            f"from vLLM {since[0]}.{since[1]}'s rules on (engines/vllm/speculative.py); "
            f"its cache is not checked (pass {named('engine_version')} only if the log's release is wrong)",
            param="engine_version")
    if method is SpecMethod.MTP:
        return tokens, Speculative(method=method, num_tokens=tokens)
    draft = given.get("draft")
    if draft is None:
        source = given.get("draft_model") or logged.draft
        why = (f"its draft model {source!r} cannot be read here ({given['draft_unread']})" if given.get("draft_unread")
               else f"its draft model {source!r} was not loaded" if source else "it names no draft model")
        raise KVBudgetError(f"check-log: the log drafts with {method}, and {why}; pass {named('draft_model')} (a "
                            "config.json, model folder, catalog name or Hub id)", param="draft_model")
    draft_id = str(given.get("draft_model") or logged.draft)
    read["draft_model"] = draft_id
    return 0, Speculative(method=method, num_tokens=tokens, draft=draft, draft_id=draft_id)


def log_total_memory(text: str) -> float | None:
    """The GPU's total memory (GiB) as the log states it, else None."""
    return first_number(text, (r"total_gpu_memory[ =(]+([\d.]+) ?GiB", r"total_memory=([\d.]+) ?GiB",
                                r"Free memory on device \([\d.]+/([\d.]+) GiB\)"))


def first_number(text: str, patterns: tuple[str, ...]) -> float | None:
    """The first pattern's number that the text has, else None."""
    for pattern in patterns:
        if m := re.search(pattern, text):
            return log_figure(m.group(1), "memory figure")
    return None
