"""What a start-up log's settings allow against the model, for the logs that state no KV figure but their settings
(vLLM's argument namespace, SGLang's `ServerArgs(...)`): the context asked for against the model's, and the tensor
parallel size against its heads, by the checks both engines run before they size a cache."""

from __future__ import annotations

from kvbudget.engines.base import LogRow
from kvbudget.model.spec import Attention, ModelSpec


def settings_rows(model: ModelSpec, *, max_len: int | None, tp: int | None, length_name: str) -> list[LogRow]:
    """The rows the settings check (none where the log states neither): `max_len` (the engine's `length_name`)
    within the model's context, and `tp` dividing its attention heads (vLLM's config.py
    verify_with_parallel_config: 'Total number of attention heads (N) must be divisible by tensor parallel size')
    and fitting its KV heads (one divides the other, or the engine refuses the layout)."""
    rows = []
    context = model.max_position_embeddings
    if max_len is not None and context:
        within = max_len <= context
        rows.append(LogRow(f"{length_name} within the model's context", f"{max_len:,}", f"<= {context:,}", within,
                           f"{model.name}'s max_position_embeddings" + ("" if within else
                                                                       ": beyond it only with rope scaling or the "
                                                                       "engine's override")))
    if tp is not None and tp > 0:  # a size below 1 is refused where it is read
        heads = model.attention_heads
        kv = {layer.kv_heads for layer in model.layers if isinstance(layer, Attention)}
        fits = (heads is None or heads % tp == 0) and all(h % tp == 0 or tp % h == 0 for h in kv)
        shape = ", ".join(filter(None, (f"{heads} attention heads" if heads else "",
                                        f"{'/'.join(map(str, sorted(kv)))} KV heads" if kv else "")))
        rows.append(LogRow("tensor parallel size fits the heads", f"{tp}", shape or "-", fits if shape else None,
                           "the heads split evenly over the ranks (KV heads replicated where tp exceeds them)"
                           if fits else "the engine refuses this tensor parallel size for the model"))
    return rows
