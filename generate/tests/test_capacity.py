"""Fleet sizing for generate: an answer that is missing is "not reported" (the fixed
--concurrency is used); a 200 whose body is not JSON is a broken server, an error."""

from __future__ import annotations

import asyncio
import json
from typing import cast

import httpx
import pytest

from sglang_fleet_generate import capacity
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.http_pool import Pool


class _Answers:
    """A Pool's get, answering each URL from a table (404 for the rest)."""

    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        self.answers = answers

    async def get(self, url: str, timeout: float) -> httpx.Response:
        status, body = self.answers.get(url, (404, b"not found"))
        return httpx.Response(status, content=body)


def sized(answers: dict[str, tuple[int, bytes]]) -> tuple[int | None, str]:
    return asyncio.run(capacity.fleet_capacity(cast(Pool, _Answers(answers)), "http://s"))


def test_a_server_without_workers_is_sized_from_its_server_info() -> None:
    assert sized({"http://s/server_info": (200, b'{"max_running_requests": 48}')})[0] == 48
    limit, how = sized({"http://s/server_info": (200, b'{"version": "0.5.23"}')})
    assert limit is None and "has no max_running_requests" in how  # valid, lacks the field


@pytest.mark.parametrize("url", ["http://s/workers", "http://s/server_info"])
def test_a_200_that_is_not_json_is_an_error(url: str) -> None:
    with pytest.raises(GenerateError, match="answered 200 but not JSON: b'<html>"):
        sized({url: (200, b"<html>proxy error</html>")})


def test_a_dp_server_is_sized_by_every_dp_rank() -> None:
    """--dp-size 8: max_running_requests is each replica's; internal_states has each DP rank's
    effective limit, which wins over the argument (the log's, not the command line's)."""
    states = [{"effective_max_running_requests_per_dp": 35}] * 8
    info = json.dumps({"max_running_requests": 48, "dp_size": 8, "internal_states": states})
    assert sized({"http://s/server_info": (200, info.encode())})[0] == 280
    bare = json.dumps({"max_running_requests": 48, "dp_size": 8})
    assert sized({"http://s/server_info": (200, bare.encode())})[0] == 384


def test_a_router_over_grpc_says_its_server_info_is_not_there() -> None:
    """smg 1.13.0 in front of gRPC workers: /workers needs the admin key, /readiness counts
    them, and /get_server_info is 501 (measured against the simulator in gRPC mode)."""
    limit, how = sized({"http://s/workers": (401, b"Invalid authentication token"),
                        "http://s/readiness": (200, b'{"status": "ready", "healthy_workers": 2}'),
                        "http://s/get_server_info": (501, b"Server info not implemented")})
    assert (limit, how) == (None, "http://s/get_server_info answered 501")
    limit, how = sized({"http://s/readiness": (200, b'{"healthy_workers": 0}')})
    assert (limit, how) == (None, "the router at http://s counts no healthy worker")
