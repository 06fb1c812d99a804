"""The README's examples say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import kvbudget

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opens_with_the_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert blocks[0].strip() == "pip install . && kvbudget estimate mistral-7b"
    assert blocks[1].strip() == "pip install '.[test]' && python -m pytest"


def test_python_api_example_figures():
    model = kvbudget.load_model("qwen3-next-80b-a3b")
    result = kvbudget.estimate(model, engine="hf", kv_dtype="auto", batch=[1, 8], context=[4096, 65536], tp=1)
    text = README.read_text()
    for value in (result.bytes_per_token, result.fixed_bytes_per_sequence, result.points[0].kv_bytes):
        assert f"# {value}:" in text


def test_catalog_size_in_readme():
    assert f"lists {len(kvbudget.catalog.entries())})" in README.read_text()
