"""The health/under-load gate's own load, for a run in which no load gate ran (``-m health``
alone): a few seconds of the long workload, oversubscribed, while a
:class:`~kvgate.http.health_sampler.HealthSampler` probes ``/health`` and ``/v1/models``.

In a run with load gates the gate judges the samples taken while they ran
(:mod:`kvgate.run.health_watch`) and sends nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.http.client import Endpoint, KvClient
from kvgate.http.health_sampler import HealthSampler, ProbeSample
from kvgate.load import LoadResult, closed_loop
from kvgate.load.scenarios import _specs, long_workload
from kvgate.profile.models import Profile

#: Seconds the own load runs (every request also times out by then): 5 s at one probe round per
#: 0.25 s gives ~20 samples per route, twice :data:`kvgate.gates.health_load.MIN_SAMPLES`.
OWN_LOAD_S = 5.0
#: Most requests in flight at once (a profile without max_num_seqs, or a large one, stays bounded).
MAX_IN_FLIGHT = 64
#: Output tokens per request: enough that a request spans several scheduler steps, few enough that
#: the requests turn over within the few seconds.
OUTPUT_TOKENS = 64
#: Most requests per slot: the count bound beside the time bound (a fast server turns a request
#: over in well under 5 s / 256 = 20 ms only with tiny prompts).
PER_SLOT = 256


@dataclass
class OwnLoad:
    """The gate's own load: ``requests`` sent at ``concurrency`` (closed loop) for at most
    ``seconds``; ``result`` the load run; ``samples`` the probes taken meanwhile."""

    workload: str
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    result: LoadResult
    samples: list[ProbeSample]

    @property
    def label(self) -> str:
        """How the verdict names this load."""
        return (f"its own load ({self.concurrency} concurrent {self.prompt_tokens:,}+{self.output_tokens}-token "
                f"{self.workload} requests for {self.seconds:g} s, {len(self.result.records)} sent)")


def run_own_load(client: KvClient, endpoint: Endpoint, profile: Profile, probe_timeout_s: float, during: str,
                 seconds: float = OWN_LOAD_S) -> OwnLoad:
    """2 x ``engine.max_num_seqs`` (else 2 x the long workload's concurrency; at most
    :data:`MAX_IN_FLIGHT`) long requests at once, each replaced when it ends (closed loop, at most
    :data:`PER_SLOT` per slot), for ``seconds``; every request is cut at that deadline. Twice what runs at once, so
    requests queue as they do in a saturated engine. Samples labelled ``during``."""
    name, wl = long_workload(profile)
    model, limit = profile.model.served_name, profile.engine.max_model_len
    out = min(wl.output_tokens, OUTPUT_TOKENS, limit - 1)
    prompt = min(wl.prompt_tokens, limit - out)
    conc = min(2 * (profile.engine.max_num_seqs or wl.concurrency), MAX_IN_FLIGHT)
    specs = _specs(client, endpoint, model, prompt, out, conc, "health-load")
    with HealthSampler(endpoint, probe_timeout_s, during) as sampler:
        result = closed_loop(endpoint, specs, n=PER_SLOT * conc, concurrency=conc, deadline_s=seconds,
                             request_timeout_s=seconds)
    return OwnLoad(name, conc, prompt, out, seconds, result, sampler.samples)


__all__ = ["MAX_IN_FLIGHT", "OUTPUT_TOKENS", "OWN_LOAD_S", "PER_SLOT", "OwnLoad", "run_own_load"]
