"""llama.cpp's compute graph for attention decoders (full or sliding-window caches) with a gated MLP or routed
experts, built as llama-server builds it to size its compute buffer, and the buffer ggml's allocator reserves for
it (ggml.py).

Read from the llama.cpp copy in llama-cpp-python 0.3.36: src/models/llama.cpp (Mixtral's GGUFs too), qwen2.cpp,
qwen3.cpp, qwen3moe.cpp, openai-moe.cpp and gemma3.cpp (the layers), src/llama-graph.cpp (`build_inp_embd`,
`build_norm`, `build_qkv`, `build_attn`, `build_attn_mha`, `build_ffn`, `build_moe_ffn`), src/llama-kv-cache.cpp
(`cpy_k`, `cpy_v`, `get_k`, `get_v`, the index inputs) and src/llama-context.cpp (the reservation: a prompt graph of
min(n_ctx, n_ubatch) tokens with one output per slot, a generation graph of one token per slot, the prompt graph
again; the buffer is the largest).

Exact against real llama-server start-ups on the CPU backend (tests/corpus/test_llamacpp_compute.py). Not
modelled, so left to the estimate: other families, quantized caches (their Hadamard rotation adds nodes), older
builds, and what a GPU backend does differently (its alignment, the copies of the inputs it is sent).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.engines.llamacpp import ggml
from kvbudget.engines.llamacpp.ggml import Graph, Tensor, external, input_, like, mul_mat, permute, view
from kvbudget.errors import ConfigError
from kvbudget.model.params import DenseShapes, RoutedExperts, dense_shapes, routed_experts
from kvbudget.model.spec import ModelSpec
from kvbudget.units import cdiv

# llama.cpp's llama graph (Mixtral's GGUFs are llama with experts), qwen2, qwen3, qwen3moe and openai-moe (gpt-oss)
GRAPHED = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma3_text"})
OPENAI_MOE = "gpt_oss"  # sliding and full caches, a router with a bias, the softmax over the chosen experts' logits,
# biased experts with swiglu_oai, and the last hidden state kept as an output (t_h_nextn)
GEMMA3 = "gemma3_text"  # embeddings scaled, Q scaled after RoPE, norms after attention and after the MLP


@dataclass(frozen=True)
class Shapes:
    """What the graph needs of a model: its attention and dense widths, its routed experts if any, and whether it
    is gpt-oss's or Gemma-3's graph."""

    dense: DenseShapes
    experts: RoutedExperts | None
    openai: bool = False
    gemma: bool = False


def shapes_of(model: ModelSpec) -> Shapes | None:
    """The model's widths when its llama.cpp graph is modelled here, else None."""
    try:
        dense = dense_shapes(model, GRAPHED, "llama.cpp's compute graph is")
    except ConfigError:
        return None
    return Shapes(dense=dense, experts=routed_experts(model), openai=model.model_type == OPENAI_MOE,
                  gemma=model.model_type == GEMMA3)


def _norm(x: Tensor, width: int) -> Tensor:
    """build_norm: RMS norm, then times its weight."""
    return like("MUL", like("RMS_NORM", x), external(width))


