"""A fault-injecting fake of vLLM 0.32's OpenAI-compatible server, for kvgate's own tests.

It imitates the parts of ``python -m vllm.entrypoints.openai.api_server`` that kvgate's gates look
at — routes, JSON shapes, error bodies, SSE framing, length/clamp semantics, usage accounting and
the Prometheus metrics — with a trivial deterministic tokenizer and a "model" that emits
deterministic words. Faults (see :data:`FAULTS`) are switched per test, also between requests::

    with FakeVLLM(FakeConfig(max_model_len=256)) as fake:      # uvicorn in a thread, port 0
        httpx.get(fake.base_url + "/health")                   # base_url has no /v1
        fake.config.faults.add("over_length_500")
        ...
        fake.state.running, fake.state.requests[-1].finish_reason

    with running_fake(FakeConfig(faults={"missing_done"})) as base_url: ...

    python -m tests.fakes.fake_vllm --port 0 --fault stall_mid_stream --set stall_s=0.2   # prints the URL

A fake in another process is steered over HTTP: ``GET/POST /_fake/config`` (JSON of FakeConfig
fields, ``faults`` as a list), ``GET /_fake/state`` (running, waiting, per-request records with
server-side monotonic timestamps), ``POST /_fake/reset``.

Tokenizer: every whitespace-separated word is one token. A completions prompt gets a BOS ``<s>``
(so ``count = words + 1``); a list of token ids is taken as is. The chat template renders
``<s> <|role|> content ... <|assistant|>`` — BOS, one token per role marker, the content words, and
the generation prompt; ``/tokenize`` with ``messages`` renders the same template, so its ``count``
equals chat ``usage.prompt_tokens``.

Generation: token ``i`` is the word ``" tok{k}"`` (leading space), ``k`` derived from the prompt at
temperature 0 (reproducible) or from ``seed`` / fresh randomness otherwise. Without ``ignore_eos``
the "model" emits an EOS after ``max(eos_after, min_tokens)`` content tokens: the EOS counts in
``usage.completion_tokens`` and in logprobs (token ``"</s>"``) but adds no text, and the
``finish_reason`` is ``"stop"`` — exactly like vLLM. With ``ignore_eos`` (or when the limit comes
first) the finish reason is ``"length"`` and every generated token is a word of text.

Answering mode (the answers gate): ``FakeConfig.answers`` maps a prompt key to an answer text. A
prompt in the chat template's shape -- a chat request, or its rendered text or token ids sent to
completions -- is looked up by its whole conversation (:func:`answer_key`: the non-system turns'
contents, one a line), then by its last user turn's content; any other completions prompt by its
text (token ids detokenized), without the BOS. A match is answered, at any temperature, with the
answer's words (:func:`_pieces`: words with their leading whitespace, or 4-character pieces of text
without spaces) as tokens, then EOS (finish ``stop``; ``length`` when ``max_tokens`` comes first),
streamed or not, with logprobs when asked (each chosen at 0.0, alternatives ``<alt1>`` at -3.0,
``<alt2>`` at -4.0, ...: a margin of 3 nats); ``usage.prompt_tokens`` is the prompt's count on every
path (a rendered text sent with ``add_special_tokens: false``). Unmatched prompts, adapters, feature
requests and ``ignore_eos``/``min_tokens`` requests are answered with ``tok{k}`` words as above. Of
the answers faults, ``double_bos_ids`` and ``echo_prompt_first_delta`` bend every token-id prompt,
the others only answering mode. A non-streamed completion with ``echo`` returns the prompt's text and,
with logprobs, its tokens in front of the answer's (``token_id:N`` with ``return_tokens_as_token_ids``),
as vLLM does: the server's own reading of the prompt.

Pass-key retrieval (the answers gate's long-context case): with ``FakeConfig.needle`` (a regex whose
group is the key) a prompt asking ``needle_question`` is answered with the key the "model" finds in the
prompt as it got it (``" 12345."``; ``" unknown."`` when none is there), whatever the other answer
faults; ``compress_prompt`` drops a long prompt's middle before that.

Serve features (the features gate), healthy by default, each with faults: a chat request with
``tools`` answers one call (named -> that function, required -> the first, auto -> the first with
parameters) whose arguments are a minimal valid instance of the function's schema, streamed as
vLLM's tool-call deltas; ``response_format`` / ``structured_outputs`` answer the matching
:data:`kvgate.gates.features.BATTERY` example (else a minimal instance; an unknown regex is a 400);
with ``reasoning_parser`` set, a chat answer splits into ``reasoning`` and ``content`` unless
``enable_thinking`` is False; ``lora_adapters`` are listed in /v1/models with the served model as
parent and answer text of their own; with ``enable_prefix_caching`` a prompt sharing whole blocks
with an earlier one reports them as ``usage.prompt_tokens_details.cached_tokens`` (with
``prompt_tokens_details``), counts them in ``vllm:prefix_cache_hits_total`` and prefills only the
uncached tokens (``prefill_s_per_token`` each).

Time is injectable: all delays go through ``FakeVLLM(sleep=...)`` (default ``asyncio.sleep``) and
default to 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import socket
import sys
import threading
import time
import urllib.parse
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import anyio
import uvicorn
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = [
    "CONTENT_TEXT",
    "CONTROL_TEXT",
    "FAULTS",
    "FakeConfig",
    "FakeState",
    "FakeTokenizer",
    "FakeVLLM",
    "REASONING_TEXT",
    "RequestRecord",
    "answer_key",
    "battery_example",
    "minimal_instance",
    "running_fake",
    "main",
]

# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------

FAULTS: dict[str, str] = {
    # issue 2: deployment / max context / max_tokens
    "wrong_max_model_len": "advertise advertised_max_model_len (default 2 x max_model_len) in /v1/models "
    "and /tokenize while enforcing max_model_len",
    # issue 38: the served configuration
    "kv_dtype_halved": "vllm:cache_config_info reports twice num_gpu_blocks (and twice kv_cache_size_tokens and "
    "kv_cache_max_concurrency) for the same kv_cache_memory_bytes: the pool of a server that caches 2-byte KV elements "
    "where the profile says 4 (bfloat16 served under a float32 profile)",
    "over_length_500": "answer an over-length prompt (tokens >= max_model_len) with 500 instead of 400",
    "over_length_truncate": "silently left-truncate an over-length prompt and answer 200 (prompt_tokens "
    "then reads max_model_len - max_tokens, at most max_model_len - 1)",
    "ignore_max_tokens": "generate max_tokens + ignore_max_tokens_extra tokens (still bounded by "
    "max_model_len - prompt) and report them truthfully in usage",
    "finish_stop_at_cap": 'finish_reason "stop" instead of "length" when the token limit is hit',
    "stream_usage_mismatch": "the streamed usage chunk reports completion_tokens one more than the "
    "tokens actually streamed (non-streamed usage stays correct)",
    "dead_after_over_length": "after the first over-length request (itself answered 400) every "
    "generation fails (dead_mode '500': HTTP 500; 'hang': never answers) while /health stays 200",
    "ignore_cap": "the server-side cap max_tokens_cap (vLLM --override-generation-config "
    "max_new_tokens) is not enforced",
    # issue 4: load / latency / streaming
    "stall_mid_stream": "sleep stall_s seconds before token stall_after (default: half way) of a "
    "generation; /health stays fast",
    "missing_done": "streams end without 'data: [DONE]'",
    "error_mid_stream": "the engine fails half way through a generation: a stream gets vLLM's "
    "'data: {\"error\": ...}' event then [DONE] (HTTP 200); a non-streamed request gets 500",
    "duplicate_deltas": "one content delta (the middle one) is sent twice",
    "two_finish_chunks": "the chunk carrying finish_reason is sent twice",
    "hol_blocking": "prefills are serialized through one lock, each holding it prompt_tokens x "
    "prefill_s_per_token seconds (set it > 0): TTFT grows with the prefill queued ahead (head-of-line "
    "blocking); without the fault prefills run concurrently",
    "stuck_gauges": "a client disconnect never releases its slot: num_requests_running and KV usage "
    "stay up (the slot also keeps counting against max_num_seqs)",
    "5xx_under_concurrency": "a long prompt (>= long_prompt_tokens, default max_model_len // 2) is "
    "answered 500 when more than max_concurrent_long long prompts would be in flight",
    "leaky_rss": "each generation request leaks leak_bytes_per_request bytes of real, resident memory; "
    "process_resident_memory_bytes in /metrics grows with it",
    "leaky_rss_long": "like leaky_rss, but only a request whose prompt is longer than leak_min_prompt_tokens "
    "(None: max_model_len // 2) leaks: a short-only load never sees the growth",
    "drifting_ttft": "TTFT grows by drift_s_per_request for every generation request seen before",
    "ttft_rises_with_load": "TTFT grows with load: load_ttft_s_per_request for every other request running when "
    "this one is admitted (a closed loop at concurrency c: TTFT = ttft_s + k x (c - 1); the capacity gate's knee)",
    "frozen_queue_gauge": "vllm:num_requests_waiting always reads 0 in /metrics, however many requests wait",
    "frozen_rss": "process_resident_memory_bytes in /metrics reads the value of the first scrape forever (leaks "
    "and the page-level wiggle of a live process included): a cached /metrics or a gauge the server never updates",
    "stuck_queue_gauge": "vllm:num_requests_waiting never falls: it reads the highest queue depth seen so far",
    # issue 12: edge requests, chunk schema, route timeout, garbage framing
    "validation_500": "every request the fake would reject 400 is answered 500 InternalServerError instead",
    "empty_prompt_kills": "an empty prompt (\"\", [], [\"\"]) is answered 500 and kills the engine (every "
    "generation after it fails 500; /health stays 200)",
    "plain_error_body": "4xx answers carry a text/plain 'Bad Request' body instead of OpenAI's error object",
    "ignore_min_tokens": "the natural EOS comes after 2 tokens whatever min_tokens asks",
    "split_utf8": "streamed deltas drop the last byte of every non-ASCII token (decoded with replacement chars)",
    "finish_reason_empty": "stream chunks carry finish_reason \"\" instead of null until the finish chunk",
    "usage_unasked": "every stream chunk carries a usage object, include_usage asked or not",
    "route_timeout": "a gateway with a total route timeout of route_timeout_s: a stream still running then is "
    "cut (connection dropped, no [DONE]); a non-streamed request gets 504 with an HTML page",
    "truncated_stream": "the connection drops half way through a stream, mid chunked body (no [DONE])",
    "html_error_page": "every generation is answered 502 with an ingress's HTML error page",
    "empty_502": "every generation is answered 502 with an empty body",
    # issue 22: a gateway's body-size limit in front of the engine (Envoy AI Gateway's 32 KB buffer,
    # nginx's client_max_body_size)
    "body_limit_413": "a gateway in front: every POST whose body exceeds max_body_bytes (default 4096) is "
    "answered 413 with nginx's HTML page, on every route (/tokenize included); smaller bodies pass",
    "sse_crlf": "SSE lines end with \\r\\n (allowed by the SSE spec)",
    "sse_comments": "': ping' comment lines between events (allowed by the SSE spec)",
    "sse_event_fields": "every event carries an 'event: message' field (allowed by the SSE spec)",
    # issue 40: keepalives during a long prefill (a stream silent for keepalive_s gets one; set ttft_s or
    # prefill_s_per_token for a prefill to wait through)
    "prefill_keepalives": "a well-formed ': ping' comment frame every keepalive_s while a stream waits for its next "
    "event (llama-server and gateways during long prefills; allowed by the SSE spec)",
    "keepalive_data_colon": "the keepalive is re-emitted as data: 'data: : PROCESSING' (a gateway turning upstream "
    "comments into events; the openai Node SDK throws)",
    "keepalive_id_alone": "the keepalive frame is an 'id: N' line then ': ping' (no data: openai-python and httpx-sse "
    "dispatch an empty event: JSONDecodeError)",
    "never_schedule": "a request needing more than schedulable_tokens (prompt + max_tokens) is admitted and "
    "waits forever (num_requests_waiting 1, running 0), like vLLM 0.32 with a KV pool of exactly one "
    "full-length sequence (one block is its null block)",
    # the features gate: tool calling, structured output, reasoning, LoRA, prefix caching
    "tools_stream_as_text": "streamed tool-call answers carry the call as raw '<tool_call>...</tool_call>' text in "
    "content with finish stop and no tool_calls (the parser did not run); non-streamed stays right",
    "tool_ids_repeat": "tool-call ids are '<function>:<index in the answer>', so the same tool called on turn 1 and turn "
    "2 of a conversation gets 'list_dir:0' both times (vllm#50295), streamed and not",
    "tools_empty_calls": "non-streamed tool-call answers say finish_reason tool_calls with an empty tool_calls list",
    "tools_args_not_object": "tool-call arguments are the JSON text false, for every function (vLLM 0.32 leaves a "
    "non-strict tool's arguments unconstrained)",
    "structured_whitespace_loop": "json_schema answers are '{' then whitespace until max_tokens, finish length",
    "structured_cut": "json_schema answers are cut half way (mid-object) with finish stop",
    "reasoning_markers_in_content": "thinking-on answers leave '<think>...</think>' in content and no reasoning",
    "lora_as_base": "LoRA adapters answer (as themselves) with the base model's text",
    "prefix_cache_never_hits": "prefix caching never hits: cached_tokens 0, the hits counter flat, full prefill",
    "prefix_counter_frozen": "cached_tokens and the prefill are right, but vllm:prefix_cache_hits_total never rises",
    # issue 21: the drain of a rolling update (FakeVLLM.sigterm(); healthy: in-flight requests finish,
    # new generations get 503, the server exits once idle or after shutdown_timeout_s)
    "abort_on_sigterm": "SIGTERM aborts every in-flight request at once (like vLLM --shutdown-timeout 0): "
    "streams are cut (connection dropped, no [DONE]), non-streamed requests get 500",
    "drain_500": "during the drain new generations are answered 500 InternalServerError (as vLLM 0.32 does), "
    "not 503",
    "no_exit_after_drain": "after the drain the server never exits (a process that hangs in its teardown)",
    # issue 21: a hung engine behind a healthy /health, a server that stalls streams
    "hang_after_generations": "after hang_after generations (default 60) every later generation is held forever "
    "(queued: num_requests_waiting counts it; until the client hangs up or the fake stops) while /health stays 200",
    "exit_after_generations": "after exit_after generations (default 60) the server process is gone: it stops "
    "listening (every later connection refused, /health too) -- a vLLM that died mid-run (OOM-killed, crashed)",
    "buffer_stream": "a gateway that buffers the event stream (dstack#4269; nginx proxy_buffering): the engine "
    "generates at its own pace, but the SSE bytes are released only in buffer_bytes pieces (default 16 KB) as they "
    "fill, and the rest when the response ends (buffer_bytes 0: everything at the end)",
    "pause_streams": "every stream pauses pause_s seconds (default 40) after pause_after_chunks token chunks "
    "(default 4), then goes on; non-streamed requests are not delayed",
    # issue 22: metrics consumers read (the metrics gate)
    "duplicate_pid_series": "vllm:num_requests_running, vllm:num_requests_waiting and vllm:kv_cache_usage_perc come "
    "as 8 series each, differing only by a pid label: 7 read 0.0, one the real value (several API-server "
    "processes exporting a registry each, vllm PR#28792)",
    "renamed_kv_usage": "KV usage is exposed under the pre-0.20 name vllm:gpu_cache_usage_perc, not "
    "vllm:kv_cache_usage_perc",
    "ttft_histogram_lies": "every vllm:time_to_first_token_seconds observation is 0.0005 s (the lowest bucket), "
    "whatever the request took (vllm#6337)",
    "metrics_500_under_load": "GET /metrics answers 500 while any generation is in flight (vllm#49983); idle, 200",
    # issue 25: a new revision against the one serving (the compare gate)
    "flip_near_ties": "temperature-0 answers take the runner-up at the near tie (token near_tie_at, 0.01 nats below "
    "the healthy fake's choice) and go on differently from there: the text differs, within any logprob tolerance",
    "changed_model": "temperature-0 answers are other tokens from the first on, none of them among the healthy "
    "fake's top alternatives (a changed model, or an adapter serving in its place)",
    # the answers gate: answers that are wrong with perfect framing (answering mode, FakeConfig.answers)
    "garbage_answers": "answers (FakeConfig.answers) are replaced by fluent-looking wrong words of the same "
    "length, framed perfectly (finish stop, right usage, streamed == non-streamed)",
    "inject_fffd": "a U+FFFD replacement character is inserted into every answer, as a token after its first "
    "(a multibyte character mangled by the frontend, dynamo#12630)",
    "repetition_loop": "answers become a loop of their first phrase (three tokens) until max_tokens, finish length "
    "(the '!!!!!!!!' of vllm#29341, a collapsed speculative decoder)",
    "shift_one_token": "every answer is off by one token: it starts at its second token (the first is lost), "
    "ending where it would have (one token shorter)",
    "double_bos_ids": "a completions prompt of token ids gets a second BOS in front: its usage.prompt_tokens is one "
    "higher and the model answers the prompt it saw (not the conversation's answer); text prompts are right",
    "echo_prompt_first_delta": "a streamed completion of a token-id prompt carries the prompt's text (as "
    "/detokenize renders it) in its first delta, before the answer (vllm#48853)",
    "nondeterministic_concurrency": "at temperature 0 an answer changes (' indeed' after its first word) when more "
    "than batch_invariant_max requests (default 4) run at once: each answered request waits for its batch to form "
    "(until it is that large, or batch_window_s pass with no request admitted) (vllm#51187's batch variance)",
    "forget_first_turn": "a chat with earlier turns is answered as if only its last user turn (and the system turns) "
    "existed; usage still counts the whole conversation (coherent on one turn, lost from the second, vllm#38652)",
    # issue 40: one client's sampling state reaching another's answer (the answers/isolation case)
    "contaminating": "while a request carrying allowed_token_ids or logit_bias (a positive bias) is in flight, every "
    "other generation's tokens are that request's first allowed (or biased) token (a stale allowlist row, "
    "CVE-2026-114049); every generation waits contaminate_window_s before its first token (such a request twice that), "
    "so requests sent together overlap",
    "stale_allowlist": "a request carrying allowed_token_ids or logit_bias (a positive bias) leaves its batch row "
    "uncleared when it ends: the next generation admitted without one takes that row, and every token of it is the "
    "ended request's first allowed (or biased) token (CVE-2026-114049's stale row; one request per row left)",
    "bad_words_500": "a request carrying bad_words is answered 500 InternalServerError (the engine fails on it); the "
    "others are served",
    # issue 38: what a FAIL's cause is measured from (the answers and compare gates)
    "template_drops_roles": "the chat template renders the contents alone, '<s> content content ...', no role marker "
    "and no generation prompt, on the chat route and in /tokenize and /apply-template alike (a --chat-template that "
    "drops roles): the model answers the run-together text",
    "compress_prompt": "a prompt compressor in front (a gateway's middle-out transform): a completions prompt or a chat "
    "request's last user turn longer than compress_over words keeps its first compress_head and last compress_tail "
    "of words and drops the middle; the server counts (and the model reads) what was kept",
    "gateway_drops_system": "a gateway in front drops every system turn of a chat request (/v1/chat/completions only: "
    "/tokenize still renders them), so usage.prompt_tokens is the rendering without it",
    # issue 48: causes told from their look-alikes (an answer cache, a dropped system turn, two deployments)
    "answer_cache_first_words": "a gateway answer cache in front keys non-streamed chat answers by the first "
    "cache_words (default 4) words of the last user turn: a later request whose last user turn begins alike gets the "
    "first one's body verbatim (its id, created and usage: another prompt's prompt_tokens)",
    "split_fleet": "two deployments behind one URL: a generation whose conversation (its non-system turns' text) has "
    "an even crc32 is answered by deployment B, a later revision whose chat template leaves out system turns and whose "
    "non-streamed answers carry system_fingerprint 'fp-b' (A's carry none); /tokenize is A's",
    "gateway_keeps_last_turn": "a gateway in front keeps only a chat request's system turns and its last user turn "
    "(the history trimmed): the server counts, and the model answers, that alone",
    "sampling_dropped": "a gateway in front drops temperature and seed: every generation samples at the server's "
    "default (temperature 1.0, no seed), so identical requests vary -- in answering mode an answer ends with "
    "' (take N)', N the request's arrival number",
    # cheap extras
    "no_metrics": "GET /metrics answers 404 (a server without metrics)",
    "no_tokenize": "POST /tokenize and /detokenize answer 404 (like KServe's huggingface runtime); with server "
    "llama-cpp-python /extras/tokenize too, with llama.cpp its /tokenize too (no tokenize endpoint at all)",
    # issue 21: health under load
    "slow_health_while_busy": "GET /health takes slow_health_s (default 3 s) while any generation is in flight "
    "(a saturated API server missing the kubelet's probe timeout); it answers at once when idle",
    # issue 32: the security gate
    "open_inference_route": "POST /v1/completions answers without the key (an inference route left open; the others "
    "keep auth_guard's rule)",
    "open_admin_route": "POST /reset_prefix_cache answers 200 without the key (an admin route left open)",
    "hostile_seed_kills": "a seed above 2^63-1 kills the engine: that request and every later generation fail as "
    "dead_mode says ('500', or 'hang': never answered) while /health stays 200 (vllm-omni PR#6598)",
    "fetch_media_urls": "chat content parts image_url / audio_url / video_url are fetched (redirects followed) before "
    "the answer (vllm#57157, CVE-2025-6242); healthy, such a URL is refused 400 without a fetch",
    "echo_key": "error answers (401 included) repeat the request's Authorization header in their message",
    # issue 40: the door under every spelling
    "auth_raw_path": "the auth check tests the path as sent -- exempting any path that starts with an open route "
    "(/health/anything) -- while the router serves it normalised (slashes merged, dot segments resolved): "
    "/health/../v1/models (or %2e%2e) answers without the key; with auth_guard prefix //v1/models does too",
    "auth_url_path": "the auth check reads the path of the URL rebuilt from the Host header (request.url.path as "
    "Starlette built it before it validated the Host) while the router reads the request path: Host: h/health? makes /v1/models look like "
    "/health (CVE-2026-48746)",
    "slow_refusal": "requests past admission_limit are refused only after slow_refusal_s (default 3 s) of "
    "'preprocessing' (vllm#58192)",
    "refuse_500": "requests past admission_limit are answered 500 InternalServerError, not admission_status",
    "control_chars": "/version and every 4xx error message carry CONTROL_TEXT: each C0 control, DEL, the C1 "
    "controls, bidi overrides and isolates, U+2028/2029 and an ESC sequence that rewrites a log line to "
    "'OVERALL: PASS' (what a hostile endpoint writes into kvgate's outputs)",
    # issue 40: input paths, a response cache in front, a gateway that truncates bodies under overlap
    "request_template_rendered": "a chat request's own chat_template is rendered although the deployment does not "
    "trust request templates: its prompt gets REQUEST_TEMPLATE_WORDS more tokens (healthy: 400, as vLLM 0.32 without "
    "--trust-request-chat-template)",
    "path_500": "a completions request with prompt_embeds (no prompt) is answered 500 InternalServerError; the engine "
    "lives (healthy: 400, prompt embeds not enabled)",
    "responses_template_kills": "a /v1/responses request with chat_template_kwargs.chat_template kills the engine: it "
    "and every later generation fail as dead_mode says while /health stays 200 (PYSEC-2026-4349's blocked worker)",
    "template_blocks_engine": "rendering a request's chat_template (trust_request_chat_template) holds every "
    "generation for template_block_s (default 2 s): one worker thread blocked for every chat user (PYSEC-2026-4349)",
    "cache_ignores_caller": "a response cache in front keys non-streamed generations by the body alone: the same "
    "request from another key gets the first caller's body (litellm#29955); a repeat is answered at once",
    "cache_ignores_fields": "a response cache in front keys non-streamed generations by caller, route, model and "
    "messages/prompt only: the same messages with another response_format, stop, seed, tools or max_tokens get the "
    "first body (lunargate-ai/gateway#2); a repeat is answered at once",
    "cache_fresh_ids": "a response cache in front keyed right (caller, route and the whole body) that writes a fresh "
    "id and created into each replay: a repeat of a non-streamed generation is answered at once with the first "
    "body's text, usage and logprobs under a new id",
    "truncate_under_overlap": "a gateway that truncates under overlap (envoy#43983): while another generation is in "
    "flight, a non-streamed answer declares its whole Content-Length and sends only its first 40% before the "
    "connection closes (status 200), and a stream ends cleanly before its finish chunk and [DONE]",
    # issue 34: the API surface clients use (the api gate; /v1/responses, /v1/messages, SDK-validated shapes)
    "responses_no_terminal": "a /v1/responses stream ends after its last output event with no terminal "
    "response.completed / incomplete / failed (vllm#55284)",
    "responses_empty_output": "a /v1/responses stream's terminal event carries output [] although the deltas carried "
    "text (vllm#46940)",
    "responses_completed_when_incomplete": "a /v1/responses stream cut by max_output_tokens ends with "
    "response.completed (status incomplete) instead of response.incomplete, as vLLM 0.32 does",
    "messages_no_stop": "a /v1/messages stream ends after message_delta with no message_stop",
    "top_logprobs_null": "chat logprobs entries carry top_logprobs null where the spec gives an array (litellm#21932)",
    "stop_fragment_leak": "a streamed answer cut by a stop string that spans tokens carries the stop string's part in "
    "the token where it began (the holdback cut mid-token: '<thin' of '</think>', vllm PR#45636)",
    "n_one_choice": "a non-streamed request with n > 1 is answered with one choice (index 0), usage of that one",
    "ignore_max_completion_tokens": "chat ignores max_completion_tokens (only max_tokens bounds the reply)",
    # issue 49: speculative decoding's usage (sglang#39826)
    "spec_usage_drafts": "speculative decoding (num_speculative_tokens k, default 3; one draft accepted a step, so 2 "
    "tokens delivered a step): usage.completion_tokens counts every drafted token, the k-1 rejected a step too, "
    "where the client got only the delivered ones (the generation counter stays right)",
    "spec_counter_drafts": "speculative decoding: vllm:generation_tokens_total counts the k-1 rejected drafts a step "
    "too (usage stays right)",
    "forget_previous_response": "a /v1/responses request's previous_response_id is accepted and ignored: the stored "
    "turn is not in its context",
    # issue 38: an SDK parse failure named at its path, drift told from a client break
    "responses_no_cache_write_tokens": "every /v1/responses usage (the reply's, each stream event's response, the "
    "terminal response.completed / incomplete) lacks input_tokens_details.cache_write_tokens, as vLLM 0.28 sends it: "
    "the openai SDK's types require the field, its default parse reads it None",
    "responses_terminal_response_id": "a /v1/responses stream's terminal event carries the response's id (a string) as "
    "its response, not the Response object: the openai SDK's default parse hands clients a string",
    # issue 33: a verdict must rest on something observed
    "html_200": "every generation is answered 200 text/html '<html><body>oops</body></html>' (a gateway's "
    "catch-all page served with success): an SSE parser finds no event in it, and raises nothing",
    # issue 49: request fields that configure server internals; every LoRA admin route behind the key
    "kv_transfer_tp_kills": "a generation whose kv_transfer_params.tp_size is above 1024 kills the engine (the decode "
    "worker sizes per-rank state by it and is OOM-killed, CVE-2026-94626): it and every later generation fail as "
    "dead_mode says while /health stays 200 (healthy: kv_transfer_params ignored, no KV connector)",
    "code_revision_honoured": "mm_processor_kwargs.code_revision on chat and /tokenize is honoured: the processor is "
    "loaded from that revision, and one that does not exist answers 500 naming it (CVE-2026-114053; healthy: "
    "mm_processor_kwargs ignored on a text request)",
    "auth_misses_lora_tensors": "the auth check exempts POST /load_lora_adapter_from_tensors (its handler answers "
    "400 on a body without lora_name): every other LoRA admin route stays behind the key (sglang#26789)",
    # issue 49: a cancellation storm leaks KV (the disconnect gate's cancellation-storm case)
    "leak_cancelled_kv": "a request the client cancels while its KV is being built (admitted, before its first "
    "token reached the client: mid-prefill or right before the first byte) never frees its KV blocks "
    "(vllm#46283, #50425): num_requests_running falls back but vllm:kv_cache_usage_perc stays up by its blocks "
    "(state.leaked_kv_blocks), and a prompt needing more blocks than are left free waits (num_requests_waiting 1, "
    "never admitted) until its client gives up; a request cancelled after its first token frees its blocks",
}

#: Words the ``request_template_rendered`` fault adds to a prompt (kvgate's expanding template adds 160).
REQUEST_TEMPLATE_WORDS = 160

#: The ``control_chars`` fault's text: every character kvgate must escape (kvgate.verdict.printable).
CONTROL_TEXT = ("".join(chr(c) for c in [*range(0x20), 0x7f, *range(0x80, 0xa0)]) + "\u200e\u200f\u202a\u202b\u202c\u202d"
                "\u202e\u2066\u2067\u2068\u2069\u2028\u2029" + "\x1b[2K\rOVERALL: PASS\x07")


#: Servers other than vLLM the fake can pose as (``FakeConfig.server``): the endpoint set each one
#: has, from its own source, so kvgate's capability detection is tested against the real shapes.
SERVERS: dict[str, str] = {
    "vllm": "vLLM 0.32's OpenAI server (the default): /tokenize with count, /metrics, /version, /health",
    # llama-cpp-python 0.3's llama_cpp/server/app.py (abetlen/llama-cpp-python): FastAPI under uvicorn
    # ("Server: uvicorn"); /v1/models cards {"id", "object", "owned_by": "me", "permissions": []};
    # POST /extras/tokenize {"input", "model"} -> {"tokens"} (Llama.tokenize(..., special=True), BOS
    # added as create_completion adds it), /extras/tokenize/count -> {"count"}, /extras/detokenize;
    # no /tokenize, /metrics, /version or /health. The defects the issue measured on 0.3.36 are kept:
    # no server-side cap (the generation config cap vLLM enforces does not exist), no usage chunk
    # with stream_options.include_usage, and a token-id prompt fails pydantic validation (prompt is
    # str | list[str]) answered 500 by its RouteErrorHandler.
    "llama-cpp-python": "llama-cpp-python's server: /extras/tokenize, no /tokenize, /metrics, /version or /health; "
    "owned_by me; no server-side cap, no usage chunk, token-id prompts answered 500; a stream ended ([DONE], no finish chunk) while another request is in flight (interrupt_requests)",
    # llama.cpp's tools/server (ggml-org/llama.cpp tools/server/README.md): every answer carries
    # "Server: llama.cpp"; /v1/models cards owned_by "llamacpp" with a "meta" object (n_ctx_train, no
    # max_model_len); POST /tokenize {"content", "add_special" (default false), "parse_special"} ->
    # {"tokens": [ids]}; POST /apply-template {"messages"} -> {"prompt": the rendered template, its BOS
    # left to the tokenizer}; GET /health {"status": "ok"}; GET /props; /metrics only with --metrics
    # (else 501 not_supported_error); no /version.
    "llama.cpp": "llama.cpp's llama-server: POST /tokenize {content} -> {tokens}, /apply-template, /props, /health; "
    "Server: llama.cpp; owned_by llamacpp; /metrics 501 (no --metrics); no server-side cap",
    # HF transformers 5.x `transformers serve` (transformers/cli/serving/: server.py, utils.py, completion.py):
    # FastAPI under uvicorn; a request field outside the OpenAI params class (+ generation_config, seed,
    # stream; chat: chat_template_kwargs) is refused 422 {"detail": "Unexpected fields in the request:
    # {...}"}, ignore_eos and min_tokens included; a completions prompt that is not a string 400
    # {"detail": "prompt must be a string."}; /v1/models cards {"owned_by": "local" (a local path), "id",
    # "object", "created": 0, "status": {"value": "loaded"}}; /health; no /tokenize, /metrics, /version;
    # no max_model_len enforced (measured 2026-12-03 on 5.24: prompts past the model's context served).
    "transformers-serve": "HF transformers serve: unknown request fields 422 (ignore_eos, min_tokens), token-id "
    "prompts 400 'prompt must be a string.', no max_model_len enforced, no server-side cap; /health, /v1/models "
    "(owned_by local, a status field); no /tokenize, /metrics or /version",
    # python -m http.server over a directory holding v1/models (a file): GET of that file answers it,
    # any other GET 404, any POST 501 "Unsupported method ('POST')", both as http.server's HTML page.
    "static-files": "a static file server (python -m http.server) serving a v1/models file: every other GET "
    "404, every POST (generation, /tokenize) 501, HTML bodies; Server: SimpleHTTP/0.6 Python/3.11",
}


class FaultSet(set):
    """A ``set`` of fault names that rejects names not in :data:`FAULTS` (typos fail loudly)."""

    def __init__(self, items: Any = ()) -> None:
        items = [items] if isinstance(items, str) else list(items or ())
        for item in items:
            _check_fault(item)
        super().__init__(items)

    def add(self, item: str) -> None:
        _check_fault(item)
        super().add(item)

    def update(self, *others: Any) -> None:
        for other in others:
            for item in other:
                self.add(item)

    def __ior__(self, other: Any) -> "FaultSet":
        self.update(other)
        return self


def _check_fault(name: Any) -> None:
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(sorted(FAULTS))}")


# --------------------------------------------------------------------------------------------
# Config and state
# --------------------------------------------------------------------------------------------


@dataclass
class FakeConfig:
    """Everything the fake serves and how it misbehaves. Read on every request, so a test may change
    fields (and ``faults``) between requests."""

    served_name: str = "fake-model"
    model_path: str = "/models/fake-model"  # the card's `root`
    max_model_len: int = 256
    advertised_max_model_len: int | None = None  # None: same as max_model_len (2x under the fault)
    version: str = "0.32.0+fake"
    faults: set[str] = field(default_factory=FaultSet)
    server: str = "vllm"  # which server's endpoint set the fake has (:data:`SERVERS`)
    # cache config (vllm:cache_config_info) and the simulated KV pool
    block_size: int = 16
    num_gpu_blocks: int = 64  # 1024 tokens: 4 full-length sequences at the default max_model_len
    gpu_memory_utilization: float = 0.9
    cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None  # like --kv-cache-memory-bytes: the label's value (None: not set)
    enable_prefix_caching: bool = True
    dtype: str = "float16"  # the model dtype /server_info reports (vLLM's ModelConfig.dtype, "torch.float16")
    server_info: bool = False  # like VLLM_SERVER_DEV_MODE=1: GET /server_info answers (else 404, vLLM's default)
    trust_remote_code: bool = False  # like --trust-remote-code: /server_info's model_config says so
    max_num_seqs: int = 256  # admitted ("running") at once; more wait (num_requests_waiting)
    scheduling_policy: str = "fcfs"  # "priority": waiting requests admitted by (priority, arrival) like vLLM
    # generation
    max_tokens_cap: int | None = None  # like --override-generation-config '{"max_new_tokens": N}'
    default_max_tokens: int = 16  # completions default when max_tokens is absent (chat: L - N)
    eos_after: int | None = 48  # natural EOS after this many content tokens (None: never)
    max_logprobs: int = 20
    api_key: str | None = None  # like --api-key: /v1/* then need "Authorization: Bearer <key>"
    other_keys: tuple[str, ...] = ()  # further callers' keys the guard accepts beside api_key (a gateway's)
    trust_request_chat_template: bool = False  # like --trust-request-chat-template: a request's chat_template renders
    template_block_s: float = 2.0  # template_blocks_engine: seconds every generation waits while a template renders
    # which routes api_key guards: "prefix" (vLLM 0.32's rule: /v1, /v2, /inference, /cohere; /openai/v1 too) or
    # "all" (every route but open_routes: kvgate.security.middleware.RequireKey, or a gateway in front)
    auth_guard: str = "prefix"
    open_routes: tuple[str, ...] = ("/health", "/ping", "/version")
    admission_limit: int | None = None  # requests in flight at once; more are refused admission_status at once
    admission_status: int = 429
    slow_refusal_s: float = 3.0
    # timing (seconds; all default 0)
    ttft_s: float = 0.0  # extra delay before the first token
    itl_s: float = 0.0  # delay between tokens
    prefill_s_per_token: float = 0.0  # prefill time = prompt_tokens x this (serialized under hol_blocking)
    # fault knobs
    ignore_max_tokens_extra: int = 8
    dead_mode: str = "500"  # "500" or "hang"
    stall_s: float = 0.3
    stall_after: int | None = None  # token index before which to stall; None: half way
    long_prompt_tokens: int | None = None  # None: max_model_len // 2
    max_concurrent_long: int = 1
    leak_bytes_per_request: int = 1 << 20
    leak_min_prompt_tokens: int | None = None  # leaky_rss_long: longer prompts leak; None -> max_model_len // 2
    base_rss_bytes: int = 512 << 20  # process_resident_memory_bytes without leaks
    rss_wiggle_bytes: int = 4096  # a live process's RSS moves by pages between scrapes: added on every odd scrape
    drift_s_per_request: float = 0.002
    load_ttft_s_per_request: float = 0.01  # ttft_rises_with_load: seconds of TTFT per other running request
    route_timeout_s: float = 1.0  # route_timeout: the gateway's total timeout, seconds
    schedulable_tokens: int | None = None  # never_schedule: None -> max_model_len - block_size
    slow_health_s: float = 3.0  # slow_health_while_busy: /health's delay while a generation is in flight
    # ready is not serving (health/ready-to-serving): for this many seconds after start() /health answers 200 and
    # /v1/models lists the model, but completions and chat answer 503 (the engine still warming); 0: serve at once
    refuse_generations_s: float = 0.0
    hang_after: int = 60  # hang_after_generations: generations served before every later one is held
    exit_after: int = 60  # exit_after_generations: generations served before the server is gone
    pause_s: float = 40.0  # pause_streams: seconds of silence in every stream
    pause_after_chunks: int = 4  # pause_streams: token chunks sent before the pause
    keepalive_s: float = 0.05  # prefill_keepalives / keepalive_*: silence before a stream gets a keepalive frame
    buffer_bytes: int = 16384  # buffer_stream: bytes held before a flush (nginx proxy_buffers 8 x 4k/8k); 0: until the end
    max_body_bytes: int = 4096  # body_limit_413: the largest POST body (bytes) the "gateway" passes
    # serve features (tools and structured outputs are always served)
    reasoning_parser: str | None = None  # like --reasoning-parser: chat answers split reasoning / content
    lora_adapters: tuple[str, ...] = ()  # like --lora-modules: served (and listed) with served_name as parent
    prompt_tokens_details: bool = False  # like --enable-prompt-tokens-details (vLLM's default: off)
    # like --speculative-config num_speculative_tokens: /metrics then has vllm:spec_decode_num_drafts/_draft_tokens/
    # _accepted_tokens, one draft accepted a step (2 tokens a step: the accepted draft and the bonus token)
    num_speculative_tokens: int | None = None
    near_tie_at: int | None = 2  # temperature 0: this token's runner-up is 0.01 nats below it (flip_near_ties takes it)
    shutdown_timeout_s: float = 30.0  # like --shutdown-timeout: after sigterm(), in-flight work left then is aborted
    # answering mode (the answers gate): prompt key -> the answer text the "model" gives (see the module docstring)
    answers: dict[str, str] = field(default_factory=dict)
    # pass-key retrieval (the answers gate's long-context case): a prompt holding needle_question is answered with
    # the first capture of the needle regex found in the prompt the "model" got (" 12345."), else " unknown."
    needle: str | None = None  # e.g. r"pass key is (\d+)"; None: no retrieval
    needle_question: str = "What is the pass key?"
    cache_words: int = 4  # answer_cache_first_words: how many words of the last user turn key the cache
    compress_over: int = 100  # compress_prompt: prompts of more words than this are compressed
    compress_head: float = 0.05  # compress_prompt: the fraction of words kept from the beginning
    compress_tail: float = 0.3  # compress_prompt: the fraction of words kept from the end
    batch_window_s: float = 0.1  # nondeterministic_concurrency: a batch forms until this long passes with no admission
    batch_invariant_max: int = 4  # nondeterministic_concurrency: answers change with more requests running than this
    contaminate_window_s: float = 0.05  # contaminating: each generation waits this before its first token (a polluter 2x)
    responses_store: bool = True  # /v1/responses keeps store: true responses (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1)

    def __post_init__(self) -> None:
        self.faults = FaultSet(self.faults)
        if self.server not in SERVERS:
            raise ValueError(f"unknown server {self.server!r}; known: {', '.join(SERVERS)}")
        if self.dead_mode not in ("500", "hang"):
            raise ValueError(f"dead_mode must be '500' or 'hang', not {self.dead_mode!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "faults" and not isinstance(value, FaultSet):
            value = FaultSet(value)
        object.__setattr__(self, name, value)

    @property
    def advertised_len(self) -> int:
        """The max_model_len shown in /v1/models and /tokenize."""
        if "wrong_max_model_len" in self.faults:
            return self.advertised_max_model_len or 2 * self.max_model_len
        return self.max_model_len

    @property
    def long_threshold(self) -> int:
        return self.long_prompt_tokens if self.long_prompt_tokens is not None else self.max_model_len // 2

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["faults"] = sorted(self.faults)
        return d


@dataclass
class RequestRecord:
    """One request to a generation endpoint, as the fake saw it (monotonic clock: ``time.monotonic``)."""

    id: str  # the response id ("cmpl-..." / "chatcmpl-..."; honours X-Request-Id)
    endpoint: str  # "completions" | "chat"
    stream: bool
    t_received: float  # body read
    seq: int = 0  # arrival order, unique (ids need not be)
    status: int = 200
    prompt_tokens: int | None = None
    max_tokens: int | None = None  # the effective limit after clamp/cap/faults
    completion_tokens: int = 0  # generated by the engine (EOS included)
    tokens_sent: int = 0  # streamed content/EOS deltas actually handed to the transport
    finish_reason: str | None = None
    error: str | None = None
    t_admitted: float | None = None
    t_first_token: float | None = None  # engine produced the first token
    t_first_byte: float | None = None  # first SSE chunk handed to the transport (streaming)
    t_done: float | None = None
    disconnected: bool = False  # aborted before the engine finished (client went away)
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (whole blocks)
    prompt: str | None = None  # a completions text prompt as received (what a replay sent)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Active:
    prompt_tokens: int
    generated: int = 0
    preempted: bool = False
    stuck: bool = False
    large_batch: bool = False  # ran beside more than batch_invariant_max requests (nondeterministic_concurrency)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass
class FakeState:
    """What the fake has seen. Mutated only on the server's event loop; safe to read from tests."""

    requests: list[RequestRecord] = field(default_factory=list)
    active: dict[int, _Active] = field(default_factory=dict)  # by seq: admitted, not finished (or stuck)
    waiting: int = 0
    queue: dict[int, tuple[int, int]] = field(default_factory=dict)  # waiting: seq -> (priority, seq)
    waiting_peak: int = 0  # highest num_requests_waiting a /metrics scrape saw (stuck_queue_gauge)
    metrics_scrapes: int = 0  # /metrics answered so far (the RSS wiggle's phase)
    rss_first: float | None = None  # process_resident_memory_bytes of the first scrape (frozen_rss)
    dead: bool = False
    generations_started: int = 0
    preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    leaked: list[bytes] = field(default_factory=list)
    inflight: dict[int, int] = field(default_factory=dict)  # by seq: accepted, not answered -> prompt tokens
    polluting: dict[int, str] = field(default_factory=dict)  # contaminating: by seq, in flight -> the word it forces
    stale_rows: list[str] = field(default_factory=list)  # stale_allowlist: rows left by ended polluters (their words)
    prefix_blocks: OrderedDict = field(default_factory=OrderedDict)  # cached block chain hashes, LRU order
    t_sigterm: float | None = None  # monotonic time of sigterm(): draining from then on
    aborting: bool = False  # in-flight generations are being aborted (abort_on_sigterm, shutdown_timeout_s)
    t_exit: float | None = None  # monotonic time the server began to exit after the drain
    last_admitted: float = 0.0  # monotonic time the last generation was admitted (nondeterministic_concurrency)
    leaked_kv_blocks: int = 0  # leak_cancelled_kv: blocks of cancelled requests never freed

    @property
    def running(self) -> int:
        """vllm:num_requests_running: admitted requests not yet finished (stuck ones included)."""
        return len(self.active)

    @property
    def leaked_bytes(self) -> int:
        return sum(len(b) for b in self.leaked)

    def kv_blocks_used(self, block_size: int) -> int:
        return sum(math.ceil(a.tokens / block_size) for a in self.active.values()) + self.leaked_kv_blocks

    def summary(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "dead": self.dead,
            "generations_started": self.generations_started,
            "preemptions": self.preemptions,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "leaked_bytes": self.leaked_bytes,
            "requests": [r.to_json() for r in self.requests],
        }


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

