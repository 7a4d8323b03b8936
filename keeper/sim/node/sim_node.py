"""A simulated exo node: joins a master, follows the State, runs fake runners, serves fake tokens.

It is shaped as a state machine over a clock, not as a set of sleeping tasks. Each runner's
status is a function of when its current attempt began (connect, load at the node's GB/s, ready)
and of the faults it suffered; one loop wakes at the next moment anything changes (or when a
message or a fault arrives), compares what the master's State shows with what the node knows,
and sends the difference. That makes the node exact under trio's MockClock, idle when nothing
happens, and lets runners keep their progress across a lost channel: ``run`` returns when the
channel closes, the caller reconnects and calls ``run`` again, and the new session re-sends
everything (a new master learns the truth from it).

Only the injected ``Clock`` is read, never the system's, so a whole cluster of these runs in
virtual time beside the master.

A runner whose model is not on the node's disk first waits, RunnerIdle as on exo, for its
download (``keeper.sim.node.downloads``, the node's models directory: one download at a time at the
node's MB/s, its progress reported as exo's download entries); a model that does not fit on the
disk fails the runner with exo's message, and exo's retries follow.

It is one module (about 700 lines) on purpose: the runners' lifecycle, the session and the loop
that reconciles them read and write the same few fields at the same wake-up; split apart, they
would need an interface between them that exists only for the split. The disk is the exception:
it only answers when a model is whole on disk, so it stands alone.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from keeper.model.apply import apply_indexed
from keeper.model.state import (
    AnyDownload,
    AnyInstance,
    AnyRunnerStatus,
    AnyShard,
    Backend,
    Edge,
    Memory,
    MemoryUsage,
    ModelCard,
    ModelId,
    Multiaddr,
    NetworkInterface,
    NodeIdentity,
    NodeNetwork,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerWarmingUp,
    SocketConnection,
    State,
    SystemVitals,
    download_model_id,
)
from keeper.runtime.clock import Clock
from keeper.sim.link.channel import ChannelClosedError, NodeSide
from keeper.sim.link.identity import NodeKey
from keeper.sim.link.protocol import (
    HEARTBEAT_S,
    INFO_REFRESH_S,
    LINK_REFRESH_S,
    AnyNodeMessage,
    CancelChat,
    CancelDownload,
    Challenge,
    ChatChunk,
    ChatError,
    ChatMessage,
    ChatRequest,
    DeleteDownload,
    DownloadReport,
    EventMessage,
    Heartbeat,
    Hello,
    LinkDown,
    LinkUp,
    NodeInfo,
    RequestInstanceDeletion,
    RunnerStatusReport,
    StartDownload,
    Welcome,
)
from keeper.sim.node.downloads import MIB, ModelsDisk
from keeper.sim.node.sim_options import (
    DEFAULT_DISK_GB,
    DEFAULT_DOWNLOAD_MB_PER_S,
    SimFault,
)

log = logging.getLogger(__name__)

GIB = 1024**3

# A runner spends this long connecting to its ring peers before it starts loading weights.
RUNNER_CONNECT_S = 0.2
# Loading progress is reported at most this often (exo reports every layer; a small model at a
# fast disk would otherwise put dozens of events in the log within a second).
LOADING_REPORT_S = 0.25
# How long a runner takes to shut down once its instance is deleted.
RUNNER_SHUTDOWN_S = 0.2
# exo's worker retries a failed runner after 0.5 s, doubling to 10 s, and asks the master to
# delete the instance after 5 failures in a row.
RUNNER_FIRST_RETRY_S = 0.5
RUNNER_MAX_RETRY_S = 10.0
RUNNER_MAX_FAILURES = 5
# exo's libp2p port; the simulated nodes do not listen on it, it only makes edges look like exo's.
PEER_PORT = 52415
# A link the node reported but the State does not show (the report raced the peer's timeout, or
# the master restarted) is reported again after this long.
LINK_RESEND_S = LINK_REFRESH_S
# Slack for floating-point sums of times: the clock lands exactly on a computed deadline, and
# the progress computed there must count it as reached.
_EPSILON = 1e-9
# The node's fake model writes this many tokens per second for each chat request.
DEFAULT_TOKENS_PER_S = 20.0
# What a node's GPU and power read (exo's system profile). exo's recorded nodes show two points,
# an idle node and one answering a chat; a runner loading its weights or holding them idle sits
# in between. Temperature and power follow the GPU on the line through the two recorded points,
# and the CPU figures stay as recorded. Sampled: sent with each NodeInfo, never a reason for one.
IDLE_GPU, IDLE_TEMP_C, IDLE_POWER_W = 0.03, 41.0, 12.0
SERVING_GPU, SERVING_TEMP_C, SERVING_POWER_W = 0.62, 58.0, 95.0
LOADING_GPU = 0.35
LOADED_GPU = 0.12
PCPU_USAGE, ECPU_USAGE = 0.2, 0.1

# How long a lose-runner node's runner serves before it dies: long enough for the State (and the
# keeper) to see it ready first, as on exo#2120 where a serving runner is killed.
LOSE_RUNNER_AFTER_S = 3.0

_REPLY_TEXT = (
    "This is a simulated reply from an exo-deploy test node. The tokens are fake, but they "
    "travel the same way real ones do: from the runner holding the first shard, through the "
    "master, to the client that asked for them, one chunk at a time until the answer ends."
)


def node_id_for(name: str) -> str:
    """A simulated node's id: the peer id of the key derived from its name, so the same name is
    the same node in every run (``keeper.sim.link.identity``)."""
    return NodeKey.for_name(name).node_id


def reply_tokens() -> list[str]:
    """The fake answer, as the chunks a node streams (each but the first with its leading space)."""
    first, *rest = _REPLY_TEXT.split(" ")
    return [first, *(" " + word for word in rest)]


def reply_to(messages: Sequence[ChatMessage]) -> list[str]:
    """The chunks a node streams for a chat: the fake answer, or, when the last message is the
    assistant's, what follows its text, as exo continues a chat from the assistant's words (its
    prefill): the tokens after the longest run of the answer's first tokens that the text starts
    with (the whole answer for a text that starts with none of it)."""
    tokens = reply_tokens()
    if not messages or messages[-1].role != "assistant":
        return tokens
    so_far = messages[-1].content
    said, length = 0, 0
    for token in tokens:
        if not so_far.startswith(token, length):
            break
        said, length = said + 1, length + len(token)
    return tokens[said:]


async def sleep_or_wake(clock: Clock, delay: float, wake: anyio.Event) -> None:
    """Sleep ``delay`` s on ``clock``, or less if ``wake`` is set meanwhile."""
    if wake.is_set():
        return
    async with anyio.create_task_group() as group:

        async def sleeper() -> None:
            await clock.sleep(max(delay, 0.0))
            group.cancel_scope.cancel()

        async def waiter() -> None:
            await wake.wait()
            group.cancel_scope.cancel()

        group.start_soon(sleeper)
        group.start_soon(waiter)


@dataclass(frozen=True)
class NodeConfig:
    name: str
    memory_gb: float
    backends: tuple[Backend, ...] = (Backend.MLX_METAL,)
    load_gb_per_s: float = 2.0
    # Its identity (the id is made of the key); None: derived from the name, for simulations in
    # one process. A node process passes the key it keeps in a file.
    key: NodeKey | None = None
    ip: str = "127.0.0.1"
    # The least time a load takes whatever the shard's size (process start, warm-up), so even a
    # tiny model is seen loading.
    load_floor_s: float = 0.0
    tokens_per_s: float = DEFAULT_TOKENS_PER_S
    # How often the node says it is alive and re-sends its info unasked: exo's cadence unless
    # told otherwise (a day-long virtual-time soak slows both; the 30 s node timeout allows it).
    heartbeat_s: float = HEARTBEAT_S
    info_refresh_s: float = INFO_REFRESH_S
    machine_model: str = "Mac (simulated)"
    chip_id: str = "Apple M4 (simulated)"
    os_version: str = "26.1"
    # Its models directory: the disk's size, how fast it downloads, and the models on it at
    # start (reported DownloadCompleted from the start; ValueError if they do not fit).
    disk_gb: float = DEFAULT_DISK_GB
    download_mb_per_s: float = DEFAULT_DOWNLOAD_MB_PER_S
    has_models: tuple[ModelCard, ...] = ()
    # How its runners misbehave (SimFault), or None.
    fault: SimFault | None = None

    @property
    def resolved_key(self) -> NodeKey:
        return self.key if self.key is not None else NodeKey.for_name(self.name)

    @property
    def resolved_id(self) -> str:
        return self.resolved_key.node_id


def retry_delay(failures: int) -> float:
    """exo's runner backoff after ``failures`` failures in a row: 0.5 s doubling to 10 s."""
    return min(RUNNER_FIRST_RETRY_S * 2 ** (failures - 1), RUNNER_MAX_RETRY_S)


