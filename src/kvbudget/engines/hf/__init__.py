"""transformers as a library: its dynamic and static caches, per release (`engine`)."""

from kvbudget.engines.hf.engine import HF, HF_STATIC, HFEngine

__all__ = ["HF", "HF_STATIC", "HFEngine"]
