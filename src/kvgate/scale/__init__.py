"""Scale-out: one kvgate load run split over N workers (processes here, or pods of a Kubernetes
Indexed Job / JobSet) and merged back into one set of records, judged as one process would.

Modules (each docstring holds the details):

- :mod:`~kvgate.scale.split`: who a worker is (``--worker k/N``, ``JOB_COMPLETION_INDEX`` +
  ``JOB_COMPLETIONS``) and its deterministic slice of a closed loop, an open loop or a replay plan;
- :mod:`~kvgate.scale.clock`: the NTP-style clock exchange with the coordinator (offset, bound);
- :mod:`~kvgate.scale.batch`: a batch as published (specs, shared start instant) and a worker's share;
- :mod:`~kvgate.scale.ship`: what a worker ships (records as gzip JSONL, its lag, clock, host load);
- :mod:`~kvgate.scale.host`: the worker's own host while it sent (its CPU, others', throttling);
- :mod:`~kvgate.scale.coordinator`: the control plane over HTTP, batches, waiting, lost workers;
- :mod:`~kvgate.scale.worker`: the worker's life (``kvgate worker``);
- :mod:`~kvgate.scale.merge`: parts -> one LoadResult per batch, a run directory, looks replayed;
- :mod:`~kvgate.scale.local` / :mod:`~kvgate.scale.k8s`: starting the workers here or as pods;
- :mod:`~kvgate.scale.session`: one split run (coordinator + workers) for a gate;
- :mod:`~kvgate.scale.soak`: a soak's rounds as overlapping batches (the soak runner's sender).

Imports: kvgate.load (the loops, records, sampling), kvgate.http.client (the endpoint),
kvgate.stats, kvgate.traffic (replay plans, duck-typed); never the gates (kvgate.gates.scale
judges what this package measures) nor the run or the plugin.
"""