@dataclass
class _Runner:
    """One runner of one instance on this node; its status is a function of time."""

    instance_id: str
    runner_id: str
    total_layers: int
    shard_bytes: int
    load_s: float
    attempt_started_at: float
    shard: AnyShard | None = None
    # Since when its model is whole on the node's disk; None: not yet (the runner waits, idle).
    disk_ready_at: float | None = -math.inf
    attempt: int = 0  # bumps whenever the runner dies, so a chat can tell its runner went away
    failures: int = 0  # in a row; reset when an attempt reaches Ready
    failed_at: float | None = None
    error: str = ""
    broken: bool = False  # fails every attempt half-way through loading
    gave_up: bool = False
    shutdown_started_at: float | None = None
    fault: SimFault | None = None  # the node's, for this runner

    @property
    def _connect_at(self) -> float:
        """When this attempt starts connecting: once it began and its model is on disk."""
        if self.disk_ready_at is None:
            return math.inf
        return max(self.attempt_started_at, self.disk_ready_at)

    @property
    def _load_started_at(self) -> float:
        return self._connect_at + RUNNER_CONNECT_S

    @property
    def waiting_for_disk(self) -> bool:
        """An attempt under way whose model is not on disk yet."""
        return (
            self.disk_ready_at is None
            and not self.shutting_down
            and not self.gave_up
            and self.failed_at is None
        )

    @property
    def ready_at(self) -> float:
        return self._load_started_at + self.load_s

    @property
    def _breaks_at(self) -> float:
        return self._load_started_at + self.load_s / 2

    @property
    def shutting_down(self) -> bool:
        return self.shutdown_started_at is not None

    def advance(self, now: float) -> None:
        """Carry out every transition due by ``now`` (retries, a broken runner's failures)."""
        while not self.shutting_down and not self.gave_up:
            if self.failed_at is not None:
                retry_at = self.failed_at + retry_delay(self.failures)
                if now < retry_at:
                    return
                self.failed_at = None
                self.attempt_started_at = retry_at
            elif self.broken and now >= self._breaks_at:
                self._fail(self._breaks_at, "runner crashed while loading its shard")
            else:
                if now >= self.ready_at:
                    self.failures = 0
                return

    def kill(self, now: float, message: str) -> bool:
        self.advance(now)
        if self.shutting_down or self.gave_up or self.failed_at is not None:
            return False
        self._fail(now, message)
        return True

    def fail_attempt(self, at: float, message: str) -> None:
        """This attempt fails at ``at`` (its model cannot be downloaded); retried as any."""
        self._fail(at, message)

    def _fail(self, at: float, message: str) -> None:
        self.failures += 1
        self.attempt += 1
        self.failed_at = at
        self.error = message
        if self.failures >= RUNNER_MAX_FAILURES:
            self.gave_up = True

    def shut_down(self, now: float) -> None:
        if not self.shutting_down:
            self.shutdown_started_at = now
            self.attempt += 1

    def serving(self, now: float) -> bool:
        return (
            not self.shutting_down
            and not self.gave_up
            and self.failed_at is None
            and now >= self.ready_at
            and self.fault != "stall-warmup"
            and not self.lost(now)
        )

    def lost(self, now: float) -> bool:
        """A lose-runner fault: the runner died after serving a while; the instance stays."""
        return self.fault == "lose-runner" and now >= self.ready_at + LOSE_RUNNER_AFTER_S

    def status(self, now: float, chatting: bool) -> AnyRunnerStatus:
        if self.shutdown_started_at is not None:
            if now < self.shutdown_started_at + RUNNER_SHUTDOWN_S:
                return RunnerShuttingDown()
            return RunnerShutdown()
        if self.gave_up or self.failed_at is not None:
            return RunnerFailed(error_message=self.error)
        if now < self._connect_at:
            return RunnerIdle()  # exo's runner waits idle for its model's download
        if now < self._load_started_at:
            return RunnerConnecting()
        if now < self.ready_at:
            return RunnerLoading(layers_loaded=self._layers_at(now), total_layers=self.total_layers)
        if self.fault == "stall-warmup":
            return RunnerWarmingUp()  # for good
        if self.lost(now):
            return RunnerShutdown()
        return RunnerRunning() if chatting else RunnerReady()

    def _report_step(self) -> float:
        return max(self.load_s / max(self.total_layers, 1), LOADING_REPORT_S)

    def _layers_at(self, now: float) -> int:
        step = self._report_step()
        ticks = math.floor((now - self._load_started_at) / step + _EPSILON)
        loaded = math.floor(ticks * step / self.load_s * self.total_layers + _EPSILON)
        return min(self.total_layers, loaded)

    def next_change(self, now: float) -> float | None:
        """When this runner's status next changes by itself (None: not until something happens)."""
        if self.shutdown_started_at is not None:
            end = self.shutdown_started_at + RUNNER_SHUTDOWN_S
            return end if now < end else None
        if self.gave_up:
            return None
        if self.failed_at is not None:
            return self.failed_at + retry_delay(self.failures)
        if self.disk_ready_at is None:
            return None  # the download's end says when (the node's disk)
        if now < self._load_started_at:
            return self._load_started_at
        if now < self.ready_at:
            step = self._report_step()
            ticks = math.floor((now - self._load_started_at) / step + _EPSILON)
            candidates = [self.ready_at, self._load_started_at + (ticks + 1) * step]
            if self.broken:
                candidates.append(self._breaks_at)
            return min(candidates)
        if self.fault == "lose-runner" and now < self.ready_at + LOSE_RUNNER_AFTER_S:
            return self.ready_at + LOSE_RUNNER_AFTER_S
        return None


