"""SGLang: its token pool and capacity (`engine`), and its scheduler for the simulator (`scheduler`)."""

from kvbudget.engines.sglang.engine import SGLANG, SGLangEngine

__all__ = ["SGLANG", "SGLangEngine"]
