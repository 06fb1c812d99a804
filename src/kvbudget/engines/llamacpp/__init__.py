"""llama.cpp: its KV cells, slots and logs (`engine`), what changed between builds (`releases`), and
llama-server's loop for the simulator (`scheduler`)."""

from kvbudget.engines.llamacpp.engine import LLAMACPP, LlamaCppEngine

__all__ = ["LLAMACPP", "LlamaCppEngine"]
