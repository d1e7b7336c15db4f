"""Fault-injecting fakes for kvgate's own tests (see :mod:`tests.fakes.fake_vllm`).

Names are re-exported lazily so that ``python -m tests.fakes.fake_vllm`` does not import the module
twice.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAULTS", "FakeConfig", "FakeState", "FakeTokenizer", "FakeVLLM", "RequestRecord", "running_fake"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import fake_vllm

        return getattr(fake_vllm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
