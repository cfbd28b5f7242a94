"""The gate's accept length: return_meta_info exists from SGLang 0.5.13 (entrypoints/openai/
protocol.py); earlier releases ignore it, which the gate reports instead of printing nothing.
An answer that is not a chat completion is an error, never "not reported"."""

from __future__ import annotations

import http.server
import json
import re
import threading

import pytest

from sglang_fleet import cli
from sglang_fleet.stages.gate.host import check_server as gate_check
from sglang_fleet.stages.gate.host import gate_smoke


def smoke(accept: float | None, meta: bool | None, version: str | None) -> dict[str, object]:
    return {"answer": "4", "ttft_s": 0.1, "tokens_per_s": 50.0, "accept_length": accept,
            "meta_info": meta, "version": version}


def test_releases_with_and_without_meta_info() -> None:
    assert gate_smoke.meta_info_reported("0.5.12.post1") is False
    assert gate_smoke.meta_info_reported("0.5.13") is True
    assert gate_smoke.meta_info_reported(None) is None


def test_describe_says_why_there_is_no_accept_length() -> None:
    line = gate_smoke.describe(smoke(None, False, "0.5.12"))
    assert line.endswith("accept length not reported by this release (SGLang 0.5.12: "
                         "return_meta_info arrived in 0.5.13)")
    assert "accept length 2.85" in gate_smoke.describe(smoke(2.85, True, "0.5.23"))
    assert "not reported by this server" in gate_smoke.describe(smoke(None, None, None))
    assert "accept length" not in gate_smoke.describe(smoke(None, True, "0.5.23"))


def test_meta_info_of_a_valid_answer_with_and_without_it() -> None:
    where = "http://h/v1/chat/completions"
    assert gate_smoke.meta_info(200, b'{"choices": [{"message": {"content": "4"}}]}', where) == {}
    body = b'{"choices": [{"meta_info": {"spec_accept_length": 2.5}}]}'
    assert gate_smoke.meta_info(200, body, where) == {"spec_accept_length": 2.5}


@pytest.mark.parametrize(("status", "body", "says"), [
    (200, b"<html>502 Bad Gateway</html>", "answered 200 but not a chat completion"),
    (200, b'{"choices": []}', "answered 200 but not a chat completion"),
    (200, b'{"object": "error"}', "answered 200 but not a chat completion"),
    (200, b'{"choices": [{"meta_info": [1]}]}', "meta_info is list, not an object"),
    (200, b'{"choices": [{"meta_info": {"spec_accept_length": "2.5"}}]}',
     "spec_accept_length is '2.5', not a number"),
    (500, b"Internal Server Error", "answered 500: Internal Server Error"),
])
def test_a_broken_answer_is_an_error(status: int, body: bytes, says: str) -> None:
    with pytest.raises(gate_check.GateError, match=re.escape(says)):
        gate_smoke.meta_info(status, body, "http://h/v1/chat/completions")


def test_server_info_that_is_not_an_object_is_an_error() -> None:
    assert gate_check.server_info(200, b'{"version": "0.5.23"}') == {"version": "0.5.23"}
    with pytest.raises(gate_check.GateError, match="answered 200 but not a JSON object"):
        gate_check.server_info(200, b"[1, 2]")


class _BrokenMetaInfo(http.server.BaseHTTPRequestHandler):
    """A server whose streamed answer is fine and whose meta_info answer is not JSON."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("stream"):
            payload = (b'data: {"choices": [{"delta": {"content": "4"}}], "usage": '
                       b'{"completion_tokens": 1}}\n\ndata: [DONE]\n\n')
        else:
            payload = b"<html>upstream went away</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        payload = b'{"data": [{"id": "m"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def test_smoke_command_fails_on_a_broken_meta_info_answer(
        capsys: pytest.CaptureFixture[str]) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BrokenMetaInfo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert cli.main(["smoke", url]) == 1
        err = capsys.readouterr().err
        assert "(return_meta_info) answered 200 but not a chat completion" in err
        assert "not reported" not in err
    finally:
        server.shutdown()
        server.server_close()
