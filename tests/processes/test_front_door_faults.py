"""Four clients through the bridge's front door through every fault, on real processes and
signals, against four clients straight to exo in the same run (docs/design.md §8.6).

The stand-in for a stock exo (``exo-deploy master --exo-compat``: chats routed to the instance
with the fewest in flight, ready or not, held until it is ready, closed when it is deleted,
exo's 404 when there is none; §7.5), three ``exo-deploy node`` processes and ``exo-deploy
bridge`` with fast failover, all as processes (``tests/standin_processes.py``). Qwen3-0.6B at
one instance; four clients stream chats one after another through the bridge's front door and
four straight to the stand-in, each chat long enough (2 s) that a fault lands mid-answer. One
test a fault, each on the node serving the model:

- ``kill -9`` of its process group;
- a 15 s freeze (SIGSTOP, SIGCONT 15 s later): past the bridge's dead-after (8 s), short of
  exo's own 30 s timeout;
- a runner crash (``RUNNER_KILL_SIGNAL``: its runner dies, the process stays up and starts it
  again with exo's backoff);
- exo's master changing: the stand-in killed -9 and a new one started on its port from an empty
  State, as a stock exo's new master starts (every instance gone, chats 404 "No instance found"
  until the model is placed again).

Each chat is counted as ``tests/front_door_clients.py`` counts it (answered whole, failed, cut,
hung). Through the front door none may fail, be cut or hang, chats must be answered after the
fault, and the door must have had work (chats continued, sent again or held); straight to exo
the fault must have cost something, or it did not land. Both counts print on one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import pytest
from front_door_clients import CLIENTS, Tally, start_clients
from metrics_scrape import scrape
from standin_processes import StandinWithBridge, poll, standin_with_bridge

from keeper.model.master_change import MASTER_CHANGED

pytestmark = pytest.mark.e2e

# Tokens per chat: 2 s of a simulated node's answer (20 tokens/s), so with four clients each
# side has about four chats in flight at any moment and a fault finds some mid-answer.
TOKENS = 40
# Chats answered through the door before the fault: one per client, so every client is
# chatting steadily when it lands.
BEFORE = CLIENTS
# Chats answered through the door once the model serves again: two per client shows the door
# serving on what exo serves after the fault.
AFTER = 2 * CLIENTS
# After a chat that was not answered a client waits this long before its next, on both sides,
# as a client that retries does: without it, exo's instant refusals during an outage (a refused
# connection, a 404) would count one outage hundreds of times.
RETRY_PAUSE_S = 1.0
# The freeze's length: past the bridge's dead-after (8 s), so the door's chats on the frozen
# node must be continued elsewhere, and short of exo's own 30 s node timeout.
FREEZE_S = 15.0
# How long the model may take to serve again after a fault: the bridge's 8 s dead-after and a
# load; for a new master, its start and the nodes reconnecting (their backoff reaches 5 s).
RECOVERY_S = 60.0
# Waits for chats answered: at 2 s a chat, four clients answer two a second; this only bounds a
# broken run.
CHATS_S = 60.0
# The bridge's history has the incident once it is resolved: within a poll or two of serving.
HISTORY_S = 10.0
# The door's own counts, by outcome, from the bridge's /metrics.
DOOR_OUTCOMES = ("ok", "held", "retried", "migrated", "failed", "cancelled")

# A fault, done to the node serving the model: it returns once the model serves again, with the
# seconds from the fault to then (None when the fault never stopped it serving in the bridge's
# view: a runner crash).
Fault = Callable[[StandinWithBridge, str, Tally], Awaitable[float | None]]


async def serving_without(run: StandinWithBridge, lost: set[str]) -> bool:
    """The model served in the bridge's view on an instance exo lists, none of ``lost`` left."""
    found = await run.instances()
    return bool(found) and not lost & set(found or {}) and await run.serving()


async def kill_9(run: StandinWithBridge, holder: str, _: Tally) -> float:
    lost = set(await run.instances() or {})
    run.kill_node(holder)
    return await poll(lambda: serving_without(run, lost), RECOVERY_S, "serving without it")


