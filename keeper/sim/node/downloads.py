"""A simulated node's models directory: what its disk holds, and its downloads over a clock.

exo's DownloadCoordinator as the simulation needs it (``docs/design.md`` §3.6 has the entries):

- exo downloads every file of a model for any shard, so an entry stands for the whole model
  and its size is the card's ``storage_size``;
- one download at a time, at the node's rate; a further request waits its turn, in order, as
  ``DownloadPending``;
- while a model downloads its entry is ``DownloadOngoing``, moving every ``REPORT_S`` counted
  from the download's start (exo sends about one a second), then ``DownloadCompleted``;
- a model that does not fit in what is free (less what the downloads queued before it still
  need) is ``DownloadFailed`` at once, with exo's message naming the sizes;
- cancelling stops the download and keeps its bytes: ``DownloadPending`` with what was
  downloaded so far, as exo's coordinator reports it; asked for again, it resumes from there;
- deleting removes the model's files, whole or partial, and its entry reads ``DownloadPending``
  with nothing downloaded, as exo's does.

Like the runners of ``keeper.sim.node.sim_node``, everything is a function of time: each method
takes the moment it acts at, progress is computed rather than counted, and a download that
ends between two calls ends exactly when it should (the next one starts at that instant), so
virtual time sees exact figures. No I/O and no clock of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from keeper.model.state import (
    AnyDownload,
    AnyShard,
    DiskUsage,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgressData,
    Memory,
    ModelCard,
    ModelId,
    PipelineShardMetadata,
)

GIB = 1024**3
MIB = 1024**2
# A downloading model's entry moves this often (exo throttles its progress events to one a
# second per model).
REPORT_S = 1.0
# Where a simulated node says its models are, as exo's recorded answers show it (nothing is
# written there).
MODELS_DIR = "/fake/models"
# A model's files, as Hugging Face repositories hold them: the weights in safetensors files of
# up to about 5 GB, and a handful of small ones beside them (config, tokenizer, index...); so
# exo's recorded Qwen3-0.6B (one weights file) counts 8.
WEIGHTS_FILE_BYTES = 5 * 1000**3
SMALL_FILES = 7
# Slack for floating-point sums of times, as in keeper.sim.node.sim_node.
_EPSILON = 1e-9


def file_count(total_bytes: int) -> int:
    """How many files a model of ``total_bytes`` is downloaded as (see ``WEIGHTS_FILE_BYTES``)."""
    return SMALL_FILES + max(1, math.ceil(total_bytes / WEIGHTS_FILE_BYTES))


def whole_model_shard(card: ModelCard) -> PipelineShardMetadata:
    """The shard exo names a model by when no runner asked for it (a model found on disk)."""
    return PipelineShardMetadata(
        model_card=card,
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=card.n_layers,
        n_layers=card.n_layers,
    )


def disk_refusal(disk_bytes: int, cards: Iterable[ModelCard]) -> str | None:
    """Why models said to be on disk at start cannot be (they take more than the disk), or
    None."""
    cards = list(cards)
    held = sum(card.storage_size.in_bytes for card in cards)
    if held <= disk_bytes:
        return None
    return (
        f"the models said to be on disk ({', '.join(card.model_id for card in cards)}) take "
        f"{held / GIB:.1f} GiB, more than the {disk_bytes / GIB:.1f} GiB disk"
    )


@dataclass
class _Model:
    """One model this node knows of: its bytes on disk and where its download stands."""

    shard: AnyShard  # the shard it was first asked for, which exo's entries carry
    total: int
    on_disk: int = 0  # for the model downloading: what it had when this download started
    started_at: float | None = None  # downloading since then; None: not downloading
    completed_at: float | None = None  # whole on disk since then (-inf: from the start)
    error: str | None = None  # the last request failed so (DownloadFailed)
    deleted: bool = False  # its files were deleted (DownloadPending with nothing, as exo)

    @property
    def model_id(self) -> ModelId:
        return self.shard.model_card.model_id

    def done_by(self, rate: float) -> float:
        assert self.started_at is not None
        return self.started_at + (self.total - self.on_disk) / rate


class ModelsDisk:
    """The models directory of one node: ``total_bytes`` of disk, downloads at ``rate`` bytes/s.

    ``has`` are the models on disk from the start (exo finds them when it starts and reports
    them complete); ValueError if they do not fit (``disk_refusal``).
    """

    def __init__(
        self,
        node_id: str,
        total_bytes: int,
        rate: float,
        has: Iterable[ModelCard] = (),
        models_dir: str = MODELS_DIR,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"a download rate must be positive, got {rate}")
        has = list(has)
        refusal = disk_refusal(total_bytes, has)
        if refusal is not None:
            raise ValueError(refusal)
        self.node_id = node_id
        self.total_bytes = total_bytes
        self.rate = rate
        self.models_dir = models_dir
        self._models: dict[ModelId, _Model] = {}
        self._queue: list[ModelId] = []  # waiting their turn, first first
        self._active: ModelId | None = None
        self._idle_since = -math.inf  # when the last download ended (the next starts no sooner)
        # Bumped by every change but a download's progress; with the progress tick it keys the
        # entries last built (a node reads them at every wake-up).
        self._version = 0
        self._built: tuple[tuple[int, int | None], dict[ModelId, AnyDownload]] | None = None
        for card in has:
            size = card.storage_size.in_bytes
            self._models[card.model_id] = _Model(
                whole_model_shard(card), size, on_disk=size, completed_at=-math.inf
            )

    # --- reading ------------------------------------------------------------------------------

    def completed_at(self, model_id: ModelId) -> float | None:
        """Since when the model is whole on disk, or None while it is not."""
        model = self._models.get(model_id)
        return model.completed_at if model is not None else None

    def downloading(self) -> ModelId | None:
        return self._active

    def queued(self) -> list[ModelId]:
        return list(self._queue)

    def entries(self, now: float) -> dict[ModelId, AnyDownload]:
        """Every model's entry as exo would report it at ``now`` (progress as of the last
        ``REPORT_S`` tick of its download). The caller must not change the mapping."""
        key = (self._version, self._tick(now))
        if self._built is None or self._built[0] != key:
            entries = {
                model_id: self._entry(model, now) for model_id, model in self._models.items()
            }
            self._built = (key, entries)
        return self._built[1]

    def usage(self, now: float) -> DiskUsage:
        """The disk as ``df`` would show it at the last progress tick."""
        used = sum(self._reported_bytes(model, now) for model in self._models.values())
        return DiskUsage(
            total=Memory(in_bytes=self.total_bytes),
            available=Memory(in_bytes=max(self.total_bytes - used, 0)),
        )

    def settled_bytes(self) -> int:
        """The bytes on disk not counting the download under way: what changes only when a
        download ends, stops or is deleted (a node reports its disk at once when it does)."""
        return sum(
            model.on_disk for model in self._models.values() if model.model_id != self._active
        )

    def next_change(self, now: float) -> float | None:
        """When an entry next moves by itself: the next progress tick or the end of the
        download under way (None: nothing downloads)."""
        model = self._active_model()
        if model is None:
            return None
        assert model.started_at is not None
        ticks = math.floor((now - model.started_at) / REPORT_S + _EPSILON)
        return min(model.done_by(self.rate), model.started_at + (ticks + 1) * REPORT_S)

    # --- acting -------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Finish every download due by ``now``; each next one starts the moment the one before
        it ended."""
        while (model := self._active_model()) is not None:
            done_at = model.done_by(self.rate)
            if now + _EPSILON < done_at:
                return
            model.on_disk = model.total
            model.started_at = None
            model.completed_at = done_at
            self._version += 1
            self._active = None
            self._idle_since = done_at
            self._start_next(done_at)

    def request(self, shard: AnyShard, at: float) -> str | None:
        """Download the shard's model unless it is on disk, downloading or waiting its turn.
        Returns None, or why it cannot (the disk is too small): then its entry is
        DownloadFailed with that message."""
        self.advance(at)
        model_id = shard.model_card.model_id
        self._version += 1
        model = self._models.get(model_id)
        if model is None:
            model = _Model(shard, max(shard.model_card.storage_size.in_bytes, 0))
            self._models[model_id] = model
        if model.completed_at is not None or model_id == self._active or model_id in self._queue:
            return None
        need = model.total - model.on_disk
        free = self._free_after_queue(at)
        if need > free:
            model.error = self._disk_full(model_id, need, free)
            return model.error
        model.error = None
        model.deleted = False
        self._queue.append(model_id)
        if self._active is None:
            self._start_next(max(at, self._idle_since))
        return None

    def cancel(self, model_id: ModelId, now: float) -> bool:
        """Stop the model's download, keeping its bytes (or take it out of the queue). Returns
        whether there was one to stop."""
        self.advance(now)
        self._version += 1
        if model_id in self._queue:
            self._queue.remove(model_id)
            return True
        model = self._active_model()
        if model is None or model.model_id != model_id:
            return False
        model.on_disk = self._exact_bytes(model, now)
        model.started_at = None
        self._active = None
        self._idle_since = now
        self._start_next(now)
        return True

    def delete(self, model_id: ModelId, now: float) -> bool:
        """Delete the model's files, whole or partial (stopping its download). Returns whether
        this node knew the model."""
        if model_id not in self._models:
            return False
        self.cancel(model_id, now)
        self._version += 1
        model = self._models[model_id]
        model.on_disk = 0
        model.completed_at = None
        model.error = None
        model.deleted = True
        return True

    def survivor(self, now: float) -> ModelsDisk:
        """The disk as a restarted node finds it: every file kept, no download running (one cut
        short reads DownloadPending with its bytes, as exo reports a partial download it finds
        when it starts)."""
        self.advance(now)
        if self._active is not None:
            self.cancel(self._active, now)
        survivor = ModelsDisk(self.node_id, self.total_bytes, self.rate, (), self.models_dir)
        survivor._models = {
            model_id: replace(model, started_at=None) for model_id, model in self._models.items()
        }
        return survivor

    # --- inside -------------------------------------------------------------------------------

    def _active_model(self) -> _Model | None:
        return self._models[self._active] if self._active is not None else None

    def _tick(self, now: float) -> int | None:
        """How many progress ticks the download under way has had by ``now`` (None: none)."""
        model = self._active_model()
        if model is None or model.started_at is None:
            return None
        return max(math.floor((now - model.started_at) / REPORT_S + _EPSILON), 0)

    def _start_next(self, at: float) -> None:
        if self._active is not None or not self._queue:
            return
        model = self._models[self._queue.pop(0)]
        model.started_at = at
        self._active = model.model_id

    def _exact_bytes(self, model: _Model, now: float) -> int:
        if model.started_at is None:
            return model.on_disk
        done = model.on_disk + (now - model.started_at) * self.rate
        return min(model.total, math.floor(done + _EPSILON))

    def _reported_bytes(self, model: _Model, now: float) -> int:
        if model.started_at is None:
            return model.on_disk
        ticks = max(math.floor((now - model.started_at) / REPORT_S + _EPSILON), 0)
        return self._exact_bytes(model, model.started_at + ticks * REPORT_S)

    def _free_after_queue(self, now: float) -> int:
        """What is free once the download under way and those queued have their bytes."""
        used = sum(self._exact_bytes(model, now) for model in self._models.values())
        coming = sum(
            model.total - self._exact_bytes(model, now)
            for model in self._models.values()
            if model.model_id == self._active or model.model_id in self._queue
        )
        return self.total_bytes - used - coming

    def _disk_full(self, model_id: ModelId, need: int, free: int) -> str:
        # exo's InsufficientDiskSpaceError, then what the sizes were.
        return (
            f"No writable model directory has {need / GIB:.1f} GiB free. Checked: "
            f"['{self.models_dir}'] ({model_id} needs {need / GIB:.1f} GiB; "
            f"{max(free, 0) / GIB:.1f} GiB of {self.total_bytes / GIB:.1f} GiB free)"
        )

    def _directory(self, model_id: ModelId) -> str:
        return f"{self.models_dir}/{model_id}"

    def _entry(self, model: _Model, now: float) -> AnyDownload:
        node_id, shard, directory = self.node_id, model.shard, self._directory(model.model_id)
        if model.completed_at is not None:
            return DownloadCompleted(
                node_id=node_id,
                shard_metadata=shard,
                model_directory=directory,
                total=Memory(in_bytes=model.total),
            )
        if model.model_id == self._active:
            return DownloadOngoing(
                node_id=node_id,
                shard_metadata=shard,
                model_directory=directory,
                download_progress=self._progress(model, now),
            )
        if model.error is not None:
            return DownloadFailed(
                node_id=node_id,
                shard_metadata=shard,
                model_directory=directory,
                error_message=model.error,
            )
        if model.deleted:
            return DownloadPending(node_id=node_id, shard_metadata=shard, model_directory=directory)
        return DownloadPending(
            node_id=node_id,
            shard_metadata=shard,
            model_directory=directory,
            downloaded=Memory(in_bytes=model.on_disk),
            total=Memory(in_bytes=model.total),
        )

    def _progress(self, model: _Model, now: float) -> DownloadProgressData:
        assert model.started_at is not None
        downloaded = self._reported_bytes(model, now)
        files = file_count(model.total)
        return DownloadProgressData(
            total=Memory(in_bytes=model.total),
            downloaded=Memory(in_bytes=downloaded),
            downloaded_this_session=Memory(in_bytes=downloaded - model.on_disk),
            completed_files=files * downloaded // model.total if model.total else files,
            total_files=files,
            speed=float(self.rate),
            eta_ms=int((model.total - downloaded) / self.rate * 1000),
        )
