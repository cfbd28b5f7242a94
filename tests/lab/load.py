"""Steady client load through a URL while something else happens: counts every failure."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Self

import httpx


class Background:
    """``_run`` on a thread of its own for the length of a ``with`` block: it runs until
    ``stopping`` is set, which leaving the block does before waiting for it."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()


class Load(Background):
    """``rate`` chat completions per second against ``url`` until stopped."""

    def __init__(self, url: str, api_key: str, model: str, rate: float = 25) -> None:
        super().__init__()
        self.url, self.rate, self.model = url.rstrip("/"), rate, model
        self.client = httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=120,
                                   limits=httpx.Limits(max_connections=64))
        self.results: Counter[str] = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.started = 0.0
        self.seconds = 0.0

    def _one(self) -> None:
        try:
            r = self.client.post(f"{self.url}/v1/chat/completions", json={
                "model": self.model, "max_tokens": 16,
                "messages": [{"role": "user", "content": "Count to three."}]})
            outcome = "ok" if r.status_code == 200 else f"HTTP {r.status_code}"
            detail = r.text[:200]
        except httpx.HTTPError as exc:
            outcome, detail = type(exc).__name__, str(exc)
        with self.lock:
            self.results[outcome] += 1
            if outcome != "ok":
                self.errors.append(f"{time.strftime('%H:%M:%S')} {outcome}: {detail}")

    def _run(self) -> None:
        with ThreadPoolExecutor(32) as pool:
            tick = self.started = time.monotonic()
            while not self.stopping.is_set():
                pool.submit(self._one)
                tick += 1 / self.rate
                time.sleep(max(0.0, tick - time.monotonic()))
        self.seconds = time.monotonic() - self.started

    @property
    def sent(self) -> int:
        return sum(self.results.values())

    @property
    def failed(self) -> int:
        return self.sent - self.results["ok"]
