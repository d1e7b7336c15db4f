"""Profile-authoring commands of the ``kvgate`` command line: ``schema``, ``lint``, ``advise``.

:func:`add_commands` adds their sub-parsers to ``kvgate``'s; each sets ``args.run`` to the
function that runs it (returning the exit code), which :func:`kvgate.cli.main.main` calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

#: Exit codes: done / clean; findings (lint errors, a stale schema, no advice possible); bad input.
OK, FINDINGS, USAGE = 0, 1, 2


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``schema``, ``lint`` and ``advise`` to the ``kvgate`` sub-parsers ``sub``."""
    schema = sub.add_parser("schema", help="print or write the profile JSON Schema and field reference",
                            description="Print the JSON Schema of a deployment profile (generated from "
                                        "kvgate.profile.models), or write it and the field reference docs.")
    schema.add_argument("what", choices=["profile"], help="which schema (profile)")
    mode = schema.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true",
                      help="write the checked-in schema and docs/profile-fields.md instead of printing")
    mode.add_argument("--check", action="store_true", help="exit 1 when the checked-in copies are stale")
    mode.add_argument("--reference", action="store_true", help="print the Markdown field reference instead")
    schema.add_argument("--schema-path", default=None, metavar="PATH", help=argparse.SUPPRESS)
    schema.add_argument("--reference-path", default=None, metavar="PATH", help=argparse.SUPPRESS)
    schema.set_defaults(run=run_schema)
    from kvgate.authoring import advise
    from kvgate.authoring import lint

    lint.add_parser(sub)
    advise.add_parser(sub)


def run_schema(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``kvgate schema profile [--write|--check|--reference]``."""
    out, err = out or sys.stdout, err or sys.stderr
    from kvgate.profile import schema as ps

    schema_path = Path(args.schema_path) if args.schema_path else ps.PROFILE_SCHEMA
    ref_path = Path(args.reference_path) if args.reference_path else ps.FIELD_REFERENCE
    if args.write:
        try:
            written = ps.write(schema_path, ref_path)
        except OSError as exc:
            print(f"kvgate schema: cannot write {exc.filename or schema_path}: {exc.strerror or exc}", file=err)
            return USAGE
        for path in written:
            print(f"kvgate schema: wrote {path}", file=out)
        return OK
    if args.check:
        stale = ps.stale(schema_path, ref_path)
        for path in stale:
            print(f"kvgate schema: {path} is stale; regenerate with: kvgate schema profile --write", file=err)
        return FINDINGS if stale else OK
    out.write(ps.field_reference() if args.reference else ps.schema_text())
    return OK
