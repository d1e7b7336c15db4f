"""The new revision against the one serving today (the compare gate): the golden set and its
answers (:mod:`kvgate.compare.golden`), the baseline -- a live endpoint or an earlier run's reports
(:mod:`kvgate.compare.baseline`) -- and the interleaved latency pairs (:mod:`kvgate.compare.latency`).
Verdicts: :mod:`kvgate.gates.compare`."""
