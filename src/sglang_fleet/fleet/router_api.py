"""The router's worker API and the workers' own metrics, over HTTP from the operator's machine.

    router = Router("http://10.0.0.10:30080", api_key)
    router.remove("http://10.0.0.11:30000")      # new requests go elsewhere at once
    drained("http://10.0.0.11:30000", timeout=600)
    router.add("http://10.0.0.11:30000")
    router.wait_healthy("http://10.0.0.11:30000", timeout=120)

Measured with smg 1.13.0 and sglang-router 0.3.2: ``DELETE /workers/{id}`` takes the worker
out of routing at once and does not cut the requests already sent to it (they finish with 200);
``POST /workers`` and ``DELETE`` answer 202 and finish in the background. A worker added through
``POST /workers`` does not inherit the router's ``--api-key`` (both log a warning; smg then never
registers a worker that answers 401, 0.3.2 registers it as model ``unknown``): the payload
carries the worker's key. smg keeps a deleted worker listed as ``status: draining`` for 5 s
(its fixed drain settle time, smg/router_args.py) and answers 409 to a ``POST`` of a URL it
lists or is still registering (``WORKER_ALREADY_EXISTS``, ``WORKER_CREATE_IN_PROGRESS``);
0.3.2 drops the entry at once and queues a second registration.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from sglang_fleet.config import connection

RUNNING = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
DRAINING = "draining"  # smg's status of a removed worker (no new requests) until it is dropped


class RouterError(Exception):
    """The router refused or did not answer; the message says which and what it said."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Router:
    def __init__(self, url: str, api_key: str | None, timeout: float = 10,
                 worker_api_key: str | None = None) -> None:
        """``api_key`` opens the router's API; ``worker_api_key`` is what the router must send to
        the workers it is given (default: the same key, as when router and servers share the
        ``sglang-api-key`` secret)."""
        self.url = url.rstrip("/")
        self.worker_api_key = worker_api_key if worker_api_key is not None else api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self.http.request(method, path, **kw)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise RouterError(f"router {self.url}: {method} {path}: {exc}") from None
        if response.status_code >= 400:
            body = response.content[:200].decode(errors="replace").replace("\n", " ")
            raise RouterError(f"router {self.url}: {method} {path} answered "
                              f"{response.status_code}: {body}", response.status_code)
        try:
            return response.json() if response.content else None
        except ValueError:  # not JSON, or not UTF-8: not a router
            raise RouterError(f"router {self.url}: {method} {path} answered "
                              f"{response.status_code} but not JSON: {response.content[:80]!r} "
                              "(is it smg or sglang-router?)") from None

    def alive(self) -> bool:
        try:
            return self.http.get("/liveness").status_code == 200
        except (httpx.HTTPError, httpx.InvalidURL):
            return False

    def workers(self, routed_only: bool = False) -> dict[str, dict[str, Any]]:
        """Registered workers by URL; ``routed_only``: without those on their way out (smg's
        ``status: draining`` after a DELETE)."""
        answer = self._call("GET", "/workers")
        workers = answer.get("workers", []) if isinstance(answer, dict) else None
        if not isinstance(workers, list) or not all(
                isinstance(w, dict) and isinstance(w.get("url"), str) for w in workers):
            raise RouterError(f"router {self.url}: GET /workers answered something other than "
                              "a list of workers with URLs (is it smg or sglang-router?)")
        return {w["url"]: w for w in workers
                if not (routed_only and w.get("status") == DRAINING)}

    def add(self, url: str) -> bool:
        """Register ``url`` unless it is registered already (or, smg, being registered); True
        if it was added. A worker still draining after a removal is waited out first."""
        self._wait(lambda: self.workers().get(url, {}).get("status") != DRAINING, 30,
                   f"{url} to finish draining before it is added again")
        if url in self.workers():
            return False
        try:
            self._call("POST", "/workers", json=self.worker_payload(url))
        except RouterError as err:
            if err.status == 409:  # listed or registering meanwhile: what was asked
                return False
            raise
        return True

    def worker_payload(self, url: str) -> dict[str, str]:
        """``POST /workers`` body: ``{"url": ..., "api_key": ...}`` (the key only when set)."""
        return {"url": url, **({"api_key": self.worker_api_key} if self.worker_api_key else {})}

    def remove(self, url: str) -> bool:
        """Take ``url`` out of routing; True if it was registered."""
        worker = self.workers().get(url)
        if worker is None:
            return False
        if not isinstance(worker.get("id"), str | int):
            raise RouterError(f"router {self.url}: worker {url} has no id to remove it by")
        self._call("DELETE", f"/workers/{worker['id']}")
        self._wait(lambda: url not in self.workers(routed_only=True), 30,
                   f"{url} to leave the router")
        return True

    def wait_alive(self, timeout: float) -> None:
        self._wait(self.alive, timeout, "the router to answer")

    def wait_listed(self, urls: list[str], timeout: float) -> None:
        """Until each of ``urls`` is registered (smg lists a worker once it reached it)."""
        self._wait(lambda: set(urls) <= set(self.workers(routed_only=True)), timeout,
                   f"the router to list {', '.join(urls)}")

    def wait_healthy(self, url: str, timeout: float) -> None:
        self._wait(lambda: bool(self.workers().get(url, {}).get("is_healthy")), timeout,
                   f"the router to see {url} healthy")

    def rejoin(self, urls: list[str], timeout: float) -> Iterator[str]:
        """Add each of ``urls``, then yield each once the router sees it healthy. All are added
        before any is waited for, so the router's health checks of them overlap.

            for url in router.rejoin(urls, timeout=120):
                print(f"{url} healthy")
        """
        for url in urls:
            self.add(url)
        for url in urls:
            self.wait_healthy(url, timeout)
            yield url

    def _wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RouterError(f"router {self.url}: gave up waiting {timeout:.0f} s for {what}")
            time.sleep(0.5)


def in_flight(url: str) -> int | None:
    """Requests running or queued on a server, from its /metrics (None if it has none; a
    server in gRPC mode serves it on its side port)."""
    try:
        text = httpx.get(connection.metrics_url(url), timeout=5).text
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return None
    total, seen = 0.0, False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in RUNNING:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue  # a line that is not a sample: no metric to drain by
            seen = True
    return int(total) if seen else None


def drained(url: str, timeout: float, poll: float = 0.5) -> tuple[bool, int | None]:
    """Wait until ``url`` has nothing running or queued; (done, what is left) at the bound."""
    deadline = time.monotonic() + timeout
    while True:
        left = in_flight(url)
        if left == 0 or left is None:
            return left == 0, left
        if time.monotonic() > deadline:
            return False, left
        time.sleep(poll)
