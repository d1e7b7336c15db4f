"""The soak: the runner (:mod:`.runner`: rounds of fixed offered load), the resource samplers
(:mod:`.sampling`: process-tree RSS/swap, remote ``/metrics``, GPU memory via pynvml) and the
picture (:mod:`.plot`). The verdict lives in :mod:`kvgate.gates.soak`.

May import :mod:`kvgate.load`, :mod:`kvgate.http`, :mod:`kvgate.stats`, :mod:`kvgate.profile`.
"""
