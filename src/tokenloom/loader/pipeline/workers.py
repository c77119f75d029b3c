"""DataLoader worker processes that import no torch.

A torch DataLoader worker runs torch's worker loop, so every worker imports torch: about 190 MB
resident per process before it reads a byte, most of it private (relocated library pages), which
is most of what a loader tree's memory is on a small machine. tokenloom's workers only read and
pack (:class:`~tokenloom.loader.pipeline.dataset.PackedStream`: Lance and numpy), so
:class:`WorkerPool` runs them as plain spawned processes instead:

* worker ``w`` of ``W`` is sent a detached copy of the stream (its plan inputs are mapped from the
  node's plan store, not copied) and builds groups ``w, w + W, ...`` of the rest of the epoch
  into its shared-memory ring (:mod:`~tokenloom.loader.pipeline.transit`);
* each group crosses as one small message on the worker's own pipe, at most
  ``prefetch_factor`` groups ahead of the credits the training process returns, so a worker
  never runs further ahead than its ring allows; pipes, not ``multiprocessing.Queue``, whose
  named semaphores (``/dev/shm/sem.mp-*``) outlive a process group killed by ``kill -9``;
* a spawned worker does not run the training script again: the stream needs nothing from
  ``__main__``, and a script's ``import torch`` would undo the point (with a
  ``worker_init_fn`` defined in ``__main__`` the script is run, as torch's workers do);
  ``forkserver`` works too, ``fork`` is refused (Lance is not fork-safe);
* the training process reads the pipes round-robin: the stream is the same for any ``W``;
* with ``persistent=True`` (``DataLoader(persistent_workers=True)``) the processes outlive a
  pass: each pass sends them its ``(epoch, step)`` on the same pipe, so ``set_epoch`` and
  ``load_state_dict`` reach them, and their object-store fetches go on into the next epoch
  while it starts;
* a worker's exception is raised in the training process with the worker's traceback; a worker
  that dies (killed, out of memory) is reported with its exit code and signal within a step
  (every worker is watched while the training process waits, and between steps), never after
  the groups already queued are used up; on any exit the workers are stopped (their rings are
  anonymous memory: nothing to clean up); a training process killed outright takes its workers
  with it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.process import defined_in_main, die_with_parent, main_not_rerun

__all__ = ["WorkerPool", "KeptPool", "WorkerError", "describe_exit", "multiprocessing_context"]

_POLL_S = 0.25  # how often a waiting training process checks that its worker is alive
_CHECK_S = 0.05  # how often a training process handing out batches checks it (WorkerPool.check)
_STOP_S = 5.0  # how long a stopped worker may take to exit before it is killed


class WorkerError(LoaderError):
    """A DataLoader worker failed or died."""


def _worker_main(
    stream: Any,
    worker: int,
    workers: int,
    conn: Any,
    init_fn: Callable[[int], None] | None,
    parent: int,
    prefetch: int,
    forkserver: bool,
    persistent: bool = False,
) -> None:
    """Body of worker ``worker``: its groups, then ``("done", info)`` or ``("error", ...)``.

    ``conn`` is the worker's end of a pipe: it sends at most ``prefetch`` groups ahead of the
    ``"credit"`` messages the training process returns for the groups it took. The ring's
    descriptor is handed over by this process (``DupFd``) when the training process reads the
    first group, so a worker that is done waits for its ``"taken"`` message before it exits.
    A ``persistent`` worker runs one pass per ``("cursor", (epoch, step))`` message, from that
    cursor, and stays alive between passes (its stream keeps its fetch pipeline, already reading
    the next epoch's first rows) until it is sent ``("stop", None)`` or stopped."""
    # under forkserver the parent is the fork server, which ends with the training process
    die_with_parent(os.getppid() if forkserver else parent)
    credits, taken, sent_ring = prefetch, False, False
    orders: list[tuple[str, Any]] = []  # control messages not yet acted on (persistent)

    def receive() -> None:  # one message; EOFError once the training process is gone
        nonlocal credits, taken
        message = conn.recv()
        if message == "credit":
            credits += 1
        elif message == "taken":
            taken = True
        else:  # ("cursor", (epoch, step)) or ("stop", None)
            orders.append(message)

    try:
        if init_fn is not None:
            init_fn(worker)
        while True:
            if persistent:
                while not orders:
                    receive()
                kind, cursor = orders.pop(0)
                if kind != "cursor":
                    break
                stream.seek(*cursor)
            for group in stream.groups(worker, workers, keep=persistent):
                while credits <= 0:
                    receive()
                credits -= 1
                sent_ring = sent_ring or group.slots is not None
                conn.send(("group", group))
            imported = {f"{m}_imported": m in sys.modules for m in ("torch", "numba")}
            conn.send(("done", imported))
            if not persistent:
                break
        while sent_ring and not taken:  # the training process says so, or stops this process
            receive()
    except BaseException as exc:  # noqa: BLE001 - reported to the training process
        text = "".join(traceback.format_exception(exc))
        for report in ((exc, text), (None, text)):  # the exception itself may not pickle
            try:
                conn.send(("error", report))
                break
            except Exception:  # noqa: BLE001, S112 - unpicklable, or nobody reads any more
                continue
    finally:
        conn.close()


def describe_exit(worker: int, pid: int | None, code: int | None) -> str:
    """How worker ``worker`` ended, for an error: its pid, exit code and the killing signal."""
    text = f"DataLoader worker {worker} (pid {pid}) exited unexpectedly with code {code}"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        text += f", killed by {name}"
        if -code == signal.SIGKILL:
            text += " (the kernel's out-of-memory killer sends it: see `dmesg`)"
    return text


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


def multiprocessing_context(context: Any) -> Any:
    """The multiprocessing context workers start with: ``None`` (``spawn``), ``"spawn"``,
    ``"forkserver"`` or such a context object.

    Raises:
        LoaderError: ``fork`` (or an unknown method): a forked child inherits Lance's running
            threads and locks mid-state.
    """
    if context is None:
        return mp.get_context("spawn")
    if isinstance(context, str):
        if context not in mp.get_all_start_methods():
            raise LoaderError(
                f"multiprocessing_context {context!r} is not a start method here; use 'spawn' "
                "(the default) or 'forkserver'"
            )
        context = mp.get_context(context)
    method = context.get_start_method()
    if method not in ("spawn", "forkserver"):
        raise LoaderError(
            f"multiprocessing_context {method!r} is refused: Lance is not fork-safe (a forked "
            "worker inherits its threads and locks mid-state); use 'spawn' (the default) or "
            "'forkserver'"
        )
    return context


class WorkerPool:
    """``workers`` spawned processes building a stream's groups; iterate for them in order.

    Each worker talks through its own pipe (no ``multiprocessing.Queue``: a queue's named POSIX
    semaphores, ``/dev/shm/sem.mp-*``, outlive a process group killed by ``kill -9``). While the
    training process waits it watches every worker, and :meth:`check` (called by the DataLoader
    between steps) notices a dead one within a step, however many groups are queued.

    Args:
        stream: The :class:`~tokenloom.loader.pipeline.dataset.PackedStream` (detached: no torch
        class). workers: Number of processes (>= 1).
        context: A multiprocessing context or start method (default ``spawn``; ``forkserver``
            works too; ``fork`` is refused: Lance is not fork-safe).
        prefetch: Groups each worker may have queued ahead of the training process.
        timeout: Seconds to wait for one group before giving up (0: no limit; a dead worker is
            detected either way).
        init_fn: Called in each worker with its index before it reads (``worker_init_fn``).
        main_objects: Functions the stream calls in the workers (a row transform): one defined
            in the script's ``__main__`` makes the workers run the script again to find it.
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
        main_objects: tuple = (),
        persistent: bool = False,
    ) -> None:
        if workers < 1:
            raise LoaderError(f"workers must be >= 1, got {workers}")
        self.stream, self.workers = stream, int(workers)
        self.context = multiprocessing_context(context)
        self.prefetch, self.timeout, self.init_fn = max(int(prefetch), 1), float(timeout), init_fn
        self.main_objects = tuple(main_objects)
        self.torch_imported: bool | None = None
        """Whether any worker had torch imported when it finished (``None`` until one did)."""
        self.numba_imported: bool | None = None
        """The same for numba (a token stream's workers pack with the prebuilt kernel, without
        it)."""
        self.persistent = bool(persistent)
        self.passes = 0
        """Passes these processes ran to their end."""
        self.running = False
        """Whether a pass is being iterated (a persistent pool is reused only between passes)."""
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._started = False
        self._checked = 0.0  # time.monotonic() of the last check()

    @classmethod
    def of_loader(
        cls, loader: Any, stream: Any, *, main_objects: tuple = (), persistent: bool = False
    ) -> WorkerPool:
        """The pool a ``torch.utils.data.DataLoader`` subclass's settings ask for:
        ``num_workers``, ``multiprocessing_context``, ``prefetch_factor``, ``timeout`` and
        ``worker_init_fn``, on ``stream`` (its dataset's detached stream)."""
        return cls(
            stream,
            loader.num_workers,
            context=loader.multiprocessing_context,
            prefetch=loader.prefetch_factor or 2,
            timeout=loader.timeout,
            init_fn=loader.worker_init_fn,
            main_objects=main_objects,
            persistent=persistent,
        )

    @property
    def alive(self) -> bool:
        """Whether the processes are started and idle or running (a persistent pool between
        passes)."""
        return self._started

    @property
    def stopped(self) -> bool:
        """Whether the processes were started and have since been stopped (closed, or a pass
        left before its end); a pool not yet started is not stopped."""
        return bool(self._procs) and not self._started

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty when not started)."""
        return [p.pid for p in self._procs] if self._started else []

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
        forkserver = ctx.get_start_method() == "forkserver"
        pipes = [ctx.Pipe(duplex=True) for _ in range(W)]
        self._conns = [here for here, _ in pipes]
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(
                    self.stream, w, W, pipes[w][1], self.init_fn, os.getpid(), self.prefetch,
                    forkserver, self.persistent,
                ),
                name=f"tokenloom-loader-{w}",
                daemon=True,
            )
            for w in range(W)
        ]  # fmt: skip
        self._started = True
        try:
            with main_not_rerun(not defined_in_main(self.init_fn, *self.main_objects)):
                for p in self._procs:
                    p.start()
        finally:
            for _, there in pipes:
                there.close()  # the workers hold them: a worker's death is an EOF here

    def _run(self, cursor: tuple[int, int] | None) -> Iterator[Any]:
        W = self.workers
        finished = False
        self.running = True
        try:
            if not self._started:
                self._start()
            elif not self.persistent:
                raise LoaderError("a WorkerPool that is not persistent runs one pass")
            procs, conns = self._procs, self._conns
            if self.persistent and cursor is not None:
                order = ("cursor", (int(cursor[0]), int(cursor[1])))
                for v in range(W):
                    self._tell(conns[v], procs[v], v, order)
            w = 0
            while True:
                kind, payload = self._get(conns[w], procs[w], w)
                if kind == "error":
                    _raise(w, *payload)
                if kind == "done":
                    # groups are dealt round-robin: the first worker without one in its turn
                    # means every later group index is past the epoch's end
                    self._done(payload)
                    for v in [*range(w + 1, W), *range(w)] if self.persistent else []:
                        kind, payload = self._get(conns[v], procs[v], v)  # its "done" too
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
                self._tell(conns[w], procs[w], w, "credit")
                if payload.slots is not None:
                    # its ring is mapped here (unpickling took the descriptor)
                    self._tell(conns[w], procs[w], w, "taken")
                yield payload
                w = (w + 1) % W
        finally:
            self.running = False
            if not (self.persistent and finished):
                self.close()

    def _done(self, info: dict) -> None:
        self.torch_imported = bool(self.torch_imported) or info["torch_imported"]
        self.numba_imported = bool(self.numba_imported) or info["numba_imported"]

    def close(self) -> None:
        """Stop the processes (a persistent pool's next :meth:`run` starts new ones). Idle
        persistent workers are sent ``("stop", None)`` first; any still running are ended."""
        if not self._started:
            return
        self._started = False
        procs, conns = self._procs, self._conns
        if self.persistent and not self.running:
            for c in conns:
                try:
                    c.send(("stop", None))
                except OSError:  # it died, or closed its end
                    pass
            deadline = time.monotonic() + _POLL_S
            for p in procs:
                if p.pid is not None:
                    p.join(max(deadline - time.monotonic(), 0.0))
        self._stop(procs, conns)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown; daemons go anyway
            pass

    def check(self) -> None:
        """Raise :class:`WorkerError` if a worker has died (a non-zero exit: killed, out of
        memory); a worker that finished its groups exits with 0. At most every
        :data:`_CHECK_S` (a check is a ``waitpid`` per worker: called per batch, that was ~10%
        of the training process's CPU per batch with two workers)."""
        now = time.monotonic()
        if now - self._checked < _CHECK_S:
            return
        self._checked = now
        for w, p in enumerate(self._procs if self._started else []):
            code = p.exitcode if p.pid is not None else None
            if code:
                raise WorkerError(describe_exit(w, p.pid, code))

    def _tell(self, conn: Any, proc: Any, w: int, message: Any) -> None:
        try:
            conn.send(message)
        except OSError:  # the worker closed its end: it finished its groups, or it died
            proc.join(_POLL_S)
            if proc.exitcode:
                raise WorkerError(describe_exit(w, proc.pid, proc.exitcode)) from None

    def _get(self, conn: Any, proc: Any, w: int) -> tuple[str, Any]:
        started = time.monotonic()
        while True:
            if mp.connection.wait([conn, proc.sentinel], timeout=_POLL_S) and conn.poll():
                message = self._recv(conn, proc, w)
                if message is not None:
                    return message
            if not proc.is_alive():
                if conn.poll():  # what it sent just before exiting
                    message = self._recv(conn, proc, w)
                    if message is not None:
                        return message
                raise WorkerError(describe_exit(w, proc.pid, proc.exitcode))
            self.check()  # another worker, whose groups are queued, may be the dead one
            if self.timeout and time.monotonic() - started > self.timeout:
                raise WorkerError(
                    f"DataLoader timed out after {self.timeout:g} s waiting for worker {w}"
                )

    @staticmethod
    def _recv(conn: Any, proc: Any, w: int) -> tuple[str, Any] | None:
        """The worker's next message; ``None`` at the end of its pipe (it died). A group whose
        ring descriptor can no longer be fetched (the worker died holding it) is its death."""
        try:
            return conn.recv()  # type: ignore[no-any-return]
        except EOFError:
            return None
        except Exception as exc:
            proc.join(_POLL_S)
            if proc.exitcode:
                raise WorkerError(describe_exit(w, proc.pid, proc.exitcode)) from exc
            raise

    @staticmethod
    def _stop(procs: list[Any], conns: list[Any]) -> None:
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
        for c in conns:
            c.close()


class KeptPool:
    """The worker pool a loader keeps between passes with ``persistent_workers``, with what it
    was started for (a key of the dataset's read settings), for every loader alike."""

    def __init__(self) -> None:
        self._kept: tuple[tuple, WorkerPool] | None = None

    @property
    def pool(self) -> WorkerPool | None:
        """The kept pool until its workers are stopped (a stopped one is forgotten); it may not
        have started yet (its first pass starts it)."""
        if self._kept is not None and self._kept[1].stopped:
            self._kept = None
        return self._kept[1] if self._kept is not None else None

    def get(
        self, key: tuple, start: Callable[[bool], WorkerPool], *, persistent: bool
    ) -> WorkerPool:
        """This pass's workers: the kept ones when the last pass ran to its end, they live and
        ``key`` equals theirs (items compared by identity, then equality); else ``start``'s,
        kept when ``persistent``."""
        if persistent and self._kept is not None:
            kept_key, kept = self._kept
            same = all(a is b or a == b for a, b in zip(kept_key, key, strict=True))
            if not kept.stopped and not kept.running and same:  # (a pass still iterated: new ones)
                return kept
        self.close()
        pool = start(persistent)
        if persistent:
            self._kept = (key, pool)
        return pool

    def close(self) -> None:
        """Stop the kept workers; the next pass starts new ones."""
        if self._kept is not None:
            self._kept[1].close()
            self._kept = None
