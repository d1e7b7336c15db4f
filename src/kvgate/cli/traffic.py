"""``kvgate traffic``: look at a traffic sample (``show``) and write a synthetic one (``synth``).

``kvgate traffic show FILE [--profile NAME]`` prints :meth:`~kvgate.traffic.sample.TrafficSample.summary`
(path, SHA-256, requests, sessions, prompt/output p50/p90/p99, arrival rate mean and busiest 1-s
window); with a profile, whether every request fits its ``engine.max_model_len`` and
``limits.max_tokens_cap`` (:func:`~kvgate.traffic.sample.overlong`, the callout the replaying gates
make before sending anything). ``kvgate traffic synth --out FILE`` writes
:func:`kvgate.traffic.synth.synth` (seeded; the defaults made ``profiles/traffic/tiny-chat.jsonl``).
:func:`add_command` adds it to ``kvgate``'s sub-parsers; it sets ``args.run``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from kvgate.profile.models import DEFAULT_PROFILE_DIR, ProfileError, load_profile
from kvgate.traffic.sample import FORMATS, TrafficError, load_sample, overlong, overlong_message
from kvgate.traffic.synth import SynthSpec, write

#: Exit codes: done (every request fits); some requests do not fit the profile; bad input.
OK, FINDINGS, USAGE = 0, 1, 2


def add_command(sub: argparse._SubParsersAction) -> None:
    """Add ``traffic show`` and ``traffic synth`` to the ``kvgate`` sub-parsers ``sub``."""
    from kvgate.authoring.advise import non_negative_int, positive_int

    tr = sub.add_parser("traffic", help="show a traffic sample's lengths and arrivals, or write a synthetic one",
                        description="Traffic samples the load and soak gates replay (workloads.*.traffic).")
    cmds = tr.add_subparsers(dest="traffic_command", required=True, metavar="show|synth")
    show = cmds.add_parser("show", help="requests, sessions, length percentiles, arrival rate and bursts of a sample",
                           description="Print what a traffic sample holds; with --profile, whether it fits the "
                                       "deployment (exit 1 when some requests do not).")
    show.add_argument("file", metavar="FILE", help="the sample (JSONL, OpenAI request log, ShareGPT, /metrics text)")
    show.add_argument("--format", choices=["auto", *FORMATS], default="auto", help="default: told from the content")
    show.add_argument("--profile", metavar="NAME|PATH", help="check the sample against this profile's limits")
    show.add_argument("--profile-dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR")
    show.set_defaults(run=run_show)
    d = SynthSpec()
    syn = cmds.add_parser("synth", help="write a synthetic multi-turn chat sample (seeded)",
                          description="Write a synthetic JSONL sample: multi-turn sessions sharing one system prompt "
                                      "plus single-turn requests, Poisson arrivals (see kvgate.traffic.synth).")
    syn.add_argument("--out", "-o", required=True, metavar="FILE", help="the JSONL file to write")
    syn.add_argument("--seed", type=non_negative_int, default=d.seed, help=f"default {d.seed}")
    syn.add_argument("--sessions", type=positive_int, default=d.sessions, metavar="N", help=f"default {d.sessions}")
    syn.add_argument("--singles", type=positive_int, default=d.singles, metavar="N",
                     help=f"single-turn requests (default {d.singles})")
    syn.add_argument("--long-singles", type=non_negative_int, default=d.long_singles, metavar="N",
                     help=f"of them long documents, {d.long_prompt[0]:,}-{d.long_prompt[1]:,} prompt tokens "
                          f"(default {d.long_singles})")
    syn.add_argument("--duration", type=float, default=d.duration_s, metavar="S",
                     help=f"seconds of recorded arrivals (default {d.duration_s:g})")
    syn.add_argument("--max-total", type=positive_int, default=d.max_total, metavar="TOKENS",
                     help=f"prompt + output of any request at most (default {d.max_total:,})")
    syn.set_defaults(run=run_synth)


def run_show(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``kvgate traffic show``: :data:`OK`, :data:`FINDINGS` (requests over the profile's limits) or :data:`USAGE`."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        sample = load_sample(args.file, args.format)
        profile = load_profile(args.profile, Path(args.profile_dir)) if args.profile else None
    except (TrafficError, ProfileError) as exc:
        print(f"kvgate traffic show: {exc}", file=err)
        return USAGE
    print(sample.summary(), file=out)
    if profile is None:
        return OK
    L, cap = profile.engine.max_model_len, profile.limits.max_tokens_cap
    found = overlong(sample, L, cap)
    print(overlong_message(found, sample, L, cap, where=f"profile {profile.name}"), file=out)
    return OK if found is None else FINDINGS


def run_synth(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``kvgate traffic synth``: :data:`OK` with the file written, :data:`USAGE` for options that
    contradict each other or a path that cannot be written."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        spec = SynthSpec(seed=args.seed, sessions=args.sessions, singles=args.singles, long_singles=args.long_singles,
                         duration_s=args.duration, max_total=args.max_total)
        path = write(spec, args.out)
    except (ValueError, OSError) as exc:  # SynthSpec's contradictions; the path
        why = f"cannot write {args.out}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
        print(f"kvgate traffic synth: {why}", file=err)
        return USAGE
    sample = load_sample(path)
    print(f"kvgate traffic synth: wrote {sample.describe()}", file=out)
    return OK
