"""The door: who may call what, and what a hostile caller can do (the security gate's measurements).

:mod:`.routes` lists the routes to knock on (the server's ``openapi.json`` plus the known routes of
vLLM, SGLang, llama.cpp, TGI and LiteLLM); :mod:`.hostile` the hostile parameters; :mod:`.probe` sends
them and records what came back; :mod:`.middleware` is the ASGI middleware kvgate's embedded default
runs in front of every vLLM route (vLLM's own ``--api-key`` guards only ``/v1``, ``/v2``,
``/inference``, ``/cohere``). The verdicts are :mod:`kvgate.gates.security`'s.
"""
