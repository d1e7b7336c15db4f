"""Simulated servers of known truth for kvgate's statistical verdicts (issue 48): the dependence
designs, the observations they produce, and the Monte-Carlo cells that count how often each
case's own decision code says PASS, FAIL or INCONCLUSIVE.

Not kvgate: a benchmark's helper package (``benchmarks/verdict_statistics.py`` runs it, and
``tests/test_verdict_statistics.py`` runs a smaller version in CI). Nothing here decides a
verdict: every run ends in the function the gate itself calls (``kvgate.gates.*``,
``kvgate.load.sampling``, ``kvgate.stats``); :mod:`verdict_sim.cases` only feeds those functions
simulated observations and reads back their status.

**Designs** (:class:`Design`): a run's latent values ``z`` (unit-variance normal, one per request
or per round, in send order) with a known dependence -- independent; lock-step waves of ``m``
requests with intraclass correlation ``rho`` (``z = sqrt(rho) a_wave + sqrt(1 - rho) e``; rho 1.0:
every request of a wave identical, as measured on the embedded server, ICC 0.998); AR(1) in send
order or in rounds with ``phi`` (stationary, ``z_t = phi z_(t-1) + sqrt(1 - phi^2) e_t``). Every
design keeps the *marginal* distribution, so the truth a case is judged against (a p95, a slope,
a ratio) is the same under every design: only the dependence changes.

**Latencies** are lognormal: ``x = T exp(SIGMA (z - Z95))`` with ``Z95`` = the standard normal's
0.95 quantile, so the marginal p95 is exactly ``T`` (ms) whatever the design.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import signal as _signal
from scipy import stats as _st

#: The lognormal shape of simulated latencies (sigma of log-latency; 0.5: p99/p50 ~ 3.2).
SIGMA = 0.5
#: The standard normal's 0.95 quantile: ``T exp(SIGMA (z - Z95))`` has its p95 at ``T``.
Z95 = float(_st.norm.ppf(0.95))
PASS, FAIL, INCONCLUSIVE, OTHER = "PASS", "FAIL", "INCONCLUSIVE", "OTHER"


@dataclass(frozen=True)
class Design:
    """A dependence design: ``kind`` ``iid``, ``waves`` (``param`` = ICC rho, waves of the case's
    own size) or ``ar1`` (``param`` = phi); ``label`` as the table prints it."""

    kind: str
    param: float = 0.0
    #: The profile's ``slo.pass_confidence_floor`` for this design (None: unset, the strict claim:
    #: no PASS below ``slo.confidence``). A floor lets a PASS of too few effective samples state a
    #: lower confidence: its wrong-PASS claim is then ``1 - floor``.
    floor: float | None = None
    #: soak: the profile's ``soak.autocorrelation_max`` for this design; ``"profile"`` (default): as
    #: the profile states it (smollm2-cpu: 0.5); None: the profile assumes nothing (the slopes allow for
    #: what the residuals cannot rule out, up to ``kvgate.stats.RHO_MAX``).
    soak_rho_max: float | None | str = "profile"

    @property
    def label(self) -> str:
        if self.kind == "iid":
            out = "independent"
        elif self.kind == "waves":
            out = f"lock-step waves, ICC {self.param:g}"
        elif self.kind == "ar1":
            out = f"AR(1) phi {self.param:g}"
        else:
            out = self.kind
        if self.soak_rho_max != "profile":
            out += (", soak.autocorrelation_max null (nothing assumed)" if self.soak_rho_max is None
                    else f", soak.autocorrelation_max {self.soak_rho_max:g}")
        return out + (f", pass_confidence_floor {self.floor:g}" if self.floor is not None else "")

    @property
    def key(self) -> str:
        base = f"{self.kind}{self.param:g}" if self.kind in ("waves", "ar1") else self.kind
        if self.soak_rho_max != "profile":
            base += "+rhomax" + ("null" if self.soak_rho_max is None else f"{self.soak_rho_max:g}")
        return base + (f"+floor{self.floor:g}" if self.floor is not None else "")

    def latent(self, rng: np.random.Generator, n: int, wave: int = 4) -> np.ndarray:
        """``n`` unit-variance normal values with this design's dependence (``wave``: the wave size
        of a ``waves`` design: the requests that move together)."""
        if n <= 0:
            return np.zeros(0)
        if self.kind == "iid":
            return rng.standard_normal(n)
        if self.kind == "waves":
            rho = self.param
            w = -(-n // wave)
            a = np.repeat(rng.standard_normal(w), wave)[:n]
            return math.sqrt(rho) * a + math.sqrt(1 - rho) * rng.standard_normal(n)
        if self.kind == "ar1":
            phi = self.param
            e = rng.standard_normal(n)
            z0 = rng.standard_normal()
            out, _ = _signal.lfilter([math.sqrt(1 - phi * phi)], [1.0, -phi], e, zi=[phi * z0])
            return out
        raise ValueError(f"unknown design kind {self.kind!r}")


IID = Design("iid")
WAVES_09 = Design("waves", 0.9)
WAVES_10 = Design("waves", 1.0)
AR_05 = Design("ar1", 0.5)
AR_08 = Design("ar1", 0.8)
#: AR(1) 0.8 rounds with the soak assuming nothing (``soak.autocorrelation_max`` null): what the
#: slopes' intervals give where the profile does not state an assumption the rounds break.
AR_08_NO_ASSUMPTION = Design("ar1", 0.8, soak_rho_max=None)
#: Lock-step waves at ICC 1.0 judged under the floor smollm2-cpu ships (slo.pass_confidence_floor 0.6).
WAVES_10_FLOOR = Design("waves", 1.0, floor=0.6)


def lognormal_ms(z: np.ndarray, p95_ms: float, sigma: float = SIGMA) -> np.ndarray:
    """Latencies (ms) with marginal p95 ``p95_ms`` from latent ``z`` (see the module docstring);
    ``sigma``: the sd of log-latency."""
    return p95_ms * np.exp(sigma * (np.asarray(z) - Z95))


#: Truth points every case is simulated at, as multiples of its limit in the direction of "worse":
#: ``limit`` (1x: the boundary, where both a wrong PASS and a wrong FAIL are counted), ``1.5x`` and
#: ``2x`` (power: a FAIL is right), ``healthy`` (the deployment meets its limit with room: the
#: false-alarm point of the budget; each case says what its healthy truth is).
TRUTHS = ("healthy", "limit", "1.5x", "2x")


@dataclass
class Cell:
    """One (case, design, truth) cell: ``counts`` of each outcome over ``runs`` simulated runs."""

    case: str
    design: str
    truth: str
    runs: int
    counts: dict[str, int]
    seconds: float = 0.0

    def rate(self, status: str) -> float:
        return self.counts.get(status, 0) / self.runs if self.runs else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "design": self.design, "truth": self.truth, "runs": self.runs,
                "counts": dict(self.counts), "seconds": round(self.seconds, 2)}


def mc_se(rate: float, runs: int) -> float:
    """The Monte-Carlo standard error of a rate measured over ``runs`` runs, at the rate's stated
    value (so a cell measured at 0 still gets a tolerance): ``sqrt(p (1 - p) / runs)``."""
    return math.sqrt(max(rate, 0.0) * (1 - max(rate, 0.0)) / runs) if runs else float("inf")


def within(measured: float, stated: float, runs: int, k: float = 3.0) -> bool:
    """A cell keeps its stated rate when ``measured <= stated + k`` Monte-Carlo standard errors."""
    return measured <= stated + k * mc_se(stated, runs)


def run_cell(case: str, design: Design, truth: str, runs: int, seed: int,
             one: Callable[[np.random.Generator, Design, str], str]) -> Cell:
    """``runs`` runs of ``one(rng, design, truth) -> status``, each with its own
    ``numpy.random.Generator`` spawned from ``seed`` (reproducible cell by cell, whatever runs
    before it)."""
    import time
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    for child in np.random.SeedSequence(seed).spawn(runs):
        s = one(np.random.default_rng(child), design, truth)
        counts[s] = counts.get(s, 0) + 1
    return Cell(case, design.key, truth, runs, counts, time.perf_counter() - t0)


def memoise_ranks() -> None:
    """Cache kvgate's pure rank functions (``upper_rank``, ``lower_rank``, ``min_samples_to_pass``
    of :mod:`kvgate.stats.confidence`: functions of ``(n, q, confidence)`` only; ``t_quantile`` of
    :mod:`kvgate.stats`: of ``(confidence, df)``; each a few scipy calls). Only the speed changes: the same ranks, hence the same decisions. Idempotent."""
    import kvgate.stats as s
    from kvgate.stats import confidence as c
    for mod, names in ((c, ("upper_rank", "lower_rank", "min_samples_to_pass", "max_exceedances")),
                       (s, ("t_quantile",))):
        for name in names:
            f = getattr(mod, name, None)
            if f is not None and not hasattr(f, "cache_info"):
                setattr(mod, name, functools.lru_cache(maxsize=65536)(f))


__all__ = ["AR_05", "AR_08", "AR_08_NO_ASSUMPTION", "Cell", "Design", "FAIL", "IID", "INCONCLUSIVE", "OTHER", "PASS", "SIGMA", "TRUTHS",
           "WAVES_09", "WAVES_10", "WAVES_10_FLOOR", "Z95", "lognormal_ms", "mc_se", "memoise_ranks", "run_cell", "within"]