def _attention(g: Graph, s: DenseShapes, cur: Tensor, pos: Tensor, inputs: dict[str, Tensor], n_tokens: int,
               n_kv: int, flash: bool, scale_q: bool = False) -> Tensor:
    """build_qkv, RoPE, build_attn and build_attn_mha for one layer: the attention's output before its projection."""
    hd, heads, kv_heads = s.head_dim, s.heads, s.kv_heads
    projected = []
    for width, n in ((s.q, heads), (s.kv, kv_heads), (s.kv, kv_heads)):
        x = mul_mat(external(s.hidden, width), cur)
        if s.qkv_bias:
            x = like("ADD", x, external(width))
        projected.append(view(x, hd, n, n_tokens, op="RESHAPE"))
    q, k, v = projected
    if s.qk_norm:
        q, k = (like("MUL", like("RMS_NORM", x), external(hd)) for x in (q, k))
    q, k = like("ROPE", q, pos), like("ROPE", k, pos)
    if scale_q:  # Gemma-3: Q times f_attention_scale after RoPE
        q = like("SCALE", q)
    for x in (q, v, k):  # expanded in this order so that nothing is reordered between them
        g.expand(x)
    cache_k, cache_v = external(s.kv, n_kv), external(s.kv, n_kv)
    g.expand(ggml.set_rows(cache_k, view(k, s.kv, n_tokens), inputs["k_idxs"]))
    if flash:
        g.expand(ggml.set_rows(cache_v, view(v, s.kv, n_tokens), inputs["v_idxs"]))
        keys, values = view(cache_k, hd, kv_heads, n_kv), view(cache_v, hd, kv_heads, n_kv)
    else:  # the V cache is transposed: one row per element of each head
        rows = view(view(v, s.kv, n_tokens, op="RESHAPE"), 1, s.kv * n_tokens, op="RESHAPE")
        g.expand(ggml.set_rows(view(cache_v, 1, s.kv * n_kv, op="RESHAPE"), rows, inputs["v_idxs"]))
        keys, values = view(cache_k, hd, kv_heads, n_kv), view(cache_v, n_kv, kv_heads, hd)
    q = permute(view(q, hd, heads, n_tokens), 0, 2, 1, 3)
    keys, values = permute(keys, 0, 2, 1, 3), permute(values, 0, 2, 1, 3)
    if flash:
        out = view(ggml.flash_attn(q, keys, values, inputs["mask"]), s.q, n_tokens, op="RESHAPE")
    else:
        scores = like("SOFT_MAX", mul_mat(keys, q), inputs["mask"])
        out = ggml.cont(permute(mul_mat(values, scores), 0, 2, 1, 3), s.q, n_tokens)
    g.expand(out)
    return out


def _experts(g: Graph, e: RoutedExperts, cur: Tensor, openai: bool) -> Tensor:
    """build_moe_ffn: the router's logits, the top k experts (an argsort), their weights (Mixtral, Qwen3-MoE: of
    the softmax over all experts, normalised; gpt-oss: biased logits, the softmax over the k chosen), each token
    through its experts' gate, up and down (mul_mat_id; gpt-oss adds each expert's bias), weighted, and the k
    outputs added."""
    n_tokens = cur.ne[1]
    probs = mul_mat(external(e.hidden, e.experts), cur)
    probs = like("ADD", probs, external(e.experts)) if openai else like("SOFT_MAX", probs)
    selected = view(Tensor(op="ARGSORT", type="i32", ne=probs.ne, srcs=(probs,)), e.top_k, n_tokens)
    weights = ggml.get_rows(view(probs, 1, e.experts, n_tokens, op="RESHAPE"), selected)
    weights = view(weights, e.top_k, n_tokens, op="RESHAPE")
    if openai:
        weights = view(like("SOFT_MAX", weights), 1, e.top_k, n_tokens, op="RESHAPE")
    else:
        total = like("CLAMP", Tensor(op="SUM_ROWS", type="f32", ne=(1, n_tokens, 1, 1), srcs=(weights,)))
        weights = view(like("DIV", weights, total), 1, e.top_k, n_tokens, op="RESHAPE")
    g.expand(weights)
    cur = view(cur, e.hidden, 1, n_tokens, op="RESHAPE")

    def through(width_in: int, width_out: int, x: Tensor) -> Tensor:
        y = ggml.mul_mat_id(external(width_in, width_out, e.experts), x, selected)
        return like("ADD_ID", y, external(width_out, e.experts), selected) if openai else y

    up = through(e.hidden, e.intermediate, cur)
    gate = through(e.hidden, e.intermediate, cur)
    out = like("MUL", through(e.intermediate, e.hidden, like("GLU", gate, up)), weights)
    g.expand(out)
    rows = [view(out, e.hidden, n_tokens) for _ in range(e.top_k)]
    for row in rows:
        g.expand(row)
    total = rows[0]
    for row in rows[1:]:
        total = like("ADD", total, row)
        g.expand(total)
    return total if e.top_k > 1 else ggml.cont(total, e.hidden, n_tokens)


