"""Parameter counts of the 2025-2026 families whose decoder layers carry more than attention and one MLP: Gemma 3n
(per-layer embeddings, AltUp, LAuReL), Gemma 4 (a dense MLP beside 128 experts, keys that are the values on global
layers), Kimi Linear (Kimi delta attention between MLA layers) and DeepSeek-V4 (compressed attention with an indexer,
hyper-connections, grouped output projection, an MTP layer kept apart).

Each count is the modules transformers builds for the config, weight for weight (transformers 5.25:
models/gemma3n/modeling_gemma3n.py, models/gemma4/modeling_gemma4.py, models/kimi_linear/modeling_kimi_linear.py,
models/deepseek_v4/modeling_deepseek_v4.py); DeepSeek-V4's MTP layer as vLLM builds it
(vllm/model_executor/models/deepseek_v4_mtp.py, vLLM 0.32). Buffers the checkpoints also store (DeepSeek-V4's hash
routing table, the routers' score-correction biases) are not parameters and are left out. tests/unit/model/
test_mixed_params.py checks every count against the real modules and the published totals.
"""

from __future__ import annotations

from collections.abc import Callable

from kvbudget.errors import ConfigError
from kvbudget.model.config import Fields
from kvbudget.model.spec import (
    Attention,
    Compressed,
    FullAttention,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    RecurrentState,
    SharedKV,
)

# (part, stored, active, layer): one group of parameters as kvbudget.model.params.ParamGroup holds it
Group = tuple[str, int, int, int | None]


def latent_attention_params(spec: LatentAttention, f: Fields, hidden: int) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi): the query (through q_lora_rank when set, with its norm),
    the joint K/V down-projection with the rope key and its norm, the up-projection, and the output."""
    heads = spec.heads
    q_lora = f.get("q_lora_rank")
    qk = spec.qk_nope_dim + spec.rope_dim
    q = hidden * heads * qk if not q_lora else hidden * q_lora + q_lora + q_lora * heads * qk
    kv_a = hidden * (spec.latent_dim + spec.rope_dim) + spec.latent_dim
    kv_b = spec.latent_dim * heads * (spec.qk_nope_dim + spec.v_dim)
    return q + kv_a + kv_b + heads * spec.v_dim * hidden


def moe_layout(i: int, f: Fields, mt: str) -> tuple[int, int, int, int, bool]:
    """(experts, top_k, expert intermediate, shared intermediate, is layer i MoE) of these families."""
    if mt == "gemma4_text":  # every layer: a dense MLP (the shared expert) beside the routed experts
        moe = bool(f.get("enable_moe_block", default=False))
        return ((f.int("num_experts"), f.int("top_k_experts"), f.int("moe_intermediate_size"),
                 f.int("intermediate_size"), True) if moe else (0, 0, 0, 0, False))
    if mt == "kimi_linear":
        experts = f.get("num_experts", default=0) or 0
        moe = bool(experts) and i >= (f.get("first_k_dense_replace") or 0) and i % (f.get("moe_layer_freq") or 1) == 0
        inter = f.int("moe_intermediate_size") if experts else 0
        return (experts, f.get("num_experts_per_token", "num_experts_per_tok") or 0, inter,
                (f.get("num_shared_experts") or 0) * inter, moe)
    if mt == "deepseek_v4":  # every layer MoE (the first num_hash_layers route by token id: the same weights)
        inter = f.int("moe_intermediate_size")
        shared = (f.get("n_shared_experts") or 0) * inter
        return f.int("n_routed_experts"), f.int("num_experts_per_tok"), inter, shared, True
    return 0, 0, 0, 0, False


def mlp_widths(f: Fields, layers: int) -> list[int]:
    """Each layer's `intermediate_size`: one for all, or one per layer (Gemma 3n's published configs)."""
    widths = f.get("intermediate_size")
    if not isinstance(widths, list):
        return [f.int("intermediate_size")] * layers
    if len(widths) != layers:
        raise ConfigError(f"{f.where}: intermediate_size lists {len(widths)} widths for {layers} layers; give one "
                          "width, or one per layer", param="model")
    return widths


def _gated(hidden: int, inter: int) -> int:
    return 3 * hidden * inter  # gate, up, down


def _feed_forward(i: int, f: Fields, mt: str, hidden: int) -> list[Group]:
    """Layer i's MoE block (routed experts, router, shared expert) or dense MLP of `intermediate_size`."""
    experts, top_k, inter, shared, moe = moe_layout(i, f, mt)
    if not moe:
        return [("mlp", _gated(hidden, f.int("intermediate_size")), _gated(hidden, f.int("intermediate_size")), i)]
    per_expert = _gated(hidden, inter)
    router = hidden * experts + (hidden + experts if mt == "gemma4_text" else 0)  # Gemma 4: a scale per dim, expert
    out: list[Group] = [("experts", experts * per_expert, top_k * per_expert, i), ("router", router, router, i)]
    if shared:
        out.append(("shared_expert", _gated(hidden, shared), _gated(hidden, shared), i))
    return out


