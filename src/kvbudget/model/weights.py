"""Weight bytes: exact from safetensors headers when the checkpoint is at hand, else from the parameter
count and the checkpoint's quantization (fp8 blocks, MXFP4 experts, int4/int8 groups)."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from kvbudget.errors import ConfigError, KVBudgetError, named
from kvbudget.files import MAX_DOCUMENT_BYTES, parse_json_text
from kvbudget.model.params import ParamGroup, count_parameters
from kvbudget.model.spec import ModelSpec
from kvbudget.validate import shown

# Bytes per element of the safetensors dtypes.
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                           "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "U32": 4, "U16": 2,
                           "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75}
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# 4-bit floats with an 8-bit power-of-two scale per 32 (MXFP4): gpt-oss's experts, and DeepSeek-V4's where its config
# says expert_dtype "fp4" (float4_e2m1fn_x2 values, a float8_e8m0fnu scale per 32 inputs: DeepSeek's
# inference/model.py Linear; vLLM 0.32 loads them as MXFP4)
FP4_EXPERT_BYTES = 4.25 / 8


def _fp4_experts(model: ModelSpec) -> bool:
    return model.config.get("expert_dtype") == "fp4"


def mxfp4_checkpoint(model: ModelSpec) -> bool:
    """Whether the checkpoint's quantization_config says MXFP4 (gpt-oss: its experts; engines load them their way)."""
    q = model.config.get("quantization_config") or {}
    return str(q.get("quant_method", "")).lower() == "mxfp4"


@dataclass(frozen=True, kw_only=True)
class Weights:
    total_params: int  # the model proper (MTP modules excluded)
    active_params: int  # used per generated token (input embedding included)
    mtp_params: int  # multi-token-prediction modules, loaded by engines only for speculative decoding
    total_bytes: int  # the whole checkpoint without MTP
    per_gpu_bytes: int  # on the most loaded GPU under tp x pp
    active_bytes: int  # read per decode step (the roofline's weight term)
    exact: bool  # True when read from safetensors headers
    basis: str  # how the bytes were obtained, for people

    def to_dict(self) -> dict[str, Any]:
        return {"parameters": {"total": self.total_params, "active": self.active_params, "mtp": self.mtp_params},
                "total_bytes": self.total_bytes, "per_gpu_bytes": self.per_gpu_bytes,
                "active_bytes": self.active_bytes, "exact": self.exact, "basis": self.basis}


def _bytes_per_param(model: ModelSpec) -> tuple[dict[str, float], str]:
    """Bytes per parameter for quantizable linear weights, experts, and everything else."""
    base = _DTYPE_BYTES.get(model.dtype, 2)
    q = model.config.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    fp4 = _fp4_experts(model)
    if not q:
        if fp4:
            return ({"linear": base, "experts": FP4_EXPERT_BYTES, "other": base},
                    f"FP4 experts (4-bit values + an 8-bit scale per 32: expert_dtype fp4), the rest {model.dtype}")
        return {"linear": base, "experts": base, "other": base}, f"{model.dtype} weights"
    if method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        scale = 4 / (block[0] * block[1])  # one float32 scale per block
        return ({"linear": 1 + scale, "experts": FP4_EXPERT_BYTES if fp4 else 1 + scale, "other": base},
                f"fp8 linear weights with a float32 scale per {block[0]}x{block[1]} block"
                + (", FP4 experts (expert_dtype fp4)" if fp4 else "") + f", the rest {model.dtype}")
    if method == "mxfp4":
        return ({"linear": base, "experts": FP4_EXPERT_BYTES, "other": base},
                f"MXFP4 experts (4-bit values + an 8-bit scale per 32), the rest {model.dtype}")
    if method == "compressed-tensors" and _compressed_weights(q) is not None:
        return _compressed(q, base, model.dtype)
    if method in ("awq", "gptq", "compressed-tensors"):
        bits = q.get("bits") or q.get("w_bit") or 4
        group = q.get("group_size") or q.get("q_group_size") or 128
        per = bits / 8 + 2 / group + bits / 8 / group  # packed values, fp16 scale and packed zero per group
        return ({"linear": per, "experts": per, "other": base},
                f"{method} int{bits} linear weights, groups of {group} (fp16 scale + zero point), "
                f"the rest {model.dtype}")
    raise ConfigError(f"{model.name}: quantization method {method!r} is not modelled; give the weight bytes "
                      f"({named('weights', 'SIZE')})", param="weights")