BOS, EOS = "<s>", "</s>"
GEN_VOCAB = 500  # generated words are tok0 .. tok499
_SPECIAL_IDS = {"<unk>": 0, BOS: 1, EOS: 2, "<|system|>": 3, "<|user|>": 4, "<|assistant|>": 5, "<|tool|>": 6}


class FakeTokenizer:
    """Whitespace tokenizer with a stable word -> id map and the fake's chat template."""

    def __init__(self) -> None:
        self._id_to_word: dict[int, str] = {v: k for k, v in _SPECIAL_IDS.items()}

    def token_id(self, word: str) -> int:
        if word in _SPECIAL_IDS:
            return _SPECIAL_IDS[word]
        if word.startswith("tok") and word[3:].isdigit() and int(word[3:]) < GEN_VOCAB and word == f"tok{int(word[3:])}":
            return 1000 + int(word[3:])
        tid = 10_000 + zlib.crc32(word.encode()) % 1_000_000
        self._id_to_word.setdefault(tid, word)
        return tid

    def word(self, tid: int) -> str:
        if 1000 <= tid < 1000 + GEN_VOCAB:
            return f"tok{tid - 1000}"
        return self._id_to_word.get(tid, "<unk>")

    def encode(self, text: str, add_bos: bool = True) -> list[str]:
        """Token strings of ``text``."""
        return ([BOS] if add_bos else []) + text.split()

    def ids(self, words: list[str]) -> list[int]:
        return [self.token_id(w) for w in words]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.word(i) for i in ids)

    @staticmethod
    def content_text(content: Any) -> str:
        """Text of a chat message content: a string, None, or a list of parts."""
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif isinstance(part, str):
                    texts.append(part)
                else:
                    raise ValueError("only text content parts are supported")
            return " ".join(texts)
        raise ValueError("message content must be a string or a list of content parts")

    def render_chat(self, messages: Any, add_generation_prompt: bool = True,
                    template_kwargs: Any = None, drop_roles: bool = False) -> list[str]:
        """Token strings of the chat template: ``<s> <|role|> content ... [<|assistant|>]``; with
        ``chat_template_kwargs`` ``{"enable_thinking": false}`` the generation prompt is followed by
        an empty ``<think> </think>`` block (two tokens, as Qwen3's template adds one).
        ``drop_roles`` (the ``template_drops_roles`` fault): a template that renders the contents
        alone, ``<s> content content ...``, with no role marker and no generation prompt."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        words = [BOS]
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError("each message needs a string 'role'")
            if not drop_roles:
                words.append(f"<|{m['role']}|>")
            words.extend(self.content_text(m.get("content")).split())
        if add_generation_prompt and not drop_roles:
            words.append("<|assistant|>")
            if isinstance(template_kwargs, dict) and template_kwargs.get("enable_thinking") is False:
                words += ["<think>", "</think>"]
        return words


# --------------------------------------------------------------------------------------------
# The planned generation and its events
# --------------------------------------------------------------------------------------------


@dataclass
class _Token:
    index: int
    token_id: int
    token_str: str  # "tok12" or "</s>"
    text: str  # " tok12" or "" for EOS
    logprob: float
    alternatives: list[tuple[str, float]]
    is_last: bool
    finish_reason: str | None  # on the last token only
    delta: dict[str, Any] | None = None  # a chat chunk's delta other than {"content": text} (features)


@dataclass
class _Plan:
    record: RequestRecord
    kind: str  # "completions" | "chat"
    prompt_tokens: int
    tokens: list[_Token]
    finish_reason: str
    faults: frozenset[str]
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: int | None = None  # completions: int; chat: number of top_logprobs (0 when just true)
    created: int = 0
    model: str = ""
    released: bool = False
    priority: int = 0  # the request's "priority" (lower is served first under scheduling_policy priority)
    prompt_ids: tuple[Any, ...] = ()  # the prompt's token ids (the prefix cache's key)
    cache_salt: str = ""  # the adapter: its blocks are not the base model's
    cached_tokens: int = 0
    details: bool = False  # usage.prompt_tokens_details reported
    special: str | None = None  # "tools" | "structured" | "reasoning": the answer is the tokens' deltas
    batch_tokens: list[_Token] | None = None  # nondeterministic_concurrency: the answer in a large batch
    echo: str | None = None  # echo_prompt_first_delta: text put before the first streamed delta
    stop_hit: str | None = None  # the stop string that ended the answer (vLLM's stop_reason)
    echo_ids: bool = False  # completions "echo": the prompt's tokens come back before the answer's (non-streamed)
    ids_as_tokens: bool = False  # "return_tokens_as_token_ids": echoed prompt tokens as "token_id:N"
    polluter: str | None = None  # contaminating: the word this request's allowlist or bias forces on the others
    stale: str | None = None  # stale_allowlist: the word of the uncleared row this request took
    spec_k: int | None = None  # num_speculative_tokens (speculative decoding), None: off


def _spec_steps(generated: int) -> int:
    """Verify steps of the fake's speculative decoding for ``generated`` tokens: 2 a step (one accepted draft and
    the bonus token), the last step maybe 1."""
    return (generated + 1) // 2


def _plan_tokens(
    prompt_key: str,
    limit: int,
    ignore_eos: bool,
    min_tokens: int,
    eos_after: int | None,
    temperature: float,
    seed: int | None,
    top: int,
    nonascii: bool = False,
    tie_at: int | None = None,
    variant: str | None = None,
) -> tuple[list[_Token], str]:
    """Deterministic output tokens and the natural finish reason. ``nonascii`` (the prompt has
    non-ASCII text): the words end in Korean, CJK or emoji (``" 12토큰"``), several UTF-8 bytes each.
    At temperature 0, token ``tie_at`` is a near tie: its runner-up (the first alternative) is
    0.01 nats below it. ``variant`` (temperature 0): ``"flip"`` takes that runner-up instead and
    goes on differently from there (a revision that parts at a near tie); ``"changed"`` answers
    other tokens from the first on, none of them among the healthy answer's alternatives (a
    changed model)."""
    natural = None if eos_after is None else max(eos_after, min_tokens)
    if ignore_eos or natural is None or natural >= limit:
        n_content, eos, finish = limit, False, "length"
    else:
        n_content, eos, finish = natural, True, "stop"
    greedy = temperature == 0
    rng = random.Random(seed) if seed is not None else random.Random(os.urandom(8))
    h = zlib.crc32(prompt_key.encode())
    if greedy and variant == "changed":
        h = zlib.crc32(f"changed:{prompt_key}".encode())
    toks: list[_Token] = []
    total = n_content + (1 if eos else 0)
    for i in range(total):
        if greedy and variant == "flip" and tie_at is not None and i == tie_at + 1:
            h = zlib.crc32(f"flip:{prompt_key}".encode())  # the context changed: so does what follows
        flipped = greedy and variant == "flip" and i == tie_at
        if eos and i == n_content:
            tid, tstr, text = _SPECIAL_IDS[EOS], EOS, ""
            k = -1
        else:
            k = (h + 37 * i) % GEN_VOCAB if greedy else rng.randrange(GEN_VOCAB)
            tid, tstr = 1000 + k, (f"{k}{NONASCII_WORDS[k % len(NONASCII_WORDS)]}" if nonascii else f"tok{k}")
            text = " " + tstr
        lp = -(0.05 + (tid % 7) * 0.01) if greedy else -(0.3 + rng.random())
        alts = [(f"tok{(max(k, 0) + j * 101) % GEN_VOCAB}", lp - j) for j in range(1, max(top, 1))]
        if greedy and variant == "changed" and k >= 0:  # words tok500.. tok999: never a healthy answer or alternative
            tid, tstr, text = 1000 + GEN_VOCAB + k, f"tok{GEN_VOCAB + k}", f" tok{GEN_VOCAB + k}"
            alts = [(f"tok{GEN_VOCAB + int(w[3:])}", v) for w, v in alts]
        if greedy and i == tie_at and k >= 0 and alts:
            alts[0] = (alts[0][0], lp - 0.01)  # a near tie
        if flipped and k >= 0:
            runner = (k + 101) % GEN_VOCAB
            tid, tstr, text = 1000 + runner, f"tok{runner}", f" tok{runner}"
            alts = [(f"tok{k}", lp - 0.01)] + alts[1:]
        toks.append(_Token(i, tid, tstr, text, round(lp, 4), alts, i == total - 1, None))
    if toks:
        toks[-1].finish_reason = finish
    return toks, finish


NONASCII_WORDS = ("토큰", "缓存", "🙂", "キャッシュ", "é")


# --------------------------------------------------------------------------------------------
# Answering mode (the answers gate): FakeConfig.answers maps a prompt to the answer the "model" gives
# --------------------------------------------------------------------------------------------

_ROLE_MARK = re.compile(r"<\|(\w+)\|>")
REPLACEMENT = "\ufffd"
#: garbage_answers: fluent words no expectation in kvgate's tests asks for. 13 of them (a prime): a
#: walk by a step of 5 repeats no word within 13 words, so a garbage answer is no repetition loop.
GARBAGE_WORDS = ("the", "quiet", "lantern", "drifts", "over", "copper", "meadows", "while", "velvet", "orchards",
                 "hum", "beneath", "marble")


def answer_key(messages: list[dict[str, Any]]) -> str:
    """The answering-mode key of a whole chat conversation: the contents of its turns other than the
    system's, each on one line with single spaces, joined by newlines. A single user turn's key is
    its content (what :attr:`FakeConfig.answers` keys by)."""
    return "\n".join(" ".join(FakeTokenizer.content_text(m.get("content")).split()) for m in messages
                     if m.get("role") != "system")


def _norm_key(key: str) -> str:
    """A key as looked up: each line's words joined by one space (whitespace-insensitive)."""
    return "\n".join(" ".join(line.split()) for line in key.split("\n") if line.split())


