"""Request fields that configure server internals: each sent once with a harmless value and once
with an out-of-range one by the security gate's ``hostile-parameters`` case (a canary and
``/health`` after each; resident memory before and after the lot). A server may refuse the field
(4xx) or strip/ignore it (a bounded 200); it must not die, hang or answer 5xx.

Sources (2026): ``mm_processor_kwargs`` sizes (``min_pixels``/``max_pixels``/``num_crops``) reach
the multimodal processor unchecked -> the API server OOM (GHSA-gx7p-2j49-hfq4); ``media_io_kwargs``
frame counts reach the video decoder (CVE-2026-105760); ``kv_transfer_params.tp_size`` sizes the
decode worker's per-rank transfer state -> the decode worker OOM-killed (CVE-2026-94626);
``mm_processor_kwargs.code_revision`` loads the processor's code from the revision a request names on
a server run with ``--trust-remote-code``, reachable through an unauthenticated ``/tokenize``
(CVE-2026-114053). vLLM 0.32 refuses per-request ``mm_processor_kwargs`` 400 on a text model (measured
2026-12-04, docs/security.md).

The code revision sent is :data:`NO_SUCH_REVISION`: no repository has it, so a server that honours
the field fails to load it (and names it) -- no code is fetched or run.
"""

from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: ``max_tokens`` every field probe asks for (a server that accepts the request answers this many
#: tokens at most).
MAX_TOKENS = 4
#: The revision named in ``mm_processor_kwargs.code_revision``: exists nowhere.
NO_SUCH_REVISION = "kvgate-probe-no-such-revision-0"
#: [pixels] the out-of-range image size (min and max pixels): 10^12, 4 TB of RGB at one byte a channel.
HUGE_PIXELS = 10**12
#: [frames] the out-of-range video frame count.
HUGE_FRAMES = 10**9
#: The out-of-range tensor-parallel size of the remote prefill worker (int32's largest).
HUGE_TP = 2**31 - 1


def _png_1x1() -> str:
    """A valid 1x1 RGB PNG as a ``data:`` URL (built here: no file, no fetch)."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff")) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(raw).decode()


#: A 1x1 white PNG, inline: the image ``mm_processor_kwargs`` sizes act on for an image model.
PNG_DATA_URL = _png_1x1()


@dataclass(frozen=True)
class FieldProbe:
    """One request field: ``name`` (the evidence key), ``route`` ("chat", "completions" or
    "tokenize"), ``field`` as a dotted path, ``harmless`` and ``hostile`` (each ``(words, value)``),
    ``cve`` the public report; ``image``: for an image model (``security.media_inputs``) the chat
    message carries :data:`PNG_DATA_URL`, so the processor the field configures runs."""

    name: str
    route: str
    field: str
    harmless: tuple[str, Any]
    hostile: tuple[str, Any]
    cve: str
    image: bool = False

    def body(self, model: str, value: Any, image: bool = False) -> dict[str, Any]:
        """The request carrying ``value`` in :attr:`field`'s top-level key."""
        key = self.field.split(".", 1)[0]
        text: Any = "Say OK."
        if image and self.image:
            text = [{"type": "text", "text": "Say OK."}, {"type": "image_url", "image_url": {"url": PNG_DATA_URL}}]
        if self.route == "completions":
            return {"model": model, "prompt": "Say OK.", "max_tokens": MAX_TOKENS, key: value}
        if self.route == "tokenize":
            return {"model": model, "messages": [{"role": "user", "content": text}], key: value}
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS, key: value}


FIELD_PROBES: tuple[FieldProbe, ...] = (
    FieldProbe("mm_processor_kwargs-sizes", "chat", "mm_processor_kwargs",
               ("max_pixels 1,003,520", {"max_pixels": 1_003_520}),
               ("min_pixels and max_pixels 10^12, num_crops 10^9",
                {"min_pixels": HUGE_PIXELS, "max_pixels": HUGE_PIXELS, "num_crops": 10**9}),
               "GHSA-gx7p-2j49-hfq4", image=True),
    FieldProbe("media_io_kwargs-frames", "chat", "media_io_kwargs",
               ("video num_frames 8", {"video": {"num_frames": 8}}),
               ("video num_frames 10^9, fps 10^6", {"video": {"num_frames": HUGE_FRAMES, "fps": 10**6}}),
               "CVE-2026-105760"),
    FieldProbe("kv_transfer_params-tp_size", "completions", "kv_transfer_params.tp_size",
               ("tp_size 1, no remote prefill", {"do_remote_prefill": False, "do_remote_decode": False, "tp_size": 1}),
               ("tp_size 2^31-1 with a remote prefill",
                {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "kvgate-probe",
                 "remote_block_ids": [0], "remote_host": "127.0.0.1", "remote_port": 9, "tp_size": HUGE_TP}),
               "CVE-2026-94626"),
    FieldProbe("code_revision-chat", "chat", "mm_processor_kwargs.code_revision",
               ("no code_revision (empty mm_processor_kwargs)", {}),
               (f"code_revision {NO_SUCH_REVISION!r}", {"code_revision": NO_SUCH_REVISION}),
               "CVE-2026-114053"),
    FieldProbe("code_revision-tokenize", "tokenize", "mm_processor_kwargs.code_revision",
               ("no code_revision (empty mm_processor_kwargs)", {}),
               (f"code_revision {NO_SUCH_REVISION!r}", {"code_revision": NO_SUCH_REVISION}),
               "CVE-2026-114053"),
)

NAMES = tuple(p.name for p in FIELD_PROBES)


def trust_remote_code_in(argv: Sequence[str]) -> bool | None:
    """Whether a vLLM command line (or the profile's ``engine.extra_args``) runs remote code: the
    last of ``--trust-remote-code`` / ``--no-trust-remote-code`` (``=true``/``=false`` forms too)
    wins; None when it names neither."""
    value: bool | None = None
    for tok in argv:
        if tok == "--trust-remote-code":
            value = True
        elif tok == "--no-trust-remote-code":
            value = False
        elif tok.startswith("--trust-remote-code="):
            value = tok.split("=", 1)[1].strip().lower() in ("1", "true", "yes", "on")
    return value


@dataclass(frozen=True)
class RemoteCode:
    """Whether the served config runs remote code: ``value`` (None: no source shows it) and
    ``source`` in words (``"the embedded vLLM's command line"``, ``"/server_info model_config"``), or
    why none could (``seen`` False)."""

    value: bool | None
    source: str

    @property
    def seen(self) -> bool:
        return self.value is not None


def remote_code(sources: Sequence[tuple[str, Callable[[], bool | None]]]) -> RemoteCode:
    """The first source (``(words, read)``) whose ``read()`` gives True or False; else unseen, the
    words naming every source looked at."""
    looked = []
    for words, read in sources:
        v = read()
        if v is not None:
            return RemoteCode(v, words)
        looked.append(words)
    return RemoteCode(None, "not shown by " + (", ".join(looked) if looked else "any source"))


__all__ = ["FIELD_PROBES", "FieldProbe", "HUGE_FRAMES", "HUGE_PIXELS", "HUGE_TP", "MAX_TOKENS", "NAMES",
           "NO_SUCH_REVISION", "PNG_DATA_URL", "RemoteCode", "remote_code", "trust_remote_code_in"]