class WeightFormat(Enum):
    """How a checkpoint stores linear weights, as far as it picks the kernels that run them (the values are
    aiconfigurator's names for the kernels measured on them: data/steptimes/README.md)."""

    BF16 = "bfloat16"  # 16 bits (float16 and float32 checkpoints are timed as such too)
    FP8 = "fp8"  # 8-bit floats, a scale per tensor or per output channel
    FP8_BLOCK = "fp8_block"  # 8-bit floats, a scale per block (128 x 128 as DeepSeek and Qwen3 store them)
    MXFP4 = "w4a16_mxfp4"  # 4-bit floats, an 8-bit scale per 32, 16-bit activations
    INT4 = "int4_wo"  # 4-bit integers in groups, weights only
    OTHER = "other"  # any other (int8, 8-bit groups, ...): no kernels measured on it


def weight_formats(model: ModelSpec) -> tuple[WeightFormat, WeightFormat]:
    """The formats of `model`'s quantizable linear weights and of its routed experts, as its quantization_config
    says (the same reading as the bytes per parameter)."""
    q = model.config.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if not q:
        return WeightFormat.BF16, WeightFormat.MXFP4 if _fp4_experts(model) else WeightFormat.BF16
    if method == "fp8":
        fmt = WeightFormat.FP8_BLOCK if q.get("weight_block_size") else WeightFormat.FP8
        return fmt, WeightFormat.MXFP4 if _fp4_experts(model) else fmt
    if method == "mxfp4":
        return WeightFormat.BF16, WeightFormat.MXFP4
    w = _compressed_weights(q) if method == "compressed-tensors" else None
    if w is not None:
        bits, kind = int(w["num_bits"]), str(w.get("type", "int"))
        fmt = (WeightFormat.FP8_BLOCK if str(w.get("strategy")) == "block" else WeightFormat.FP8) if (
            bits, kind) == (8, "float") else WeightFormat.INT4 if (bits, kind) == (4, "int") else WeightFormat.OTHER
        return fmt, fmt
    bits = q.get("bits") or q.get("w_bit") or 4
    fmt = WeightFormat.INT4 if method in ("awq", "gptq", "compressed-tensors") and bits == 4 else WeightFormat.OTHER
    return fmt, fmt


def param_bytes(model: ModelSpec) -> Callable[[ParamGroup], float]:
    """Bytes per parameter of a group of `model`'s parameters: routed experts, other quantizable linear weights
    and the rest (embeddings, norms, routers) each by the checkpoint's own format for them."""
    per_param, _ = _bytes_per_param(model)
    left = _left_unquantized(model)

    def rate(group: ParamGroup) -> float:
        if left(group):
            return per_param["other"]
        if group.part == "experts":
            return per_param["experts"]
        return per_param["linear"] if group.quantizable else per_param["other"]

    return rate