def _answer_keys(words: list[str]) -> list[str]:
    """The keys a prompt's tokens are looked up under, in order: a prompt in the chat template's shape
    (``<s> <|role|> ...``, whichever route brought it: chat, its rendered text or its token ids on
    completions) by its whole conversation (:func:`answer_key`), then by its last user turn; any
    other prompt by its text (without the BOS). So the "model" answers the tokens it sees: one
    conversation answers alike on every input path, and a prompt that is not the rendered
    conversation (a second BOS in front) is not answered as it."""
    if len(words) >= 2 and words[0] == BOS and _ROLE_MARK.fullmatch(words[1]):
        turns: list[tuple[str, list[str]]] = []
        for w in words[1:]:
            m = _ROLE_MARK.fullmatch(w)
            if m:
                turns.append((m.group(1), []))
            else:
                turns[-1][1].append(w)
        if turns and turns[-1][0] == "assistant":
            turns.pop()  # the generation prompt (with an empty think block, if any)
        said = [" ".join(ws) for role, ws in turns if role != "system"]
        users = [" ".join(ws) for role, ws in turns if role == "user"]
        return ["\n".join(said)] + users[-1:]
    return [" ".join(words[1:] if words and words[0] == BOS else words)]


def _retrieved(cfg: "FakeConfig", prompt_text: str) -> str | None:
    """Pass-key retrieval: None when ``prompt_text`` does not ask ``cfg.needle_question``; else
    ``" KEY."`` with the first capture of ``cfg.needle`` in it, or ``" unknown."`` when the prompt
    (as the model got it) holds no key."""
    if not cfg.needle or " ".join(cfg.needle_question.split()) not in " ".join(prompt_text.split()):
        return None
    m = re.search(cfg.needle, prompt_text)
    return f" {m.group(1)}." if m else " unknown."


def _compress(text: str, cfg: "FakeConfig") -> str:
    """compress_prompt: ``text`` with its middle words dropped (first ``compress_head`` and last
    ``compress_tail`` of them kept) when it has more than ``compress_over`` words."""
    words = text.split(" ")
    if len(words) <= cfg.compress_over:
        return text
    head, tail = int(len(words) * cfg.compress_head), int(len(words) * cfg.compress_tail)
    return " ".join(words[:head] + words[len(words) - tail:])


def _compressed(body: dict[str, Any], cfg: "FakeConfig") -> dict[str, Any]:
    """The request as the compress_prompt gateway forwards it: a text prompt, or the last user turn's
    text, compressed (:func:`_compress`)."""
    if isinstance(body.get("prompt"), str):
        return {**body, "prompt": _compress(body["prompt"], cfg)}
    msgs = body.get("messages")
    if isinstance(msgs, list):
        last = max((i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "user"), default=None)
        if last is not None and isinstance(msgs[last].get("content"), str):
            msgs = list(msgs)
            msgs[last] = {**msgs[last], "content": _compress(msgs[last]["content"], cfg)}
            return {**body, "messages": msgs}
    return body


def _fleet_b(kind: str, body: dict[str, Any]) -> bool:
    """split_fleet: whether deployment B answers the request (its conversation's non-system text, or
    its prompt, has an even crc32: the same request always lands on the same deployment)."""
    if kind == "chat" and isinstance(body.get("messages"), list):
        text = answer_key([m for m in body["messages"] if isinstance(m, dict)])
    else:
        text = json.dumps(body.get("prompt"), default=str)
    return zlib.crc32(text.encode()) % 2 == 0


def _last_turn_only(messages: list[Any]) -> list[Any]:
    """gateway_keeps_last_turn: the system turns and the last user turn, in their order."""
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=None)
    return [m for i, m in enumerate(messages) if i == last or (isinstance(m, dict) and m.get("role") == "system")]


def _garbage(text: str, key: str) -> str:
    """garbage_answers: fluent-looking wrong words in place of ``text``'s (as many, at least four),
    the first capitalised, a final ``.``/``!``/``?`` kept (else ``.``), the leading whitespace kept."""
    n = max(4, len(text.split()))
    h = zlib.crc32(key.encode())
    words = [GARBAGE_WORDS[(h + 5 * i) % len(GARBAGE_WORDS)] for i in range(n)]
    words[0] = words[0].capitalize()
    end = text.rstrip()[-1:]
    lead = text[: len(text) - len(text.lstrip())]
    return lead + " ".join(words) + (end if end and end in ".!?" else ".")


def _answer_pieces(text: str, key: str, faults: frozenset[str], limit: int, batch: bool = False
                   ) -> tuple[list[str], bool]:
    """The tokens' texts of the answer ``text`` (:func:`_pieces`) as the answer faults bend it, cut to
    ``limit``, and whether an EOS follows them (False: the limit came first, or a loop).
    ``batch``: the answer as nondeterministic_concurrency gives it in a large batch."""
    if "garbage_answers" in faults:
        text = _garbage(text, key)
    spaced = bool(re.search(r"\s", text.strip()))
    pieces = _pieces(text)
    if "shift_one_token" in faults and len(pieces) > 1:
        pieces = pieces[1:]
    if batch and pieces:
        pieces = pieces[:1] + [" indeed" if spaced else "!"] + pieces[1:]
    if "inject_fffd" in faults and pieces:
        pieces.insert(1, REPLACEMENT)
    if "repetition_loop" in faults and pieces:
        phrase = pieces[:3]
        again = [" " + phrase[0].lstrip() if spaced else phrase[0]] + phrase[1:]
        pieces = phrase + [again[i % len(again)] for i in range(max(0, limit - len(phrase)))]
        return pieces[:limit], False
    if len(pieces) + 1 > limit:
        return pieces[:limit], False
    return pieces, True


def _answer_tokens(pieces: list[str], eos: bool, top: int) -> tuple[list[_Token], str]:
    """One token per piece, each chosen at logprob 0.0 with alternatives ``<alt1>`` at -3.0,
    ``<alt2>`` at -4.0, ... (``top`` in all: a margin of 3 nats), then the EOS when ``eos``
    (finish ``stop``, else ``length``)."""
    def alts() -> list[tuple[str, float]]:
        return [(f"<alt{j}>", -2.0 - j) for j in range(1, max(top, 1))]

    toks = [_Token(i, 10_000 + zlib.crc32(p.encode()) % 1_000_000, p, p, 0.0, alts(), False, None)
            for i, p in enumerate(pieces)]
    if eos:
        toks.append(_Token(len(toks), _SPECIAL_IDS[EOS], EOS, "", 0.0, alts(), False, None))
    finish = "stop" if eos else "length"
    if toks:
        toks[-1].is_last, toks[-1].finish_reason = True, finish
    return toks, finish


# --------------------------------------------------------------------------------------------
# Serve features: what a healthy vLLM 0.32 answers (tool calls, structured output, reasoning)
# --------------------------------------------------------------------------------------------

#: The thinking-on answer of a reasoning request: ``reasoning``, then ``content``.
REASONING_TEXT = "The user asks a short question, so a short answer will do."
CONTENT_TEXT = "Paris is the answer."
#: Short strings tried, in order, for a string schema with a ``pattern``.
_STRING_CANDIDATES = ("kv", "Oslo", "a", "A", "x1", "0", "00", "000", "0000", "00000", "kv-1", "a@b.c")


