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
