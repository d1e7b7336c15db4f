from kvgate.report.redact import MASK, Redactor, redact_url


def test_url_userinfo_and_secret_query_masked():
    assert redact_url("https://u:pw@h.example/v1?api_key=abc&x=1") == f"https://{MASK}@h.example/v1?api_key={MASK}&x=1"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_registered_secret_and_auth_headers_masked_in_nested_data():
    r = Redactor(["sk-live-123456"])
    data = {"msg": "sent sk-live-123456", "headers": {"Authorization": "Bearer other"},
            "log": ['authorization: Bearer zzz-top', {"api_key": "q"}]}
    out = r.data(data)
    flat = repr(out)
    assert "sk-live-123456" not in flat and "other" not in flat and "zzz-top" not in flat
    assert out["msg"] == f"sent {MASK}"


def test_short_strings_are_not_treated_as_secrets():
    r = Redactor(["ab"])
    assert r.text("abc") == "abc"


def test_short_placeholder_keys_never_rewrite_kvgate_words_or_ids():
    """vLLM servers without auth get keys like ``EMPTY``/``test``; a key ``PASS`` or ``tiny`` must
    not turn ``overall: PASS`` into ``***`` or ``tiny-cpu/fit`` into ``***-cpu/fit`` (found by a
    newcomer: summary.json then failed its own schema), yet stays masked as a token of its own."""
    from kvgate.report.redact import Redactor

    r = Redactor(["PASS", "tiny", "EMPTY"])
    assert r.text("tiny-cpu/fit/kv-pool -> PASS") == "tiny-cpu/fit/kv-pool -> PASS"
    assert r.data({"overall": "PASS", "id": "tiny-cpu/deployment"}) == {"overall": "PASS", "id": "tiny-cpu/deployment"}
    assert r.text("invalid api key EMPTY (got 'tiny')") == "invalid api key *** (got '***')"
    assert r.text("Authorization: Bearer PASS") == "Authorization: Bearer ***"
    long = Redactor(["sk-0123456789"])
    assert long.text("xsk-0123456789y") == "x***y"  # a real key is masked wherever it occurs
