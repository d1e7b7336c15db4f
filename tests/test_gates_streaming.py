"""gates/streaming.py: the single-request TTFT uses the same first-token rule as the load client."""

from kvgate.http.client import StreamReply
from kvgate.gates.streaming import first_token_s, stream_gaps

ROLE = '{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
TOKEN = '{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
FINISH = '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'


def reply(events):
    return StreamReply(status=200, events=events, elapsed_s=events[-1][0] if events else 0.0)


def test_chat_role_announcement_is_not_the_first_token():
    r = reply([(0.010, ROLE), (0.250, TOKEN), (0.260, FINISH), (0.261, "[DONE]")])
    assert first_token_s(r) == 0.250


def test_completions_first_text_chunk_is_the_first_token():
    r = reply([(0.120, '{"choices":[{"index":0,"text":"a","finish_reason":null}]}'), (0.2, "[DONE]")])
    assert first_token_s(r) == 0.120


def test_no_token_at_all_gives_none():
    assert first_token_s(reply([(0.01, ROLE), (0.02, FINISH), (0.03, "[DONE]")])) is None
    assert first_token_s(reply([(0.01, "not json"), (0.02, "[DONE]")])) is None


def test_gaps_count_the_silence_before_the_first_event():
    assert stream_gaps(reply([(0.5, ROLE), (0.75, TOKEN)])) == [0.5, 0.25]
