"""Health truth: after a fault-prone step a short generation canary must succeed within a deadline;
``/health`` alone proves little (vLLM's API server answers it while the engine is wedged). Used by the max-context, disconnect and load gates.
"""

from __future__ import annotations

from kvgate.http.probes import Exchange
from kvgate.verdict import Verdict
from kvgate.gates.common import FAIL, PASS, completion_facts, server_error


def canary_verdict(ex: Exchange, deadline_s: float, after: str) -> Verdict:
    """Health truth: the canary generation answered 200 with a completion within ``deadline_s``."""
    gate = "health/canary"
    r = ex.reply
    usage, _, problem = completion_facts(ex) if r.status == 200 else (None, None, None)
    ev = {"canary": ex.evidence(), "after": after}
    if r.status != 200 or problem or r.elapsed_s > deadline_s or not usage or not usage.get("completion_tokens"):
        why = problem or (f"answered {r.status} ({server_error(r, 120)})" if r.status != 200
                          else f"took {r.elapsed_s:.2f} s" if r.elapsed_s > deadline_s else "produced no tokens")
        if r.status != 200:
            seen: dict = {"measured": r.status, "limit": 200, "unit": "HTTP status"}
        elif r.elapsed_s > deadline_s:
            seen = {"measured": round(r.elapsed_s, 3), "limit": deadline_s, "unit": "s"}
        else:
            seen = {"measured": why, "limit": "a completion with tokens"}
        return Verdict(gate, FAIL, f"after {after} a {ex.body.get('max_tokens')}-token canary generation {why}; "
                       f"must succeed within {deadline_s:g} s -> FAIL (server unhealthy, whatever /health says)",
                       evidence=ev, **seen)
    return Verdict(gate, PASS, f"canary generation 200 in {r.elapsed_s:.2f} s after {after} -> PASS",
                   measured=round(r.elapsed_s, 3), limit=deadline_s, unit="s", evidence=ev)