def decoder_graph(shapes: Shapes, n_tokens: int, n_outputs: int, caches: tuple[tuple[bool, int], ...],
                  flash: bool) -> Graph:
    """The graph llama-server reserves for a batch of `n_tokens` with `n_outputs` outputs; `caches`: each layer's
    cache, (sliding, cells of one stream); a sliding cache has its own mask and indices."""
    s, experts = shapes.dense, shapes.experts
    g = Graph()
    tokens = input_("i32", n_tokens)
    embd = ggml.get_rows(external(s.hidden, s.vocab), tokens)
    g.expand(embd)
    g.expand(input_("f32", s.hidden, n_tokens))  # the embeddings input the batch could have given instead
    pos = input_("i32", n_tokens)
    inputs = {sliding: {"k_idxs": input_("i64", n_tokens),
                        "v_idxs": input_("i64", n_tokens if flash else n_tokens * s.kv),
                        "mask": input_("f16" if flash else "f32", n_kv, n_tokens)}
              for sliding, n_kv in dict(caches).items()}
    out_ids = input_("i32", n_outputs)
    x = like("SCALE", embd) if shapes.gemma else embd  # Gemma: the embeddings times sqrt(n_embd)
    for layer, (sliding, n_kv) in enumerate(caches):
        residual = x
        attended = _attention(g, s, _norm(x, s.hidden), pos, inputs[sliding], n_tokens, n_kv, flash,
                              scale_q=shapes.gemma)
        cur = mul_mat(external(s.q, s.hidden), attended)
        if shapes.openai:
            cur = like("ADD", cur, external(s.hidden))  # the output projection's bias
        elif layer == s.layers - 1:  # only the rows that are output go on
            cur, residual = ggml.get_rows(cur, out_ids), ggml.get_rows(residual, out_ids)
        if shapes.gemma:
            cur = _norm(cur, s.hidden)  # after attention
        ffn_in = like("ADD", cur, residual)
        cur = _norm(ffn_in, s.hidden)
        if experts is None:
            up, gate = mul_mat(external(s.hidden, s.mlp), cur), mul_mat(external(s.hidden, s.mlp), cur)
            cur = mul_mat(external(s.mlp, s.hidden), like("GLU", gate, up))
        else:
            cur = _experts(g, experts, cur, shapes.openai)
        if shapes.gemma:
            cur = _norm(cur, s.hidden)  # after the MLP
        x = like("ADD", cur, ffn_in)
    if shapes.openai:  # the last hidden state is an output (t_h_nextn); the rows that are output go on
        x.is_output = True
        x = ggml.get_rows(x, out_ids)
    norm = _norm(x, s.hidden)
    norm.is_output = True
    logits = mul_mat(external(s.hidden, s.vocab), norm)
    logits.is_output = True
    g.expand(logits)
    return g


def compute_buffer(s: Shapes, caches: tuple[tuple[bool, int], ...], n_tokens: int, n_parallel: int,
                   flash: bool) -> int:
    """The CPU compute buffer llama-server reserves (llama_context::sched_reserve): the larger of the prompt graph,
    `n_tokens` (min(n_ctx, n_batch, n_ubatch)) rounded up to a multiple of the `n_parallel` slots with one output
    per slot, and the generation graph, one token and one output per slot. `caches`: each layer's (sliding, cells
    of one stream); with a stream per slot the tensors are split by stream, their sizes the same."""
    n_tokens = cdiv(n_tokens, n_parallel) * n_parallel
    prompt = decoder_graph(s, n_tokens, min(n_tokens, n_parallel), caches, flash)
    generation = decoder_graph(s, n_parallel, n_parallel, caches, flash)
    return max(ggml.reserve(prompt), ggml.reserve(generation))
