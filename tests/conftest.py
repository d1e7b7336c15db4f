"""Shared fixtures for kvgate's own tests."""

from __future__ import annotations

from pathlib import Path

# Import lazily-loaded HTTP stacks up front: pytester's in-process runs drop modules first
# imported inside them, and httpx imports httpcore lazily -- a re-imported httpcore then has new
# exception classes that httpx no longer maps (httpcore.ConnectError escaping as an INTERNALERROR).
import httpcore  # noqa: F401
import httpx  # noqa: F401
import openai  # noqa: F401
import pytest

httpx.HTTPTransport()  # instantiating triggers httpx's own lazy imports of httpcore internals

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def write_profile(tmp_path: Path):
    """Write a YAML profile into tmp_path and return its path."""

    def write(name: str, text: str) -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        return p

    return write


MINIMAL = """\
model:
  served_name: m
  architecture: {layers: 2, attention_heads: 4, kv_heads: 2, head_dim: 64}
engine:
  max_model_len: 256
"""
