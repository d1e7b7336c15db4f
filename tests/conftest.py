"""Shared fixtures for kvgate's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

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