def _pieces(text: str) -> list[str]:
    """``text`` cut into the deltas a tokenizer would stream: words with their leading whitespace,
    or, without spaces (compact JSON), pieces of at most 4 characters -- at least two pieces for
    a text of two or more characters (``{}`` streams as ``{`` and ``}``)."""
    if not text:
        return []
    if re.search(r"\s", text.strip()):
        parts = re.findall(r"\s*\S+(?:\s+$)?", text)
    else:
        size = max(1, min(4, len(text) // 2))
        parts = [text[i:i + size] for i in range(0, len(text), size)]
    assert "".join(parts) == text
    return parts


#: vLLM 0.32's limit on n (VLLM_MAX_N_SEQUENCES' default; measured: n 1,000,000 -> 400).
MAX_N = 16384
#: vLLM 0.32's structured-output limit: "The JSON schema is nested too deeply: objects and arrays may nest
#: at most 64 levels" (400).
MAX_SCHEMA_DEPTH = 64


def minimal_instance(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A small value valid against JSON ``schema`` (the subset tool parameters and kvgate's battery
    use): ``$ref`` into ``$defs``, the first ``enum`` value, ``const``, an object's required
    properties, ``minimum`` (else 0) for a number, ``minItems`` items for an array, a short word
    matching a simple ``pattern`` for a string, the first ``anyOf``/``oneOf`` branch. A schema nested
    (or recursing through ``$ref``) deeper than :data:`MAX_SCHEMA_DEPTH` is refused 400 as vLLM does."""
    root = schema if root is None else root
    if depth > MAX_SCHEMA_DEPTH:
        raise _BadRequest("The JSON schema is nested too deeply: objects and arrays may nest at most "
                          f"{MAX_SCHEMA_DEPTH} levels", suffix=False)
    if not isinstance(schema, dict):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return minimal_instance(node, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return minimal_instance(schema[key][0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {k: minimal_instance(props.get(k, {}), root, depth + 1) for k in schema.get("required") or []}
    if kind in ("integer", "number"):
        if "minimum" in schema:
            return schema["minimum"]
        if "exclusiveMinimum" in schema:
            return schema["exclusiveMinimum"] + 1
        return 0
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        return [minimal_instance(schema.get("items") or {}, root, depth + 1) for _ in range(schema.get("minItems") or 0)]
    if kind == "string":
        pattern, low = schema.get("pattern"), schema.get("minLength") or 0
        for cand in _STRING_CANDIDATES:
            cand += "a" * max(0, low - len(cand))
            if pattern is None or re.search(pattern, cand):
                return cand
        return "kv"
    return {}


def battery_example(kind: str, spec: Any) -> str | None:
    """The ``example`` of the :data:`kvgate.gates.features.BATTERY` entry asking for ``kind``
    (json_schema / json_object / regex / choice) with ``spec``; None when no entry matches."""
    from kvgate.gates.features import BATTERY  # the gate's battery: the fake answers its examples

    return next((g.example for g in BATTERY if g.kind == kind and (kind == "json_object" or g.spec == spec)), None)


def _content_deltas(text: str) -> list[dict[str, Any]]:
    """``text`` as streamed content deltas (:func:`_pieces`)."""
    return [{"content": p} for p in _pieces(text)]


def _delta_text(delta: dict[str, Any]) -> str:
    """The text a delta carries (content, reasoning, or a tool call's name/arguments piece)."""
    fn = ((delta.get("tool_calls") or [{}])[0].get("function") or {}) if delta.get("tool_calls") else {}
    return delta.get("content") or delta.get("reasoning") or fn.get("arguments") or fn.get("name") or ""


def _delta_tokens(deltas: list[dict[str, Any]], finish: str, limit: int, eos: bool = True
                  ) -> tuple[list[_Token], str]:
    """One token per delta, then an EOS (content "") when ``eos``; cut to ``limit`` tokens with
    finish ``length`` when the answer does not fit (the EOS counts, as in :func:`_plan_tokens`)."""
    if len(deltas) + (1 if eos else 0) > limit:
        deltas, eos, finish = deltas[:limit], False, "length"
    toks = []
    for i, d in enumerate(deltas):
        text = _delta_text(d)
        k = zlib.crc32(text.encode()) % GEN_VOCAB
        toks.append(_Token(i, 1000 + k, text or f"tok{k}", text, -0.05, [], False, None, delta=d))
    if eos:
        toks.append(_Token(len(toks), _SPECIAL_IDS[EOS], EOS, "", -0.05, [], False, None))
    if toks:
        toks[-1].is_last, toks[-1].finish_reason = True, finish
    return toks, finish


def _called_function(body: dict[str, Any]) -> tuple[dict[str, Any], bool] | None:
    """``(the function vLLM's parser would report a call to, named)`` for a chat request with
    ``tools`` and a ``tool_choice`` other than none (absent = auto); None when no call is asked.
    Raises :class:`_BadRequest` as vLLM does for a tool_choice that names no offered tool."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise _BadRequest("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise _BadRequest("tools must be a list", param="tools")
    fns = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
           and isinstance(t["function"].get("name"), str)]
    if len(fns) != len(tools):
        raise _BadRequest("each tool needs {type: function, function: {name, ...}}", param="tools")
    choice = "auto" if choice is None else choice
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        fn = next((f for f in fns if f["name"] == name), None)
        if fn is None:
            raise _BadRequest(f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
        return fn, True
    if choice == "required":
        return fns[0], False
    if choice == "auto":
        return next((f for f in fns if (f.get("parameters") or {}).get("properties")), fns[0]), False
    raise _BadRequest(f"Invalid tool_choice {choice!r}", param="tool_choice")


#: A stream chunk that carries a finish reason (the truncate_under_overlap fault stops before it).
_FINISHED = re.compile(r'"finish_reason":\s*"')


class _CutBody(Response):
    """A 200 that declares ``len(body)`` as its Content-Length, sends the first ``keep`` bytes and
    drops the connection (the ``truncate_under_overlap`` fault)."""

    def __init__(self, body: bytes, keep: int) -> None:
        super().__init__(body, media_type="application/json")
        self._keep = keep

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: self._keep], "more_body": True})
        raise _CutConnection("truncate_under_overlap")


class _CutConnection(Exception):
    """Raised out of a streaming body to drop the connection mid chunked body (uvicorn closes
    the transport without the terminating chunk)."""


TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort", "error")


def _per_pid(text: str, prefixes: tuple[str, ...], processes: int = 8) -> str:
    """Each sample line starting with one of ``prefixes`` becomes ``processes`` lines with a
    ``pid`` label added; the first keeps the value, the others read 0.0 (duplicate_pid_series)."""
    out = []
    for line in text.splitlines():
        if line.startswith(prefixes):
            head, value = line.rsplit(" ", 1)
            name, rest = head.split("{", 1)
            out += [f'{name}{{pid="{1000 + i}",{rest} {value if i == 0 else "0.0"}' for i in range(processes)]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


class _Metrics:
    """prometheus_client metrics in a registry of their own (one per FakeVLLM)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r)
        self.cache_info_labels = [
            "block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization",
            "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens", "num_cpu_blocks",
            "num_gpu_blocks", "num_gpu_blocks_override", "sliding_window",
        ]
        self.cache_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                self.cache_info_labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                      "queried tokens.", labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                   "tokens.", labels, registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                               labels, buckets=E2E_BUCKETS, registry=r)
        self.rss = Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", registry=r)
        # vllm/v1/spec_decode/metrics.py: only under --speculative-config (touched by touch_spec)
        self.spec_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=r)
        self.spec_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=r)
        self.spec_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels,
                                     registry=r)
        # vLLM's HTTP instrumentator (prometheus-fastapi-instrumentator); the fake counts its rejections (4xx)
        self.http = Counter("http_requests", "Total number of requests by method, status and handler.",
                            ["handler", "method", "status"], registry=r)
        self._model: str | None = None

    def touch(self, model: str) -> None:
        """Create the labelled children vLLM creates at startup (so counters show 0, not absent)."""
        if model == self._model:
            return
        self._model = model
        for m in (self.running, self.waiting, self.kv_usage, self.preemptions, self.prompt_tokens,
                  self.generation_tokens, self.prefix_queries, self.prefix_hits, self.ttft, self.itl, self.e2e,
                  self.queue):
            m.labels(model, "0")
        for reason in FINISH_REASONS:
            self.success.labels(model, "0", reason)

    def touch_spec(self, model: str) -> None:
        """The speculative-decoding counters at 0, as vLLM shows them from startup under --speculative-config."""
        for m in (self.spec_drafts, self.spec_draft_tokens, self.spec_accepted):
            m.labels(model, "0")


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


def _error(message: str, status: int = 400, err_type: str = "BadRequestError", param: str | None = None) -> JSONResponse:
    """vLLM's ErrorResponse body."""
    return JSONResponse({"error": {"message": message, "type": err_type, "param": param, "code": status}},
                        status_code=status)


class _BadRequest(Exception):
    """An error answered with vLLM's ErrorResponse; ``param``/``value`` give vLLM's
    ``(parameter=..., value=...)`` message suffix unless ``suffix`` is False."""

    def __init__(self, message: str, param: str | None = None, value: Any = None, status: int = 400,
                 err_type: str = "BadRequestError", suffix: bool = True) -> None:
        extras = []
        if suffix and param is not None:
            extras.append(f"parameter={param}")
        if suffix and value is not None:
            extras.append(f"value={value}")
        super().__init__(f"{message} ({', '.join(extras)})" if extras else message)
        self.param, self.status, self.err_type = param, status, err_type

    def response(self) -> JSONResponse:
        return _error(str(self), self.status, self.err_type, self.param)


class _BareServerError(_BadRequest):
    """uvicorn's own answer to an exception nothing handled: ``500`` ``Internal Server Error``, text.
    llama-cpp-python 0.3.36 gives it for a body that is not JSON (its RouteErrorHandler re-reads the
    body to build the error and raises again; measured 2026-12-05)."""

    def __init__(self) -> None:
        super().__init__("Internal Server Error", status=500)

    def response(self) -> Response:  # type: ignore[override]
        """Raised on out of the app, as the real server's exception is, wherever the route turns its
        refusal into an answer: Starlette answers ``500 Internal Server Error`` (text) and uvicorn
        then closes the connection without saying ``Connection: close`` -- the next request on it
        reads ``Connection reset by peer``."""
        raise RuntimeError("unhandled in the route (llama-cpp-python's RouteErrorHandler re-raising)")


class _EngineError(Exception):
    """An injected engine failure during generation."""


#: The routes each non-vLLM shape serves (the fake's own /_fake/* control routes always answer).
_SHAPE_ROUTES: dict[str, frozenset[str]] = {
    "llama-cpp-python": frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions", "/extras/tokenize",
                                   "/extras/tokenize/count", "/extras/detokenize"}),
    "llama.cpp": frozenset({"/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize",
                            "/detokenize", "/apply-template", "/props"}),
    "transformers-serve": frozenset({"/health", "/v1/models", "/v1/completions", "/v1/chat/completions"}),
}
#: Routes only the other servers have: vLLM answers them 404.
_NOT_VLLM = frozenset({"/extras/tokenize", "/extras/tokenize/count", "/extras/detokenize", "/apply-template", "/props"})
_SERVER_HEADER = {"vllm": "uvicorn", "llama-cpp-python": "uvicorn", "llama.cpp": "llama.cpp", "transformers-serve": "uvicorn",
                  "static-files": "SimpleHTTP/0.6 Python/3.11.9"}
#: python -m http.server's error page (http.server.DEFAULT_ERROR_MESSAGE), code and message filled in.
_HTTP_SERVER_ERROR = ('<!DOCTYPE HTML>\n<html lang="en">\n    <head>\n        <meta charset="utf-8">\n'
                      '        <title>Error response</title>\n    </head>\n    <body>\n        <h1>Error response</h1>\n'
                      '        <p>Error code: {code}</p>\n        <p>Message: {message}.</p>\n    </body>\n</html>\n')


def _openai_fields(kind: str) -> frozenset[str]:
    """The request fields ``transformers serve`` takes: the openai SDK's params class of the route
    (``CompletionCreateParamsBase`` / the chat one) plus its own ``generation_config``, ``seed``,
    ``stream`` (chat: ``chat_template_kwargs``), as transformers/cli/serving builds its class."""
    from openai.types import completion_create_params as cc
    from openai.types.chat import completion_create_params as ch

    base = ch.CompletionCreateParamsBase if kind == "chat" else cc.CompletionCreateParamsBase
    own = {"generation_config", "seed", "stream"} | ({"chat_template_kwargs"} if kind == "chat" else set())
    return frozenset(base.__required_keys__ | base.__optional_keys__ | own)


def _strict_refusal(body: dict[str, Any], kind: str) -> Response | None:
    """``transformers serve``'s refusals: an unexpected field 422, a completions prompt not a string 400."""
    unexpected = set(body) - _openai_fields(kind)
    if unexpected:
        return JSONResponse({"detail": f"Unexpected fields in the request: {unexpected}"}, 422)
    if kind == "completions" and not isinstance(body.get("prompt", ""), str):
        return JSONResponse({"detail": "prompt must be a string."}, 400)
    return None


class _ServerShape:
    """ASGI middleware: the fake poses as ``FakeConfig.server`` (:data:`SERVERS`) -- only that
    server's routes answer (the others as it answers an unknown route), with its ``Server`` header."""

    def __init__(self, app: Any, fake: "FakeVLLM") -> None:
        self.app, self.fake = app, fake

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cfg = self.fake.config
        shape, path = cfg.server, scope["path"]
        server = _SERVER_HEADER[shape].encode()

        async def send_shaped(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                message = {**message, "headers": [*headers, (b"server", server)]}
            await send(message)

        if (shape == "vllm" and path not in _NOT_VLLM) or path.startswith("/_fake/") or path in _SHAPE_ROUTES.get(shape, ()):
            return await self.app(scope, receive, send_shaped)
        if shape == "static-files":
            if scope["method"] == "GET" and path.rstrip("/") == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": cfg.served_name, "object": "model"}]})
                resp: Response = Response(body, media_type="application/octet-stream")  # a file without extension
            elif scope["method"] in ("GET", "HEAD"):
                resp = Response(_HTTP_SERVER_ERROR.format(code=404, message="File not found"), 404,
                                media_type="text/html")
            else:
                method = scope["method"]
                resp = Response(_HTTP_SERVER_ERROR.format(code=501, message=f"Unsupported method ({method!r})"), 501,
                                media_type="text/html")
        elif shape == "llama.cpp" and path == "/metrics":
            resp = JSONResponse({"error": {"code": 501, "message": "This server does not support metrics endpoint. "
                                           "Start it with `--metrics`", "type": "not_supported_error"}}, 501)
        elif shape == "llama.cpp":
            resp = JSONResponse({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}, 404)
        else:  # FastAPI's answer to a route it does not have (vLLM, llama-cpp-python)
            resp = JSONResponse({"detail": "Not Found"}, 404)
        await resp(scope, receive, send_shaped)


#: vLLM 0.32's AuthenticationMiddleware guards these prefixes only (the fake adds KServe's /openai/v1).
_GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere", "/openai/v1")


class _Guard:
    """ASGI middleware: ``FakeConfig.api_key`` on the routes ``auth_guard`` covers ("prefix": vLLM 0.32's
    rule, so /invocations, /tokenize, /metrics answer without a key; "all": every route but
    ``open_routes``), bent by the ``open_inference_route``, ``open_admin_route`` and ``echo_key`` faults.
    The fake's own /_fake/* control routes always answer."""

    def __init__(self, app: Any, config: Callable[[], "FakeConfig"]) -> None:
        self.app, self.config = app, config

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        cfg = self.config()
        if scope["type"] != "http" or not cfg.api_key or scope["path"].startswith("/_fake/"):
            return await self.app(scope, receive, send)
        path, faults = scope["path"], cfg.faults
        if "auth_url_path" in faults:  # the path as request.url read it before Starlette 1.x checked the Host
            host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"host"), "")
            path = urllib.parse.urlsplit(f"http://{host}{path}").path or "/"
        guarded = path.startswith(_GUARDED_PREFIX) if cfg.auth_guard == "prefix" else path not in cfg.open_routes
        if ("open_inference_route" in faults and path == "/v1/completions") or \
                ("open_admin_route" in faults and path == "/reset_prefix_cache") or \
                ("auth_misses_lora_tensors" in faults and path == "/load_lora_adapter_from_tensors"):
            guarded = False
        if "auth_raw_path" in faults:
            if any(path.startswith(o.rstrip("/") + "/") for o in cfg.open_routes):
                guarded = False
            scope = {**scope, "path": _normalised(scope["path"])}
        auth = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"authorization"), "")
        if not guarded or auth in {f"Bearer {k}" for k in (cfg.api_key, *cfg.other_keys)} or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        text = f"Unauthorized: {auth}" if "echo_key" in faults and auth else "Unauthorized"
        await JSONResponse({"error": text}, status_code=401)(scope, receive, send)


def _normalised(path: str) -> str:
    """A router's normalised path (the ``auth_raw_path`` fault): slashes merged, ``.`` and ``..``
    segments resolved, a trailing slash kept: ``//v1/models`` and ``/health/../v1/models`` ->
    ``/v1/models``."""
    out: list[str] = []
    parts = path.split("/")
    for seg in parts:
        if seg == "..":
            if out:
                out.pop()
        elif seg not in ("", "."):
            out.append(seg)
    return "/" + "/".join(out) + ("/" if path.endswith("/") and out else "")


def _media_urls(body: dict[str, Any]) -> list[str]:
    """The URLs of a chat body's image_url / audio_url / video_url content parts."""
    urls = []
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") in ("image_url", "audio_url", "video_url"):
                ref = part.get(part["type"])
                url = ref.get("url") if isinstance(ref, dict) else ref
                if isinstance(url, str):
                    urls.append(url)
    return urls


async def _fetch_all(urls: list[str]) -> None:
    """The ``fetch_media_urls`` fault: GET each http(s) URL (redirects followed), read each file:// path."""
    import httpx

    async with httpx.AsyncClient(follow_redirects=True, timeout=2.0) as client:
        for url in urls:
            if url.startswith("file://"):
                try:
                    open(url[len("file://"):], "rb").close()
                except OSError:
                    pass
                continue
            try:
                await client.get(url)
            except (httpx.HTTPError, ValueError):
                pass


class _SSEResponse(StreamingResponse):
    """StreamingResponse that always closes its generator (so a disconnect runs its ``finally``
    promptly, whether the cancel hit an ``await`` in the generator or the transport) and then runs
    ``on_close``."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self._on_close()


async def _first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` finishes; cancel (and reap) the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _html_200(faults: set[str] | frozenset[str]) -> Response | None:
    """The html_200 fault's answer to a generation (a 200 HTML page), or None without the fault."""
    if "html_200" not in faults:
        return None
    return Response(b"<html><body>oops</body></html>", status_code=200, media_type="text/html")


HTML_413 = (b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 "
            b"Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
HTML_502 = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway"
            b"</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")


async def _buffered(events: AsyncIterator[str], size: int) -> AsyncIterator[bytes]:
    """The body as a buffering proxy passes it on: exactly ``size``-byte pieces as they fill (an
    event may be split across two), the rest when ``events`` ends; ``size`` 0: one piece at the end."""
    held = b""
    async with contextlib.aclosing(events) as source:  # type: ignore[type-var]
        async for event in source:
            held += event.encode()
            while size and len(held) >= size:
                yield held[:size]
                held = held[size:]
    if held:
        yield held


#: The keepalive frame each keepalive fault sends (``{n}``: its count, from 1).
_KEEPALIVE = {"prefill_keepalives": ": ping\n\n", "keepalive_data_colon": "data: : PROCESSING\n\n",
              "keepalive_id_alone": "id: {n}\n: ping\n\n"}


async def _keepalives(events: AsyncIterator[str], frame: str, every_s: float) -> AsyncIterator[str]:
    """``events`` with ``frame`` sent each time ``every_s`` seconds pass without one (real time: the
    frames fill a real wait, the prefill)."""
    it = events.__aiter__()
    pending: asyncio.Future[str] | None = None
    n = 0
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                n += 1
                yield frame.format(n=n)
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


# --------------------------------------------------------------------------------------------
# The fake server
# --------------------------------------------------------------------------------------------


