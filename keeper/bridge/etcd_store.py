"""The bridge's durable records in etcd (``--store etcd://HOST:PORT[,...]``), and who acts.

Several bridges beside one exo cluster share one store; one of them acts (steps the keeper, calls
exo's mutating routes), the others stand by with a live view and serve the API. The records stay
event-sourced, the same numbered events the local log holds (``keeper.runtime.event_store``):

- ``PREFIX/log/<idx, 12 digits>``: one event each. A batch is appended in one transaction that
  succeeds only if its keys do not exist yet (``create_revision == 0``): a total order, and
  optimistic concurrency for writes from any bridge. A writer that lost the race reads what it
  missed (``StoreMovedOnError``) and its command is validated again on the newer State, so of two
  bridges creating one model exactly one wins and the other answers 409.
- ``PREFIX/snapshot``: the State every ``snapshot_every`` events; the log keys it covers are then
  deleted (compaction). A reader behind the snapshot reloads it.
- ``PREFIX/leader``: the acting bridge's name, under an etcd lease of ``--lease-s`` seconds,
  renewed every ``renew_every_s``. A bridge acts only while its last renewal is younger than the
  renew deadline (two thirds of the lease, as client-go's leader election stops before the lease
  can lapse), so when etcd stops answering it stops acting before anyone else could start.
- ``PREFIX/intent/<instance id>``, ``PREFIX/doomed/<instance id>``: the acting bridge's exo calls,
  recorded before each is sent in a transaction that succeeds only while the leader key is still
  the one this bridge created (``fence``): a bridge that lost its lease never sends a call, and a
  new leader resumes the recorded creations (the same instance id: idempotent in exo) and
  deletions instead of placing anew. Deletions asked through any bridge are written with the
  events that call for them, in the same transaction.
- ``PREFIX/cluster``: the exo node ids the prefix belongs to (``check_cluster``).

Why etcd's JSON gateway over httpx, not a gRPC client: figures and reasons in README's dependency
list. Writes are synchronous calls with a short timeout, like the local log's fsync in
``commit_now``: the bridge records a few events a minute, a write costs a few milliseconds, and
the command that needs one can then validate and record in one stretch no other task interleaves.
While the store does not answer, writes are refused at once (503 naming the store) instead of
waiting on each; the lease loop's next good answer clears that.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import anyio
import anyio.to_thread
import httpx

from keeper.bridge.etcd_access import StoreAccess, StoreAddress, parse_store_url
from keeper.bridge.etcd_gateway import REQUEST_TIMEOUT_S, EtcdUnavailableError, Gateway
from keeper.bridge.etcd_gateway import b64 as _b64
from keeper.bridge.etcd_gateway import unb64 as _unb64
from keeper.model.apply import apply_all
from keeper.model.events import AnyEvent, IndexedEvent
from keeper.model.state import State
from keeper.runtime.event_store import LogNotWritableError
from keeper.runtime.starting import MasterStartError

log = logging.getLogger(__name__)

__all__ = [
    "EtcdStore",
    "EtcdUnavailableError",
    "NotActingError",
    "OutcomeUnknownError",
    "StoreAccess",
    "StoreAddress",
    "StoreError",
    "StoreMovedOnError",
    "check_prefix",
    "parse_store_url",
]

DEFAULT_PREFIX = "/exo-deploy/"
DEFAULT_LEASE_S = 5.0
# Renewals: once a second (etcd's own clients renew at a third of the TTL; a second is finer and
# still one small request), faster for leases under four seconds so a slow answer is not fatal.
RENEW_EVERY_S = 1.0
# The share of the lease after which a bridge that could not renew stops acting: the rest is the
# margin between "I stopped" and "another may start" (client-go: 10 s of a 15 s lease).
RENEW_DEADLINE_SHARE = 2.0 / 3.0
# A write whose answer did not come is tried again (the same transaction: its compares make a
# second landing impossible) until it is settled or this long has passed since it was first sent:
# three tries of a second, well under the CLI's 10 s, then the API answers "outcome unknown".
WRITE_DEADLINE_S = 3.0
# A try with less time left than this is not worth sending: the answer would not come in time.
MIN_TRY_S = 0.05
# Digits of a log key: sorted as text, they are sorted as numbers (a trillion events).
IDX_DIGITS = 12
# A command racing other bridges re-validates at most this often before it gives up (a 503).
COMMAND_TRIES = 8
# Between two tries of a broken watch: long enough not to spin, short enough to look live.
WATCH_RETRY_S = 0.5
# The first read, at start-up, may wait this long for each answer: a bridge started beside a busy
# etcd (its first TLS handshake, the password's bcrypt) must not exit for a slow answer, while a
# refused connection still fails at once. Later reads keep the lease's short timeout.
STARTUP_TIMEOUT_S = 5.0


class StoreError(LogNotWritableError):
    """The store did not take the write (unreachable, no quorum): a 503 naming the store."""


class OutcomeUnknownError(StoreError):
    """A write was sent and no answer came within its deadline: it may yet apply (a 503 that
    says so, never "nothing was changed"; docs/design.md §8.5)."""


class StoreMovedOnError(Exception):
    """Another bridge wrote first: the view is caught up, validate the command again."""


class NotActingError(Exception):
    """A fenced write refused: this bridge no longer holds the leader key."""


def check_prefix(prefix: str) -> str:
    if not prefix.startswith("/") or not prefix.endswith("/") or len(prefix) < 2:
        raise MasterStartError(f"--store-prefix {prefix!r}: expected /NAME/ (slashes both ends)")
    return prefix


def _prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def landed(answer: Mapping[str, Any], value: str) -> bool:
    """Whether a failed append's answer shows ``value`` at its first log key (the range its
    failure branch reads): an earlier try of the same append, whose answer was lost, landed."""
    responses = cast(list[dict[str, Any]], answer.get("responses") or [])
    if not responses:
        return False
    kvs = cast(list[dict[str, Any]], responses[0].get("response_range", {}).get("kvs") or [])
    return bool(kvs) and kvs[0].get("value") == _b64(value)


def put_op(key: str, value: str, lease: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease is not None:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: str, end: str | None = None) -> dict[str, Any]:
    body = {"key": _b64(key)}
    if end is not None:
        body["range_end"] = _b64(end)
    return {"request_delete_range": body}


def range_op(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


def created_is(key: str, revision: int) -> dict[str, Any]:
    return {
        "key": _b64(key),
        "target": "CREATE",
        "result": "EQUAL",
        "create_revision": str(revision),
    }


class EtcdStore:
    """The bridge's State from the etcd log, its writes, its leadership (module doc)."""

    def __init__(
        self,
        address: StoreAddress,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        lease_s: float = DEFAULT_LEASE_S,
        snapshot_every: int = 1_000,
        monotonic: Callable[[], float] = time.monotonic,
        access: StoreAccess | None = None,
    ) -> None:
        self.address = address
        self.name = name
        self.prefix = prefix
        self.lease_s = lease_s
        self.renew_every_s = min(RENEW_EVERY_S, lease_s / 4)
        self.renew_deadline_s = lease_s * RENEW_DEADLINE_SHARE
        self.snapshot_every = snapshot_every
        self._monotonic = monotonic
        self._timeout_s = min(REQUEST_TIMEOUT_S, self.renew_every_s)
        self._gateway = Gateway(address, self._timeout_s, access)
        self._state = State()
        self._revision = 0  # the store revision the view has read up to
        self._since_snapshot = 0
        self.write_error: str | None = None
        self.unreachable_since: float | None = None  # monotonic
        self.watching = False
        # leadership
        self.leader: str | None = None
        self._lease: int | None = None
        self._leader_rev: int | None = None  # create revision of the leader key I made
        self._renewed_at: float | None = None  # monotonic, before the renewal that succeeded

    # --- keys ---------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _log_key(self, idx: int) -> str:
        return f"{self.prefix}log/{idx:0{IDX_DIGITS}d}"

    # --- reading ------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def next_idx(self) -> int:
        return self._state.last_event_applied_idx + 1

    @property
    def stale(self) -> bool:
        """Whether the view may miss what other bridges wrote (the store is not answering)."""
        return self.unreachable_since is not None or not self.watching

    @property
    def acting(self) -> bool:
        renewed = self._renewed_at
        return (
            self._leader_rev is not None
            and renewed is not None
            and self._monotonic() - renewed < self.renew_deadline_s
        )

    def open(self, node_ids: Iterable[str] = ()) -> None:
        """Read the snapshot and the log after it, then check the prefix is this exo cluster's
        (``check_cluster`` with ``node_ids``); MasterStartError (exit 2) if unreachable or not."""
        try:
            self._catch_up(STARTUP_TIMEOUT_S)
            foreign = self.check_cluster(node_ids, STARTUP_TIMEOUT_S)
        except EtcdUnavailableError as exc:
            said = str(exc) if exc.refused else f"etcd not reachable ({exc})"
            raise MasterStartError(f"--store {self.address.url}: {said}") from None
        if foreign is not None:
            raise MasterStartError(f"--store {self.address.url}: {foreign}")

    def _catch_up(self, timeout_s: float | None = None) -> None:
        """Apply what the log holds past the view; reload the snapshot if the log was compacted."""
        while True:
            kvs, revision = self._gateway.range(
                self._log_key(self.next_idx), _prefix_end(self._key("log/")), timeout_s
            )
            events = [IndexedEvent.model_validate_json(_unb64(kv["value"])) for kv in kvs]
            gap = bool(events) and events[0].idx != self.next_idx
            if (gap or (not events and self.next_idx == 0)) and self._load_snapshot(timeout_s):
                continue
            break
        if events and events[0].idx == self.next_idx:
            self._apply(events)
        self._revision = max(self._revision, revision)

    def _load_snapshot(self, timeout_s: float | None = None) -> bool:
        kvs, _ = self._gateway.range(self._key("snapshot"), timeout_s=timeout_s)
        if not kvs:
            return False
        state = State.model_validate_json(_unb64(kvs[0]["value"]))
        if state.last_event_applied_idx < self.next_idx:
            return False
        self._state = state
        return True

    def _apply(self, events: Sequence[IndexedEvent]) -> None:
        fresh = [event for event in events if event.idx >= self.next_idx]
        if fresh and fresh[0].idx == self.next_idx:
            self._state = apply_all(self._state, fresh)
            self._since_snapshot += len(fresh)

    def read_prefix(self, name: str) -> dict[str, str]:
        """Every key under ``PREFIX/name`` (without the prefix) and its value."""
        kvs, _ = self._gateway.range(self._key(name), _prefix_end(self._key(name)))
        start = len(self._key(name))
        return {_unb64(kv["key"])[start:]: _unb64(kv.get("value", "")) for kv in kvs}

    # --- writing ------------------------------------------------------------------------------

    def commit_now(
        self,
        events: Sequence[AnyEvent],
        *,
        fenced: bool = False,
        doomed: Iterable[str] = (),
        drop: Iterable[str] = (),
    ) -> list[IndexedEvent]:
        """Append ``events`` after the view's last, put ``doomed`` keys and delete the ``drop``
        keys (under the prefix), in one transaction.

        ``StoreMovedOnError`` when another bridge wrote first (the view is caught up: validate
        again); ``StoreError`` (503) when the store does not answer; ``NotActingError`` for a
        ``fenced`` write of a bridge that no longer leads."""
        doomed = list(doomed)
        if not events and not doomed:
            return []
        if self.write_error is not None:
            raise StoreError(f"{self.write_error}; nothing was changed")
        first = self.next_idx
        indexed = [
            IndexedEvent.model_construct(idx=first + offset, event=event)
            for offset, event in enumerate(events)
        ]
        compare = [created_is(self._log_key(item.idx), 0) for item in indexed]
        if fenced:
            compare.append(self._fence_compare())
        success = [put_op(self._log_key(item.idx), item.model_dump_json()) for item in indexed]
        success += [put_op(self._key(f"doomed/{instance_id}"), "") for instance_id in doomed]
        success += [delete_op(self._key(key)) for key in drop]
        first_value = indexed[0].model_dump_json() if indexed else None
        failure = [range_op(self._log_key(first))] if indexed else []
        answer, retried = self._settled_txn(compare, success, failure)
        if not answer.get("succeeded"):
            if retried and first_value is not None and landed(answer, first_value):
                # An earlier try landed, its answer lost: done, once (its compares held).
                kv = answer["responses"][0]["response_range"]["kvs"][0]
                self._apply(indexed)
                self._revision = max(self._revision, int(kv["mod_revision"]))
                return indexed
            self._catch_up_or_unreachable()
            if fenced and not self._still_leader():
                raise NotActingError("this bridge no longer holds the leader key")
            raise StoreMovedOnError
        self._state = apply_all(self._state, indexed)
        self._since_snapshot += len(indexed)
        self._revision = max(self._revision, int(answer["header"]["revision"]))
        return indexed

    def _settled_txn(
        self,
        compare: Sequence[Mapping[str, Any]],
        success: Sequence[Mapping[str, Any]],
        failure: Sequence[Mapping[str, Any]],
    ) -> tuple[dict[str, Any], bool]:
        """The answer to an append, and whether an earlier try may have landed first.

        A try that failed before it was sent is "nothing was changed". One whose answer never
        came (a read timeout, a dropped connection, etcd's own timeout) is sent again, the same
        transaction: if the first landed, the compares now fail and the failure branch shows
        the first log key (``landed``); if not, the first can never land after this one. Until
        ``WRITE_DEADLINE_S`` after the first try; then ``OutcomeUnknownError``."""
        deadline = self._monotonic() + WRITE_DEADLINE_S
        maybe_sent = False
        while True:
            remaining = deadline - self._monotonic()
            try:
                answer = self._gateway.txn(
                    compare, success, failure, timeout_s=min(self._timeout_s, remaining)
                )
            except EtcdUnavailableError as exc:
                self.unreachable(str(exc), refused=exc.refused)
                maybe_sent = maybe_sent or exc.maybe_sent
                if not maybe_sent:
                    raise StoreError(f"{self.write_error}; nothing was changed") from None
                if deadline - self._monotonic() < MIN_TRY_S:
                    raise OutcomeUnknownError(
                        f"outcome unknown: the write was sent to the store and no answer came "
                        f"in {WRITE_DEADLINE_S:g} s ({self.write_error}); it may yet apply: "
                        "check with GET /deployments"
                    ) from None
                continue
            if maybe_sent:
                self.reachable()
            return answer, maybe_sent

    def _catch_up_or_unreachable(self) -> None:
        try:
            self._catch_up()
        except EtcdUnavailableError as exc:
            self.unreachable(str(exc), refused=exc.refused)
            raise StoreError(f"{self.write_error}; nothing was changed") from None

    def commit_retrying(
        self, events: Sequence[AnyEvent], *, fenced: bool, drop: Iterable[str] = ()
    ) -> list[IndexedEvent]:
        """``commit_now`` of records that stay true whoever wrote before them (the tick's)."""
        drop = list(drop)
        for _ in range(COMMAND_TRIES):
            try:
                return self.commit_now(events, fenced=fenced, drop=drop)
            except StoreMovedOnError:
                continue
        raise StoreError(f"store {self.address.url}: too many concurrent writers; retrying")

    def snapshot_now_if_due(self) -> None:
        if self._since_snapshot < self.snapshot_every or not self.acting:
            return
        state = self._state
        try:
            self._gateway.txn(
                [self._fence_compare()],
                [
                    put_op(self._key("snapshot"), state.model_dump_json()),
                    delete_op(self._log_key(0), self._log_key(state.last_event_applied_idx + 1)),
                ],
            )
        except EtcdUnavailableError as exc:
            log.warning("store snapshot not written (%s); the log holds every event", exc)
            return
        self._since_snapshot = 0

    def probe(self, *, always: bool = False) -> bool:
        del always
        return self.write_error is None

    # --- fencing ------------------------------------------------------------------------------

    def _fence_compare(self) -> dict[str, Any]:
        return created_is(self._key("leader"), self._leader_rev if self._leader_rev else -1)

    def _still_leader(self) -> bool:
        try:
            kvs, _ = self._gateway.range(self._key("leader"))
        except EtcdUnavailableError:
            return False
        mine = bool(kvs) and int(kvs[0].get("create_revision", 0)) == self._leader_rev
        if not mine:
            self._lost("the leader key is no longer this bridge's")
        return mine

    def fence(self, puts: Mapping[str, str], deletes: Iterable[str] = ()) -> bool:
        """Record ``puts`` (and drop ``deletes``), keys under the prefix, only while this bridge
        acts: True if written, so the exo call they announce may be sent."""
        if not self.acting:
            return False
        ops = [put_op(self._key(key), value) for key, value in puts.items()]
        ops += [delete_op(self._key(key)) for key in deletes]
        try:
            answer = self._gateway.txn([self._fence_compare()], ops)
        except EtcdUnavailableError as exc:
            self.unreachable(str(exc), refused=exc.refused)
            return False
        if not answer.get("succeeded"):
            self._lost("a fenced write found another leader")
            return False
        # Still acting after the round trip: a bridge paused (SIGSTOP, a laptop's sleep) in the
        # middle of the write wakes with its lease run out and sends nothing on its strength.
        return self.acting

    # --- the store's health -------------------------------------------------------------------

    def unreachable(self, why: str, *, refused: bool = False) -> None:
        """The store did not answer (or, ``refused``, refused this bridge's credentials): every
        change is refused naming it, in ``/healthz`` too, until an answer comes."""
        state = "refuses this bridge" if refused else "unreachable"
        error = f"store {self.address.url} {state}: {why}"
        if self.unreachable_since is None or error != self.write_error:
            log.error("%s; refusing changes", error)
        if self.unreachable_since is None:
            self.unreachable_since = self._monotonic()
        self.write_error = error

    def reachable(self) -> None:
        if self.unreachable_since is not None:
            log.warning("store %s answers again", self.address.url)
        self.unreachable_since = None
        self.write_error = None

    # --- leadership ---------------------------------------------------------------------------

    def _lost(self, why: str) -> None:
        if self._leader_rev is not None:
            log.warning("%s stops acting: %s", self.name, why)
        self._leader_rev = None
        self._renewed_at = None

    def campaign_once(self) -> None:
        """One round: a lease if none, the leader key if free, a renewal if mine (sync)."""
        now = self._monotonic()
        if self._lease is not None:
            answer = self._gateway.call("/v3/lease/keepalive", {"ID": str(self._lease)})
            if int(answer.get("result", {}).get("TTL", 0)) <= 0:  # expired: the key went with it
                self._lease = None
                self.leader = None
                self._lost("its lease expired")
        if self._lease is None:
            answer = self._gateway.call(
                "/v3/lease/grant", {"TTL": str(max(1, round(self.lease_s)))}
            )
            self._lease = int(answer["ID"])
        lease_started = now
        key = self._key("leader")
        answer = self._gateway.txn(
            [created_is(key, 0)], [put_op(key, self.name, self._lease)], [range_op(key)]
        )
        if answer.get("succeeded"):
            self._leader_rev = int(answer["header"]["revision"])
            self.leader = self.name
            log.info("%s acts (leader key at revision %d)", self.name, self._leader_rev)
        else:
            kvs = answer["responses"][0]["response_range"].get("kvs", [])
            holder = kvs[0] if kvs else None
            if holder is None:
                self.leader = None
            else:
                self.leader = _unb64(holder.get("value", ""))
                if int(holder.get("lease", 0)) == self._lease:
                    self._leader_rev = int(holder["create_revision"])
                else:
                    self._lost(f"{self.leader} holds the leader key")
        if self._leader_rev is not None:
            self._renewed_at = lease_started

    async def campaign(self) -> None:
        """Campaign and renew every ``renew_every_s`` until cancelled."""
        while True:
            started = self._monotonic()
            try:
                await anyio.to_thread.run_sync(self.campaign_once)
            except EtcdUnavailableError as exc:
                self.unreachable(str(exc), refused=exc.refused)
            except (KeyError, ValueError) as exc:
                log.warning("unexpected answer from the store: %s", exc)
            else:
                self.reachable()
            await anyio.sleep(max(0.0, self.renew_every_s - (self._monotonic() - started)))

    def resign(self) -> None:
        """Give the leader key up at once (a clean stop): a standby takes over without waiting."""
        lease, self._lease = self._lease, None
        self._lost("it stops")
        if lease is not None:
            with contextlib.suppress(EtcdUnavailableError):
                self._gateway.call("/v3/lease/revoke", {"ID": str(lease)})

    # --- the live view ------------------------------------------------------------------------

    async def watch(self) -> None:
        """Follow the log from the view's revision until cancelled; reconnect when it breaks."""
        async with httpx.AsyncClient(
            trust_env=False, timeout=httpx.Timeout(5.0, read=None), verify=self._gateway.verify
        ) as http:
            while True:
                for endpoint in self.address.endpoints:
                    try:
                        await self._watch_from(http, endpoint)
                    except (httpx.HTTPError, EtcdUnavailableError, ValueError, KeyError) as exc:
                        log.debug("watch on %s broke: %s", endpoint, exc)
                    self.watching = False
                    await anyio.sleep(WATCH_RETRY_S)

    async def _watch_from(self, http: httpx.AsyncClient, endpoint: str) -> None:
        self._catch_up()
        body = {
            "create_request": {
                "key": _b64(self._key("log/")),
                "range_end": _b64(_prefix_end(self._key("log/"))),
                "start_revision": str(self._revision + 1),
            }
        }
        async with http.stream(
            "POST",
            self.address.http_url(endpoint, "/v3/watch"),
            json=body,
            headers=self._gateway.headers(),
        ) as stream:
            async for line in stream.aiter_lines():
                if not line.strip():
                    continue
                result = json.loads(line).get("result", {})
                if result.get("created"):
                    self.watching = True
                if result.get("compact_revision") or result.get("canceled"):
                    return  # fell behind a compaction: catch up and watch again
                events: list[IndexedEvent] = []
                for item in result.get("events", []):
                    if item.get("type") == "DELETE":
                        continue
                    events.append(IndexedEvent.model_validate_json(_unb64(item["kv"]["value"])))
                if events:
                    if events[0].idx > self.next_idx:
                        self._catch_up()
                    else:
                        self._apply(events)
                self._revision = max(self._revision, int(result["header"]["revision"]))

    def close(self) -> None:
        self.resign()
        self._gateway.close()

    # --- the exo cluster this prefix belongs to -----------------------------------------------

    def check_cluster(self, node_ids: Iterable[str], timeout_s: float | None = None) -> str | None:
        """Why the prefix belongs to another exo cluster (no node in common), or None; records
        the nodes seen: the first bridge's, then any that join, written by the acting bridge."""
        seen = sorted(set(node_ids))
        if not seen:
            return None
        kvs, _ = self._gateway.range(self._key("cluster"), timeout_s=timeout_s)
        recorded: list[str] = json.loads(_unb64(kvs[0]["value"])) if kvs else []
        if recorded and not set(recorded) & set(seen):
            return (
                f"store prefix {self.prefix} belongs to another exo cluster (nodes "
                f"{', '.join(recorded[:3])}...; this exo has {', '.join(seen[:3])}): use "
                "another --store-prefix"
            )
        union = sorted(set(recorded) | set(seen))
        if union != recorded and (self.acting or not recorded):
            key = self._key("cluster")
            if kvs:
                compare = [
                    {
                        "key": _b64(key),
                        "target": "MOD",
                        "result": "EQUAL",
                        "mod_revision": kvs[0]["mod_revision"],
                    }
                ]
            else:
                compare = [created_is(key, 0)]
            self._gateway.txn(compare, [put_op(key, json.dumps(union))], timeout_s=timeout_s)
        return None
