"""Text Generation Inference: its paged blocks, capacity and logs (`engine`)."""

from kvbudget.engines.tgi.engine import TGI, TGIEngine

__all__ = ["TGI", "TGIEngine"]