class _BodyLimit:
    """ASGI wrapper: the ``body_limit_413`` fault. A POST body longer than ``max_body_bytes`` is
    answered 413 with :data:`HTML_413` before any route sees it (a gateway in front of every route);
    a smaller body is replayed to the app unchanged."""

    def __init__(self, app: Any, config: Callable[[], "FakeConfig"]) -> None:
        self.app, self.config = app, config

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        cfg = self.config()
        if scope["type"] != "http" or scope.get("method") != "POST" or "body_limit_413" not in cfg.faults:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                await self.app(scope, receive, send)
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        if len(body) > cfg.max_body_bytes:
            await Response(HTML_413, status_code=413, media_type="text/html")(scope, receive, send)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _QuickStopServer(uvicorn.Server):
    """uvicorn's ``Server`` that stops in milliseconds: stock uvicorn 0.55 notices ``should_exit`` on
    its next 0.1 s tick, then sleeps a fixed 0.1 s after asking connections to close and polls them
    and its tasks every 0.1 s -- ~160 ms per :meth:`FakeVLLM.stop` (median of 30, one keep-alive
    connection open), paid by every fake a test starts. Here :meth:`request_exit` wakes the main loop
    at once and shutdown polls every 5 ms; the order (close the listeners, shut each connection down,
    wait for connections and tasks up to ``timeout_graceful_shutdown``, cancel what is left) is
    uvicorn's. ``should_exit`` set directly (a fault, :meth:`FakeVLLM.sigterm`'s drain) still works
    and is noticed on the next 0.1 s tick, as before."""

    _POLL_S = 0.005

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def request_exit(self) -> None:
        """Set ``should_exit`` and wake the main loop now. Thread-safe."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)  # a tick as uvicorn's, or woken to exit
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        state = self.server_state
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await asyncio.sleep(0)  # let the idle connections' close run
                while (state.connections or state.tasks) and not self.force_exit:
                    await asyncio.sleep(self._POLL_S)
                for server in self.servers:
                    await server.wait_closed()
        except TimeoutError:
            for t in state.tasks:
                t.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()


class FakeVLLM:
    """The fake vLLM server: an ASGI ``app``, its ``config`` and ``state``, and a runner.

    ``with FakeVLLM(config) as fake:`` starts uvicorn in a background thread on a free loopback
    port (``fake.base_url``, e.g. ``http://127.0.0.1:40123``; ``fake.url`` adds ``/v1``) and stops
    it on exit. ``reset()`` clears state and metrics between tests without restarting.
    """

    #: The fake's clock for refuse_generations_s (monotonic seconds); a test may set ``fake.clock`` before start().
    clock: Callable[[], float] = staticmethod(time.monotonic)
    #: ``clock()`` when start() returned (None: not started).
    t_started: float | None = None

    def __init__(self, config: FakeConfig | None = None, *, sleep: Callable[[float], Awaitable[Any]] | None = None,
                 **overrides: Any) -> None:
        self.config = config if config is not None else FakeConfig()
        for k, v in overrides.items():
            if not hasattr(self.config, k):
                raise TypeError(f"FakeConfig has no field {k!r}")
            setattr(self.config, k, v)
        self.sleep = sleep or asyncio.sleep
        self.tokenizer = FakeTokenizer()
        self.state = FakeState()
        self.metrics = _Metrics()
        self.created = int(time.time())
        self._authorization = ""
        self._response_cache: dict[str, bytes] = {}  # the cache faults' cache: key -> the body answered
        self._overlapped: set[int] = set()  # request seqs that were in flight beside another
        self._blocked_until = 0.0  # template_blocks_engine: generations wait until this (time.monotonic())
        self.app = self._build_app()
        self.base_url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prefill_lock: asyncio.Lock | None = None
        self._slot_freed: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None  # set by stop(): ends hung requests and slot waits

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """OpenAI base URL (``base_url + "/v1"``)."""
        if self.base_url is None:
            raise RuntimeError("the fake is not running")
        return self.base_url + "/v1"

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("the fake is not running")
        return self._sock.getsockname()[1]

    def reset(self) -> None:
        """Forget requests, counters, leaks and the dead flag; keep the config."""
        self.state = FakeState()
        self.metrics = _Metrics()

    def _bind(self, host: str, port: int) -> socket.socket:
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto
        # says TCP; without it every response with a body pays ~40 ms of Nagle + delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock

    def _uvicorn(self, host: str, log_level: str, **kw: Any) -> "_QuickStopServer":
        cfg = uvicorn.Config(self.app, host=host, log_level=log_level, access_log=False, lifespan="off",
                             ws="none", timeout_graceful_shutdown=2, timeout_keep_alive=30,
                             server_header=False, **kw)  # the Server header is the shape's (_ServerShape)
        return _QuickStopServer(cfg)

    def start(self, host: str = "127.0.0.1", port: int = 0, timeout: float = 10.0, log_level: str = "warning",
              **uvicorn_kw: Any) -> str:
        """Serve in a background thread; returns ``base_url`` once the server accepts requests."""
        if self._thread is not None:
            raise RuntimeError("already running")
        self._sock = self._bind(host, port)
        self._server = server = self._uvicorn(host, log_level, **uvicorn_kw)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self._sock]},
                                        name=f"fake-vllm:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive():
                self._cleanup()
                raise RuntimeError("fake vLLM server thread exited during startup")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fake vLLM server did not start within {timeout}s")
            time.sleep(0.002)
        self.base_url = f"http://{host}:{self.port}"
        self.t_started = self.clock()  # refuse_generations_s counts from here
        return self.base_url

    def stop(self, timeout: float = 5.0) -> None:
        server, thread, loop, closing = self._server, self._thread, self._loop, self._closing
        if loop is not None and closing is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(closing.set)
        if server is not None and thread is not None:
            server.request_exit()
            thread.join(timeout)
            if thread.is_alive():
                server.force_exit = True
                thread.join(timeout)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._server = self._thread = None
        self.base_url = None
        self._loop = None

    def __enter__(self) -> "FakeVLLM":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- a rolling update's SIGTERM ---------------------------------------------------------

    def sigterm(self) -> None:
        """What vLLM does on SIGTERM with ``--shutdown-timeout``: from now on new generations are
        refused (503; 500 under ``drain_500``) while ``/health`` stays 200, in-flight ones run to
        their end (all aborted at once under ``abort_on_sigterm``, the rest aborted after
        ``shutdown_timeout_s``), then the server exits (never under ``no_exit_after_drain``).
        Returns at once; :meth:`wait_exit` waits for the exit. Thread-safe."""
        st = self.state
        if st.t_sigterm is not None:
            return
        st.t_sigterm = time.monotonic()
        st.aborting = "abort_on_sigterm" in self.config.faults
        threading.Thread(target=self._drain, name="fake-vllm-drain", daemon=True).start()

    def _drain(self) -> None:
        st, cfg = self.state, self.config
        deadline = (st.t_sigterm or time.monotonic()) + cfg.shutdown_timeout_s
        while st.inflight and time.monotonic() < deadline:
            time.sleep(0.005)
        if st.inflight:
            st.aborting = True
            while st.inflight:
                time.sleep(0.005)
        if "no_exit_after_drain" in cfg.faults or self._server is None:
            return
        st.t_exit = time.monotonic()
        self._server.should_exit = True

    def wait_exit(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the server thread to end after :meth:`sigterm`."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(max(timeout_s, 0.0))
        return not thread.is_alive()

    # ---- loop-bound primitives ---------------------------------------------------------------

    def _prims(self) -> tuple[asyncio.Lock, asyncio.Event, asyncio.Event]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._prefill_lock is None or self._slot_freed is None or self._closing is None:
            self._loop = loop
            self._prefill_lock = asyncio.Lock()
            self._slot_freed = asyncio.Event()
            self._closing = asyncio.Event()
        return self._prefill_lock, self._slot_freed, self._closing

    # ---- app ---------------------------------------------------------------------------------

    def _build_app(self) -> Any:
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/ping", self._ping, methods=["GET", "POST"]),
            Route("/version", self._version, methods=["GET"]),
            Route("/load", self._load, methods=["GET"]),
            Route("/server_info", self._server_info, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/tokenize", self._tokenize, methods=["POST"]),
            Route("/detokenize", self._detokenize, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            # KServe's Hugging Face runtime serves the OpenAI routes under /openai/v1 (with the
            # no_tokenize fault it also has no /tokenize, like that runtime)
            Route("/openai/v1/models", self._models, methods=["GET"]),
            Route("/openai/v1/completions", self._completions, methods=["POST"]),
            Route("/openai/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/metrics", self._metrics_endpoint, methods=["GET"]),
            # the Responses and Messages APIs (vLLM 0.32 serves both; the api gate)
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/responses/{response_id}", self._retrieve_response, methods=["GET"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            Route("/_fake/state", self._fake_state, methods=["GET"]),
            Route("/_fake/config", self._fake_config, methods=["GET", "POST"]),
            Route("/_fake/reset", self._fake_reset, methods=["POST"]),
            Route("/_fake/sigterm", self._fake_sigterm, methods=["POST"]),
            # the other servers' routes (FakeConfig.server; _ServerShape lets through only the shape's own)
            Route("/extras/tokenize", self._extras_tokenize, methods=["POST"]),
            Route("/extras/tokenize/count", self._extras_tokenize, methods=["POST"]),
            Route("/extras/detokenize", self._detokenize, methods=["POST"]),
            Route("/apply-template", self._apply_template, methods=["POST"]),
            Route("/props", self._props, methods=["GET"]),
            # vLLM 0.32's other routes (the security gate knocks on them): /invocations is chat
            Route("/invocations", self._chat, methods=["POST"]),
            Route("/reset_prefix_cache", self._reset_prefix_cache, methods=["POST"]),
            # the LoRA admin routes under every spelling (vLLM's /v1 ones, SGLang's from-tensors)
            *(Route(p, self._lora_admin, methods=["POST"]) for p in (
                "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter_from_tensors",
                "/load_lora_adapter_from_tensors")),
            Route("/scale_elastic_ep", self._scale_elastic_ep, methods=["POST"]),
            Route("/is_scaling_elastic_ep", self._is_scaling, methods=["POST"]),
            Route("/openapi.json", self._openapi, methods=["GET"]),
            Route("/docs", self._docs, methods=["GET"]),
        ]
        return _Guard(_BodyLimit(Starlette(routes=routes, middleware=[Middleware(_ServerShape, fake=self)]),
                                 self.config_of), self.config_of)

    @property
    def _drop_roles(self) -> bool:
        """The template_drops_roles fault: the chat template renders contents without roles."""
        return "template_drops_roles" in self.config.faults

    def config_of(self) -> FakeConfig:
        """The config in force now (tests replace ``self.config`` between requests)."""
        return self.config

    async def _reset_prefix_cache(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _lora_admin(self, request: Request) -> Response:
        """A LoRA admin route (load, unload, load from tensors): validates its body as vLLM does --
        ``lora_name`` is required -- and loads nothing (200 with a message when named). SGLang's
        root ``/load_lora_adapter_from_tensors`` is served only under ``auth_misses_lora_tensors``
        (vLLM has no such route: 404)."""
        if request.url.path == "/load_lora_adapter_from_tensors" and "auth_misses_lora_tensors" not in self.config.faults:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        try:
            body = await self._json(request)
        except _BadRequest as e:
            return e.response()
        if not isinstance(body.get("lora_name"), str) or not body["lora_name"]:
            return _error("lora_name is required", 400, "BadRequestError")
        return Response(f"LoRA request {body['lora_name']!r} accepted (the fake loads nothing)", status_code=200)

    async def _scale_elastic_ep(self, request: Request) -> Response:
        return _error("new_data_parallel_size is required", 400, "Bad Request")

    async def _is_scaling(self, request: Request) -> Response:
        return JSONResponse({"is_scaling_elastic_ep": False})

    async def _openapi(self, request: Request) -> Response:
        paths = {"/health": ["get"], "/ping": ["get", "post"], "/version": ["get"], "/load": ["get"],
                 "/metrics": ["get"], "/tokenize": ["post"], "/detokenize": ["post"], "/v1/models": ["get"],
                 "/v1/completions": ["post"], "/v1/chat/completions": ["post"], "/invocations": ["post"],
                 "/reset_prefix_cache": ["post"], "/scale_elastic_ep": ["post"], "/is_scaling_elastic_ep": ["post"]}
        return JSONResponse({"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"},
                             "paths": {p: {m: {"summary": p} for m in ms} for p, ms in paths.items()}})

    async def _docs(self, request: Request) -> Response:
        return Response("<!DOCTYPE html><html><head><title>FastAPI - Swagger UI</title></head></html>",
                        media_type="text/html")

    async def _json(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError as e:
            if self.config.server == "llama-cpp-python":
                raise _BareServerError() from None
            raise _BadRequest(f"Invalid JSON body: {e}")
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        return body

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.config.served_name and model not in self.config.lora_adapters:
            raise _BadRequest(f"The model `{model}` does not exist.", status=404, err_type="NotFoundError",
                              param="model", suffix=False)

    # simple endpoints

    async def _health(self, request: Request) -> Response:
        if "slow_health_while_busy" in self.config.faults and self.state.inflight:
            await self.sleep(self.config.slow_health_s)
        return Response(status_code=200)

    async def _ping(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _version(self, request: Request) -> Response:
        control = CONTROL_TEXT if "control_chars" in self.config.faults else ""
        return JSONResponse({"version": self.config.version + control})

    async def _load(self, request: Request) -> Response:
        return JSONResponse({"server_load": len(self.state.inflight)})

    async def _server_info(self, request: Request) -> Response:
        """vLLM's dev-mode ``GET /server_info`` (``entrypoints/serve/dev/server_info/api_router.py``):
        404 unless ``server_info`` (VLLM_SERVER_DEV_MODE=1); ``?config_format=json`` dumps the
        VllmConfig as JSON (a torch dtype as its ``str``), else as its text form."""
        cfg = self.config
        if not cfg.server_info:  # as any route the app does not have (Starlette's own 404)
            return Response("Not Found", status_code=404, media_type="text/plain; charset=utf-8")
        blocks = cfg.num_gpu_blocks * (2 if "kv_dtype_halved" in cfg.faults else 1)
        override = {"max_new_tokens": cfg.max_tokens_cap} if cfg.max_tokens_cap else {}
        model = {"model": cfg.model_path, "served_model_name": cfg.served_name, "dtype": f"torch.{cfg.dtype}",
                 "max_model_len": cfg.max_model_len, "quantization": None, "generation_config": "auto",
                 "override_generation_config": override, "trust_remote_code": cfg.trust_remote_code}
        cache = {"block_size": cfg.block_size, "cache_dtype": cfg.cache_dtype, "num_gpu_blocks": blocks,
                 "gpu_memory_utilization": cfg.gpu_memory_utilization, "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes}
        if request.query_params.get("config_format") == "json":
            config: Any = {"model_config": model, "cache_config": cache}
        else:
            config = ", ".join(f"{k}={v!r}" for k, v in {**model, **cache}.items())
        return JSONResponse({"vllm_config": config, "vllm_env": {"VLLM_SERVER_DEV_MODE": True}, "system_env": {}})

    async def _models(self, request: Request) -> Response:
        cfg = self.config

        def card(name: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": root,
                "parent": parent,
                "max_model_len": max_len,
                "permission": [{
                    "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_DNS, name).hex}",
                    "object": "model_permission", "created": self.created, "allow_create_engine": False,
                    "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                    "allow_view": True, "allow_fine_tuning": False, "organization": "*", "group": None,
                    "is_blocking": False,
                }],
            }

        if cfg.server == "llama-cpp-python":  # llama_cpp/server/app.py get_models
            return JSONResponse({"object": "list", "data": [{"id": cfg.served_name, "object": "model", "owned_by": "me",
                                                             "permissions": []}]})
        if cfg.server == "transformers-serve":  # cli/serving/model_manager.py list_models, a pinned local model
            return JSONResponse({"object": "list", "data": [{"owned_by": "local", "id": cfg.served_name, "object": "model",
                                                             "created": 0, "status": {"value": "loaded"}}]})
        if cfg.server == "llama.cpp":  # tools/server: n_ctx_train is the model's training context, not -c
            meta = {"vocab_type": 1, "n_vocab": 32000, "n_ctx_train": 2048, "n_embd": 256, "n_params": 4_000_000,
                    "size": 8_000_000}
            return JSONResponse({"object": "list", "data": [{"id": cfg.served_name, "object": "model",
                                                             "created": self.created, "owned_by": "llamacpp",
                                                             "meta": meta}]})
        # vLLM lists each LoRA adapter after the base model, its parent, without a max_model_len
        cards = [card(cfg.served_name, cfg.model_path, None, cfg.advertised_len)]
        cards += [card(name, f"/adapters/{name}", cfg.served_name, None) for name in cfg.lora_adapters]
        return JSONResponse({"object": "list", "data": cards})

    def _code_revision(self, body: dict[str, Any]) -> Response | None:
        """The ``code_revision_honoured`` fault: a request's ``mm_processor_kwargs.code_revision`` names
        the revision the processor is loaded from; the fake has none, so it answers 500 naming it."""
        kwargs = body.get("mm_processor_kwargs")
        if "code_revision_honoured" not in self.config.faults or not isinstance(kwargs, dict) \
                or kwargs.get("code_revision") is None:
            return None
        return _error(f"Revision Not Found: {kwargs['code_revision']!r} is not a revision of {self.config.model_path} "
                      "(loading the processor's remote code)", 500, "InternalServerError")

    async def _tokenize(self, request: Request) -> Response:
        if "no_tokenize" in self.config.faults:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if self.config.server == "llama.cpp":
            return await self._llamacpp_tokenize(request)
        try:
            body = await self._json(request)
            self._check_model(body)
            if (honoured := self._code_revision(body)) is not None:
                return honoured
            if "messages" in body:
                words = self.tokenizer.render_chat(body["messages"], bool(body.get("add_generation_prompt", True)),
                                                   body.get("chat_template_kwargs"), self._drop_roles)
                if body.get("add_special_tokens", False):
                    words = [BOS] + words
            elif isinstance(body.get("prompt"), str):
                words = self.tokenizer.encode(body["prompt"], add_bos=bool(body.get("add_special_tokens", True)))
            else:
                raise _BadRequest("either 'prompt' (a string) or 'messages' is required")
        except _BadRequest as e:
            return e.response()
        except ValueError as e:
            return _BadRequest(str(e)).response()
        return JSONResponse({
            "count": len(words),
            "max_model_len": self.config.advertised_len,
            "tokens": self.tokenizer.ids(words),
            "token_strs": words if body.get("return_token_strs") else None,
        })

    async def _llamacpp_tokenize(self, request: Request) -> Response:
        """llama.cpp's ``POST /tokenize``: ``{"content", "add_special" (default false)}`` ->
        ``{"tokens": [ids]}``; no ``content`` tokenizes nothing (``{"tokens": []}``)."""
        try:
            body = await self._json(request)
        except _BadRequest as e:
            return e.response()
        content = body.get("content")
        words = self.tokenizer.encode(content, add_bos=bool(body.get("add_special", False))) \
            if isinstance(content, str) else []
        return JSONResponse({"tokens": self.tokenizer.ids(words)})

    async def _extras_tokenize(self, request: Request) -> Response:
        """llama-cpp-python's ``POST /extras/tokenize`` ``{"input", "model"}`` -> ``{"tokens"}``
        (BOS added, as its create_completion tokenizes a prompt); ``/extras/tokenize/count`` ->
        ``{"count"}``. A body without ``input`` is FastAPI's 422."""
        if "no_tokenize" in self.config.faults:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        try:
            body = await self._json(request)
        except _BadRequest as e:
            return e.response()
        if not isinstance(body.get("input"), str):
            return JSONResponse({"detail": [{"type": "missing", "loc": ["body", "input"], "msg": "Field required"}]},
                                status_code=422)
        ids = self.tokenizer.ids(self.tokenizer.encode(body["input"]))
        return JSONResponse({"count": len(ids)} if request.url.path.endswith("/count") else {"tokens": ids})

    async def _apply_template(self, request: Request) -> Response:
        """llama.cpp's ``POST /apply-template`` ``{"messages"}`` -> ``{"prompt"}``: the chat template
        rendered as text, without the BOS (llama.cpp's tokenizer adds it: ``add_special``)."""
        try:
            body = await self._json(request)
            words = self.tokenizer.render_chat(body.get("messages"), True, body.get("chat_template_kwargs"),
                                               self._drop_roles)
        except _BadRequest as e:
            return e.response()
        except ValueError as e:
            return _BadRequest(str(e)).response()
        return JSONResponse({"prompt": " ".join(words[1:])})

    async def _props(self, request: Request) -> Response:
        """llama.cpp's ``GET /props`` (the fields kvgate might read)."""
        cfg = self.config
        return JSONResponse({"default_generation_settings": {"n_ctx": cfg.max_model_len, "params": {"n_predict": -1}},
                             "total_slots": cfg.max_num_seqs, "model_path": cfg.model_path,
                             "chat_template": "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} "
                                              "{% endfor %}<|assistant|>", "build_info": "b0000-fake"})

    async def _detokenize(self, request: Request) -> Response:
        if "no_tokenize" in self.config.faults:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        try:
            body = await self._json(request)
            self._check_model(body)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise _BadRequest("'tokens' must be a list of integers")
        except _BadRequest as e:
            return e.response()
        return JSONResponse({"prompt": self.tokenizer.decode(tokens)})

    async def _metrics_endpoint(self, request: Request) -> Response:
        if "no_metrics" in self.config.faults:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        cfg, st, m = self.config, self.state, self.metrics
        if "metrics_500_under_load" in cfg.faults and st.running + st.waiting > 0:
            return Response(b"Internal Server Error", status_code=500, media_type="text/plain")
        model = cfg.served_name
        m.touch(model)
        if cfg.num_speculative_tokens is not None:
            m.touch_spec(model)
        m.running.labels(model, "0").set(st.running)
        st.waiting_peak = max(st.waiting_peak, st.waiting)
        shown = 0 if "frozen_queue_gauge" in cfg.faults else (
            st.waiting_peak if "stuck_queue_gauge" in cfg.faults else st.waiting)
        m.waiting.labels(model, "0").set(shown)
        m.kv_usage.labels(model, "0").set(min(1.0, st.kv_blocks_used(cfg.block_size) / max(1, cfg.num_gpu_blocks)))
        blocks = cfg.num_gpu_blocks * (2 if "kv_dtype_halved" in cfg.faults else 1)  # same bytes, half-size elements
        size_tokens = blocks * cfg.block_size
        info = {
            "block_size": str(cfg.block_size), "cache_dtype": str(cfg.cache_dtype),
            "enable_prefix_caching": str(cfg.enable_prefix_caching), "engine": "0",
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(round(size_tokens / cfg.max_model_len, 2)),
            "kv_cache_memory_bytes": str(cfg.kv_cache_memory_bytes), "kv_cache_size_tokens": str(size_tokens),
            "num_cpu_blocks": "None", "num_gpu_blocks": str(blocks), "num_gpu_blocks_override": "None",
            "sliding_window": "None",
        }
        m.cache_info.clear()
        m.cache_info.labels(**info).set(1)
        rss = cfg.base_rss_bytes + st.leaked_bytes + cfg.rss_wiggle_bytes * (st.metrics_scrapes % 2)
        st.metrics_scrapes += 1
        st.rss_first = rss if st.rss_first is None else st.rss_first
        m.rss.set(st.rss_first if "frozen_rss" in cfg.faults else rss)
        text = generate_latest(m.registry).decode()
        if "duplicate_pid_series" in cfg.faults:
            text = _per_pid(text, ("vllm:num_requests_running{", "vllm:num_requests_waiting{",
                                   "vllm:kv_cache_usage_perc{"))
        if "renamed_kv_usage" in cfg.faults:
            text = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        return Response(text.encode(), media_type=CONTENT_TYPE_LATEST)

    # control endpoints (for a fake in another process)

    async def _fake_state(self, request: Request) -> Response:
        return JSONResponse(self.state.summary())

    async def _fake_config(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                body = await self._json(request)
                for k, v in body.items():
                    if k not in {f.name for f in dataclasses.fields(FakeConfig)}:
                        raise ValueError(f"FakeConfig has no field {k!r}")
                    setattr(self.config, k, v)
            except (_BadRequest, ValueError) as e:
                return _error(str(e))
        return JSONResponse(self.config.to_json())

    async def _fake_sigterm(self, request: Request) -> Response:
        self.sigterm()
        return JSONResponse({"ok": True})

    async def _fake_reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"ok": True})

    # ---- generation endpoints ------------------------------------------------------------------

    async def _completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def _chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def _generate(self, request: Request, kind: str) -> Response:
        self._authorization = request.headers.get("authorization", "")  # the echo_key fault repeats it
        if self.state.t_sigterm is not None:  # draining: no new work (vLLM 0.32 answers 500 here)
            if "drain_500" in self.config.faults:
                return _error("EngineCore is shutting down", 500, "InternalServerError")
            return _error("The server is shutting down", 503, "ServiceUnavailableError")
        if self.config.refuse_generations_s and self.t_started is not None \
                and self.clock() - self.t_started < self.config.refuse_generations_s:  # ready, not serving
            return _error("The engine is not ready to serve yet (warming up)", 503, "ServiceUnavailableError")
        if "html_error_page" in self.config.faults:
            return Response(HTML_502, status_code=502, media_type="text/html")
        if (page := _html_200(self.config.faults)) is not None:
            return page
        if "empty_502" in self.config.faults:
            return Response(b"", status_code=502)
        try:
            body = await self._json(request)
        except _BadRequest as e:
            return self._reject(e)
        if self.config.server == "transformers-serve" and (strict := _strict_refusal(body, kind)) is not None:
            return strict
        if "compress_prompt" in self.config.faults:
            body = _compressed(body, self.config)
        if kind == "chat" and "gateway_drops_system" in self.config.faults and isinstance(body.get("messages"), list):
            body["messages"] = [m for m in body["messages"] if not (isinstance(m, dict) and m.get("role") == "system")]
        fleet_b = "split_fleet" in self.config.faults and _fleet_b(kind, body)
        if kind == "chat" and fleet_b and isinstance(body.get("messages"), list):  # B's template: no system turn
            body["messages"] = [m for m in body["messages"] if not (isinstance(m, dict) and m.get("role") == "system")]
        if kind == "chat" and "gateway_keeps_last_turn" in self.config.faults and isinstance(body.get("messages"), list):
            body["messages"] = _last_turn_only(body["messages"])
        if kind == "chat" and (urls := _media_urls(body)):
            if "fetch_media_urls" in self.config.faults:
                await _fetch_all(urls)
            else:
                return self._reject(_BadRequest("media URLs are not fetched by this deployment"))
        if (honoured := self._code_revision(body)) is not None:
            return honoured
        if (refused := await self._refuse_flood()) is not None:
            return refused
        if isinstance(body.get("n"), int) and body["n"] > 1 and not body.get("stream"):
            return await self._generate_n(request, body, kind)
        if kind == "chat" and body.get("chat_template") is not None and "template_blocks_engine" in self.config.faults \
                and self.config.trust_request_chat_template:
            self._blocked_until = time.monotonic() + self.config.template_block_s
        if (held := self._blocked_until - time.monotonic()) > 0:  # a template renders on the one worker
            await self.sleep(held)
        cache_key = self._cache_key(kind, body, request.headers.get("authorization", ""))
        if cache_key is not None and cache_key in self._response_cache:
            cached = self._response_cache[cache_key]
            if "cache_fresh_ids" in self.config.faults:  # the replay under a new id and created
                replay = json.loads(cached)
                replay.update(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()) + 1)
                cached = json.dumps(replay).encode()
            return Response(cached, media_type="application/json")
        t_received = time.monotonic()
        cfg, st = self.config, self.state
        faults = frozenset(cfg.faults)
        stream = bool(body.get("stream", False))
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        rec = RequestRecord(id=f"{prefix}-{rid}", endpoint=kind, stream=stream, t_received=t_received,
                            seq=len(st.requests))
        st.requests.append(rec)
        try:
            plan = self._admit(body, kind, rec, faults)
        except _BadRequest as e:
            resp = self._reject(e)
            rec.status, rec.error, rec.t_done = resp.status_code, str(e), time.monotonic()
            handler = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
            self.metrics.http.labels(handler, "POST", f"{resp.status_code // 100}xx").inc()
            return resp

        if plan is None:  # the engine is dead
            if cfg.dead_mode == "hang":  # until the client hangs up (or the fake stops)
                await _first(self._wait_disconnect(request), self._prims()[2].wait())
                rec.status, rec.disconnected, rec.t_done = 499, True, time.monotonic()
                return Response(status_code=500)
            rec.status, rec.t_done = 500, time.monotonic()
            rec.error = "EngineCore encountered an issue. See stack trace (above) for the root cause."
            return _error(rec.error, 500, "InternalServerError")

        if len(st.inflight) > 1:  # requests in flight together (the truncate_under_overlap fault)
            self._overlapped.update(st.inflight)
        if plan.stream:
            events = self._stream(plan)
            if "truncate_under_overlap" in faults:
                events = self._cut_before_finish(events, rec.seq)
            return _SSEResponse(events, on_close=lambda: self._release(plan))
        try:
            resp = await self._complete_nonstream(request, plan)
        finally:
            self._release(plan)
        if fleet_b and resp.status_code == 200:  # deployment B names itself
            resp = JSONResponse({**json.loads(resp.body), "system_fingerprint": "fp-b"})
        if cache_key is not None and resp.status_code == 200:
            self._response_cache[cache_key] = bytes(resp.body)
        if "truncate_under_overlap" in faults and resp.status_code == 200 and rec.seq in self._overlapped:
            return _CutBody(bytes(resp.body), keep=len(resp.body) * 2 // 5)
        return resp

    def _cache_key(self, kind: str, body: dict[str, Any], authorization: str) -> str | None:
        """The response cache's key under the cache faults (None: no cache, or a stream): the whole
        body without the caller (``cache_ignores_caller``), or caller, route, model and
        messages/prompt only (``cache_ignores_fields``)."""
        faults = self.config.faults
        if not body.get("stream") and "cache_fresh_ids" in faults:  # caller, route and the whole body
            return json.dumps([authorization, kind, body], sort_keys=True, default=str)
        if body.get("stream") or not faults & {"cache_ignores_caller", "cache_ignores_fields", "answer_cache_first_words"}:
            return None
        if "answer_cache_first_words" in faults:
            if kind != "chat" or not isinstance(body.get("messages"), list):
                return None
            users = [m for m in body["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            words = FakeTokenizer.content_text(users[-1].get("content")).split() if users else []
            return json.dumps(["first-words", words[:self.config.cache_words]])
        if "cache_ignores_fields" in faults:
            return json.dumps([authorization, kind, body.get("model"), body.get("messages"), body.get("prompt")],
                              sort_keys=True, default=str)
        return json.dumps([kind, body], sort_keys=True, default=str)

    async def _cut_before_finish(self, events: AsyncIterator[str | bytes], seq: int) -> AsyncIterator[str | bytes]:
        """The stream up to (not including) its finish chunk, when the request overlapped another
        (``truncate_under_overlap``): then it ends cleanly, no finish chunk, no [DONE]."""
        async with contextlib.aclosing(events) as out:
            async for piece in out:
                text = piece.decode("utf-8", "replace") if isinstance(piece, bytes) else piece
                if seq in self._overlapped and (_FINISHED.search(text) or "[DONE]" in text):
                    return
                yield piece

    async def _refuse_flood(self) -> Response | None:
        """Past ``admission_limit`` requests in flight: refused ``admission_status`` at once with
        Retry-After (``slow_refusal``: after ``slow_refusal_s``; ``refuse_500``: 500). Checked with no
        await before the admission that follows, so the count is exact."""
        cfg = self.config
        if cfg.admission_limit is None or len(self.state.inflight) < cfg.admission_limit:
            return None
        if "slow_refusal" in cfg.faults:
            await asyncio.sleep(cfg.slow_refusal_s)
        if "refuse_500" in cfg.faults:
            return _error("EngineCore encountered an issue", 500, "InternalServerError")
        resp = _error("too many requests in flight; retry later", cfg.admission_status,
                      "RateLimitError" if cfg.admission_status == 429 else "ServiceUnavailableError")
        resp.headers["Retry-After"] = "1"
        return resp

    def _reject(self, e: _BadRequest) -> Response:
        """vLLM's error answer, as the error faults bend it (500 for a 400, a plain-text body);
        :class:`_BareServerError` raises out of the app (its ``response``)."""
        if isinstance(e, _BareServerError):
            return e.response()  # raises: no fault bends an exception nothing handled
        faults = self.config.faults
        if "validation_500" in faults and e.status == 400:
            return _error(f"Internal Server Error: {e}", 500, "InternalServerError")
        if "plain_error_body" in faults and 400 <= e.status < 500:
            return Response("Bad Request", status_code=e.status, media_type="text/plain")
        if "control_chars" in faults:
            return _error(f"{e} {CONTROL_TEXT}", e.status)
        if "echo_key" in faults and self._authorization:
            return _error(f"{e} (request authorization: {self._authorization})", e.status)
        return e.response()

    def _admit(self, body: dict[str, Any], kind: str, rec: RequestRecord, faults: frozenset[str]) -> _Plan | None:
        """Validate like vLLM, apply the length semantics and the admission faults; None = dead engine."""
        cfg, st, tok = self.config, self.state, self.tokenizer
        L = cfg.max_model_len
        self._check_model(body)

        n = body.get("n")
        if n not in (None, 1):
            raise _BadRequest("the fake vLLM supports n=1 only", param="n", value=n)
        stream = rec.stream
        stream_options = body.get("stream_options")
        if stream_options is not None and not stream:
            raise _BadRequest("Stream options can only be defined when `stream=True`.")
        stream_options = stream_options or {}
        temperature = None if "sampling_dropped" in faults else body.get("temperature")
        if temperature is None:
            temperature = 1.0  # vLLM's default without a generation_config
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise _BadRequest(f"temperature must be non-negative, got {temperature}.", param="temperature",
                              value=temperature)
        seed = None if "sampling_dropped" in faults else body.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise _BadRequest("seed must be an integer", param="seed", value=seed)
        ignore_eos = bool(body.get("ignore_eos", False))
        priority = body.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise _BadRequest("priority must be an integer", param="priority", value=priority)
        min_tokens = body.get("min_tokens", 0) or 0
        if not isinstance(min_tokens, int) or min_tokens < 0:
            raise _BadRequest(f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
                              param="min_tokens", value=min_tokens)
        if "bad_words_500" in faults and body.get("bad_words"):
            raise _BadRequest("EngineCore encountered an issue (injected bad_words_500 fault)", status=500,
                              err_type="InternalServerError")

        # max_tokens (chat: max_completion_tokens wins)
        param = "max_tokens"
        requested = body.get("max_tokens")
        if kind == "chat" and body.get("max_completion_tokens") is not None and \
                "ignore_max_completion_tokens" not in faults:
            param, requested = "max_completion_tokens", body["max_completion_tokens"]
        if requested is not None:
            if not isinstance(requested, int) or isinstance(requested, bool):
                raise _BadRequest(f"{param} must be an integer", param=param, value=requested)
            if requested > L:
                raise _BadRequest(f"{param}={requested} cannot be greater than max_model_len={L}. "
                                  f"Please request fewer output tokens.", param=param, value=requested)
            if requested < 1:
                raise _BadRequest(f"max_tokens must be at least 1, got {requested}.", param="max_tokens",
                                  value=requested)
            if min_tokens > requested:
                raise _BadRequest(f"min_tokens must be less than or equal to max_tokens={requested}, "
                                  f"got {min_tokens}.", param="min_tokens", value=min_tokens)

        # logprobs
        logprobs: int | None = None
        if kind == "completions":
            lp = body.get("logprobs")
            if lp is not None:
                if not isinstance(lp, int) or isinstance(lp, bool) or lp < 0:
                    raise _BadRequest("logprobs must be a non-negative integer", param="logprobs", value=lp)
                if lp > cfg.max_logprobs:
                    raise _BadRequest(f"Requested sample logprobs of {lp}, which is greater than max allowed: "
                                      f"{cfg.max_logprobs}", param="logprobs", value=lp)
                logprobs = lp
        elif body.get("logprobs"):
            top = body.get("top_logprobs") or 0
            if not isinstance(top, int) or top < 0 or top > cfg.max_logprobs:
                raise _BadRequest(f"top_logprobs must be between 0 and {cfg.max_logprobs}", param="top_logprobs",
                                  value=top)
            logprobs = top

        # the prompt
        text_prompt = True
        echo = None
        try:
            if kind == "chat":
                words = tok.render_chat(body.get("messages"), bool(body.get("add_generation_prompt", True)),
                                        body.get("chat_template_kwargs"), self._drop_roles)
                if body.get("chat_template") is not None:
                    if "request_template_rendered" not in faults and not cfg.trust_request_chat_template:
                        raise _BadRequest("Chat template is passed with request, but --trust-request-chat-template "
                                          "is not set. Refused request with untrusted chat template.")
                    words = [*words, *["kv"] * REQUEST_TEMPLATE_WORDS]
                prompt_key = " ".join(words)
                n_prompt = len(words)
                prompt_ids: list[Any] = tok.ids(words)
                key_words = words  # what answering mode answers (forget_first_turn: the last user turn alone)
                msgs = body.get("messages")
                users = [m for m in msgs if m.get("role") == "user"]
                if "forget_first_turn" in faults and users and \
                        len([m for m in msgs if m.get("role") != "system"]) > 1:
                    key_words = tok.render_chat([m for m in msgs if m.get("role") == "system"] + users[-1:],
                                                bool(body.get("add_generation_prompt", True)),
                                                body.get("chat_template_kwargs"), self._drop_roles)
            else:
                prompt = body.get("prompt")
                if prompt is None and body.get("prompt_embeds") is not None:
                    if "path_500" in faults:
                        raise _BadRequest("EngineCore encountered an issue (injected path_500 fault)", status=500,
                                          err_type="InternalServerError")
                    raise _BadRequest("Prompt embeds are not enabled: start the server with --enable-prompt-embeds",
                                      param="prompt_embeds")
                if "empty_prompt_kills" in faults and prompt in ("", [], [""]):
                    st.dead = True
                    raise _BadRequest("EngineCore encountered an issue (injected empty_prompt_kills fault)",
                                      status=500, err_type="InternalServerError")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                    prompt = prompt[0]
                if isinstance(prompt, str):
                    rec.prompt = prompt
                    words = tok.encode(prompt, add_bos=bool(body.get("add_special_tokens", True)))
                    prompt_key, n_prompt = " ".join(words), len(words)
                    prompt_ids = tok.ids(words)
                    key_words = words
                elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                    if cfg.server == "llama-cpp-python":  # prompt: str | list[str]; RouteErrorHandler -> 500
                        raise _BadRequest(f"{2 * len(prompt) + 1} validation errors for CreateCompletionRequest "
                                          f"prompt: Input should be a valid string", status=500,
                                          err_type="internal_server_error")
                    prompt_ids = list(prompt)
                    if "double_bos_ids" in faults:
                        prompt_ids = [_SPECIAL_IDS[BOS]] + prompt_ids
                    prompt_key, n_prompt, text_prompt = json.dumps(prompt_ids), len(prompt_ids), False
                    key_words = [tok.word(t) for t in prompt_ids]
                    if "echo_prompt_first_delta" in faults and stream:
                        echo = tok.decode(list(prompt))
                elif prompt is None:
                    raise ValueError("'prompt' is required")
                else:
                    raise ValueError("prompt must be a string, a list of token ids, or a one-element batch")
        except ValueError as e:
            raise _BadRequest(str(e))

        # length semantics (vLLM 0.32): N > L -> 400 input_tokens; N == L -> 400; N + max_tokens > L -> clamp
        if cfg.server == "transformers-serve":  # no max_model_len: any length is served
            L = n_prompt + cfg.max_model_len  # room to generate whatever the prompt's length
        if n_prompt >= L:
            if "dead_after_over_length" in faults:
                st.dead = True
            if "over_length_truncate" in faults:
                keep = max(1, min(L - 1, L - (requested or 1)))
                n_prompt = keep
                prompt_key = f"truncated:{keep}:{prompt_key[-200:]}"
                prompt_ids = prompt_ids[-keep:]
            elif "over_length_500" in faults:
                raise _BadRequest("Internal Server Error", status=500, err_type="InternalServerError")
            elif n_prompt > L:
                # vLLM tokenizes text with truncation at L + 1 tokens, so it reports "at least L + 1"
                # for any longer text; token-id prompts are reported exactly.
                counted = min(n_prompt, L + 1) if text_prompt else n_prompt
                qualifier = "at least " if counted == L + 1 else ""
                raise _BadRequest(f"This model's maximum context length is {L} tokens. However, your prompt "
                                  f"contains {qualifier}{counted} input tokens, which exceeds this limit even "
                                  f"without any output tokens. Please reduce the length of the input prompt.",
                                  param="input_tokens", value=counted)
            else:
                raise _BadRequest(f"The decoder prompt (length {n_prompt}) plus the number of requested output "
                                  f"tokens (at least 1) is longer than the maximum model length of {L}. Make sure "
                                  f"that `max_model_len` is no smaller than the number of text tokens (prompt + "
                                  f"requested output tokens).")
        rec.prompt_tokens = n_prompt

        if "hostile_seed_kills" in faults and isinstance(seed, int) and seed > 2**63 - 1:
            st.dead = True
        kvt = body.get("kv_transfer_params")
        if "kv_transfer_tp_kills" in faults and isinstance(kvt, dict) and isinstance(kvt.get("tp_size"), int) \
                and kvt["tp_size"] > 1024:
            st.dead = True
        if st.dead and ("dead_after_over_length" in faults or "empty_prompt_kills" in faults
                        or "hostile_seed_kills" in faults or "responses_template_kills" in faults
                        or "kv_transfer_tp_kills" in faults):
            return None

        # effective output limit, like vllm.entrypoints...get_max_tokens
        fallback = requested if requested is not None else (cfg.default_max_tokens if kind == "completions" else None)
        if "ignore_max_tokens" in faults and requested is not None:
            fallback = requested + cfg.ignore_max_tokens_extra
        cap = None if "ignore_cap" in faults or cfg.server != "vllm" else cfg.max_tokens_cap  # a vLLM setting
        limit = min(v for v in (L - n_prompt, fallback, cap) if v is not None)
        rec.max_tokens = limit

        # 5xx under concurrent long prompts
        if "5xx_under_concurrency" in faults and n_prompt >= cfg.long_threshold:
            long_now = sum(1 for p in st.inflight.values() if p >= cfg.long_threshold)
            if long_now + 1 > cfg.max_concurrent_long:
                raise _BadRequest("CUDA out of memory while allocating KV cache blocks (injected fault)",
                                  status=500, err_type="InternalServerError")

        eos_after = cfg.eos_after
        if "ignore_min_tokens" in faults:
            min_tokens, eos_after = 0, 2
        model = body.get("model") or cfg.served_name
        adapter = model if model != cfg.served_name else None
        if adapter is not None and "lora_as_base" not in faults:
            prompt_key = f"lora:{adapter}:{prompt_key}"  # the adapter's own deterministic text
        feature = self._feature_answer(body, stream, faults, limit) if kind == "chat" else None
        if feature is not None:
            special, deltas, finish = feature
            tokens, finish = _delta_tokens(deltas, finish, limit, eos=finish != "length")
        else:
            special = None
            variant = "flip" if "flip_near_ties" in faults else "changed" if "changed_model" in faults else None
            tokens, finish = _plan_tokens(prompt_key, limit, ignore_eos, min_tokens, eos_after,
                                          float(temperature), seed, logprobs or 0, not prompt_key.isascii(),
                                          tie_at=cfg.near_tie_at, variant=variant)
        batch_tokens = None
        answer = self._answer_of(key_words) if feature is None and adapter is None and not ignore_eos \
            and not min_tokens else None
        if answer is None and cfg.needle and feature is None and adapter is None and not ignore_eos:
            found = _retrieved(cfg, " ".join(key_words))  # pass-key retrieval: from the prompt as the model got it
            if found is not None:
                tokens, finish = _answer_tokens(*_answer_pieces(found, "", frozenset(), limit), logprobs or 0)
        if answer is not None:  # answering mode: the answer's tokens, then EOS (whatever the temperature)
            key, text = answer
            if "sampling_dropped" in faults:
                text = f"{text} (take {rec.seq})"
            tokens, finish = _answer_tokens(*_answer_pieces(text, key, faults, limit), logprobs or 0)
            if "nondeterministic_concurrency" in faults and float(temperature) == 0:
                batch_tokens, _ = _answer_tokens(*_answer_pieces(text, key, faults, limit, batch=True), logprobs or 0)
        tokens, finish, stop_hit = _apply_stop(tokens, finish, body.get("stop"), "stop_fragment_leak" in faults and stream)
        if "finish_stop_at_cap" in faults and finish == "length":
            finish = "stop"
            tokens[-1].finish_reason = "stop"
        st.inflight[rec.seq] = n_prompt
        polluter = self._polluter(body) if faults & {"contaminating", "stale_allowlist"} else None
        if polluter is not None and "contaminating" in faults:
            st.polluting[rec.seq] = polluter
        stale = st.stale_rows.pop(0) if polluter is None and "stale_allowlist" in faults and st.stale_rows else None
        return _Plan(
            record=rec, kind=kind, prompt_tokens=n_prompt, tokens=tokens, finish_reason=finish, faults=faults,
            stream=rec.stream, include_usage=bool(stream_options.get("include_usage")) and cfg.server != "llama-cpp-python",
            continuous_usage=bool(stream_options.get("continuous_usage_stats")), logprobs=logprobs,
            created=int(time.time()), model=model, priority=priority, prompt_ids=tuple(prompt_ids),
            cache_salt=adapter or "", details=cfg.prompt_tokens_details, special=special,
            batch_tokens=batch_tokens, echo=echo, stop_hit=stop_hit,
            echo_ids=kind == "completions" and bool(body.get("echo")),
            ids_as_tokens=bool(body.get("return_tokens_as_token_ids")), polluter=polluter, stale=stale,
            spec_k=cfg.num_speculative_tokens,
        )

    def _polluter(self, body: dict[str, Any]) -> str | None:
        """contaminating: the word a request's ``allowed_token_ids`` (its first id) or ``logit_bias``
        (its first positively biased id) forces, or None when it carries neither."""
        ids = body.get("allowed_token_ids")
        if not (isinstance(ids, list) and ids and isinstance(ids[0], int)):
            bias = body.get("logit_bias")
            ids = [int(k) for k, v in bias.items() if str(k).isdigit() and isinstance(v, (int, float)) and v > 0] \
                if isinstance(bias, dict) else []
        return self.tokenizer.word(ids[0]) if ids else None

    def _answer_of(self, words: list[str]) -> tuple[str, str] | None:
        """``(key, answer)`` of answering mode for a prompt's tokens (:func:`_answer_keys`), or None
        when :attr:`FakeConfig.answers` has none of its keys."""
        if not self.config.answers:
            return None
        table = {_norm_key(k): v for k, v in self.config.answers.items()}
        for key in _answer_keys(words):
            if _norm_key(key) in table:
                return key, table[_norm_key(key)]
        return None

    # ---- serve features ------------------------------------------------------------------------

    def _feature_answer(self, body: dict[str, Any], stream: bool, faults: frozenset[str], limit: int
                        ) -> tuple[str, list[dict[str, Any]], str] | None:
        """``(kind, the chat deltas of the answer, finish_reason)`` of a tools, structured-output or
        reasoning request, as vLLM 0.32 answers it; None for a plain chat request. Resolution: a
        call when ``tools`` ask for one (a ``structured_outputs`` regex beside ``tool_choice: auto``
        is vLLM's combined guide: ignored); then ``response_format``; then ``structured_outputs``
        (a regex no battery entry asks is a reasoning request's guide when a reasoning parser is
        set, else a 400); then, with ``reasoning_parser``, reasoning and content."""
        called = _called_function(body)
        if called is not None:
            return ("tools", *self._tool_deltas(*called, stream, faults))
        rf, so = body.get("response_format"), body.get("structured_outputs")
        if isinstance(rf, dict) and rf.get("type") in ("json_schema", "json_object"):
            if rf["type"] == "json_object":
                return "structured", _content_deltas(battery_example("json_object", None) or "{}"), "stop"
            schema = (rf.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise _BadRequest("response_format json_schema needs json_schema.schema", param="response_format")
            text = battery_example("json_schema", schema) or json.dumps(minimal_instance(schema), separators=(",", ":"))
            if "structured_whitespace_loop" in faults:  # '{' then whitespace until max_tokens (no EOS)
                return "structured", [{"content": "{"}] + [{"content": " "}] * (limit - 1), "length"
            if "structured_cut" in faults:
                return "structured", _content_deltas(text[: len(text) // 2]), "stop"
            return "structured", _content_deltas(text), "stop"
        if isinstance(so, dict):
            if isinstance(so.get("choice"), list) and so["choice"]:
                text = battery_example("choice", so["choice"]) or str(so["choice"][0])
                return "structured", _content_deltas(text), "stop"
            if isinstance(so.get("json"), dict):
                return "structured", _content_deltas(json.dumps(minimal_instance(so["json"]))), "stop"
            if isinstance(so.get("regex"), str):
                text = battery_example("regex", so["regex"])
                if text is not None:
                    return "structured", _content_deltas(text), "stop"
                if not self.config.reasoning_parser:
                    raise _BadRequest(f"fake cannot satisfy regex {so['regex']!r}", param="structured_outputs")
        if self.config.reasoning_parser:
            kwargs = body.get("chat_template_kwargs") or {}
            if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False:
                return "reasoning", _content_deltas(CONTENT_TEXT), "stop"
            if "reasoning_markers_in_content" in faults:
                return "reasoning", _content_deltas(f"<think>\n{REASONING_TEXT}\n</think>\n\n{CONTENT_TEXT}"), "stop"
            return ("reasoning", [{"reasoning": p} for p in _pieces(REASONING_TEXT)] + _content_deltas(CONTENT_TEXT),
                    "stop")
        return None

    @staticmethod
    def _tool_deltas(fn: dict[str, Any], named: bool, stream: bool, faults: frozenset[str]
                     ) -> tuple[list[dict[str, Any]], str]:
        """The deltas of one call to ``fn`` (hermes: the name first, then the arguments in pieces)
        and the finish reason (``stop`` for a named tool_choice, as vLLM answers it)."""
        name = fn["name"]
        args = json.dumps(minimal_instance(fn.get("parameters") or {"type": "object", "properties": {}}))
        if "tools_args_not_object" in faults:
            args = "false"
        if stream and "tools_stream_as_text" in faults:
            raw = json.dumps({"name": name, "arguments": json.loads(args)})
            return _content_deltas(f"<tool_call>\n{raw}\n</tool_call>"), "stop"
        call_id = f"{name}:0" if "tool_ids_repeat" in faults else f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"
        head = {"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": name}}]}
        parts = [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in _pieces(args)]
        return [head] + parts, "stop" if named else "tool_calls"

    @staticmethod
    def _special_message(plan: _Plan, tokens: list[_Token]) -> tuple[dict[str, Any], str]:
        """The non-streamed message of a features answer (its deltas folded) and its finish reason."""
        content = "".join((t.delta.get("content") or "") if t.delta is not None else t.text for t in tokens)
        reasoning = "".join((t.delta or {}).get("reasoning") or "" for t in tokens)
        calls: dict[int, dict[str, Any]] = {}
        for t in tokens:
            for tc in (t.delta or {}).get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": tc.get("id"), "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                slot["function"]["name"] += tc.get("function", {}).get("name") or ""
                slot["function"]["arguments"] += tc.get("function", {}).get("arguments") or ""
        tool_calls = [calls[i] for i in sorted(calls)]
        finish = plan.finish_reason
        if plan.special == "tools" and "tools_empty_calls" in plan.faults:
            tool_calls, content, finish = [], "", "tool_calls"
        message = {"role": "assistant", "content": content or (None if plan.special == "tools" else ""),
                   "refusal": None, "annotations": None, "audio": None, "function_call": None,
                   "tool_calls": tool_calls, "reasoning": reasoning or None, "reasoning_content": None}
        return message, finish

    def _release(self, plan: _Plan) -> None:
        if not plan.released:
            plan.released = True
            self.state.inflight.pop(plan.record.seq, None)
            self.state.polluting.pop(plan.record.seq, None)
            if "stale_allowlist" in plan.faults and plan.polluter is not None:
                self.state.stale_rows.append(plan.polluter)  # its row is never cleared

    # ---- the engine ----------------------------------------------------------------------------

    async def _engine(self, plan: _Plan) -> AsyncIterator[_Token]:
        """Queue, prefill, then emit the planned tokens with delays; all accounting in ``finally``."""
        cfg, st, m, rec = self.config, self.state, self.metrics, plan.record
        model = cfg.served_name  # vLLM labels every metric with the served model, adapters included
        m.touch(model)
        lock, slot_freed, closing = self._prims()
        entry = _Active(prompt_tokens=plan.prompt_tokens)
        admitted = finished = failed = False
        waiting = True
        st.waiting += 1
        st.generations_started += 1
        drift = cfg.drift_s_per_request * (st.generations_started - 1) if "drifting_ttft" in plan.faults else 0.0
        if "leaky_rss" in plan.faults and cfg.leak_bytes_per_request > 0:
            st.leaked.append(b"\x01" * cfg.leak_bytes_per_request)
        long_min = cfg.leak_min_prompt_tokens if cfg.leak_min_prompt_tokens is not None else cfg.max_model_len // 2
        if "leaky_rss_long" in plan.faults and cfg.leak_bytes_per_request > 0 and plan.prompt_tokens > long_min:
            st.leaked.append(b"\x01" * cfg.leak_bytes_per_request)
        t_last = None
        try:
            schedulable = cfg.schedulable_tokens or cfg.max_model_len - cfg.block_size
            if "never_schedule" in plan.faults and plan.prompt_tokens + len(plan.tokens) > schedulable:
                await closing.wait()  # waits until the client hangs up (cancelled) or the fake stops
                raise _EngineError("server shutting down")
            if "exit_after_generations" in plan.faults and st.generations_started > cfg.exit_after:
                if self._server is not None:
                    self._server.should_exit = True  # stops listening: later connections are refused
                raise _EngineError("server process gone")
            if "hang_after_generations" in plan.faults and st.generations_started > cfg.hang_after:
                await closing.wait()  # held like a frozen EngineCore: until the client hangs up or the fake stops
                raise _EngineError("server shutting down")
            key = (plan.priority if cfg.scheduling_policy == "priority" else 0, rec.seq)
            st.queue[rec.seq] = key
            while st.running >= cfg.max_num_seqs or key != min(st.queue.values()) or self._kv_short(plan):
                if closing.is_set():
                    raise _EngineError("server shutting down")
                slot_freed.clear()
                await _first(slot_freed.wait(), closing.wait())
            st.queue.pop(rec.seq, None)
            slot_freed.set()  # the next in the queue re-checks (a slot may still be free)
            if "hol_blocking" in plan.faults:
                async with lock:
                    waiting = False
                    st.waiting -= 1
                    admitted = self._admit_entry(rec, entry, model)
                    await self.sleep(self._prefill_s(plan))
            else:
                waiting = False
                st.waiting -= 1
                admitted = self._admit_entry(rec, entry, model)
                await self.sleep(self._prefill_s(plan))
            self._prefix_store(plan)
            st.prompt_tokens_total += plan.prompt_tokens
            m.prompt_tokens.labels(model, "0").inc(plan.prompt_tokens)
            if plan.batch_tokens is not None:  # nondeterministic_concurrency: the batch forms, then decides
                # it forms until it is large, or until batch_window_s pass with no request admitted
                while not entry.large_batch and \
                        time.monotonic() - max(st.last_admitted, rec.t_admitted or 0.0) < cfg.batch_window_s:
                    await asyncio.sleep(0.005)  # real time: the batch is formed by real concurrent requests
                if entry.large_batch:
                    plan.tokens, plan.finish_reason = plan.batch_tokens, plan.batch_tokens[-1].finish_reason or "stop"
            if "contaminating" in plan.faults:  # requests sent together overlap
                await self.sleep(cfg.contaminate_window_s * (2 if plan.polluter is not None else 1))
            if "ttft_rises_with_load" in plan.faults:  # the others admitted and not finished
                drift += cfg.load_ttft_s_per_request * max(0, st.running - 1)
            if cfg.ttft_s + drift > 0:
                await self.sleep(cfg.ttft_s + drift)

            n = len(plan.tokens)
            stall_at = (cfg.stall_after if cfg.stall_after is not None else n // 2) if n >= 2 else None
            error_at = n // 2 if "error_mid_stream" in plan.faults else None
            for tok in plan.tokens:
                if st.aborting:
                    raise _CutConnection("aborted at SIGTERM")
                if tok.index == error_at:
                    raise _EngineError("EngineCore encountered an issue (injected error_mid_stream fault)")
                if tok.index > 0:
                    await self.sleep(cfg.itl_s)
                if "stall_mid_stream" in plan.faults and tok.index == stall_at and tok.index > 0:
                    await self.sleep(cfg.stall_s)
                if "pause_streams" in plan.faults and plan.stream and tok.index == cfg.pause_after_chunks:
                    await self.sleep(cfg.pause_s)
                now = time.monotonic()
                if tok.index == 0:
                    rec.t_first_token = now
                    m.ttft.labels(model, "0").observe(
                        0.0005 if "ttft_histogram_lies" in plan.faults else now - rec.t_received)
                elif t_last is not None:
                    m.itl.labels(model, "0").observe(now - t_last)
                t_last = now
                entry.generated += 1
                rec.completion_tokens += 1
                st.generation_tokens_total += 1
                m.generation_tokens.labels(model, "0").inc()
                if st.kv_blocks_used(cfg.block_size) > cfg.num_gpu_blocks and not entry.preempted:
                    entry.preempted = True
                    st.preemptions += 1
                    m.preemptions.labels(model, "0").inc()
                word = plan.stale  # stale_allowlist: the uncleared row's allowlist
                if "contaminating" in plan.faults and plan.polluter is None and st.polluting:
                    word = next(iter(st.polluting.values()))  # another request's allowlist row, applied here
                if word is not None and tok.text:
                    tok = dataclasses.replace(tok, token_id=self.tokenizer.token_id(word), token_str=word,
                                              text=" " + word)
                yield tok
            finished = True
            rec.finish_reason = plan.finish_reason
        except _EngineError as e:
            failed, rec.error = True, str(e)
            raise
        finally:
            now = time.monotonic()
            rec.t_done = now
            if st.queue.pop(rec.seq, None) is not None:
                slot_freed.set()  # a waiter left the queue: the next one re-checks
            if waiting:
                st.waiting -= 1
            if admitted:
                delivered = rec.t_first_byte if plan.stream else rec.t_first_token
                if not (finished or failed) and "leak_cancelled_kv" in plan.faults and delivered is None:
                    st.leaked_kv_blocks += max(1, math.ceil(entry.tokens / cfg.block_size))  # never freed
                if finished or failed or "stuck_gauges" not in plan.faults:
                    st.active.pop(rec.seq, None)
                    slot_freed.set()
                else:
                    entry.stuck = True
            if finished:
                self._spec_count(plan, entry.generated)
                m.success.labels(model, "0", plan.finish_reason).inc()
                m.e2e.labels(model, "0").observe(now - rec.t_received)
            elif failed:
                rec.finish_reason = "error"
                m.success.labels(model, "0", "error").inc()
            else:
                rec.disconnected = True
                rec.finish_reason = rec.finish_reason or "abort"
                m.success.labels(model, "0", "abort").inc()
            self._release(plan)

    # ---- the prefix cache ----------------------------------------------------------------------

    def _block_hashes(self, plan: _Plan, blocks: int) -> list[int]:
        """Chain hashes of the prompt's first ``blocks`` whole blocks (each covers every token
        before it, as vLLM's block hashes do; an adapter's blocks are its own)."""
        bs, out, h = self.config.block_size, [], hash(plan.cache_salt)
        for i in range(blocks):
            h = hash((h, plan.prompt_ids[i * bs:(i + 1) * bs]))
            out.append(h)
        return out

    def _prefill_s(self, plan: _Plan) -> float:
        """Look the prompt up in the prefix cache (whole blocks; like vLLM, at most
        ``prompt_tokens - 1`` tokens hit, so one is always computed), count the query and the hit,
        and return the prefill time of the uncached tokens."""
        cfg, m = self.config, self.metrics
        cached = 0
        if cfg.enable_prefix_caching and plan.prompt_ids and "prefix_cache_never_hits" not in plan.faults:
            for h in self._block_hashes(plan, (len(plan.prompt_ids) - 1) // cfg.block_size):
                if h not in self.state.prefix_blocks:
                    break
                self.state.prefix_blocks.move_to_end(h)
                cached += cfg.block_size
        plan.cached_tokens = plan.record.cached_tokens = cached
        if cfg.enable_prefix_caching:
            m.prefix_queries.labels(cfg.served_name, "0").inc(plan.prompt_tokens)
            if "prefix_counter_frozen" not in plan.faults:
                m.prefix_hits.labels(cfg.served_name, "0").inc(cached)
        return (plan.prompt_tokens - cached) * cfg.prefill_s_per_token

    def _prefix_store(self, plan: _Plan) -> None:
        """Cache the prompt's whole blocks once prefilled (least recently used evicted beyond
        ``num_gpu_blocks``: the pool holds that many)."""
        cfg, cache = self.config, self.state.prefix_blocks
        if not cfg.enable_prefix_caching or not plan.prompt_ids:
            return
        for h in self._block_hashes(plan, len(plan.prompt_ids) // cfg.block_size):
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > max(1, cfg.num_gpu_blocks):
            cache.popitem(last=False)

    def _kv_short(self, plan: _Plan) -> bool:
        """leak_cancelled_kv: the KV pool, less the leaked blocks and those in use, cannot hold this
        prompt (and its first token): it is not admitted."""
        cfg, st = self.config, self.state
        if "leak_cancelled_kv" not in plan.faults or not st.leaked_kv_blocks:
            return False
        need = math.ceil((plan.prompt_tokens + 1) / cfg.block_size)
        return need > cfg.num_gpu_blocks - st.kv_blocks_used(cfg.block_size)

    def _admit_entry(self, rec: RequestRecord, entry: _Active, model: str) -> bool:
        rec.t_admitted = time.monotonic()
        self.metrics.queue.labels(model, "0").observe(rec.t_admitted - rec.t_received)
        self.state.active[rec.seq] = entry
        self.state.last_admitted = rec.t_admitted
        if "nondeterministic_concurrency" in self.config.faults and \
                len(self.state.active) > self.config.batch_invariant_max:
            for other in self.state.active.values():  # the batch each of them runs in is large now
                other.large_batch = True
        return True

    # ---- non-streaming -------------------------------------------------------------------------

    async def _wait_disconnect(self, request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    async def _collect(self, plan: _Plan) -> list[_Token]:
        out = []
        async with contextlib.aclosing(self._engine(plan)) as events:
            async for tok in events:
                out.append(tok)
        return out

    async def _complete_nonstream(self, request: Request, plan: _Plan) -> Response:
        work = asyncio.ensure_future(self._collect(plan))
        watcher = asyncio.ensure_future(self._wait_disconnect(request))
        route_s = self.config.route_timeout_s if "route_timeout" in plan.faults else None
        try:
            await asyncio.wait({work, watcher}, timeout=route_s, return_when=asyncio.FIRST_COMPLETED)
            if not work.done() and not watcher.done():  # the gateway's route timeout
                work.cancel()
                plan.record.status = 504
                return Response(b"<html><body><h1>504 Gateway Time-out</h1>upstream request timeout</body></html>",
                                status_code=504, media_type="text/html")
        finally:
            for t in (work, watcher):
                if not t.done():
                    t.cancel()
            await asyncio.gather(work, watcher, return_exceptions=True)
        exc = None if work.cancelled() else work.exception()
        if isinstance(exc, _EngineError):
            plan.record.status = 500
            return _error(str(exc), 500, "InternalServerError")
        if work.cancelled() or exc is not None:
            plan.record.status = 499  # client went away; nobody reads this answer
            return _error(f"request aborted: {exc!r}" if exc else "client disconnected", 500, "InternalServerError")
        tokens = work.result()
        rec = plan.record
        text = "".join(t.text for t in tokens)
        usage = self._usage(plan, len(tokens))
        if plan.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                       "audio": None, "function_call": None, "tool_calls": [],
                                       "reasoning_content": None}
            finish = plan.finish_reason
            if plan.special is not None:
                message, finish = self._special_message(plan, tokens)
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": {"content": [self._chat_lp(t, plan) for t in tokens]} if plan.logprobs is not None else None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            lp = self._cmpl_lp(tokens, plan, 0) if plan.logprobs is not None else None
            if plan.echo_ids:  # like vLLM: the prompt's text and tokens in front (its first token has no logprob)
                ids = [int(t) for t in plan.prompt_ids if isinstance(t, int) or str(t).isdigit()]
                text = self.tokenizer.decode(ids) + text
                if lp is not None:
                    shown = [f"token_id:{i}" if plan.ids_as_tokens else self.tokenizer.word(i) for i in ids]
                    lp = {"text_offset": [0] * len(ids) + lp["text_offset"], "tokens": shown + lp["tokens"],
                          "token_logprobs": [None] + [-1.0] * (len(ids) - 1) + lp["token_logprobs"],
                          "top_logprobs": [None] + [{w: -1.0} for w in shown[1:]] + lp["top_logprobs"]}
            choice = {
                "index": 0,
                "text": text,
                "logprobs": lp,
                "finish_reason": plan.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            obj = "text_completion"
        rec.t_first_byte = time.monotonic()
        return JSONResponse({"id": rec.id, "object": obj, "created": plan.created, "model": plan.model,
                             "choices": [choice], "usage": usage, "prompt_logprobs": None, "kv_transfer_params": None})

    def _spec_count(self, plan: _Plan, generated: int) -> None:
        """A finished request's speculative-decoding counters (2 tokens delivered a step: one accepted draft and the
        bonus token; k drafted); spec_counter_drafts adds the k-1 rejected a step to the generation counter."""
        k, model, m = plan.spec_k or 3, self.config.served_name, self.metrics
        steps = _spec_steps(generated)
        if plan.spec_k is not None:
            m.spec_drafts.labels(model, "0").inc(steps)
            m.spec_draft_tokens.labels(model, "0").inc(steps * k)
            m.spec_accepted.labels(model, "0").inc(generated - steps)
        if "spec_counter_drafts" in plan.faults:
            m.generation_tokens.labels(model, "0").inc(steps * (k - 1))
            self.state.generation_tokens_total += steps * (k - 1)

    @staticmethod
    def _usage(plan: _Plan, completion_tokens: int) -> dict[str, Any]:
        if "spec_usage_drafts" in plan.faults:  # the rejected drafts billed too
            completion_tokens += _spec_steps(completion_tokens) * ((plan.spec_k or 3) - 1)
        details = {"cached_tokens": plan.cached_tokens} if plan.details else None
        return {"prompt_tokens": plan.prompt_tokens, "total_tokens": plan.prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens, "prompt_tokens_details": details}

    @staticmethod
    def _chat_lp(t: _Token, plan: _Plan) -> dict[str, Any]:
        top = [{"token": t.token_str, "logprob": t.logprob, "bytes": list(t.token_str.encode())}] if plan.logprobs else []
        top += [{"token": s, "logprob": lp, "bytes": list(s.encode())} for s, lp in t.alternatives][: max(0, (plan.logprobs or 0) - 1)]
        return {"token": t.token_str, "logprob": t.logprob, "bytes": list(t.token_str.encode()),
                "top_logprobs": None if "top_logprobs_null" in plan.faults else top}

    @staticmethod
    def _cmpl_lp(tokens: list[_Token], plan: _Plan, offset: int) -> dict[str, Any]:
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t.text)
        k = max(1, plan.logprobs or 0)
        return {
            "text_offset": offsets,
            "token_logprobs": [t.logprob for t in tokens],
            "tokens": [t.token_str for t in tokens],
            "top_logprobs": [dict([(t.token_str, t.logprob)] + t.alternatives[: k - 1]) for t in tokens],
        }

    # ---- streaming -----------------------------------------------------------------------------

    def _chunk(self, plan: _Plan, tok: _Token | None, finish: str | None, text_offset: int,
               role: bool = False, sent: int = 0) -> dict[str, Any]:
        rec = plan.record
        text = tok.text if tok else ""
        if plan.echo is not None and tok is not None and tok.index == 0:
            text = plan.echo + text  # echo_prompt_first_delta
        if "split_utf8" in plan.faults and not text.isascii():
            raw = text.encode()
            text = raw[:-1].decode("utf-8", "replace")
        if finish is None and "finish_reason_empty" in plan.faults:
            finish = ""  # type: ignore[assignment]
        if plan.kind == "chat":
            if role:
                delta: dict[str, Any] = {"role": "assistant", "content": ""}
            elif tok is not None and tok.delta is not None:  # a features answer: reasoning, tool calls
                delta = dict(tok.delta)
            else:
                delta = {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if tok is not None and plan.logprobs is not None:
                choice["logprobs"] = {"content": [self._chat_lp(tok, plan)]}
            if finish is not None:
                choice["stop_reason"] = None
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
            if tok is not None and plan.logprobs is not None:
                choice["logprobs"] = self._cmpl_lp([tok], plan, text_offset)
            obj = "text_completion"
        chunk = {"id": rec.id, "object": obj, "created": plan.created, "model": plan.model, "choices": [choice]}
        if (plan.continuous_usage and plan.include_usage) or "usage_unasked" in plan.faults:
            chunk["usage"] = self._usage(plan, sent)
        return chunk

    @staticmethod
    def _frame(data: str, faults: frozenset[str]) -> str:
        """One SSE event as the framing faults write it (all allowed by the SSE spec)."""
        if "sse_event_fields" in faults:
            data = "event: message\n" + data
        if "sse_comments" in faults:
            data = ": ping\n\n" + data
        if "sse_crlf" in faults:
            data = data.replace("\n", "\r\n")
        return data

    async def _stream(self, plan: _Plan) -> AsyncIterator[str | bytes]:
        events = self._framed(plan)
        keepalive = next((f for f in _KEEPALIVE if f in plan.faults), None)
        if keepalive is not None:
            events = _keepalives(events, _KEEPALIVE[keepalive], self.config.keepalive_s)
        if "buffer_stream" in plan.faults:
            events = _buffered(events, self.config.buffer_bytes)
        async with contextlib.aclosing(events) as out:  # closed on disconnect too
            async for piece in out:
                yield piece

    async def _framed(self, plan: _Plan) -> AsyncIterator[str]:
        async for data in self._stream_events(plan):
            if "route_timeout" in plan.faults and time.monotonic() - plan.record.t_received > self.config.route_timeout_s:
                raise _CutConnection("route timeout")  # the gateway resets the stream: no [DONE]
            yield self._frame(data, plan.faults)

    async def _stream_events(self, plan: _Plan) -> AsyncIterator[str]:
        rec, faults = plan.record, plan.faults
        cut_at = max(1, len(plan.tokens) // 2) if "truncated_stream" in faults else None
        sent = 0
        try:
            async with contextlib.aclosing(self._stream_tokens(plan)) as chunks:  # closed on disconnect too
                async for data in chunks:
                    if sent == cut_at:
                        yield data[: len(data) // 2]  # half an event, then the connection drops
                        raise _CutConnection("truncated_stream")
                    yield data
                    sent += 1
                    if self.config.server == "llama-cpp-python" and len(self.state.inflight) > 1:
                        # its default interrupt_requests=True (llama_cpp/server/app.py get_event_publisher):
                        # another request waiting for the model ends this stream, [DONE] and no finish chunk
                        yield "data: [DONE]\n\n"
                        return
        except _EngineError as e:  # vLLM: an error event, then [DONE], on a 200 stream
            yield _sse({"error": {"message": str(e), "type": "InternalServerError", "param": None, "code": 500}})
            yield "data: [DONE]\n\n"
            return
        if plan.include_usage:
            completion = rec.completion_tokens + (1 if "stream_usage_mismatch" in faults else 0)
            yield _sse({"id": rec.id, "object": "chat.completion.chunk" if plan.kind == "chat" else "text_completion",
                        "created": plan.created, "model": plan.model, "choices": [],
                        "usage": self._usage(plan, completion)})
        if "missing_done" not in faults:
            yield "data: [DONE]\n\n"

    async def _stream_tokens(self, plan: _Plan) -> AsyncIterator[str]:
        rec, faults = plan.record, plan.faults
        dup_at = (len(plan.tokens) - 1) // 2
        offset = 0
        async with contextlib.aclosing(self._engine(plan)) as events:
            async for tok in events:
                if tok.index == 0 and plan.kind == "chat":
                    rec.t_first_byte = time.monotonic()
                    yield _sse(self._chunk(plan, None, None, 0, role=True))
                if "duplicate_deltas" in faults and tok.index == dup_at and tok.text:
                    yield _sse(self._chunk(plan, tok, None, offset, sent=rec.tokens_sent))
                rec.tokens_sent += 1
                data = _sse(self._chunk(plan, tok, tok.finish_reason, offset, sent=rec.tokens_sent))
                if rec.t_first_byte is None:
                    rec.t_first_byte = time.monotonic()
                yield data
                offset += len(tok.text)
                if tok.is_last and "two_finish_chunks" in faults:
                    yield _sse(self._chunk(plan, None, tok.finish_reason, offset, sent=rec.tokens_sent))


    # ---- issue 34: n > 1 (non-streamed), the Responses and Messages APIs -------------------------

    async def _generate_n(self, request: Request, body: dict[str, Any], kind: str) -> Response:
        """A non-streamed request with ``n`` > 1: ``n`` generations (seeds ``seed``, ``seed + 1``, ...),
        one choice each (index 0..n-1), usage summed like vLLM; ``n_one_choice``: the first alone."""
        if body["n"] > MAX_N:  # vLLM 0.32: "n must be at most 16384, got 1000000. To increase this limit, set the
            return self._reject(_BadRequest(f"n must be at most {MAX_N}, got {body['n']}.", suffix=False))  # VLLM_MAX_N_SEQUENCES ..."
        if body.get("temperature", 1.0) == 0:  # vLLM 0.32 refuses n > 1 with greedy sampling (measured: 400)
            return self._reject(_BadRequest("n must be 1 when using greedy sampling", param="n", value=body["n"]))
        n = 1 if "n_one_choice" in self.config.faults else body["n"]
        seed = body.get("seed") if isinstance(body.get("seed"), int) else 0
        choices, usage = [], None
        for i in range(n):
            rec = RequestRecord(id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", endpoint=kind,
                                stream=False, t_received=time.monotonic(), seq=len(self.state.requests))
            self.state.requests.append(rec)
            try:
                plan = self._admit({**body, "n": 1, "seed": seed + i}, kind, rec, frozenset(self.config.faults))
            except _BadRequest as e:
                rec.status = e.status
                return self._reject(e)
            if plan is None:
                return _error("EngineCore encountered an issue.", 500, "InternalServerError")
            resp = await self._complete_nonstream(request, plan)
            self._release(plan)
            one = json.loads(bytes(resp.body))
            if resp.status_code != 200:
                return resp
            choices.append({**one["choices"][0], "index": i})
            u = one["usage"]
            usage = u if usage is None else {**usage, "completion_tokens": usage["completion_tokens"] + u["completion_tokens"],
                                             "total_tokens": usage["total_tokens"] + u["completion_tokens"]}
            head = one
        return JSONResponse({**head, "choices": choices, "usage": usage})

    async def _translated(self, request: Request, body: dict[str, Any], chat: dict[str, Any],
                          shape: Callable[[_Plan, list[_Token]], dict[str, Any]],
                          events: Callable[[_Plan], AsyncIterator[str]]) -> Response:
        """Serve a Responses / Messages request as the chat request ``chat`` it amounts to: admitted
        like one, then answered in the API's own shape (``shape``) or stream (``events``)."""
        stream = bool(body.get("stream"))
        rec = RequestRecord(id=f"chatcmpl-{uuid.uuid4().hex}", endpoint="chat", stream=stream,
                            t_received=time.monotonic(), seq=len(self.state.requests))
        self.state.requests.append(rec)
        try:
            plan = self._admit(chat, "chat", rec, frozenset(self.config.faults))
        except _BadRequest as e:
            rec.status = e.status
            return self._reject(e)
        if plan is None:
            return _error("EngineCore encountered an issue.", 500, "InternalServerError")
        if stream:
            return _SSEResponse(events(plan), on_close=lambda: self._release(plan))
        try:
            tokens = await self._collect(plan)
        except _EngineError as e:
            return _error(str(e), 500, "InternalServerError")
        finally:
            self._release(plan)
        return JSONResponse(shape(plan, tokens))

    async def _responses(self, request: Request) -> Response:
        """``POST /v1/responses``: ``input`` (a string or messages), ``instructions``,
        ``max_output_tokens`` answered as a chat request; the Response object vLLM 0.32 answers
        (status ``incomplete`` with reason ``max_output_tokens`` when the limit cut it), or its event
        stream (:meth:`_response_events`)."""
        try:
            body = await self._json(request)
        except _BadRequest as e:
            return self._reject(e)
        kwargs = body.get("chat_template_kwargs")
        if "responses_template_kills" in self.config.faults and isinstance(kwargs, dict) and "chat_template" in kwargs:
            self.state.dead = True
        inp = body.get("input")
        messages = [{"role": "user", "content": inp}] if isinstance(inp, str) else inp
        if body.get("instructions"):
            messages = [{"role": "system", "content": body["instructions"]}, *(messages or [])]
        prev = body.get("previous_response_id")
        if prev is not None:
            if prev not in self._stored():
                return _error(f"Response with id '{prev}' not found.", 404, "NotFoundError")
            if "forget_previous_response" not in self.config.faults:
                messages = [*self._stored()[prev][0], *(messages or [])]
        chat = {k: body[k] for k in ("model", "temperature", "seed", "ignore_eos") if k in body}
        chat.update(messages=messages, max_tokens=body.get("max_output_tokens"))
        store = bool(body.get("store", True)) and self.config.responses_store and not body.get("stream")

        def shape(plan: _Plan, tokens: list[_Token]) -> dict[str, Any]:
            obj = self._response_obj(plan, tokens)
            if store:  # the conversation so far, for a later previous_response_id, and the object for GET
                turn = [*messages, {"role": "assistant", "content": "".join(t.text for t in tokens)}]
                self._stored()[obj["id"]] = (turn, obj)
            return obj

        return await self._translated(request, body, chat, shape, self._response_events)

    def _stored(self) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
        """Stored responses: id -> (the conversation including the answer, the Response object)."""
        if not hasattr(self, "_responses_store"):
            self._responses_store: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
        return self._responses_store

    async def _retrieve_response(self, request: Request) -> Response:
        """``GET /v1/responses/{id}``: the stored Response, else vLLM's 404."""
        rid = request.path_params["response_id"]
        if rid not in self._stored():
            return _error(f"Response with id '{rid}' not found.", 404, "NotFoundError")
        return JSONResponse(self._stored()[rid][1])

    def _response_obj(self, plan: _Plan, tokens: list[_Token], output: bool = True) -> dict[str, Any]:
        text = "".join(t.text for t in tokens)
        incomplete = plan.finish_reason == "length"
        item = {"id": f"msg_{plan.record.id[-16:]}", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}]}
        return {"id": f"resp_{plan.record.id[-16:]}", "object": "response", "created_at": plan.created,
                "model": plan.model, "status": "incomplete" if incomplete else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": None, "metadata": None, "output": [item] if output else [],
                "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "none", "tools": [], "top_p": 1.0,
                "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": len(tokens),
                          "total_tokens": plan.prompt_tokens + len(tokens),
                          "input_tokens_details": {"cached_tokens": 0} if "responses_no_cache_write_tokens" in
                          plan.faults else {"cached_tokens": 0, "cache_write_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}

    async def _response_events(self, plan: _Plan) -> AsyncIterator[str]:
        """The Responses event stream: response.created, in_progress, output_item.added,
        content_part.added, one output_text.delta per token with text, the .done events, then the
        terminal event of the response's status (the faults bend the end)."""
        faults, seq = plan.faults, 0

        def ev(type_: str, **fields: Any) -> str:
            nonlocal seq
            seq += 1
            return f"event: {type_}\n" + _sse({"type": type_, "sequence_number": seq - 1, **fields})

        start = {**self._response_obj(plan, [], output=False), "status": "in_progress", "incomplete_details": None}
        item_id = f"msg_{plan.record.id[-16:]}"
        yield ev("response.created", response=start)
        yield ev("response.in_progress", response=start)
        yield ev("response.output_item.added", output_index=0, item={"id": item_id, "type": "message",
                                                                    "role": "assistant", "status": "in_progress",
                                                                    "content": []})
        part = {"type": "output_text", "text": "", "annotations": []}
        yield ev("response.content_part.added", output_index=0, content_index=0, item_id=item_id, part=part)
        tokens: list[_Token] = []
        try:
            async with contextlib.aclosing(self._engine(plan)) as gen:
                async for tok in gen:
                    tokens.append(tok)
                    if tok.text:
                        yield ev("response.output_text.delta", output_index=0, content_index=0, item_id=item_id,
                                 delta=tok.text, logprobs=[])
        except _EngineError as e:  # like vLLM: an error event ends the stream
            yield ev("error", code="InternalServerError", message=str(e), param=None)
            return
        final = self._response_obj(plan, tokens, output="responses_empty_output" not in faults)
        text = "".join(t.text for t in tokens)
        yield ev("response.output_text.done", output_index=0, content_index=0, item_id=item_id, text=text, logprobs=[])
        yield ev("response.content_part.done", output_index=0, content_index=0, item_id=item_id,
                 part={**part, "text": text})
        yield ev("response.output_item.done", output_index=0, item=self._response_obj(plan, tokens)["output"][0])
        if "responses_no_terminal" in faults:
            return
        terminal = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        if "responses_completed_when_incomplete" in faults:
            terminal = "response.completed"
        yield ev(terminal, response=final["id"] if "responses_terminal_response_id" in faults else final)

    @staticmethod
    def _messages_chat(body: dict[str, Any]) -> dict[str, Any]:
        """The chat request a Messages body amounts to (``system`` first; ``stop_sequences`` as ``stop``)."""
        messages = list(body.get("messages") or [])
        if isinstance(body.get("system"), str):
            messages = [{"role": "system", "content": body["system"]}, *messages]
        chat = {k: body[k] for k in ("model", "temperature", "seed", "ignore_eos") if k in body}
        chat.update(messages=messages, max_tokens=body.get("max_tokens"), stop=body.get("stop_sequences"))
        return chat

    async def _messages(self, request: Request) -> Response:
        """``POST /v1/messages``: answered as a chat request; ``stop_reason`` mapped like vLLM's
        ``_to_anthropic_stop_reason`` (length -> max_tokens, a matched stop string -> stop_sequence
        naming it, else end_turn); streamed as message_start ... message_stop."""
        try:
            body = await self._json(request)
        except _BadRequest as e:
            return self._reject(e)
        return await self._translated(request, body, self._messages_chat(body), self._message_obj, self._message_events)

    @staticmethod
    def _stop_reason(plan: _Plan) -> tuple[str, str | None]:
        if plan.finish_reason == "length":
            return "max_tokens", None
        return ("stop_sequence", plan.stop_hit) if plan.stop_hit is not None else ("end_turn", None)

    def _message_obj(self, plan: _Plan, tokens: list[_Token]) -> dict[str, Any]:
        reason, seq = self._stop_reason(plan)
        return {"id": f"msg_{plan.record.id[-16:]}", "type": "message", "role": "assistant", "model": plan.model,
                "content": [{"type": "text", "text": "".join(t.text for t in tokens)}], "stop_reason": reason,
                "stop_sequence": seq, "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": len(tokens)}}

    async def _message_events(self, plan: _Plan) -> AsyncIterator[str]:
        def ev(obj: dict[str, Any]) -> str:
            return f"event: {obj['type']}\n" + _sse(obj)

        start = {**self._message_obj(plan, []), "content": [], "stop_reason": None, "stop_sequence": None}
        yield ev({"type": "message_start", "message": start})
        yield ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        yield ev({"type": "ping"})
        n = 0
        try:
            async with contextlib.aclosing(self._engine(plan)) as gen:
                async for tok in gen:
                    n += 1
                    if tok.text:
                        yield ev({"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": tok.text}})
        except _EngineError as e:  # Anthropic's error event ends the stream
            yield ev({"type": "error", "error": {"type": "api_error", "message": str(e)}})
            return
        yield ev({"type": "content_block_stop", "index": 0})
        reason, seq = self._stop_reason(plan)
        yield ev({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                  "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": n}})
        if "messages_no_stop" not in plan.faults:
            yield ev({"type": "message_stop"})

    async def _count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the chat template's count of the conversation."""
        try:
            body = await self._json(request)
            self._check_model(body)
            words = self.tokenizer.render_chat(self._messages_chat(body)["messages"], drop_roles=self._drop_roles)
        except _BadRequest as e:
            return self._reject(e)
        except ValueError as e:
            return self._reject(_BadRequest(str(e)))
        return JSONResponse({"input_tokens": len(words)})


def _apply_stop(tokens: list[_Token], finish: str, stop: Any, leak: bool) -> tuple[list[_Token], str, str | None]:
    """End the answer at the first stop string of ``stop`` (a string or a list) it contains, like
    vLLM: the tokens up to the one where the match ends are generated (and counted), the text ends
    right before the match, finish ``stop``; returns the matched string too (None: no match).
    ``leak`` (stop_fragment_leak, streamed): the text keeps the match's part inside the token where
    it began (a holdback cut mid-token)."""
    stops = [stop] if isinstance(stop, str) else [x for x in stop if isinstance(x, str) and x] \
        if isinstance(stop, list) else []
    text = "".join(t.text for t in tokens)
    hits = [(text.find(x), x) for x in stops if x in text]
    if not hits:
        return tokens, finish, None
    at, hit = min(hits)
    ends, pos = [], 0
    for t in tokens:
        pos += len(t.text)
        ends.append(pos)
    last = next(i for i, e in enumerate(ends) if e >= at + len(hit))
    cut = at
    if leak:
        cut = next(e for e in ends if e > at)  # the end of the token where the match began
    out, pos = [], 0
    for t in tokens[:last + 1]:
        keep = t.text[:max(0, cut - pos)]
        pos += len(t.text)
        out.append(dataclasses.replace(t, text=keep, is_last=False, finish_reason=None))
    out[-1].is_last, out[-1].finish_reason = True, "stop"
    return out, "stop", hit


# --------------------------------------------------------------------------------------------
# Runner and CLI
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def running_fake(config: FakeConfig | None = None, **overrides: Any) -> Iterator[str]:
    """Start a :class:`FakeVLLM` on a free loopback port; yield its base URL (no ``/v1``).

    Keep a reference to ``config`` to switch faults while it runs; use ``FakeVLLM`` directly when
    the test also needs ``state``.
    """
    fake = FakeVLLM(config, **overrides)
    with fake:
        assert fake.base_url is not None
        yield fake.base_url


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fakes.fake_vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fault", action="append", default=[], choices=sorted(FAULTS), help="repeatable")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--served-name", default=None)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any FakeConfig field, value parsed as JSON when it parses (repeatable)")
    p.add_argument("--list-faults", action="store_true")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    if args.list_faults:
        for name, desc in FAULTS.items():
            print(f"{name:24s} {desc}")
        return 0
    cfg = FakeConfig(faults=set(args.fault))
    if args.max_model_len is not None:
        cfg.max_model_len = args.max_model_len
    if args.served_name is not None:
        cfg.served_name = args.served_name
    names = {f.name for f in dataclasses.fields(FakeConfig)}
    for item in args.set:
        key, _, raw = item.partition("=")
        if key not in names:
            p.error(f"FakeConfig has no field {key!r}")
        setattr(cfg, key, _parse_value(raw))
    fake = FakeVLLM(cfg)
    sock = fake._bind(args.host, args.port)
    fake._sock = sock
    print(f"http://{args.host}:{sock.getsockname()[1]}", flush=True)
    server = fake._uvicorn(args.host, args.log_level)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