def _group(part: str, count: int, layer: int | None = None) -> Group:
    return part, count, count, layer


def _ple_width(f: Fields) -> int:
    """The width of a layer's per-layer embedding: 256 where the config leaves it out (Gemma3nTextConfig's and
    Gemma4TextConfig's default), 0 for none (Gemma 4's larger models)."""
    width = f.get("hidden_size_per_layer_input", default=256)
    return 0 if not width else f.int("hidden_size_per_layer_input", default=256)


def _per_layer_inputs(f: Fields, layers: int, hidden: int) -> list[Group]:
    """Gemma's per-layer embeddings (PLE): a second embedding of `hidden_size_per_layer_input` per layer and token
    (a lookup, on the input side), the projection of the hidden state to them and its norm (before layer 0)."""
    width = _ple_width(f)
    if not width:
        return []
    vocab = f.int("vocab_size_per_layer_input", default=262_144)  # Gemma3nTextConfig's and Gemma4TextConfig's
    return [_group("embedding", vocab * layers * width), _group("mlp", hidden * layers * width, 0),
            _group("norm", width)]


def _layer_input(f: Fields, hidden: int, i: int) -> list[Group]:
    """A decoder layer's share of the per-layer embeddings: its gate, projection back and norm."""
    width = _ple_width(f)
    return [_group("mlp", 2 * hidden * width, i), _group("norm", hidden, i)] if width else []


def _attention(f: Fields, hidden: int, heads: int, head_dim: int, kv: tuple[int, int] | None, i: int) -> Group:
    """Gemma's attention: Q and O of `heads` x `head_dim`, a norm over Q's heads, and unless the layer reads another
    layer's K/V (`kv` None), K (and V, unless K is V) of kv[0] heads x head_dim with K's norm (kv[1]: 2 with V, 1
    without). `attention_bias` adds the projections' biases."""
    count = 2 * hidden * heads * head_dim + head_dim
    bias = heads * head_dim + hidden
    if kv is not None:
        count += kv[1] * hidden * kv[0] * head_dim + head_dim
        bias += kv[1] * kv[0] * head_dim
    return _group("attention", count + (bias if f.get("attention_bias", default=False) else 0), i)


def _gemma3n(model: ModelSpec, f: Fields, hidden: int) -> list[Group]:
    layers, heads = model.num_layers, model.attention_heads or 1
    widths = mlp_widths(f, layers)
    streams, rank = f.int("altup_num_inputs", default=4), f.int("laurel_rank", default=64)  # Gemma3nTextConfig's
    kv_heads, head_dim = f.int("num_key_value_heads"), f.int("head_dim")
    first_shared = layers - (f.get("num_kv_shared_layers", default=0) or 0)
    # AltUp's projections of the hidden state to its other streams (input side) and back (output side)
    altup = (streams - 1) * hidden * hidden
    out = [_group("mlp", altup, 0), _group("mlp", altup, layers - 1)]
    out += _per_layer_inputs(f, layers, hidden)
    for i in range(layers):
        kv = (kv_heads, 2) if i < first_shared else None
        out += [_attention(f, hidden, heads, head_dim, kv, i),
                _group("mlp", _gated(hidden, int(widths[i])), i),
                _group("mlp", 2 * hidden * rank, i),  # LAuReL: a rank-`laurel_rank` residual
                _group("router", hidden * streams, i),  # AltUp's modality router
                # four norms, LAuReL's, AltUp's router norm and output scale, its correction and prediction
                _group("norm", 7 * hidden + streams * streams + streams ** 3, i)]
        out += _layer_input(f, hidden, i)
    return out


