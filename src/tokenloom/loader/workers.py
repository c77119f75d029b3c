"""DataLoader worker processes that import no torch.

A torch DataLoader worker runs torch's worker loop, so every worker imports torch: about 190 MB
resident per process before it reads a byte, most of it private (relocated library pages), which
is most of what a loader tree's memory is on a small machine. tokenloom's workers only read and
pack (:class:`~tokenloom.loader.dataset.PackedStream`: Lance and numpy), so
:class:`WorkerPool` runs them as plain spawned processes instead:

* worker ``w`` of ``W`` is sent a detached copy of the stream (its plan inputs are mapped from the
  node's plan store, not copied) and builds groups ``w, w + W, ...`` of the rest of the epoch
  into its shared-memory ring (:class:`~tokenloom.loader.buffers.SharedSlots`);
* each group crosses as one small message on the worker's own bounded queue
  (``prefetch_factor`` groups), so a worker never runs further ahead than its ring allows;
* a spawned worker does not run the training script again: the stream needs nothing from
  ``__main__``, and a script's ``import torch`` would undo the point (with a
  ``worker_init_fn`` defined in ``__main__`` the script is run, as torch's workers do);
* the training process reads the queues round-robin: the stream is the same for any ``W``;
* with ``persistent=True`` (``DataLoader(persistent_workers=True)``) the processes outlive a
  pass: each pass sends them its ``(epoch, step)``, so ``set_epoch`` and ``load_state_dict``
  reach them, and their object-store fetches go on into the next epoch while it starts;
* a worker's exception is raised in the training process with the worker's traceback; a worker
  that dies (killed, out of memory) is reported with its exit code instead of hanging; on any
  exit the workers are stopped (their rings are anonymous memory: nothing to clean up); a
  training process killed outright takes its workers with it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.spawn
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tokenloom.loader.read import LoaderError
from tokenloom.process import die_with_parent

__all__ = ["WorkerPool", "WorkerError"]

_POLL_S = 0.25  # how often a waiting training process checks that its worker is alive
_STOP_S = 5.0  # how long a stopped worker may take to exit before it is killed


class WorkerError(LoaderError):
    """A DataLoader worker failed or died."""


def _worker_main(
    stream: Any,
    worker: int,
    workers: int,
    out: Any,
    init_fn: Callable[[int], None] | None,
    parent: int,
    ring_taken: Any,
    control: Any = None,
) -> None:
    """Body of worker ``worker``: its groups, then ``("done", info)`` or ``("error", ...)``.

    The ring's descriptor is handed over by this process (``DupFd``) when the training process
    reads the first group, so a worker that is done waits for ``ring_taken`` before it exits.
    A persistent worker (``control`` given) runs one pass per ``(epoch, step)`` it is sent, from
    that cursor, and stays alive between passes (its stream keeps its fetch pipeline, already
    reading the next epoch's first rows) until it is sent ``None`` or stopped."""
    die_with_parent(parent)  # a training process killed by -9 takes its workers with it
    sent_ring = False
    try:
        if init_fn is not None:
            init_fn(worker)
        while True:
            keep = control is not None
            if keep:
                cursor = control.get()
                if cursor is None:
                    break
                stream.seek(*cursor)
            for group in stream.groups(worker, workers, keep=keep):
                sent_ring = sent_ring or group.slots is not None
                out.put(("group", group))
            out.put(("done", {"torch_imported": "torch" in sys.modules}))
            if not keep:
                break
        if sent_ring and control is None:
            ring_taken.wait()  # the training process sets it, or stops this process
    except BaseException as exc:  # noqa: BLE001 - reported to the training process
        text = "".join(traceback.format_exception(exc))
        try:
            out.put(("error", (exc, text)))
        except Exception:  # noqa: BLE001 - the exception itself does not pickle
            out.put(("error", (None, text)))
    finally:
        out.close()
        out.join_thread()  # everything put is flushed before the process exits


_START_LOCK = threading.Lock()


@contextmanager
def _main_not_rerun(skip: bool) -> Iterator[None]:
    """While starting workers: leave the parent's ``__main__`` out of what a spawned child
    prepares (multiprocessing would run the script again in every worker)."""
    if not skip:
        yield
        return
    with _START_LOCK:
        original = multiprocessing.spawn.get_preparation_data

        def prepare(name: str) -> dict:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        multiprocessing.spawn.get_preparation_data = prepare
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = original


def _raise(worker: int, exc: BaseException | None, text: str) -> None:
    message = f"DataLoader worker {worker} failed:\n{text.rstrip()}"
    if isinstance(exc, LoaderError | ValueError | TypeError | KeyError | OSError):
        try:
            new = type(exc)(message)
        except Exception:  # noqa: BLE001 - a constructor with other arguments
            new = None
        if new is not None:
            raise new from None
    raise WorkerError(message)


class WorkerPool:
    """``workers`` spawned processes building a stream's groups; iterate for them in order.

    Args:
        stream: The :class:`~tokenloom.loader.dataset.PackedStream` (detached: no torch class).
        workers: Number of processes (>= 1).
        context: A multiprocessing context (default ``spawn``: Lance is not fork-safe).
        prefetch: Groups each worker may have queued ahead of the training process.
        timeout: Seconds to wait for one group before giving up (0: no limit; a dead worker is
            detected either way).
        init_fn: Called in each worker with its index before it reads (``worker_init_fn``).
        persistent: Keep the processes between passes (:meth:`run` starts each pass from a
            cursor; a pass left before its end stops them, the next :meth:`run` starts new
            ones). Otherwise each pass (``iter(pool)``) starts and stops its own processes.
    """

    def __init__(
        self,
        stream: Any,
        workers: int,
        *,
        context: Any = None,
        prefetch: int = 2,
        timeout: float = 0.0,
        init_fn: Callable[[int], None] | None = None,
        persistent: bool = False,
    ) -> None:
        if workers < 1:
            raise LoaderError(f"workers must be >= 1, got {workers}")
        self.stream, self.workers = stream, int(workers)
        self.context = context if context is not None else mp.get_context("spawn")
        self.prefetch, self.timeout, self.init_fn = max(int(prefetch), 1), float(timeout), init_fn
        self.persistent = bool(persistent)
        self.torch_imported: bool | None = None
        """Whether any worker had torch imported when it finished (``None`` until one did)."""
        self.passes = 0
        """Passes these processes ran to their end."""
        self.running = False
        """Whether a pass is being iterated (a persistent pool is reused only between passes)."""
        self._procs: list[Any] | None = None
        self._queues: list[Any] = []
        self._taken: list[Any] = []
        self._control: list[Any] | None = None

    @property
    def alive(self) -> bool:
        """Whether the processes are started and idle or running (a persistent pool between
        passes)."""
        return self._procs is not None

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty when not started)."""
        return [p.pid for p in self._procs or []]

    def __iter__(self) -> Iterator[Any]:
        return self.run(None)

    def run(self, cursor: tuple[int, int] | None) -> Iterator[Any]:
        """One pass of groups, in order: from ``cursor`` ``(epoch, step)`` on a persistent
        pool, else from where the stream's own cursor was when the processes started."""
        if self.persistent and cursor is None:
            raise LoaderError("a persistent WorkerPool runs from a cursor: run((epoch, step))")
        return self._run(cursor)

    def _start(self) -> None:
        ctx, W = self.context, self.workers
        self._queues = [ctx.Queue(maxsize=self.prefetch) for _ in range(W)]
        self._taken = [ctx.Event() for _ in range(W)]
        self._control = [ctx.SimpleQueue() for _ in range(W)] if self.persistent else None
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(
                    self.stream, w, W, self._queues[w], self.init_fn, os.getpid(),
                    self._taken[w], self._control[w] if self._control else None,
                ),
                name=f"tokenloom-loader-{w}",
                daemon=True,
            )
            for w in range(W)
        ]  # fmt: skip
        uses_main = getattr(self.init_fn, "__module__", None) in ("__main__", "__mp_main__")
        with _main_not_rerun(not uses_main):
            for p in self._procs:
                p.start()

    def _run(self, cursor: tuple[int, int] | None) -> Iterator[Any]:
        W = self.workers
        finished = False
        self.running = True
        try:
            if self._procs is None:
                self._start()
            elif not self.persistent:
                raise LoaderError("a WorkerPool that is not persistent runs one pass")
            procs, queues, taken = self._procs, self._queues, self._taken
            assert procs is not None
            if self._control is not None:
                for control in self._control:
                    control.put((int(cursor[0]), int(cursor[1])) if cursor else None)
            w = 0
            while True:
                kind, payload = self._get(queues[w], procs[w], w)
                if kind == "error":
                    _raise(w, *payload)
                if kind == "done":
                    # groups are dealt round-robin: the first worker without one in its turn
                    # means every later group index is past the epoch's end
                    self._done(payload)
                    for v in [*range(w + 1, W), *range(w)] if self.persistent else []:
                        kind, payload = self._get(queues[v], procs[v], v)  # its "done" too
                        if kind == "error":
                            _raise(v, *payload)
                        if kind != "done":
                            raise WorkerError(
                                f"DataLoader worker {v} sent a group past the epoch's end; "
                                "this is a bug in tokenloom, please report it"
                            )
                        self._done(payload)
                    finished = True
                    self.passes += 1
                    return
                if payload.slots is not None:
                    taken[w].set()  # its ring is mapped here (unpickling took the descriptor)
                yield payload
                w = (w + 1) % W
        finally:
            self.running = False
            if not (self.persistent and finished):
                self.close()

    def _done(self, info: dict) -> None:
        self.torch_imported = bool(self.torch_imported) or info["torch_imported"]

    def close(self) -> None:
        """Stop the processes (a persistent pool's next :meth:`run` starts new ones)."""
        procs, self._procs = self._procs, None
        if procs is not None:
            self._stop(procs, self._queues)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown; daemons go anyway
            pass

    def _get(self, q: Any, proc: Any, w: int) -> tuple[str, Any]:
        started = time.monotonic()
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                pass
            if not proc.is_alive():
                try:  # what it put just before exiting
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    raise WorkerError(
                        f"DataLoader worker {w} (pid {proc.pid}) exited unexpectedly with code "
                        f"{proc.exitcode} (killed, or out of memory?)"
                    ) from None
            if self.timeout and time.monotonic() - started > self.timeout:
                raise WorkerError(
                    f"DataLoader timed out after {self.timeout:g} s waiting for worker {w}"
                )

    @staticmethod
    def _stop(procs: list[Any], queues: list[Any]) -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.terminate()
        deadline = time.monotonic() + _STOP_S
        for p in procs:
            if p.pid is None:
                continue
            p.join(max(deadline - time.monotonic(), 0.0))
            if p.is_alive():
                p.kill()
                p.join()
        for q in queues:
            q.cancel_join_thread()
            q.close()
