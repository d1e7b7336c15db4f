"""Short/long pools behind one router (:mod:`.routing`): each pool's own URL, where each request
landed (read from each pool's ``/metrics``), and the interference the split removes. Launching the
pools and their router lives in :mod:`kvgate.launch.pools`; the verdicts in :mod:`kvgate.gates.pools`.

May import :mod:`kvgate.http`, :mod:`kvgate.load`, :mod:`kvgate.profile`.
"""
