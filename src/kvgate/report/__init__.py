"""Everything kvgate writes about a run: the run record and summary.json (:mod:`.record`),
its outcome and exit code under the gate mode (:mod:`.outcome`), the
report set replaced as a whole (:mod:`.outputs`), Allure metadata (:mod:`.allure_meta`), the
sign-off page (:mod:`.signoff`), the HTML report (:mod:`.render`), plots (:mod:`.plots`), and the
redaction every written byte passes through (:mod:`.redact`).

May import :mod:`kvgate.verdict`, :mod:`kvgate.stats`, :mod:`kvgate.profile`; never
:mod:`kvgate.run` or :mod:`kvgate.plugin`.
"""
