"""Parameter counts from a config, by part (embeddings, attention, MLP, experts, mixers, norms).

An analytic count: what transformers would build for the config. It is checked against the published
totals of the bundled models in tests/unit/model/test_params.py (within 2%). Exact byte counts come from safetensors
headers instead (kvbudget.weights) when the checkpoint is at hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.errors import ConfigError, named
from kvbudget.model.config import Fields, model_type_of, text_config_of
from kvbudget.model.mixed import COUNTS, gemma4_vision_params, latent_attention_params, mlp_widths, moe_layout
from kvbudget.model.spec import (
    Attention,
    IndexerKeys,
    LatentAttention,
    ModelSpec,
    NoCache,
    RecurrentState,
    SlidingWindow,
)

# transformers' default for tie_word_embeddings where the config leaves it out.
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "opt", "falcon", "cohere"}


@dataclass(frozen=True)
class ParamGroup:
    """Parameters of one part of the model: `count` stored, `active` used per token."""

    # "embedding", "lm_head", "attention", "indexer", "mlp", "experts", "router", "shared_expert", "mixer", "norm",
    # "mtp" or
    # "vision" (a multimodal model's vision tower and projector)
    part: str
    count: int
    active: int
    layer: int | None = None  # None: outside the decoder layers (embeddings, lm_head, final norm, MTP)

    @property
    def replicated(self) -> bool:
        """Held whole on every tensor-parallel rank (norms, MoE routers, DeepSeek-V3.2's indexer: vLLM builds its
        projections replicated); the rest is split over the ranks."""
        return self.part in ("norm", "router", "indexer")

    @property
    def quantizable(self) -> bool:
        """Linear weights that quantized checkpoints store quantized (not embeddings, norms, routers)."""
        return self.part in ("attention", "mlp", "experts", "shared_expert", "mixer", "mtp", "indexer")


@dataclass(frozen=True)
class ParamCount:
    groups: tuple[ParamGroup, ...]

    @property
    def total(self) -> int:
        """Parameters of the model proper (multi-token-prediction modules excluded, as model cards count)."""
        return sum(g.count for g in self.groups if g.part != "mtp")

    @property
    def active(self) -> int:
        return sum(g.active for g in self.groups if g.part != "mtp")

    @property
    def mtp(self) -> int:
        return sum(g.count for g in self.groups if g.part == "mtp")


def _fields(model: ModelSpec) -> Fields:
    return Fields(text_config_of(model.config), model_type_of(model.config) or "", model.name)


@dataclass(frozen=True)
class Widths:
    """The widths an activation estimate needs: hidden size, vocabulary, and the widest MLP per token."""

    hidden: int
    vocab: int
    mlp: int  # intermediate width of the dense MLP, or of the active experts together in an MoE layer


def activation_widths(model: ModelSpec) -> Widths:
    """Hidden, vocabulary and MLP widths from the config (MoE: the experts one token runs, together)."""
    f = _fields(model)
    hidden = f.int("hidden_size", "n_embd", "d_model")
    vocab = f.int("vocab_size", "padded_vocab_size")
    inter = f.get("intermediate_size", "ffn_hidden_size", "ffn_dim", default=4 * hidden) or 4 * hidden
    if isinstance(inter, list):  # one per layer (Gemma 3n)
        inter = max(mlp_widths(f, model.num_layers))
    moe_inter = f.get("moe_intermediate_size")
    top_k = f.get("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "top_k_experts")
    if moe_inter and top_k:
        inter = max(inter if not f.get("n_routed_experts") else 0, moe_inter * top_k)
    return Widths(hidden, vocab, int(inter))


def head_vocab(model: ModelSpec) -> int:
    """The tokens the model's LM head scores: an EAGLE-3 head's draft_vocab_size where its config gives one (a
    smaller vocabulary mapped to the target's), else vocab_size."""
    f = _fields(model)
    return f.int("draft_vocab_size") if f.get("draft_vocab_size") else f.int("vocab_size", "padded_vocab_size")


# Families whose weights follow another family's rules (the same projections under a new model_type).
_SAME_WEIGHTS_AS = {"qwen3_5_text": "qwen3_next", "qwen3_5_moe_text": "qwen3_next", "deepseek_v32": "deepseek_v3",
                    "glm4_moe": "deepseek_v3", "minimax_m2": "mixtral"}
# Families whose weights kvbudget does not count yet (their KV is modelled; pass the weight bytes to plan).
_UNCOUNTED = {"granitemoehybrid"}


def count_parameters(model: ModelSpec) -> ParamCount:
    """Analytic parameter count of `model` (built from its config.json)."""
    f = _fields(model)
    mt = _SAME_WEIGHTS_AS.get(f.model_type, f.model_type)
    if mt in _UNCOUNTED:
        raise ConfigError(f"weights: kvbudget does not count {f.model_type} parameters yet ({model.name}); give the "
                          f"weight bytes per GPU to plan ({named('weights', 'SIZE')})", param="weights")
    hidden = f.int("hidden_size", "n_embd", "d_model")
    vocab = f.int("vocab_size", "padded_vocab_size")
    groups: list[ParamGroup] = []
    if mt in COUNTS:  # Gemma 3n, Gemma 4, Kimi Linear, DeepSeek-V4: layers of their own (kvbudget.model.mixed)
        return _mixed_count(model, f, mt, hidden, vocab)

    def add(part: str, count: int, active: int | None = None, layer: int | None = None) -> None:
        if count:
            groups.append(ParamGroup(part, count, count if active is None else active, layer))

    add("embedding", vocab * hidden)
    if mt == "opt":
        add("embedding", (f.int("max_position_embeddings") + 2) * hidden)
    tied = f.get("tie_word_embeddings", default=mt in _TIED_BY_DEFAULT)
    if not tied:
        add("lm_head", vocab * hidden)
    add("norm", hidden)

    by_layer: dict[int, list] = {}
    for spec in model.layers:
        by_layer.setdefault(spec.layer, []).append(spec)
    for i in range(model.num_layers):
        for spec in by_layer.get(i, []):
            if isinstance(spec, RecurrentState):
                add("mixer", _mixer(spec, f, hidden), layer=i)
            elif isinstance(spec, LatentAttention):
                add("attention", latent_attention_params(spec, f, hidden), layer=i)
            elif isinstance(spec, IndexerKeys):  # DeepSeek-V3.2's lightning indexer (vLLM: deepseek_v2.py Indexer)
                heads = f.int("index_n_heads")
                add("indexer", f.int("q_lora_rank") * heads * spec.dim + hidden * (spec.dim + heads) + 2 * spec.dim,
                    layer=i)
            elif isinstance(spec, Attention):
                add("attention", _attention(spec, f, mt, hidden, model.attention_heads or 1), layer=i)
        single_block = mt == "nemotron_h"  # each layer is a mixer, attention or an MLP, never two of them
        if single_block and not all(isinstance(spec, NoCache) for spec in by_layer.get(i, [])):
            add("norm", hidden, layer=i)
            continue
        for part, count, active in _feed_forward(i, f, mt, hidden):
            add(part, count, active, layer=i)
        add("norm", 2 * hidden, layer=i)

    modules = _mtp_modules(model, f, mt, hidden, groups)
    if modules is not None:
        add("mtp", modules.total)
    add("vision", vision_parameters(model.config.get("vision_config"), hidden), active=0)
    return ParamCount(tuple(groups))


@dataclass(frozen=True, kw_only=True)
class MTPModules:
    """A model's multi-token-prediction modules as its modelling code builds them, its embeddings and LM head left
    out (checkpoints may hold copies; engines share the target's): `layers` decoder layers, each `block` (a copy of
    the model's last attention layer, part by part: its MoE or MLP as that layer's); `fuse` parameters of the
    projection of [embedding; hidden state] to the hidden size (2h x h each), `norms` of the norms around them,
    both over all the layers; `fuse_per_layer` whether each layer has its own projection (DeepSeek's eh_proj) or
    the layers share one (Qwen's mtp.fc)."""

    layers: int
    block: tuple[ParamGroup, ...]
    fuse: int
    norms: int
    fuse_per_layer: bool

    @property
    def total(self) -> int:
        return self.layers * sum(g.count for g in self.block) + self.fuse + self.norms


def mtp_modules(model: ModelSpec) -> MTPModules | None:
    """The MTP modules of `model` (None where its config declares none, or its family has none kvbudget counts)."""
    f = _fields(model)
    mt = _SAME_WEIGHTS_AS.get(f.model_type, f.model_type)
    if mt in _UNCOUNTED:
        return None
    groups = count_parameters(model).groups
    return _mtp_modules(model, f, mt, f.int("hidden_size", "n_embd", "d_model"), list(groups))


def _mtp_modules(model: ModelSpec, f: Fields, mt: str, hidden: int, groups: list[ParamGroup]) -> MTPModules | None:
    """DeepSeek-V3 / R1 / V3.2, Kimi-K2 and GLM-4.5 / 4.6 (deepseek_mtp.py, glm4_moe_mtp.py): per layer enorm,
    hnorm, eh_proj (2h -> h), a decoder layer and shared_head's norm; Qwen3-Next and Qwen3.5 / 3.6
    (qwen3_next_mtp.py, qwen3_5_mtp.py): pre_fc_norm_embedding, pre_fc_norm_hidden, fc (2h -> h) and the final norm
    once, and full-attention decoder layers."""
    layers = len({s.layer for s in model.draft_layers})
    if mt == "kimi_k2":  # no MTP drafter in vLLM, but its checkpoints may carry the layers (DeepSeek's layout)
        layers = f.get("num_nextn_predict_layers", default=0) or 0
    if not layers or mt not in ("deepseek_v3", "kimi_k2", "qwen3_next"):
        return None
    last = max(s.layer for s in model.layers if isinstance(s, (Attention, LatentAttention)))
    block = tuple(ParamGroup(g.part, g.count, g.active) for g in groups if g.layer == last)
    if mt == "qwen3_next":
        return MTPModules(layers=layers, block=block, fuse=2 * hidden * hidden, norms=3 * hidden,
                          fuse_per_layer=False)
    return MTPModules(layers=layers, block=block, fuse=layers * 2 * hidden * hidden, norms=layers * 3 * hidden,
                      fuse_per_layer=True)


def _mixed_count(model: ModelSpec, f: Fields, mt: str, hidden: int, vocab: int) -> ParamCount:
    """The layers kvbudget.model.mixed counts, with the embedding, the LM head unless tied, the final norm and a
    vision tower (Gemma 4's own, else counted as a ViT)."""
    groups = [ParamGroup(part, count, active, layer) for part, count, active, layer in COUNTS[mt](model, f, hidden)]
    groups.append(ParamGroup("embedding", vocab * hidden, vocab * hidden))
    if not f.get("tie_word_embeddings", default=mt in _TIED_BY_DEFAULT):
        groups.append(ParamGroup("lm_head", vocab * hidden, vocab * hidden))
    groups.append(ParamGroup("norm", hidden, hidden))
    tower = model.config.get("vision_config")
    if isinstance(tower, dict) and tower.get("model_type") == "gemma4_vision":
        vision = gemma4_vision_params(tower, hidden)
    else:
        vision = vision_parameters(tower, hidden)
    return ParamCount(tuple(groups + ([ParamGroup("vision", vision, 0)] if vision else [])))


def vision_tower(model: ModelSpec) -> tuple[int | None, int | None] | None:
    """(layers, hidden size) of a multimodal model's vision tower as its vision_config states them (None where it
    does not), or None for a model without a vision_config."""
    vision = model.config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    layers = vision.get("num_hidden_layers") or vision.get("depth")
    hidden = vision.get("hidden_size")
    return (layers if isinstance(layers, int) else None, hidden if isinstance(hidden, int) else None)


def vision_parameters(vision: object, text_hidden: int) -> int:
    """A vision tower's parameters from its vision_config, counted as a ViT encoder (an estimate where the tower
    differs): the patch embedding (3 x patch^2, twice for a temporal patch of 2), learned positions of a fixed
    image size (SigLIP), `layers` blocks of attention (4 h^2 with biases), MLP (2 h x intermediate with biases) and
    two layer norms, the final norm, and a projection to the text model's width. 0 without a vision_config."""
    if not isinstance(vision, dict):
        return 0
    h, inner = vision.get("hidden_size"), vision.get("intermediate_size")
    layers = vision.get("num_hidden_layers") or vision.get("depth")
    patch = vision.get("patch_size")
    if not all(isinstance(x, int) and x > 0 for x in (h, inner, layers, patch)):
        return 0
    assert isinstance(h, int) and isinstance(inner, int) and isinstance(layers, int) and isinstance(patch, int)
    frames = vision.get("temporal_patch_size") or 1
    count = 3 * frames * patch * patch * h + h
    if isinstance(vision.get("image_size"), int):
        count += (vision["image_size"] // patch) ** 2 * h
    block = 4 * (h * h + h) + 2 * h * inner + inner + h + 4 * h
    return count + layers * block + 2 * h + h * text_hidden


def _attention(spec: Attention, f: Fields, mt: str, hidden: int, heads: int) -> int:
    q_dim = heads * spec.k_dim
    kv_dim = spec.kv_heads * (spec.k_dim + spec.v_dim)
    o_in = heads * spec.v_dim
    if mt == "qwen3_next":
        q_dim *= 2  # gated attention: the query projection also produces the output gate
    count = hidden * (q_dim + kv_dim) + o_in * hidden
    if mt in ("qwen2", "qwen2_moe") or f.get("attention_bias") or f.get("add_qkv_bias") or mt == "opt":
        count += heads * spec.k_dim + kv_dim
        if mt == "opt" or (f.get("attention_bias") and mt == "gpt_oss"):
            count += hidden  # output projection bias
    if mt in ("qwen3", "qwen3_moe", "qwen3_next", "gemma3_text") or f.get("use_qk_norm"):
        count += 2 * spec.k_dim
    if mt == "gpt_oss":
        count += heads  # attention sinks
    return count


def _mixer(spec: RecurrentState, f: Fields, hidden: int) -> int:
    k = spec.conv_kernel
    if spec.mixer == "gated_delta_net":
        hv, _, dv = spec.state_shape
        hk_dk = (spec.conv_channels - hv * dv) // 2
        return (hidden * (2 * hk_dk + 2 * hv * dv) + hidden * 2 * hv + spec.conv_channels * k
                + 2 * hv + dv + hv * dv * hidden)
    if spec.mixer == "mamba":
        d_inner, d_state = spec.state_shape
        dt_rank = f.get("mamba_dt_rank", default=-(-hidden // 16))
        return (hidden * 2 * d_inner + d_inner * k + d_inner + d_inner * (dt_rank + 2 * d_state)
                + dt_rank * d_inner + d_inner + d_inner * d_state + d_inner + d_inner * hidden + 3 * d_state)
    # mamba2
    n_heads, d_head, d_state = spec.state_shape
    d_ssm = n_heads * d_head
    return (hidden * (2 * d_ssm + 2 * spec.groups * d_state + n_heads) + spec.conv_channels * (k + 1)
            + 3 * n_heads + d_ssm + d_ssm * hidden)


def _feed_forward(i: int, f: Fields, mt: str, hidden: int) -> list[tuple[str, int, int]]:
    """(part, stored, active) of layer i's MLP or MoE block."""
    gated = lambda inter: 3 * hidden * inter  # noqa: E731  gate, up, down
    if mt == "opt":
        ffn = f.int("ffn_dim")
        return [("mlp", 2 * hidden * ffn + ffn + hidden, 2 * hidden * ffn + ffn + hidden)]
    if mt == "falcon":
        ffn = f.get("ffn_hidden_size", default=4 * hidden)
        return [("mlp", 2 * hidden * ffn, 2 * hidden * ffn)]
    if mt == "chatglm":
        ffn = f.int("ffn_hidden_size")
        return [("mlp", gated(ffn), gated(ffn))]
    if mt == "nemotron_h":  # relu2 MLP: up and down only
        ffn = f.int("intermediate_size")
        return [("mlp", 2 * hidden * ffn, 2 * hidden * ffn)]

    experts, top_k, expert_inter, shared_inter, moe = _moe_layout(i, f, mt, hidden)
    if not moe:
        inter = f.int("intermediate_size_mlp") if mt == "llama4_text" else f.int("intermediate_size")
        return [("mlp", gated(inter), gated(inter))]
    per_expert = gated(expert_inter)
    router = hidden * experts
    if mt == "deepseek_v3" and (f.get("topk_method") == "noaux_tc" or f.model_type == "glm4_moe"):
        router += experts  # the gate's e_score_correction_bias (vLLM's deepseek_v2.py, glm4_moe.py)
    if mt == "gpt_oss":  # fused gate_up with biases, down with bias, router with bias
        per_expert = hidden * 2 * expert_inter + 2 * expert_inter + expert_inter * hidden + hidden
        router += experts
    out = [("experts", experts * per_expert, top_k * per_expert), ("router", router, router)]
    if shared_inter:
        shared = gated(shared_inter) + (hidden if mt in ("qwen2_moe", "qwen3_next") else 0)
        out.append(("shared_expert", shared, shared))
    return out


@dataclass(frozen=True)
class RoutedExperts:
    """A mixture-of-experts layer: one token runs through `top_k` of its `experts`, each `intermediate` wide,
    over a hidden size of `hidden`; `quantized`: the checkpoint quantizes its weights."""

    experts: int
    top_k: int
    intermediate: int
    hidden: int
    quantized: bool


def routed_experts(model: ModelSpec) -> RoutedExperts | None:
    """The routed experts of a mixture-of-experts model (its widest MoE layer), or None for a dense one."""
    f = _fields(model)
    mt = _SAME_WEIGHTS_AS.get(f.model_type, f.model_type)
    hidden = f.int("hidden_size", "n_embd", "d_model")
    widest = None
    for i in range(model.num_layers):
        experts, top_k, inter, _, moe = _moe_layout(i, f, mt, hidden)
        if moe and experts and top_k and (widest is None or top_k * inter > widest[1] * widest[2]):
            widest = (int(experts), int(top_k), int(inter))
    if widest is None:
        return None
    return RoutedExperts(experts=widest[0], top_k=widest[1], intermediate=widest[2], hidden=hidden,
                         quantized=quantized(model)
                         or model.config.get("expert_dtype") == "fp4")  # DeepSeek-V4: FP4 experts


def quantized(model: ModelSpec) -> bool:
    """Whether the checkpoint quantizes its weights (its config has a quantization_config)."""
    return bool(model.config.get("quantization_config"))


def architectures(model: ModelSpec) -> tuple[str, ...]:
    """The model classes the config names (`architectures`: what transformers and engines pick the code by);
    empty where it names none."""
    return tuple(str(a) for a in model.config.get("architectures") or ())


def _moe_layout(i: int, f: Fields, mt: str, hidden: int) -> tuple[int, int, int, int, bool]:
    """(experts, top_k, expert intermediate, shared intermediate, is this layer MoE)."""
    if mt in COUNTS:
        return moe_layout(i, f, mt)
    if mt == "mixtral":
        return f.int("num_local_experts"), f.int("num_experts_per_tok"), f.int("intermediate_size"), 0, True
    if mt == "gpt_oss":
        return (f.int("num_local_experts"), f.int("num_experts_per_tok", "experts_per_token"),
                f.int("intermediate_size"), 0, True)
    if mt in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        # transformers 5 writes num_local_experts where the published configs say num_experts
        experts = f.get("num_experts", "num_local_experts", default=0) or 0
        step = f.get("decoder_sparse_step", default=1) or 1
        moe = experts > 0 and i not in (f.get("mlp_only_layers") or []) and (i + 1) % step == 0
        shared = f.get("shared_expert_intermediate_size", default=0) or 0
        return experts, f.get("num_experts_per_tok", default=0), f.get("moe_intermediate_size", default=0), shared, moe
    if mt in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        experts = f.get("n_routed_experts") or 0
        moe = bool(experts) and i >= (f.get("first_k_dense_replace") or 0) and i % (f.get("moe_layer_freq") or 1) == 0
        inter = f.int("moe_intermediate_size") if experts else 0
        return experts, f.get("num_experts_per_tok") or 0, inter, (f.get("n_shared_experts") or 0) * inter, moe
    if mt == "llama4_text":
        step = f.get("interleave_moe_layer_step", default=1) or 1
        moe = (i + 1) % step == 0
        inter = f.int("intermediate_size")
        return f.int("num_local_experts"), f.int("num_experts_per_tok"), inter, inter, moe
    if mt == "jamba":
        experts = f.get("num_experts", default=1) or 1
        moe = experts > 1 and i % f.int("expert_layer_period") == (f.get("expert_layer_offset") or 0)
        return experts, f.get("num_experts_per_tok", default=1), f.int("intermediate_size"), 0, moe
    return 0, 0, 0, 0, False


# Families whose layers vLLM wraps for LoRA as Llama's are (QKV, output, gate-and-up and down projections, and the
# embedding and LM head): the dense decoders of vllm/model_executor/models/llama.py and its siblings
LLAMA_LIKE = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "granite",
                        "olmo2"})


@dataclass(frozen=True, kw_only=True)
class DenseShapes:
    """The widths of a dense decoder's projections: every layer attention with a gated MLP."""

    layers: int
    hidden: int
    vocab: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    mlp: int  # intermediate size of the gated MLP
    qkv_bias: bool  # Q, K and V projections with a bias (Qwen2's always; Llama's with attention_bias)
    qk_norm: bool  # an RMS norm over each head of Q and K before RoPE (Qwen3, Gemma-3)

    @property
    def q(self) -> int:
        """Query heads x head dim."""
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        """KV heads x head dim (K and V alike)."""
        return self.kv_heads * self.head_dim


def dense_shapes(model: ModelSpec, families: frozenset[str], what: str) -> DenseShapes:
    """The projection widths of a dense decoder of one of `families`, or an error naming why `model` is not one
    (`what` says what needs them)."""
    f = _fields(model)
    if f.model_type not in families:
        raise ConfigError(f"{model.name}: {what} modelled for dense decoders ({', '.join(sorted(families))}), not "
                          f"{f.model_type or 'this family'}")
    attention = [s for s in model.layers if isinstance(s, Attention)]
    if len(attention) != len(model.layers) or not model.attention_heads:
        raise ConfigError(f"{model.name}: {what} modelled for models whose every layer is attention")
    first = attention[0]
    return DenseShapes(layers=len(model.layers), hidden=f.int("hidden_size"), vocab=f.int("vocab_size"),
                       heads=model.attention_heads, kv_heads=first.kv_heads, head_dim=first.k_dim,
                       mlp=f.int("intermediate_size"),
                       qkv_bias=f.model_type == "qwen2" or bool(f.get("attention_bias", default=False)),
                       qk_norm=f.model_type in ("qwen3", "qwen3_moe", "gemma3_text"))


@dataclass(frozen=True)
class Rotary:
    """One rotary position embedding as the config states it (layers with the same settings share one): the
    dimensions it rotates, its scaling kind (the config's rope_type) and factor, and the positions it covers."""

    rotary_dim: int
    scaling: str  # the rope_type: "default", "llama3", "linear", "dynamic", "yarn", "deepseek_yarn", "longrope", ...
    max_positions: int  # max_position_embeddings
    factor: float = 1.0
    original_max_positions: int | None = None


# Families whose attention has no rotary embedding (learned positions, ALiBi, or none at all).
_NO_ROTARY = frozenset({"opt", "jamba", "nemotron_h", "bloom", "mpt"})


def rotary_embeddings(model: ModelSpec) -> tuple[Rotary, ...]:
    """The distinct rotary embeddings of the language model: one per layer type whose settings differ (Gemma-3's
    local and global layers, per-layer-type `rope_parameters`), else one. Empty for families without one."""
    f = _fields(model)
    if f.model_type in _NO_ROTARY or (f.model_type == "falcon" and f.get("alibi")) or model.max_position_embeddings \
            is None:
        return ()
    by_type: dict[str, int] = {}  # the rotated width of each attention layer type
    for spec in model.layers:
        if isinstance(spec, LatentAttention):
            by_type.setdefault("full_attention", spec.rope_dim)
        elif isinstance(spec, Attention):
            by_type.setdefault("sliding_attention" if isinstance(spec, SlidingWindow) else "full_attention", spec.k_dim)
    if not by_type:
        return ()
    settings = _rope_settings(f, set(by_type))
    tables = {}
    for layer_type, s in settings.items():
        partial = s.get("partial_rotary_factor") or f.get("partial_rotary_factor") or 1.0
        width = by_type.get(layer_type, next(iter(by_type.values())))
        if not any(isinstance(spec, LatentAttention) for spec in model.layers):
            width = int(width * partial)
        original = s.get("original_max_position_embeddings") or f.get("original_max_position_embeddings")
        tables[layer_type] = Rotary(
            rotary_dim=width, scaling=str(s.get("rope_type") or s.get("type") or "default"),
            max_positions=model.max_position_embeddings, factor=float(s.get("factor") or 1.0),
            original_max_positions=original if isinstance(original, int) else None)
    return tuple(tables.values())


def _rope_settings(f: Fields, layer_types: set[str]) -> dict[str, dict]:
    """Each attention layer type's rope settings: transformers 5's `rope_parameters` (flat, or by layer type), else
    `rope_scaling`; sliding layers with a base of their own (`rope_local_base_freq`, Gemma-3) rotate apart, unscaled."""
    params = f.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        return {t: params[t] for t in sorted(layer_types) if t in params} or {"full_attention": {}}
    flat = params if isinstance(params, dict) else f.get("rope_scaling")
    flat = flat if isinstance(flat, dict) else {}
    if f.get("rope_local_base_freq") and "sliding_attention" in layer_types:
        return {"full_attention": flat, "sliding_attention": {"rope_type": "default"}}
    return {"full_attention": flat}


@dataclass(frozen=True, kw_only=True)
class ImageItems:
    """What one image of the largest size becomes in a multimodal model: the patch positions its vision tower
    runs, and the embeddings it gives the language model; with the tower's widths."""

    patches: int
    tokens: int
    layers: int
    hidden: int
    intermediate: int
    text_hidden: int


# Tiles of Llama-4's image processor at most (its preprocessor_config.json's max_patches), plus the global view.
LLAMA4_MAX_TILES = 16


def image_items(model: ModelSpec) -> ImageItems | None:
    """The largest image of a model whose vision tower takes fixed-size images or tiles and whose config says what
    an image becomes: Gemma-3 (SigLIP, `mm_tokens_per_image`), Llama-4 (tiles of `image_size`, pixel shuffle),
    Mistral-3 (Pixtral up to `image_size`, merged `spatial_merge_size` squared). None for other models (no vision
    tower, or one whose image size the config does not fix)."""
    vision, mt = model.config.get("vision_config"), str(model.config.get("model_type") or "")
    if not isinstance(vision, dict) or mt not in ("gemma3", "llama4", "mistral3"):
        return None
    numbers = [v for k in ("image_size", "patch_size", "num_hidden_layers", "hidden_size", "intermediate_size")
               if isinstance(v := vision.get(k), int) and v > 0]
    if len(numbers) < 5:
        return None
    size, patch, layers, hidden, inter = numbers
    side = size // patch
    if mt == "gemma3":
        patches, tokens = side * side, int(model.config.get("mm_tokens_per_image") or 256)
    elif mt == "llama4":
        per_tile = int(side * side * float(vision.get("pixel_shuffle_ratio") or 0.5) ** 2)
        patches, tokens = (LLAMA4_MAX_TILES + 1) * (side * side + 1), (LLAMA4_MAX_TILES + 1) * per_tile
    else:
        merged = side // int(model.config.get("spatial_merge_size") or 1)
        patches, tokens = side * side, merged * merged
    return ImageItems(patches=patches, tokens=tokens, layers=layers, hidden=hidden, intermediate=inter,
                      text_hidden=_fields(model).int("hidden_size"))
