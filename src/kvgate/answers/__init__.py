"""The answers gate's measurement: what a right answer is (:mod:`~kvgate.answers.checks`), how
answers are asked for, streamed and not (:mod:`~kvgate.answers.observe`), and the accuracy task
with its binomial interval (:mod:`~kvgate.answers.task`), and how two answers part token by token
(:mod:`~kvgate.answers.tokendiff`). Verdicts live in :mod:`kvgate.gates.answers`."""