def _compressed_weights(q: dict[str, Any]) -> dict[str, Any] | None:
    """The weights scheme of a compressed-tensors checkpoint (its first config group that quantizes weights)."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict):
        return None
    return next((g["weights"] for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)
                 and g["weights"].get("num_bits")), None)


# A compressed-tensors checkpoint's `ignore` list names the Linear modules it leaves unquantized, as "re:" regexes
# (re.match) or whole module names (compressed-tensors utils/match.py). kvbudget matches each entry against the names
# Hugging Face checkpoints give one module of each part (model.layers.N.<name>, alone or in a multimodal model): a
# part whose module an entry names stays in the model's dtype (Kimi-K2.5's int4 checkpoint leaves its attention,
# shared experts and dense MLP in bfloat16 that way). A part is counted whole: an entry naming one projection of
# it (q_proj alone) does not leave it unquantized.
_MODULES = {"attention": ("self_attn.o_proj",), "mlp": ("mlp.down_proj",), "experts": ("mlp.experts.0.down_proj",),
            "shared_expert": ("mlp.shared_experts.down_proj", "mlp.shared_expert.down_proj")}
_PREFIXES = ("", "language_model.", "model.language_")  # a text model's names alone and inside a multimodal model
MAX_IGNORE_ENTRIES = 20_000  # past any real checkpoint's list (one name per ignored Linear of a 100-layer model)
MAX_IGNORE_CHARS = 1_000  # one entry: a module name or a regex


def _left_unquantized(model: ModelSpec) -> Callable[[ParamGroup], bool]:
    """Whether a group of `model`'s parameters is one its compressed-tensors `ignore` list leaves unquantized."""
    q = model.config.get("quantization_config") or {}
    ignore = q.get("ignore") if str(q.get("quant_method", "")).lower() == "compressed-tensors" else None
    if not ignore:
        return lambda group: False
    where = f"{model.name}: quantization_config.ignore"
    if not isinstance(ignore, list) or len(ignore) > MAX_IGNORE_ENTRIES:
        raise ConfigError(f"{where} must be a list of at most {MAX_IGNORE_ENTRIES:,} module names or 're:' regexes, "
                          f"got {type(ignore).__name__}" + (f" of {len(ignore):,}" if isinstance(ignore, list) else ""),
                          param="model")
    patterns, names = [], set()
    for entry in ignore:
        if not isinstance(entry, str) or not 0 < len(entry) <= MAX_IGNORE_CHARS:
            raise ConfigError(f"{where}: each entry must be a module name or 're:' regex of 1 to {MAX_IGNORE_CHARS:,} "
                              f"characters, got {shown(entry)}", param="model")
        if not entry.startswith("re:"):
            names.add(entry.rsplit("model.layers.", 1)[-1])
            continue
        try:
            patterns.append(re.compile(entry[3:]))
        except re.error as exc:
            raise ConfigError(f"{where}: {shown(entry)} is not a regular expression ({exc}); fix or drop the entry",
                              param="model") from None

    def left(group: ParamGroup) -> bool:
        if group.layer is None or group.part not in _MODULES:  # the LM head and embeddings are unquantized anyway
            return False
        candidates = tuple(f"{prefix}model.layers.{group.layer}.{m}" for m in _MODULES[group.part]
                           for prefix in _PREFIXES)
        return any(c.rsplit("model.layers.", 1)[-1] in names or any(p.match(c) for p in patterns)
                   for c in candidates)

    return left


def _compressed(q: dict[str, Any], base: float, dtype: str) -> tuple[dict[str, float], str]:
    """compressed-tensors as its config_groups say: `num_bits` per weight of type int or float, and a scale per
    output channel (negligible beside the row: left out), per group of `group_size` (a 16-bit scale, and a zero
    point when asymmetric), or per tensor."""
    w = _compressed_weights(q) or {}
    bits, kind, strategy = int(w["num_bits"]), str(w.get("type", "int")), str(w.get("strategy", "tensor"))
    per = bits / 8
    if strategy == "group":
        group = int(w.get("group_size") or 128)
        per += 2 / group + (0 if w.get("symmetric", True) else bits / 8 / group)
        what = f"groups of {group}"
    else:
        what = f"a scale per {strategy}"
    return ({"linear": per, "experts": per, "other": base},
            f"compressed-tensors {kind}{bits} linear weights ({q.get('format', 'quantized')}, {what}), "
            f"the rest {dtype}")


