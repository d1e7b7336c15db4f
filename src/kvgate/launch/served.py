"""What a server kvgate launched was told: its command line, and -- when the model directory it
serves is on this machine (the embedded vLLM) -- the files vLLM reads from it that no HTTP route
shows: the chat template and ``generation_config.json``.

:func:`launched_config` reads them for ``deployment/served-config``
(:func:`kvgate.gates.deployment.served_config_verdict`). Where vLLM 0.32 finds them:

* chat template -- ``--chat-template`` (a file path, or the template itself when no such file
  exists: ``entrypoints/chat_utils.py::load_chat_template``), else the tokenizer's own:
  ``chat_template.jinja`` in the model directory (what transformers saves since 4.43, and reads
  first), else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named
  templates: ``default``).
* sampling defaults -- ``--generation-config`` ``auto`` (the default) reads the model
  directory's ``generation_config.json``, a directory path reads that one, ``vllm`` none; of it
  vLLM takes :data:`SAMPLING_KEYS` (``config/model.py::get_diff_sampling_param``), then
  ``--override-generation-config`` on top.

A docker container's model directory is inside the container: those files are listed as not
visible, never assumed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: The fields of ``generation_config.json`` vLLM turns into default sampling parameters.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")

#: Which launcher's command line it is, in words (:attr:`kvgate.http.client.Endpoint.launched_by`).
SOURCES = {"embedded": "the embedded vLLM's command line", "docker": "the docker container's command line"}


@dataclass(frozen=True)
class LaunchedConfig:
    """A launched server's command line and model files.

    ``argv``: the command line as rendered; ``source``: where it came from, in words.
    ``chat_template_sha256``: sha256 (hex) of the template text vLLM loads, or None with
    ``chat_template_source`` saying why (the source otherwise: the file, or ``--chat-template``
    given inline). ``generation_config``: the :data:`SAMPLING_KEYS` of the
    ``generation_config.json`` vLLM reads (``{}`` when it reads none), or None with
    ``generation_config_source`` saying why.
    """

    argv: tuple[str, ...]
    source: str
    chat_template_sha256: str | None = None
    chat_template_source: str = ""
    generation_config: dict[str, Any] | None = None
    generation_config_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The evidence form, without ``argv``: summary.json's ``launch.command`` holds the command line once."""
        return {"source": self.source, "chat_template_sha256": self.chat_template_sha256,
                "chat_template_source": self.chat_template_source, "generation_config": self.generation_config,
                "generation_config_source": self.generation_config_source}


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--x v`` or ``--x=v``; the last one wins), or None."""
    value = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def sha256_text(text: str) -> str:
    """sha256 (hex) of ``text`` as UTF-8 -- the hash ``model.chat_template.sha256`` states."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _template_in(model_dir: Path) -> tuple[str | None, str]:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), str(jinja)
    cfg = model_dir / "tokenizer_config.json"
    if not cfg.is_file():
        return None, f"{model_dir} has no chat_template.jinja or tokenizer_config.json"
    try:
        tmpl = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
    except (ValueError, AttributeError) as exc:
        return None, f"{cfg} is not JSON ({exc})"
    if isinstance(tmpl, list):  # named templates: vLLM (transformers) uses "default"
        tmpl = next((t.get("template") for t in tmpl if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(tmpl, str):
        return None, f"{cfg} has no chat_template (the server then refuses chat requests)"
    return tmpl, f"{cfg} chat_template"


def _chat_template(argv: Sequence[str], model_dir: Path | None) -> tuple[str | None, str]:
    given = flag_value(argv, "--chat-template")
    if given is not None:
        path = Path(given)
        if path.is_file():
            return path.read_text(encoding="utf-8"), f"--chat-template {given}"
        if "{" in given:
            return given, "--chat-template (the template given inline)"
        return None, f"--chat-template {given}: no such file on this machine"
    if model_dir is None:
        return None, "the model directory is not on this machine"
    return _template_in(model_dir)


def _generation_config(argv: Sequence[str], model_dir: Path | None) -> tuple[dict[str, Any] | None, str]:
    mode = flag_value(argv, "--generation-config") or "auto"
    if mode == "vllm":
        return {}, "--generation-config vllm: vLLM's own defaults, no generation_config.json"
    where = model_dir if mode == "auto" else Path(mode)
    if where is None:
        return None, "the model directory is not on this machine"
    path = where / "generation_config.json"
    if not path.is_file():
        return {}, f"{path} absent: vLLM's own defaults"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return None, f"{path} is not JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object"
    return {k: data[k] for k in SAMPLING_KEYS if k in data}, str(path)


def launched_config(argv: Sequence[str], launched_by: str | None) -> LaunchedConfig | None:
    """The :class:`LaunchedConfig` of a server kvgate launched with ``argv`` (None for
    ``--endpoint``: no ``argv``). The model files are read only for the ``embedded`` launcher,
    whose ``--model`` directory is on this machine; a docker container's are not visible."""
    if not argv:
        return None
    source = SOURCES.get(launched_by or "", f"the {launched_by} launcher's command line")
    model = flag_value(argv, "--model")
    model_dir = Path(model) if launched_by == "embedded" and model and Path(model).is_dir() else None
    if launched_by != "embedded":
        why = f"not visible: the model directory ({model or 'unknown'}) is inside the container"
        given = flag_value(argv, "--chat-template")
        inline = given is not None and "{" in given  # a template given inline is on the command line itself
        return LaunchedConfig(tuple(argv), source, sha256_text(given) if inline and given else None,
                              "--chat-template (the template given inline)" if inline else why, None, why)
    tmpl, tmpl_src = _chat_template(argv, model_dir)
    gen, gen_src = _generation_config(argv, model_dir)
    return LaunchedConfig(tuple(argv), source, sha256_text(tmpl) if tmpl is not None else None, tmpl_src, gen, gen_src)
