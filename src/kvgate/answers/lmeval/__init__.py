"""The accuracy task through lm-eval (``answers.accuracy.lm_eval``; docs/answers.md, "Accuracy
through lm-eval").

:mod:`~kvgate.answers.lmeval.task` turns kvgate's JSONL task into an lm-eval task YAML over that
file (pure); :mod:`~kvgate.answers.lmeval.runner` checks a named task, runs lm-eval in a child
process and reads back its per-sample scores as an :class:`~kvgate.answers.lmeval.runner.Outcome`;
:mod:`~kvgate.answers.lmeval.child` is that child (``python -m kvgate.answers.lmeval.child``), the
only module that imports lm-eval. The verdict is :func:`kvgate.gates.answers.lm_eval_verdict`.

Why a child process and not lm-eval in the run's own process: offline is an environment that must
be set before ``datasets`` and ``huggingface_hub`` are imported (their offline switches are read at
import, and the run may have imported them already to build the embedded model); lm-eval configures
logging, progress bars and an asyncio loop of its own; a hung evaluation is bounded by killing the
child. The cost is the child's start: about 5 s (lm-eval's import, the task's data read) plus, for a named task, lm-eval's
task index (7-14 s on 2 loaded cores) -- the same time lm-eval would take in process, once.
"""
