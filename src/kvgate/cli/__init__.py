"""The ``kvgate`` command line (also ``python -m kvgate``): :mod:`.main` (the parser, ``kvgate
serve``), :mod:`.authoring` (``schema``, ``lint``, ``advise``), :mod:`.report` (``kvgate report``),
:mod:`.traffic` (``kvgate traffic show|synth``).

Thin: each command parses its arguments and calls the library. May import anything in kvgate
except :mod:`kvgate.plugin` and :mod:`kvgate.run` (pytest's side).
"""
