"""How an endpoint comes to exist: one interface (:mod:`.base`: ``Launcher``, ``choose``) and one
module per launcher -- a given URL (:mod:`.target`), KServe discovery (:mod:`.kserve`), the
embedded vLLM on the CPU with its tiny model (:mod:`.local`, :mod:`.tinymodel`), Docker via
testcontainers (:mod:`.docker`), short/long pools behind nginx (:mod:`.pools`); vLLM's serve
arguments as its own parser defines them, snapshotted per version (:mod:`.vllm_args`).

May import :mod:`kvgate.http`, :mod:`kvgate.profile`, :mod:`kvgate.report.redact`; never pytest.
"""