def analytic_weights(model: ModelSpec, tp: int = 1, stages: Sequence[range] | None = None, ep: int = 1) -> Weights:
    """Weight bytes from the parameter count (an estimate unless the checkpoint is plain bf16/fp16).

    `stages`: the layers of each pipeline stage, as the engine splits them (default: one stage). `ep`: expert
    parallelism over `ep` data-parallel attention ranks: routed experts are spread over tp x ep GPUs, the rest
    is replicated on each rank (and split by tp)."""
    counts = count_parameters(model)
    _, basis = _bytes_per_param(model)
    rate = param_bytes(model)

    def size(group: ParamGroup) -> float:
        return group.count * rate(group)

    def active_size(group: ParamGroup) -> float:
        if group.part == "embedding":
            return 0  # a lookup: one row per token, not read whole
        return group.active * rate(group)

    main = [g for g in counts.groups if g.part != "mtp"]
    left = _left_unquantized(model)
    if kept := sorted({g.part.replace("_", " ") for g in main if left(g)}):
        basis += f"; {', '.join(kept)} left in {model.dtype} by its ignore list"
    total = int(sum(size(g) for g in main))
    per_gpu = _per_gpu(main, size, tp, stages or [range(model.num_layers)], ep)
    return Weights(total_params=counts.total, active_params=counts.active, mtp_params=counts.mtp, total_bytes=total,
                   per_gpu_bytes=per_gpu, active_bytes=int(sum(active_size(g) for g in main)),
                   exact=False, basis=f"analytic: {basis}")


@dataclass(frozen=True, kw_only=True)
class LayerWeights:
    """The analytic weight bytes by where an engine that splits layers puts them (llama.cpp's -ngl)."""

    layers: tuple[int, ...]  # each decoder layer's
    input: int  # token embeddings (and a vision tower)
    output: int  # the LM head and the final norm (tied embeddings: the embeddings again, which the head reads)
    exact: bool = False  # read from the file's tensors


def layer_weights(model: ModelSpec) -> LayerWeights:
    """Each decoder layer's weight bytes, the input side's and the output side's: a GGUF file's own tensors where the
    model came from one (exact), else an estimate as `analytic_weights` (MTP modules left out)."""
    if model.source.startswith("gguf:"):
        from kvbudget.model.gguf import gguf_layer_bytes

        per_layer, input_bytes, output_bytes = gguf_layer_bytes(Path(model.source[5:]), model.num_layers)
        return LayerWeights(layers=tuple(per_layer), input=input_bytes, output=output_bytes, exact=True)
    counts = count_parameters(model)
    rate = param_bytes(model)

    def size(group: ParamGroup) -> float:
        return group.count * rate(group)

    layers = [0.0] * model.num_layers
    input_side = output_side = 0.0
    for g in counts.groups:
        if g.part == "mtp":
            continue
        if g.layer is not None:
            layers[g.layer] += size(g)
        elif g.part in ("embedding", "vision"):
            input_side += size(g)
        else:
            output_side += size(g)
    if model.config.get("tie_word_embeddings") and not any(g.part == "lm_head" for g in counts.groups):
        output_side += sum(size(g) for g in counts.groups if g.part == "embedding")  # the head reads them too
    return LayerWeights(layers=tuple(int(x) for x in layers), input=int(input_side), output=int(output_side))


def _per_gpu(groups: list[ParamGroup], size: Callable[[ParamGroup], float], tp: int,
             stages: Sequence[range], ep: int = 1) -> int:
    """The most loaded GPU: layers split by pipeline stage, then tensor-parallel ranks share each stage.
    Embeddings and the LM head are vocabulary-parallel; norms and routers are replicated."""
    pp = len(stages)
    loads = []
    for index, stage in enumerate(stages):
        load = 0.0
        for g in groups:
            if g.layer is None:
                if (g.part in ("embedding", "vision") and index != 0) or (g.part in ("lm_head", "norm")
                                                                        and index != pp - 1):
                    continue
            elif g.layer not in stage:
                continue
            load += size(g) / (1 if g.replicated else tp * ep if g.part == "experts" else tp)
        loads.append(load)
    return int(max(loads))


