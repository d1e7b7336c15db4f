"""One run of the suite, from options to exit code: the object that owns it
(:mod:`.session`: configure -> launch -> gates -> reports), the life-cycle hooks around pytest's
session (:mod:`.lifecycle`: early launch, phases, interrupts) and gate modes and exit codes
(:mod:`.modes`).

pytest's side of kvgate: :mod:`kvgate.plugin` only wires hooks to this package; nothing below
:mod:`kvgate.run` imports it.
"""
