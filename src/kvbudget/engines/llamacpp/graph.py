"""llama.cpp's compute graph for dense decoders, built as llama-server builds it to size its compute buffer, and
the buffer ggml's allocator reserves for it (ggml.py).

Read from the llama.cpp copy in llama-cpp-python 0.3.36: src/models/llama.cpp, qwen2.cpp and qwen3.cpp (the
layers), src/llama-graph.cpp (`build_inp_embd`, `build_norm`, `build_qkv`, `build_attn`, `build_attn_mha`,
`build_ffn`), src/llama-kv-cache.cpp (`cpy_k`, `cpy_v`, `get_k`, `get_v`, the index inputs) and
src/llama-context.cpp (the reservation: a prompt graph of min(n_ctx, n_ubatch) tokens with one output per slot,
a generation graph of one token per stream, the prompt graph again; the buffer is the largest).

Exact against real llama-server start-ups on the CPU backend (tests/corpus/test_llamacpp_compute.py). Not
modelled, so left to the estimate: other families, quantized caches (their Hadamard rotation adds nodes), older
builds, and what a GPU backend does differently (its alignment, the copies of the inputs it is sent).
"""

from __future__ import annotations

from kvbudget.engines.llamacpp import ggml
from kvbudget.engines.llamacpp.ggml import Graph, Tensor, external, input_, like, mul_mat, permute, view
from kvbudget.errors import ConfigError
from kvbudget.model.params import DenseShapes, dense_shapes
from kvbudget.model.spec import ModelSpec
from kvbudget.units import cdiv

GRAPHED = frozenset({"llama", "mistral", "qwen2", "qwen3"})  # llama.cpp's llama, qwen2 and qwen3 graphs


def shapes_of(model: ModelSpec) -> DenseShapes | None:
    """The model's widths when its llama.cpp graph is modelled here, else None."""
    try:
        return dense_shapes(model, GRAPHED, "llama.cpp's compute graph is")
    except ConfigError:
        return None


def _norm(x: Tensor, width: int) -> Tensor:
    """build_norm: RMS norm, then times its weight."""
    return like("MUL", like("RMS_NORM", x), external(width))


def _attention(g: Graph, s: DenseShapes, cur: Tensor, pos: Tensor, inputs: dict[str, Tensor], n_tokens: int,
               n_kv: int, flash: bool) -> Tensor:
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


def decoder_graph(s: DenseShapes, n_tokens: int, n_outputs: int, n_kv: int, flash: bool) -> Graph:
    """The graph llama-server reserves for a batch of `n_tokens` with `n_outputs` outputs over `n_kv` cells."""
    g = Graph()
    tokens = input_("i32", n_tokens)
    embd = ggml.get_rows(external(s.hidden, s.vocab), tokens)
    g.expand(embd)
    g.expand(input_("f32", s.hidden, n_tokens))  # the embeddings input the batch could have given instead
    pos = input_("i32", n_tokens)
    inputs = {"k_idxs": input_("i64", n_tokens), "v_idxs": input_("i64", n_tokens if flash else n_tokens * s.kv),
              "mask": input_("f16" if flash else "f32", n_kv, n_tokens)}
    out_ids = input_("i32", n_outputs)
    x = embd
    for layer in range(s.layers):
        residual = x
        attended = _attention(g, s, _norm(x, s.hidden), pos, inputs, n_tokens, n_kv, flash)
        cur = mul_mat(external(s.q, s.hidden), attended)
        if layer == s.layers - 1:  # only the rows that are output go on
            cur, residual = ggml.get_rows(cur, out_ids), ggml.get_rows(residual, out_ids)
        ffn_in = like("ADD", cur, residual)
        cur = _norm(ffn_in, s.hidden)
        up, gate = mul_mat(external(s.hidden, s.mlp), cur), mul_mat(external(s.hidden, s.mlp), cur)
        cur = mul_mat(external(s.mlp, s.hidden), like("GLU", gate, up))
        x = like("ADD", cur, ffn_in)
    norm = _norm(x, s.hidden)
    norm.is_output = True
    logits = mul_mat(external(s.hidden, s.vocab), norm)
    logits.is_output = True
    g.expand(logits)
    return g


def compute_buffer(s: DenseShapes, cells: int, n_tokens: int, n_parallel: int, flash: bool) -> int:
    """The CPU compute buffer llama-server reserves (llama_context::sched_reserve): the larger of the prompt graph,
    `n_tokens` (min(n_ctx, n_batch, n_ubatch)) rounded up to a multiple of the `n_parallel` slots with one output
    per slot, and the generation graph, one token and one output per slot. `cells`: the cells of one stream
    (with a stream per slot the tensors are split by stream, their sizes the same)."""
    n_tokens = cdiv(n_tokens, n_parallel) * n_parallel
    prompt = decoder_graph(s, n_tokens, min(n_tokens, n_parallel), cells, flash)
    generation = decoder_graph(s, n_parallel, n_parallel, cells, flash)
    return max(ggml.reserve(prompt), ggml.reserve(generation))
