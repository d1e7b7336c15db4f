"""Writing and checking profiles before anything runs: ``kvgate advise`` (:mod:`.advise`: a
hardened profile from the model, hardware, traffic and SLO), ``kvgate lint`` (:mod:`.lint`: what a
profile asks of vLLM that cannot work, against vLLM's serve-argument snapshot in
:mod:`kvgate.launch.vllm_args`).

May import: :mod:`kvgate.profile`, :mod:`kvgate.kv`, :mod:`kvgate.http` (live ``/metrics`` for
advise), :mod:`kvgate.verdict`, :mod:`kvgate.stats`. Never pytest, never :mod:`kvgate.run`.
"""
