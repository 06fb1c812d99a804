"""How many layers llama-server can keep on one GPU (`-ngl N`, `--n-gpu-layers N`), the rest in host memory.

From llama.cpp's source (src/llama-model.cpp load_tensors): the GPU takes the "layers" from index
n_layer + 1 - N on, where index n_layer is the output (the LM head and the final norm): N = 1 offloads the output
alone, N = n_layer + 1 everything. Token embeddings stay in host memory whatever N. Each offloaded layer's K and V
go with it (offload_kqv, the default), and the GPU holds the compute buffer. The weights per layer are a GGUF
file's own tensors where the model came from one, else the analytic count (an estimate, like the plan's); with
tied embeddings the output holds a copy of them. The caches are exact for the slot's cells.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.engines.base import Offload
from kvbudget.model.weights import layer_weights
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.model.spec import ModelSpec


def fit_layers(model: ModelSpec, gpu_memory: int, cache: list[int], fixed: int) -> Offload | None:
    """The largest -ngl whose layers, their caches and `fixed` (the compute buffer and the runtime's own memory)
    fit in `gpu_memory` bytes; None when even the output layer does not, or when everything fits."""
    w = layer_weights(model)
    n = model.num_layers
    gpu = fixed + w.output
    if gpu > gpu_memory:
        return None
    value = 1
    for i in range(n - 1, -1, -1):  # the decoder layers from the last
        more = w.layers[i] + cache[i]
        if gpu + more > gpu_memory:
            break
        gpu += more
        value += 1
    if value == n + 1:
        return None
    on_host = n - (value - 1)  # the first layers stay, with the token embeddings
    host = w.input + sum(w.layers[:on_host]) + sum(cache[:on_host])
    return Offload(parameter="n_gpu_layers", value=value, of=n + 1, gpu_bytes=gpu, host_bytes=host,
                   note=(f"llama-server's flag: the output and the last {value - 1} of {n} layers on the GPU "
                         f"({format_bytes(gpu)} with their caches and the compute buffer), "
                         f"{format_bytes(host)} of weights and caches in host memory, run by the CPU (slower); "
                         "an estimate (the compute buffer" + ("" if w.exact else " and weights counted from the config")
                         + ")"))