def safetensors_bytes(folder: Path) -> dict[str, int]:
    """Bytes per safetensors dtype over every *.safetensors file in `folder`, from the headers alone."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise KVBudgetError(f"{folder}: no *.safetensors files to read weights from")
    totals: dict[str, int] = {}
    for path in files:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise KVBudgetError(f"{path}: not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_DOCUMENT_BYTES:  # a real header lists a few thousand tensors: well under 1 MB
                raise KVBudgetError(f"{path}: not a safetensors file kvbudget reads (its header claims {length:,} "
                                    f"bytes; at most {MAX_DOCUMENT_BYTES:,})")
            raw = fh.read(length)
        if len(raw) != length:
            raise KVBudgetError(f"{path}: not a safetensors file (its header is cut short)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise KVBudgetError(f"{path}: unreadable safetensors header (not UTF-8)") from None
        header = parse_json_text(text, f"{path}: its header", kind="safetensors header")
        if not isinstance(header, dict):
            raise KVBudgetError(f"{path}: unreadable safetensors header (not a JSON object)")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = info["data_offsets"]
                dtype = info["dtype"]
            except (KeyError, TypeError, ValueError):
                begin = end = dtype = None
            if not (type(begin) is int and type(end) is int and 0 <= begin <= end and isinstance(dtype, str)):
                raise KVBudgetError(f"{path}: unreadable safetensors header (tensor {name[:60]!r} has no dtype and "
                                    "data_offsets [begin, end])")
            totals[dtype] = totals.get(dtype, 0) + (end - begin)
    return totals


def hub_safetensors_bytes(repo_id: str) -> dict[str, int]:
    """Bytes per dtype of a Hub repo's safetensors, from their headers (huggingface_hub; no weights fetched)."""
    from huggingface_hub import get_safetensors_metadata

    meta = get_safetensors_metadata(repo_id)
    totals: dict[str, int] = {}
    for dtype, count in meta.parameter_count.items():
        totals[dtype] = totals.get(dtype, 0) + int(count * SAFETENSORS_DTYPE_BYTES.get(dtype, 2))
    return totals


def model_weights(model: ModelSpec, tp: int = 1, stages: Sequence[range] | None = None, ep: int = 1) -> Weights:
    """Exact bytes from the checkpoint's safetensors headers when the model came from a folder holding
    them, or from a Hub repo's safetensors metadata; otherwise the analytic estimate (`ep`: analytic_weights')."""
    analytic = analytic_weights(model, tp, stages, ep)
    folder = Path(model.source).parent if model.source.endswith("config.json") else None
    if model.source.startswith("gguf:"):  # the file's own tensors, quantized as they are
        from kvbudget.model.gguf import read_gguf

        path = Path(model.source[5:])
        return _scaled(analytic, read_gguf(path)[1], f"GGUF tensors in {path.name}")
    if model.source.startswith("hub:"):
        from kvbudget import hub  # (the Hub's client only where a Hub model is read)

        repo = model.source[4:]
        offline = hub.offline_reason()
        if offline:
            return replace(analytic, basis=f"{analytic.basis} (the Hub's safetensors metadata for {repo} was not "
                                           f"read: {offline})")
        try:
            by_dtype = hub_safetensors_bytes(repo)
        except Exception as exc:  # offline, gated, no safetensors: say so and use the analytic count
            return replace(analytic, basis=f"{analytic.basis} (the Hub's safetensors metadata for {repo} could not "
                                           f"be read: {type(exc).__name__})")
        return _scaled(analytic, by_dtype, f"Hub safetensors metadata of {repo}")
    if folder is None or not any(folder.glob("*.safetensors")):
        return analytic
    return _scaled(analytic, safetensors_bytes(folder), f"safetensors headers in {folder}")


def _scaled(analytic: Weights, by_dtype: dict[str, int], where: str) -> Weights:
    """Exact total bytes; per-GPU and per-step shares in the analytic proportions."""
    total = sum(by_dtype.values())
    scale = total / analytic.total_bytes if analytic.total_bytes else 1
    detail = ", ".join(f"{dtype} {size:,} B" for dtype, size in sorted(by_dtype.items()))
    return Weights(total_params=analytic.total_params, active_params=analytic.active_params,
                   mtp_params=analytic.mtp_params, total_bytes=total,
                   per_gpu_bytes=int(analytic.per_gpu_bytes * scale), active_bytes=int(analytic.active_bytes * scale),
                   exact=True,
                   basis=f"{where}: {detail}")
