"""./bootstrap's uv step: pip's configuration (``pip config list``) handed to uv as options and
environment, and a setting uv has no equivalent for refused (bootstrap then installs with pip).

``uv_pip`` runs src/kvgate/launch/uvpip.py from its file, as bootstrap does (fed on stdin, before
kvgate is installed), against a pip configuration in a
temporary directory (XDG_CONFIG_DIRS / XDG_CONFIG_HOME / HOME there, no PIP_* variables; its
settings override /etc/pip.conf's), with a fake
``uv`` that prints its arguments and the environment it was given."""
import os
import re
import subprocess
import sys
from pathlib import Path

BOOTSTRAP = Path(__file__).resolve().parents[1] / "bootstrap"
UVPIP = BOOTSTRAP.parent / "src" / "kvgate" / "launch" / "uvpip.py"
FAKE_UV = '#!/bin/sh\necho "SSL_CERT_FILE=$SSL_CERT_FILE"\necho "UV_HTTP_TIMEOUT=$UV_HTTP_TIMEOUT"\nprintf "%s\\n" "$@"\n'


def run_uv_pip(tmp_path, conf: str, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    """Runs bootstrap's uv_pip Python with ``conf`` as the user's pip.conf (over the machine's); returns
    the finished process (stdout: the fake uv's lines)."""
    line = re.search(r"^  (.*< src/kvgate/launch/uvpip\.py)$", BOOTSTRAP.read_text(), re.M)
    assert line and line.group(1).startswith('"$VENV/bin/python" - "$VENV/bin/uv" "$@"'), "bootstrap's uv_pip moved"
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV)
    uv.chmod(0o755)
    (tmp_path / "home" / "pip").mkdir(parents=True)
    (tmp_path / "home" / "pip" / "pip.conf").write_text(conf)   # the user file: over /etc/pip.conf
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(XDG_CONFIG_DIRS=str(tmp_path / "xdg"), XDG_CONFIG_HOME=str(tmp_path / "home"),
               HOME=str(tmp_path), SSL_CERT_FILE="", UV_HTTP_TIMEOUT="", **env_extra)
    return subprocess.run([sys.executable, "-", str(uv), *args], input=UVPIP.read_text(), cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=60)


def test_pip_config_reaches_uv_as_options_and_environment(tmp_path):
    conf = ("[global]\nfind-links = /opt/wheels\nextra-index-url = file:///a/simple file:///b/simple\n"
            "constraint = /etc/c.txt\ncert = /etc/ca.pem\ntimeout = 99\nindex-url = https://idx.example/simple\n"
            "[install]\nfind-links = /opt/install-wheels\n")
    p = run_uv_pip(tmp_path, conf, "install", "-q", "torch==2.13.0", PIP_NO_CACHE_DIR="1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:2] == ["SSL_CERT_FILE=/etc/ca.pem", "UV_HTTP_TIMEOUT=99"]
    argv = " ".join(lines[2:])
    assert argv.startswith(f"pip install --python {sys.executable} --index-strategy unsafe-best-match ")
    for option in ("--extra-index-url file:///a/simple --extra-index-url file:///b/simple",
                   "--constraint /etc/c.txt", "--index-url https://idx.example/simple",
                   "--find-links /opt/install-wheels", "--no-cache"):   # [install] over [global]; PIP_* over both
        assert option in argv
    assert "/opt/wheels" not in argv
    assert argv.endswith("-q torch==2.13.0")


def test_pip_setting_without_uv_equivalent_is_refused_in_one_line(tmp_path):
    p = run_uv_pip(tmp_path, "[global]\nfind-links = /opt/wheels\nprefer-binary = true\n", "install", "x")
    assert p.returncode == 3 and p.stdout == ""
    assert p.stderr == "kvgate: pip's setting prefer-binary='true' has no uv equivalent here\n"


def test_options_only_for_install(tmp_path):
    p = run_uv_pip(tmp_path, "[global]\nfind-links = /opt/wheels\n", "uninstall", "-y", "torchvision")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[2:] == ["pip", "uninstall", "--python", sys.executable, "-y", "torchvision"]