def _source(spec: LayerSpec, specs: dict[int, LayerSpec]) -> tuple[Attention, bool]:
    """The attention spec whose widths layer `spec` has, and whether it computes its own K/V."""
    if isinstance(spec, SharedKV):
        source = specs[spec.source]
        assert isinstance(source, Attention)
        return source, False
    assert isinstance(spec, Attention)
    return spec, True


def _gemma4(model: ModelSpec, f: Fields, hidden: int) -> list[Group]:
    layers, heads = model.num_layers, model.attention_heads or 1
    specs = {s.layer: s for s in model.layers}
    k_is_v = bool(f.get("attention_k_eq_v", default=False))
    out = _per_layer_inputs(f, layers, hidden)
    for i in range(layers):
        spec, own = _source(specs[i], specs)
        both = 1 if k_is_v and isinstance(spec, FullAttention) else 2  # global layers: V is K, normalised
        out.append(_attention(f, hidden, heads, spec.k_dim, (spec.kv_heads, both) if own else None, i))
        # the dense MLP (the shared expert beside routed ones): double wide on layers that share K/V when so set
        wide = 2 if f.get("use_double_wide_mlp", default=False) and not own else 1
        dense = _gated(hidden, wide * f.int("intermediate_size"))
        mlp = [(part, dense, dense, i) if part in ("mlp", "shared_expert") else (part, count, active, i)
               for part, count, active, _ in _feed_forward(i, f, "gemma4_text", hidden)]
        out += mlp
        out.append(_group("norm", (7 if len(mlp) > 1 else 4) * hidden, i))  # MoE: three norms more
        out += _layer_input(f, hidden, i)
    return out


def _kda(spec: RecurrentState, hidden: int) -> int:
    """Kimi delta attention: Q, K, V of heads x head_dim each with their short convolutions, the low-rank forget
    gate with its bias and decay, the beta projection, the low-rank output gate, the output norm and projection."""
    heads, dim, _ = spec.state_shape
    width = heads * dim
    return (3 * hidden * width + spec.conv_channels * spec.conv_kernel + 2 * (hidden * dim + dim * width) + width
            + heads + hidden * heads + dim + width * hidden)


def _kimi_linear(model: ModelSpec, f: Fields, hidden: int) -> list[Group]:
    out: list[Group] = []
    for spec in model.layers:
        i = spec.layer
        if isinstance(spec, RecurrentState):
            out.append(_group("mixer", _kda(spec, hidden), i))
        elif isinstance(spec, LatentAttention):
            out.append(_group("attention", latent_attention_params(spec, f, hidden), i))
        out += [*_feed_forward(i, f, "kimi_linear", hidden), _group("norm", 2 * hidden, i)]
    return out


def _compressor(spec: Compressed, hidden: int) -> int:
    """A DeepSeek-V4 compressor: K/V and gate projections to `dim` (twice for overlapping windows), a position bias
    per slot of its window, the entry's norm."""
    width = (2 if spec.overlap else 1) * spec.dim
    return 2 * hidden * width + spec.rate * width + spec.dim


