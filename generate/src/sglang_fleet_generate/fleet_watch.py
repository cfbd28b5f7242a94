"""The fleet behind --url while a job runs: its size (the concurrency follows it, as workers
come and go during a roll), its health (the outage breaker's probe, and the pause and resume
it reports), the configuration that answers (its fingerprint: a job's records come from one
configuration unless --allow-mixed), and the model name when --model is not given.

    await job.pick_model(http)        # GET /v1/models, unless --model
    await job.size_fleet(http)        # the concurrency, from the fleet's capacity
    await job.take_fingerprint(http)  # refused if the job's records name another one
    asyncio.create_task(job.follow_fleet(http))   # every --refresh-s until the run ends
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from sglang_fleet_generate import capacity, fingerprint
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.http_pool import Pool
from sglang_fleet_generate.job_state import JobState
from sglang_fleet_generate.output_files import manifest_name

HEALTH_TIMEOUT_S = 30.0  # SGLang's /health_generate waits for a one-token generation


class FleetWatch(JobState):
    """``digest``: the fingerprint answering now; ``fingerprints``: every one the job's records
    name (kept on the manifest); ``halt``: set when it changed, so nothing more is committed."""

    # ---- size -------------------------------------------------------------------------------
    async def size_fleet(self, http: Pool) -> None:
        limit, how = await capacity.fleet_capacity(http, self.opts.url)
        if limit is None:
            limit, how = self.opts.concurrency, f"--concurrency (fleet not sized: {how})"
        self.resize(limit)
        self.display.event("concurrency", limit=limit, source=how)

    async def follow_fleet(self, http: Pool) -> None:
        """Resize to the fleet every refresh_s: workers come and go during a roll."""
        while True:
            await asyncio.sleep(self.opts.refresh_s)
            try:
                limit, how = await capacity.fleet_capacity(http, self.opts.url)
            except Exception as exc:  # an odd answer mid-roll: keep the last size
                limit, how = None, repr(exc)
            if limit and limit != self.limiter.limit:
                self.resize(limit)
                self.display.event("concurrency", limit=limit, source=how)
            await self.follow_fingerprint(http)

    def resize(self, limit: int) -> None:
        self.limiter.resize(limit)
        self.window.resize(2 * limit + 64)
        self.stats.concurrency = limit

    # ---- health: the outage breaker's probe and callbacks ----------------------------------
    async def health(self) -> str | None:
        """The fleet's health through --url (None: healthy), the outage breaker's probe."""
        url = f"{self.opts.url}/health_generate"
        assert self.http is not None
        try:
            # a new connection: a kept-alive one the server closed would say nothing of it
            response = await self.http.get(url, HEALTH_TIMEOUT_S, fresh=True)
        except httpx.HTTPError as exc:
            return f"GET /health_generate: {type(exc).__name__}"
        if response.status_code == 200:
            return None
        return f"GET /health_generate: HTTP {response.status_code}"

    def paused(self, cause: str) -> None:
        """Every request is failing and nothing is answered: lines wait instead of failing."""
        self.stats.pause_cause, self.stats.paused_since = cause, self.breaker.paused_since
        self.display.event("paused", cause=cause, waiting=self.window.busy,
                           probe="GET /health_generate, every 1 s doubling to 30 s")

    def resumed(self, seconds: float, cause: str) -> None:
        self.stats.paused_s += seconds
        self.stats.pause_cause = self.stats.paused_since = None
        self.display.event("resumed", paused_s=round(seconds, 1), cause=cause)

    # ---- fingerprint: which configuration answers ------------------------------------------
    async def take_fingerprint(self, http: Pool) -> None:
        """What answers now; refused if the job's records were answered by another fleet
        configuration, unless --allow-mixed (an unknown one, on either side, is no evidence
        of another: sglang-router 0.3.2 gives none through the router, smg does)."""
        found = await fingerprint.read(http, self.opts.url)
        digest, fields = (found.digest, found.fields) if found else (fingerprint.UNKNOWN, {})
        has_records = any(e["records"] for e in [*self.done.values(), *self.rounds.values()])
        if found is not None and self.known() and digest not in self.fingerprints and \
                has_records and not self.opts.allow_mixed:
            raise self.mixed(digest, fields, "")
        self.fingerprints[digest] = fields
        self.digest = digest
        self.display.event("fingerprint", digest=digest,
                           answered_by=fingerprint.describe(fields))

    def known(self) -> set[str]:
        """The fingerprints of this job's records that name a configuration."""
        return {d for d in self.fingerprints if d != fingerprint.UNKNOWN}

    async def follow_fingerprint(self, http: Pool) -> None:
        """A fleet whose configuration changed mid-run (a redeploy): with --allow-mixed the
        records after it name the new one; otherwise nothing more is committed and the run
        stops, naming both. A fingerprint read where none could be (a router changed to one
        that passes /get_server_info on) is learned, not a change, unless the job's earlier
        records name another."""
        found = await fingerprint.read(http, self.opts.url)
        if found is None or found.digest == self.digest or self.halt is not None:
            return
        learned = self.digest == fingerprint.UNKNOWN and (
            not self.known() or found.digest in self.fingerprints)
        if self.opts.allow_mixed or learned:
            self.fingerprints[found.digest] = found.fields
            self.digest = found.digest
            self.display.event("fingerprint", digest=found.digest, changed=not learned,
                               answered_by=fingerprint.describe(found.fields))
            return
        self.halt = self.mixed(found.digest, found.fields, " during this run")
        self.errors.append(self.halt)

    def mixed(self, digest: str, fields: dict[str, Any], when: str) -> GenerateError:
        old_digest = next(reversed(self.fingerprints)) if self.fingerprints else self.digest
        old = self.fingerprints.get(old_digest, {})
        return GenerateError(
            f"{self.store.location.rstrip('/')}/{manifest_name(self.share)}: this job's "
            f"records were answered by {fingerprint.describe(old)} [{old_digest}]; "
            f"{self.opts.url} answers{when} with {fingerprint.describe(fields)} [{digest}] "
            f"({fingerprint.differences(old, fields) or 'its fingerprint is unknown'})\n"
            f"    fix: redeploy the job's configuration, or rerun with "
            f"{fingerprint.MIXED_FLAG} to add records of this one (each record names its "
            "fingerprint), or write to another output")

    # ---- the model --------------------------------------------------------------------------
    async def pick_model(self, http: Pool) -> None:
        if self.opts.model:
            return
        url = f"{self.opts.url}/v1/models"
        try:
            response = await http.get(url, 10)
        except httpx.HTTPError as exc:
            raise GenerateError(f"{url}: {type(exc).__name__} {exc}; check --url") from None
        try:
            self.opts.model = str(response.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise GenerateError(f"{url} answered {response.status_code} without a model name"
                                + (" (check --api-key-file)" if response.status_code == 401
                                   else "; pass --model NAME")) from None
