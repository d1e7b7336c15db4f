"""Traffic like production: samples of a deployment's own requests, replayed by the load and soak gates.

- :mod:`~kvgate.traffic.sample`: :class:`TrafficSample` / :class:`TraceRequest`, the loaders
  (:func:`load_sample`, :func:`sample_for` for a profile workload's ``traffic:``), length
  percentiles and provenance (file, SHA-256), :func:`overlong` (requests the deployment cannot serve),
  the busiest arrival windows (:meth:`TrafficSample.rate_windows`).
- :mod:`~kvgate.traffic.synth`: a seeded synthetic multi-turn chat sample (``kvgate traffic synth``;
  ``profiles/traffic/tiny-chat.jsonl``).
- :mod:`~kvgate.traffic.replay`: :func:`plan_replay` (open loop on recorded arrivals, or closed loop
  drawing from the sample; sessions kept whole) and :func:`run_replay` (exact-length prompts, a
  shared system prompt per prefix id, conversations whose history grows with the server's replies,
  sent with :mod:`kvgate.load.sessions`; the per-turn cache effect in :class:`ReplayResult`).
"""
