"""kvbudget: exact KV-cache memory for LLM serving.

    >>> import kvbudget
    >>> model = kvbudget.load_model("llama-3.1-8b")
    >>> kvbudget.estimate(model, batch=[1, 8], context=[4096]).bytes_per_token
    131072
"""

from kvbudget.dtypes import KVDtype, get_dtype
from kvbudget.engines import ENGINES, Allocation, CacheGroup, get_engine
from kvbudget.errors import KVBudgetError
from kvbudget.estimate import Estimate, Point, estimate
from kvbudget.model.config import parse_config
from kvbudget.model.load import load_model
from kvbudget import catalog
from kvbudget.model.spec import (
    ChunkedLocal,
    FullAttention,
    LatentAttention,
    ModelSpec,
    NoCache,
    RecurrentState,
    SlidingWindow,
)

__version__ = "0.1.0"

__all__ = [
    "Allocation", "CacheGroup", "ChunkedLocal", "catalog", "ENGINES", "Estimate", "FullAttention", "KVBudgetError",
    "KVDtype", "LatentAttention", "ModelSpec", "NoCache", "Point", "RecurrentState", "SlidingWindow",
    "estimate", "get_dtype", "get_engine", "load_model", "parse_config",
]