def _v4_layer(specs: list[LayerSpec], f: Fields, hidden: int, heads: int, i: int) -> list[Group]:
    """DeepSeek-V4's decoder layer i: attention through q_lora_rank to heads x head_dim with one shared K=V
    vector, attention sinks, the grouped low-rank output (o_groups x o_lora_rank), the compressors and the indexer's
    queries and weights; the MoE block; two norms; the attention's and the MLP's hyper-connections."""
    head_dim, q_lora, o_lora = f.int("head_dim"), f.int("q_lora_rank"), f.int("o_lora_rank")
    attention = (hidden * q_lora + q_lora + q_lora * heads * head_dim + hidden * head_dim + head_dim + heads
                 + heads * head_dim * o_lora + f.int("o_groups") * o_lora * hidden)
    for spec in specs:
        if isinstance(spec, Compressed):
            attention += _compressor(spec, hidden)
            if spec.role == "indexer":
                index_heads = f.int("index_n_heads")
                attention += q_lora * index_heads * spec.dim + hidden * index_heads
    streams = f.int("hc_mult")
    mix = (2 + streams) * streams  # pre, post and residual mixing weights per stream
    hyper = 2 * (mix * streams * hidden + mix + 3)
    return [_group("attention", attention, i), *_feed_forward(i, f, "deepseek_v4", hidden),
            _group("norm", 2 * hidden + hyper, i)]


def _mtp_compressors(f: Fields, layer: int) -> list[LayerSpec]:
    """The compressors of DeepSeek-V4's MTP layer: compress_ratios' entry after the model's own layers (0, a sliding
    window only, in the released configs; 4 with the indexer, overlapping; 128 without)."""
    ratios = f.cfg.get("compress_ratios")
    rate = ratios[layer] if isinstance(ratios, list) and len(ratios) > layer else 0
    if rate not in (4, 128):
        return []
    out: list[LayerSpec] = [Compressed(layer, rate, f.int("head_dim"), rate == 4)]
    return out + ([Compressed(layer, rate, f.int("index_head_dim"), True, role="indexer")] if rate == 4 else [])


def _deepseek_v4(model: ModelSpec, f: Fields, hidden: int) -> list[Group]:
    heads = model.attention_heads or 1
    by_layer: dict[int, list[LayerSpec]] = {}
    for spec in model.layers:
        by_layer.setdefault(spec.layer, []).append(spec)
    streams = f.int("hc_mult")
    head = streams * streams * hidden + streams + 1  # the hyper-connections' head: the streams mixed into one
    out = [_group("norm", head)]
    for i in range(model.num_layers):
        out += _v4_layer(by_layer.get(i, []), f, hidden, heads, i)
    mtp = f.get("num_nextn_predict_layers", default=0) or 0
    if mtp:  # each MTP layer: a decoder layer, its e/h projections, three norms and its own head
        layer = sum(g[1] for g in _v4_layer(_mtp_compressors(f, model.num_layers), f, hidden, heads, model.num_layers))
        out.append(("mtp", mtp * (layer + 2 * hidden * hidden + 3 * hidden + head), 0, None))
    return out


def gemma4_vision_params(vision: dict, text_hidden: int) -> int:
    """Gemma 4's vision tower (transformers' Gemma4VisionModel): a patch projection without bias, a learned table
    of 2 x position_embedding_size positions, layers of bias-free attention with Q and K norms, a gated MLP and four
    norms; then the projection to the text model's width."""
    h, inner, layers, patch, heads, positions = (_positive(vision, k) for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "patch_size", "num_attention_heads",
        "position_embedding_size"))
    head_dim = _positive(vision, "head_dim") if "head_dim" in vision else h // heads
    block = 4 * h * h + 2 * head_dim + 3 * h * inner + 4 * h
    return 3 * patch * patch * h + 2 * positions * h + layers * block + h * text_hidden


def _positive(vision: dict, key: str) -> int:
    value = vision.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"vision_config: {key!r} is {value!r}; Gemma 4's vision tower needs it as a positive "
                          "integer (fix the config)", param="model")
    return value


COUNTS: dict[str, Callable[[ModelSpec, Fields, int], list[Group]]] = {
    "gemma3n_text": _gemma3n, "gemma4_text": _gemma4, "kimi_linear": _kimi_linear, "deepseek_v4": _deepseek_v4}
