"""Talking to an OpenAI-compatible server, one request at a time: the client (:mod:`.client`), SSE
framing and event classes (:mod:`.sse`), folding a stream (:mod:`.stream`), the official ``openai``
SDK checks (:mod:`.sdk`), exact-token-length prompts (:mod:`.prompts`), what the server's tokenizer
and chat template make of an input (:mod:`.rendering`), the probes the gates send
(:mod:`.probes`; the features gate's in :mod:`.features`), the preflight (:mod:`.preflight`),
``/metrics`` (:mod:`.metrics`) and one request sent byte for byte as written (:mod:`.raw`: the
request targets and ``Host`` headers httpx would normalise).

Observations only, no verdicts. May import :mod:`kvgate.verdict`, :mod:`kvgate.stats`,
:mod:`kvgate.profile`, :mod:`kvgate.kv` (pure arithmetic) and :mod:`kvgate.report.redact`; never :mod:`kvgate.gates` or pytest. Timed load lives in
:mod:`kvgate.load`.
"""
