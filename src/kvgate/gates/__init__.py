"""Pure verdicts, one module per gate: observations in, :class:`~kvgate.verdict.Verdict` out; no I/O.

Each verdict names the measured value, the limit and the evidence in its message, in the house
style ``<what was seen>; <what the profile says> -> FAIL (<why>)``. A server answering garbage is a
FAIL with the body in the evidence, never an exception.

The map -- where a gate is *asserted* (suite), *decided* (here), *measured* (what sends the
requests) and *tested* (kvgate's own tests):

=============  ==========================  ====================  =====================================  ============================================
gate           asserted in                 decided in            measured by                            tested in
=============  ==========================  ====================  =====================================  ============================================
fit            suites/test_fit.py          gates/fit.py          kv/arithmetic.py                       tests/test_gates_fit.py, test_kvmath.py,
                                                                 + profile/hfconfig.py                  test_kv_families.py, e2e/test_kv_families.py,
                                                                                                        test_fit_vs_fake.py
deployment     suites/test_deployment.py   gates/deployment.py   http/probes.observe_deployment,        tests/test_gates_vs_fake.py,
                                                                 observe_served, launch/served.py       test_served_config.py, test_fit_vs_fake.py,
                                                                                                        test_deployment_spec.py
max-context    suites/test_max_context.py  gates/max_context.py  http/probes.build_prompt/send_watched  tests/test_gates_vs_fake.py
max-tokens     suites/test_max_tokens.py   gates/max_tokens.py   http/probes.send                       tests/test_gates_vs_fake.py
streaming      suites/test_streaming.py    gates/streaming.py    http/probes.send, http/sdk.sdk_stream  tests/test_gates_streaming.py, …vs_fake,
                                                                 + probes.send_bytes, read_keepalive    test_sse.py
features       suites/test_features.py     gates/features.py     gates/features.observe over            tests/test_gates_features.py,
                                                                 http/features.py                       test_features_vs_fake.py, e2e/test_features.py
answers        suites/test_answers.py      gates/answers.py      answers/observe.ask over http/client,  tests/test_gates_answers.py,
                                                                 answers/task (accuracy),               test_answers_vs_fake.py, e2e/test_real_model.py
                                                                 http/rendering.tokenize (causes)
compare        suites/test_compare.py      gates/compare.py      compare/baseline.answer_both,          tests/test_compare.py, test_kserve.py,
                                                                 compare/baseline.render_prompts,       e2e/test_served.py
                                                                 compare/latency.take_pairs
disconnect     suites/test_disconnect.py   gates/disconnect.py   http/probes.disconnect                 tests/test_gates_disconnect.py, …vs_fake
requests       suites/test_requests.py     gates/requests.py     http/probes.send / send_raw, canary    tests/test_gates_requests.py,
                                                                                                        test_requests_vs_fake.py
concurrency,   suites/test_load.py         gates/load.py         load/scenarios.run_* over kvgate.load  tests/test_gates_load.py,
latency                                                                                                 tests/test_gates_vs_fake.py
latency,       suites/test_load.py         gates/scale.py        scale/coordinator, scale/worker over   tests/test_scale.py, test_scale_k8s.py,
split                                                            kvgate.load (--workers)                e2e/test_served.py
priority       suites/test_priority.py     gates/priority.py     load/scenarios.run_priority            tests/test_gates_priority.py
autoscale-     suites/test_autoscale.py    gates/autoscale.py    load/scenarios.run_autoscale_burst     tests/test_gates_autoscale.py
signal
health         suites/test_health_load.py  gates/health_load.py  http/health_sampler.HealthSampler      tests/test_gates_health_load.py
(under-load)                                                     (run/health_watch, load/health)
pools          suites/test_pools.py        gates/pools.py        pools/routing.run_*                    tests/test_gates_pools.py,
                                                                                                        e2e/test_pools.py
soak           suites/test_soak.py         gates/soak.py         soak/runner.SoakRunner, sampling       tests/test_gates_soak.py,
                                                                                                        test_soak_vs_fake.py, test_soak_runner.py
health/canary  (inside the gates above)    gates/health.py       http/probes.canary                     tests/test_gates_vs_fake.py
=============  ==========================  ====================  =====================================  ============================================

:mod:`kvgate.gates.common` holds what several gates share (status shorthands, number formatting,
the server's error text, what a 200 completion says). A new gate is one module here, one suite
file, and its tests.
"""