@dataclass
class _Session:
    """What the node knows about one connection to the master; a new connection starts afresh."""

    channel: NodeSide
    send_lock: anyio.Lock
    state: State | None = None
    sent_status: dict[str, AnyRunnerStatus] = field(default_factory=dict[str, AnyRunnerStatus])
    link_sent_at: dict[str, float] = field(default_factory=dict[str, float])  # peer -> last LinkUp
    linked: dict[str, Edge] = field(default_factory=dict[str, Edge])  # peers we reported a link to
    deletion_requested: set[str] = field(default_factory=set[str])
    info_sent: NodeInfo | None = None
    # What a change of which sends NodeInfo at once: all of it but its sampled figures (system
    # vitals, and the disk while a download fills it), and the disk's settled bytes.
    info_key: tuple[NodeInfo, int] | None = None
    info_sent_at: float = -math.inf
    # Per model, the download entry last reported and when.
    downloads_sent: dict[ModelId, tuple[AnyDownload, float]] = field(
        default_factory=dict[ModelId, tuple[AnyDownload, float]]
    )
    heartbeat_at: float = -math.inf
    chats: dict[str, anyio.CancelScope] = field(default_factory=dict[str, anyio.CancelScope])


class SimNode:
    """A simulated exo worker. ``run(channel)`` serves one connection to the master."""

    def __init__(self, config: NodeConfig, clock: Clock, disk: ModelsDisk | None = None) -> None:
        """``disk``: the models directory it starts with (a restarted node keeps its files);
        by default the config's, holding ``has_models``."""
        self.config = config
        self._key = config.resolved_key
        self.node_id = self._key.node_id
        self._clock = clock
        self.disk = (
            disk
            if disk is not None
            else ModelsDisk(
                self.node_id,
                Memory.from_gb(config.disk_gb).in_bytes,
                config.download_mb_per_s * MIB,
                config.has_models,
            )
        )
        self._runners: dict[str, _Runner] = {}  # by instance id
        # How its runners misbehave now: the config's, until a harness says otherwise
        # (``set_fault``).
        self._fault: SimFault | None = config.fault
        # Instances whose runner a lose-runner fault killed: never started again on this node.
        self._lost: set[str] = set()
        self._chatting: Counter[str] = Counter()  # instance id -> requests being answered
        self._wake: anyio.Event | None = None
        self._session: _Session | None = None
        # Sessions that got as far as the master's Welcome (a reconnect loop resets its backoff).
        self.welcomed_sessions = 0

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def connected(self) -> bool:
        """Whether a session is open and the master's Welcome has arrived."""
        return self._session is not None and self._session.state is not None

    # --- what tests and fault harnesses read and do ---------------------------------------

    def running_instances(self) -> list[str]:
        return sorted(iid for iid, r in self._runners.items() if not r.shutting_down)

    def kill_runner(self, instance_id: str | None = None) -> int:
        """Make a runner fail now (every runner of this node when ``instance_id`` is None); it is
        retried with exo's backoff. Returns how many runners were killed."""
        now = self._clock.monotonic()
        killed = sum(
            runner.kill(now, "runner process died") for runner in self._selected(instance_id)
        )
        self._poke()
        return killed

    @property
    def fault(self) -> SimFault | None:
        return self._fault

    def set_fault(self, fault: SimFault | None) -> None:
        """Misbehave from now on as ``fault`` says, or heal (None): the soak's broken-instance
        faults (docs/design.md §10), for a while and then healed, on a node already serving.

        The runners it holds take the fault at once: ``lose-runner`` makes a runner that has
        served ``LOSE_RUNNER_AFTER_S`` die now, for good (the instance stays registered);
        ``fail-chats`` fails every chat from now; ``stall-warmup`` restarts them (as after a
        crash of the runner process), and the restarted ones hang in RunnerWarmingUp. Healed,
        a hung warm-up finishes and chats are answered again; a lost runner stays lost, as a
        dead process does, until its instance is deleted."""
        self._fault = fault
        for runner in self._runners.values():
            runner.fault = fault
        if fault == "stall-warmup":
            self.kill_runner()
        self._poke()

    def _selected(self, instance_id: str | None) -> Iterable[_Runner]:
        if instance_id is None:
            return list(self._runners.values())
        runner = self._runners.get(instance_id)
        return [runner] if runner is not None else []

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # --- a session with the master ----------------------------------------------------------

    async def run(self, channel: NodeSide) -> None:
        """Serve one connection; returns when the channel closes. Call again to reconnect."""
        session = _Session(channel=channel, send_lock=anyio.Lock())
        self._session = session
        self._wake = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                challenge = await channel.receive()
                if not isinstance(challenge, Challenge):
                    log.error(
                        "the master sent %s before its challenge; not a master this node knows",
                        type(challenge).__name__,
                    )
                    await channel.aclose()
                    return
                await self._send(
                    session,
                    Hello(
                        node_id=self.node_id,
                        name=self.name,
                        signature=self._key.sign_hello(challenge.nonce),
                        running_instances=self.running_instances(),
                    ),
                )
                tg.start_soon(self._receive_loop, session, tg)
                await self._tick_loop(session)
        except* ChannelClosedError:
            pass
        finally:
            if self._session is session:
                self._session = None
            self._wake = None

    async def _send(self, session: _Session, message: AnyNodeMessage) -> None:
        async with session.send_lock:
            await session.channel.send(message)

    async def _receive_loop(self, session: _Session, tg: TaskGroup) -> None:
        while True:
            message = await session.channel.receive()
            match message:
                case Welcome(state=state):
                    session.state = state
                    self.welcomed_sessions += 1
                case EventMessage(indexed=indexed):
                    if session.state is not None and (
                        indexed.idx > session.state.last_event_applied_idx
                    ):
                        session.state = apply_indexed(session.state, indexed)
                case ChatRequest():
                    scope = anyio.CancelScope()
                    session.chats[message.request_id] = scope
                    tg.start_soon(self._chat, session, message, scope)
                case CancelChat(request_id=request_id):
                    scope = session.chats.pop(request_id, None)
                    if scope is not None:
                        scope.cancel()
                case StartDownload(shard_metadata=shard):
                    refusal = self.disk.request(shard, self._clock.monotonic())
                    if refusal is not None:
                        log.info("node %s cannot download: %s", self.name, refusal)
                case DeleteDownload(model_id=model_id):
                    self._delete_download(model_id)
                case CancelDownload(model_id=model_id):
                    # A runner still waiting for it asks for it again at once, as exo's worker
                    # does: cancelling only stops a download nothing here needs.
                    self.disk.cancel(model_id, self._clock.monotonic())
                case Challenge():
                    pass  # only the first message of a session is one; answered in ``run``
            self._poke()

    def _delete_download(self, model_id: ModelId) -> None:
        users = sorted(
            iid
            for iid, runner in self._runners.items()
            if not runner.shutting_down
            and runner.shard is not None
            and runner.shard.model_card.model_id == model_id
        )
        if users:
            log.info("node %s keeps %s: runners of it (%s) use it", self.name, model_id, users)
            return
        self.disk.delete(model_id, self._clock.monotonic())

    async def _tick_loop(self, session: _Session) -> None:
        while True:
            self._wake = wake = anyio.Event()
            now = self._clock.monotonic()
            await self._reconcile(session, now)
            deadline = self._next_deadline(session, now)
            await sleep_or_wake(self._clock, deadline - now, wake)

    def _next_deadline(self, session: _Session, now: float) -> float:
        config = self.config
        deadlines = [
            session.heartbeat_at + config.heartbeat_s,
            session.info_sent_at + config.info_refresh_s,
        ]
        deadlines += [
            change
            for runner in self._runners.values()
            if (change := runner.next_change(now)) is not None
        ]
        deadlines += [sent + LINK_RESEND_S for sent in session.link_sent_at.values()]
        if (download_change := self.disk.next_change(now)) is not None:
            deadlines.append(download_change)
        if session.state is not None:
            deadlines += [
                sent_at + LINK_RESEND_S for sent_at in self._unconfirmed(session, session.state)
            ]
        # Never a deadline in the past: floating-point edges must not spin the loop in place.
        return max(min(deadlines), now + 1e-3)

    # --- reconciling the node with the State ----------------------------------------------

    async def _reconcile(self, session: _Session, now: float) -> None:
        self._advance(now)
        state = session.state
        if state is not None:  # before the Welcome, the node knows nothing to compare with
            self._follow_instances(state, now)
            await self._report_runners(session, now)
            await self._request_deletions(session, state)
        await self._report_info(session, state, now)
        if state is not None:  # after NodeInfo: an entry of a node not in the topology is lost
            await self._report_downloads(session, state, now)
            await self._report_links(session, state, now)
        if now >= session.heartbeat_at + self.config.heartbeat_s:
            await self._send(session, Heartbeat())
            session.heartbeat_at = now

    def _follow_instances(self, state: State, now: float) -> None:
        assigned: dict[str, AnyInstance] = {
            iid: instance
            for iid, instance in state.instances.items()
            if self.node_id in instance.shard_assignments.node_to_runner
        }
        for iid, runner in self._runners.items():
            instance = assigned.get(iid)
            mine = (
                instance.shard_assignments.node_to_runner[self.node_id]
                if instance is not None
                else None
            )
            if mine != runner.runner_id:
                runner.shut_down(now)
        self._lost &= set(assigned)
        for iid, instance in assigned.items():
            if iid not in self._runners and iid not in self._lost:
                self._runners[iid] = runner = self._new_runner(instance, now)
                if runner.waiting_for_disk:
                    self._fetch_for(runner, now)

    def _advance(self, now: float) -> None:
        """Carry the disk and every runner to ``now``: downloads end, runners waiting for one
        go on from the moment it ended."""
        self.disk.advance(now)
        for runner in self._runners.values():
            runner.advance(now)
            if runner.waiting_for_disk:
                self._fetch_for(runner, now)

    def _fetch_for(self, runner: _Runner, now: float) -> None:
        """A runner whose model is not on disk: its attempt asks for the download (nothing new
        if it is under way or queued) and waits for it; a model the disk cannot hold fails the
        attempt, with exo's message, and exo's retries follow."""
        assert runner.shard is not None
        model_id = runner.shard.model_card.model_id
        if self.disk.completed_at(model_id) is None:
            refusal = self.disk.request(runner.shard, runner.attempt_started_at)
            if refusal is not None:
                runner.fail_attempt(runner.attempt_started_at, refusal)
                return
            self.disk.advance(now)
        ready = self.disk.completed_at(model_id)
        if ready is not None:
            runner.disk_ready_at = ready
            runner.advance(now)

    def _new_runner(self, instance: AnyInstance, now: float) -> _Runner:
        assignments = instance.shard_assignments
        runner_id = assignments.node_to_runner[self.node_id]
        shard = assignments.runner_to_shard.get(runner_id)
        if shard is None:  # a malformed instance: hold nothing, fail at once
            runner = _Runner(instance.instance_id, runner_id, 0, 0, 0.0, now, gave_up=True)
            runner.error = "instance has no shard for this runner"
            return runner
        layers = max(shard.end_layer - shard.start_layer, 0)
        model_bytes = shard.model_card.storage_size.in_bytes
        shard_bytes = model_bytes * layers // max(shard.n_layers, 1)
        load_s = max(self.config.load_floor_s, shard_bytes / (self.config.load_gb_per_s * GIB))
        return _Runner(
            instance.instance_id,
            runner_id,
            layers,
            shard_bytes,
            load_s,
            now,
            shard=shard,
            disk_ready_at=self.disk.completed_at(shard.model_card.model_id),
            fault=self._fault,
        )

    async def _request_deletions(self, session: _Session, state: State) -> None:
        for iid, runner in self._runners.items():
            if runner.gave_up and iid in state.instances and iid not in session.deletion_requested:
                session.deletion_requested.add(iid)
                reason = f"runner failed {runner.failures} times on {self.name}: {runner.error}"
                await self._send(session, RequestInstanceDeletion(instance_id=iid, reason=reason))

    async def _report_runners(self, session: _Session, now: float) -> None:
        for iid, runner in list(self._runners.items()):
            status = runner.status(now, self._chatting[iid] > 0)
            if session.sent_status.get(runner.runner_id) != status:
                await self._send(
                    session, RunnerStatusReport(runner_id=runner.runner_id, runner_status=status)
                )
                session.sent_status[runner.runner_id] = status
            if isinstance(status, RunnerShutdown):
                del self._runners[iid]
                session.sent_status.pop(runner.runner_id, None)
                if runner.lost(now):
                    self._lost.add(iid)

    def _info(self, now: float) -> NodeInfo:
        total = Memory.from_gb(self.config.memory_gb)
        held = sum(runner.shard_bytes for runner in self._runners.values())
        available = Memory(in_bytes=max(total.in_bytes - held, 0))
        return NodeInfo(
            memory=MemoryUsage(ram_total=total, ram_available=available),
            backends=list(self.config.backends),
            identity=NodeIdentity(
                friendly_name=self.name,
                model_id=self.config.machine_model,
                chip_id=self.config.chip_id,
                os_version=self.config.os_version,
            ),
            network=NodeNetwork(
                interfaces=[NetworkInterface(name="en0", ip_address=self.config.ip)]
            ),
            disk=self.disk.usage(now),
            system=self._vitals(now),
        )

    def _vitals(self, now: float) -> SystemVitals:
        """The GPU's load (see ``IDLE_GPU``), from what the runners do at ``now``."""
        statuses = [runner.status(now, False) for runner in self._runners.values()]
        if self._chatting:
            gpu = SERVING_GPU
        elif any(isinstance(status, RunnerLoading) for status in statuses):
            gpu = LOADING_GPU
        elif any(isinstance(status, RunnerReady) for status in statuses):
            gpu = LOADED_GPU
        else:
            gpu = IDLE_GPU
        share = (gpu - IDLE_GPU) / (SERVING_GPU - IDLE_GPU)
        return SystemVitals(
            gpu_usage=gpu,
            temp=round(IDLE_TEMP_C + share * (SERVING_TEMP_C - IDLE_TEMP_C), 1),
            sys_power=round(IDLE_POWER_W + share * (SERVING_POWER_W - IDLE_POWER_W), 1),
            pcpu_usage=PCPU_USAGE,
            ecpu_usage=ECPU_USAGE,
        )

    async def _report_info(self, session: _Session, state: State | None, now: float) -> None:
        info = self._info(now)
        key = (info.model_copy(update={"disk": None, "system": None}), self.disk.settled_bytes())
        due = now >= session.info_sent_at + self.config.info_refresh_s
        # Timed out while the channel stayed open (a freeze): announce ourselves again.
        forgotten = (
            state is not None
            and self.node_id not in state.topology.nodes
            and now >= session.info_sent_at + self.config.heartbeat_s
        )
        if due or forgotten or key != session.info_key:
            await self._send(session, info)
            session.info_sent = info
            session.info_key = key
            session.info_sent_at = now

    async def _report_downloads(self, session: _Session, state: State, now: float) -> None:
        """Each model's entry when it moved, and again when the State has not shown it after
        ``LINK_RESEND_S`` (a report that raced the node's timeout, or a master restarted)."""
        shown = self._shown_downloads(state)
        present = self.node_id in state.topology.nodes
        for model_id, entry in self.disk.entries(now).items():
            sent = session.downloads_sent.get(model_id)
            confirmed = not present or shown.get(model_id) == entry
            if (
                sent is not None
                and sent[0] == entry
                and (confirmed or now < sent[1] + LINK_RESEND_S)
            ):
                continue
            await self._send(session, DownloadReport(download_progress=entry))
            session.downloads_sent[model_id] = (entry, now)

    def _shown_downloads(self, state: State) -> dict[ModelId, AnyDownload]:
        return {download_model_id(e): e for e in state.downloads.get(self.node_id, [])}

    def _unconfirmed(self, session: _Session, state: State) -> list[float]:
        """When each reported entry the State does not show was sent."""
        if self.node_id not in state.topology.nodes:
            return []
        shown = self._shown_downloads(state)
        return [
            sent_at
            for model_id, (entry, sent_at) in session.downloads_sent.items()
            if shown.get(model_id) != entry
        ]

    async def _report_links(self, session: _Session, state: State, now: float) -> None:
        nodes = set(state.topology.nodes)
        for peer, edge in list(session.linked.items()):
            if peer not in nodes:
                await self._send(session, LinkDown(sink=peer, edge=edge))
                del session.linked[peer]
                session.link_sent_at.pop(peer, None)
        if self.node_id not in nodes:
            return
        shown = state.topology.connections.get(self.node_id, {})
        for peer in state.topology.nodes:
            network = state.node_network.get(peer)
            if peer == self.node_id or network is None or not network.interfaces:
                continue
            address = f"/ip4/{network.interfaces[0].ip_address}/tcp/{PEER_PORT}"
            edge = SocketConnection(sink_multiaddr=Multiaddr(address=address))
            if edge in shown.get(peer, []):
                session.link_sent_at.pop(peer, None)
                session.linked[peer] = edge
                continue
            if now >= session.link_sent_at.get(peer, -math.inf) + LINK_RESEND_S:
                await self._send(session, LinkUp(sink=peer, edge=edge))
                session.link_sent_at[peer] = now
                session.linked[peer] = edge

    # --- chat ---------------------------------------------------------------------------------

    async def _chat(
        self, session: _Session, request: ChatRequest, scope: anyio.CancelScope
    ) -> None:
        try:
            with scope:
                await self._answer(session, request)
        finally:
            session.chats.pop(request.request_id, None)

    async def _answer(self, session: _Session, request: ChatRequest) -> None:
        iid = request.instance_id
        runner = self._runners.get(iid)
        if runner is None or not runner.serving(self._clock.monotonic()):
            await self._send(
                session,
                ChatError(
                    request_id=request.request_id,
                    message=f"node {self.name} has no ready runner for instance {iid}",
                ),
            )
            return
        if self._fault == "fail-chats":
            message = f"node {self.name}: simulated fault fail-chats"
            await self._send(session, ChatError(request_id=request.request_id, message=message))
            return
        attempt = runner.attempt
        tokens = reply_to(request.messages)
        count = min(request.max_tokens, len(tokens))
        finish = "stop" if count == len(tokens) else "length"
        if not tokens:  # the assistant's text already holds the whole answer
            await self._send(
                session, ChatChunk(request_id=request.request_id, finish_reason=finish)
            )
            return
        self._chatting[iid] += 1
        self._poke()
        try:
            for index in range(count):
                await self._clock.sleep(1.0 / self.config.tokens_per_s)
                now = self._clock.monotonic()
                runner.advance(now)
                if self._runners.get(iid) is not runner or runner.attempt != attempt:
                    await self._send(
                        session,
                        ChatError(
                            request_id=request.request_id,
                            message=f"the runner for {iid} on {self.name} died mid-request",
                        ),
                    )
                    return
                last = index == count - 1
                await self._send(
                    session,
                    ChatChunk(
                        request_id=request.request_id,
                        text=tokens[index],
                        finish_reason=finish if last else None,
                    ),
                )
        finally:
            self._chatting[iid] -= 1
            if self._chatting[iid] <= 0:
                del self._chatting[iid]
            self._poke()