async def freeze_15_s(run: StandinWithBridge, holder: str, _: Tally) -> float:
    lost = set(await run.instances() or {})

    async def thaw_later() -> None:
        try:
            await anyio.sleep(FREEZE_S)  # the fault's length is the scenario
        finally:
            run.thaw_node(holder)

    recovered_s = 0.0
    async with anyio.create_task_group() as group:  # returns once thawed
        run.freeze_node(holder)
        group.start_soon(thaw_later)
        # The frozen node's instance deleted by the bridge and the model served elsewhere,
        # the node still frozen or not.
        recovered_s = await poll(lambda: serving_without(run, lost), RECOVERY_S, "serving")
    return recovered_s


async def runner_crash(run: StandinWithBridge, holder: str, tally: Tally) -> None:
    # The instance stays; its runner starts again within a second. Every chat on it then was
    # ended by the crash, so the straight clients losing one says it landed.
    run.crash_runners(holder)

    async def landed_and_serving() -> bool:
        return tally.lost(tally.straight) > 0 and await run.serving()

    await poll(landed_and_serving, RECOVERY_S, "the crash reaching chats, and serving")


async def master_election(run: StandinWithBridge, _: str, __: Tally) -> float:
    run.elect_new_master()
    placed_s = await poll(lambda: serving_without(run, set()), RECOVERY_S, "placed again")

    # The bridge read it as exo's master changing (the new State empty), not as a lost node.
    async def told() -> bool:
        return any(c.startswith(MASTER_CHANGED[:-1]) for c in await run.incident_causes())

    await poll(told, HISTORY_S, f"an incident caused by {MASTER_CHANGED!r}")
    return placed_s


async def through_a_fault(tmp_path: Path, name: str, fault: Fault) -> None:
    started = anyio.current_time()
    async with (
        standin_with_bridge(tmp_path) as run,
        httpx.AsyncClient(base_url=run.bridge_url, trust_env=False, timeout=None) as door,
        httpx.AsyncClient(base_url=run.exo_url, trust_env=False, timeout=None) as exo,
    ):
        holder = await run.deploy_qwen()
        tally = Tally()
        through = tally.through
        recovered_s: float | None = None
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            start_clients(group, tally, door, exo, TOKENS, stop, pause_s=RETRY_PAUSE_S)

            async def answered(count: int) -> bool:
                return through["ok"] >= count

            try:
                await poll(lambda: answered(BEFORE), CHATS_S, "chats answered before the fault")
                recovered_s = await fault(run, holder, tally)
                after = through["ok"] + AFTER
                await poll(lambda: answered(after), CHATS_S, "chats answered after the fault")
            except BaseException:
                group.cancel_scope.cancel()  # a failed wait: the chats in flight are not waited
                raise
            stop.set()  # each client ends its chat in flight (a hung one after HUNG_S)
        samples = await scrape(door)
        door_counts = {
            outcome: sum(
                value
                for (sample, labels), value in samples.items()
                if sample == "exo_deploy_requests_total" and ("outcome", outcome) in labels
            )
            for outcome in DOOR_OUTCOMES
        }
    wall_s = anyio.current_time() - started
    shown = ", ".join(f"{outcome} {count:g}" for outcome, count in door_counts.items())
    again = "" if recovered_s is None else f"; serving again {recovered_s:.1f} s after the fault"
    print(f"\n{tally.line(name)} (the door's own counts: {shown}{again}; wall {wall_s:.0f} s)")
    # The door had work to do: chats continued, sent again or held through the fault.
    assert door_counts["migrated"] + door_counts["retried"] + door_counts["held"] > 0
    # The fault did cost the straight clients: it landed, and the comparison shows something.
    assert tally.lost(tally.straight) > 0, dict(tally.straight)
    assert through["ok"] >= BEFORE + AFTER
    assert (through["failed"], through["cut"], through["hung"]) == (0, 0, 0), dict(through)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "fault"),
    [
        pytest.param("kill -9", kill_9, marks=pytest.mark.e2e(seconds=50), id="kill_9"),
        pytest.param("freeze 15 s", freeze_15_s, marks=pytest.mark.e2e(seconds=60), id="freeze"),
        pytest.param(
            "runner crash", runner_crash, marks=pytest.mark.e2e(seconds=45), id="runner_crash"
        ),
        # exo's master changing to one with an empty State.
        pytest.param(
            "master election", master_election, marks=pytest.mark.e2e(seconds=50), id="election"
        ),
    ],
)
async def test_chats_through_a_fault(tmp_path: Path, name: str, fault: Fault) -> None:
    await through_a_fault(tmp_path, name, fault)
