"""Deployment profiles: the pydantic models and YAML loading with ``extends:`` (:mod:`.models`),
the generated JSON Schema and field reference (:mod:`.schema`), and reading a Hugging Face
``config.json`` into a profile's ``model:`` (:mod:`.hfconfig`).

The bottom of the house: imports nothing of kvgate but :mod:`kvgate.verdict`.
"""
