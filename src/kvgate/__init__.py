"""kvgate: a pytest-based deployment conformance suite for vLLM and OpenAI-compatible endpoints.

One folder per concern (each package docstring says what lives there and what it may import):
``run`` (one run: configure -> launch -> gates -> reports), ``gates`` (pure verdicts), ``kv``
(the KV arithmetic), ``profile``, ``http``, ``load``, ``soak``, ``pools``, ``launch``, ``report``,
``authoring``, ``cli``. At the top only what everything shares: :mod:`kvgate.verdict`,
:mod:`kvgate.stats`, and :mod:`kvgate.plugin` (pytest's entry point, wiring only).
"""
