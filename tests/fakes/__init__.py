"""Fault-injecting fakes for kvgate's own tests (see :mod:`tests.fakes.fake_vllm`)."""

from .fake_vllm import FAULTS, FakeConfig, FakeState, FakeTokenizer, FakeVLLM, RequestRecord, running_fake

__all__ = ["FAULTS", "FakeConfig", "FakeState", "FakeTokenizer", "FakeVLLM", "RequestRecord", "running_fake"]
