"""DataLoader worker processes that import no torch.

A torch DataLoader worker runs torch's worker loop, so every worker imports torch: about 190 MB
resident per process before it reads a byte, most of it private (relocated library pages), which
is most of what a loader tree's memory is on a small machine. tokenloom's workers only read and
pack (:class:`~tokenloom.loader.dataset.PackedStream`: Lance and numpy), so
:class:`WorkerPool` runs them as plain spawned processes instead:

* worker ``w`` of ``W`` is sent a detached copy of the stream (its plan inputs are mapped from the
  node's plan store, not copied) and builds groups ``w, w + W, ...`` of the rest of the epoch
  into its shared-memory ring (:class:`~tokenloom.loader.buffers.SharedSlots`);
* each group crosses as one small message on the worker's own pipe, at most
  ``prefetch_factor`` groups ahead of the credits the training process returns, so a worker
  never runs further ahead than its ring allows; pipes, not ``multiprocessing.Queue``, whose
  named semaphores (``/dev/shm/sem.mp-*``) outlive a process group killed by ``kill -9``;
* a spawned worker does not run the training script again: the stream needs nothing from
  ``__main__``, and a script's ``import torch`` would undo the point (with a
  ``worker_init_fn`` defined in ``__main__`` the script is run, as torch's workers do);
  ``forkserver`` works too, ``fork`` is refused (Lance is not fork-safe);
* the training process reads the pipes round-robin: the stream is the same for any ``W``;
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

from tokenloom.loader.read import LoaderError
from tokenloom.process import defined_in_main, die_with_parent, main_not_rerun

__all__ = ["WorkerPool", "WorkerError", "describe_exit", "multiprocessing_context"]

_POLL_S = 0.25  # how often a waiting training process checks that its worker is alive
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
) -> None:
    """Body of worker ``worker``: its groups, then ``("done", info)`` or ``("error", ...)``.

    ``conn`` is the worker's end of a pipe: it sends at most ``prefetch`` groups ahead of the
    ``"credit"`` messages the training process returns for the groups it took. The ring's
    descriptor is handed over by this process (``DupFd``) when the training process reads the
    first group, so a worker that is done waits for its ``"taken"`` message before it exits."""
    # under forkserver the parent is the fork server, which ends with the training process
    die_with_parent(os.getppid() if forkserver else parent)
    credits, taken, sent_ring = prefetch, False, False

    def receive() -> None:  # one message; EOFError once the training process is gone
        nonlocal credits, taken
        message = conn.recv()
        credits += message == "credit"
        taken = taken or message == "taken"

    try:
        if init_fn is not None:
            init_fn(worker)
        for group in stream.groups(worker, workers):
            while credits <= 0:
                receive()
            credits -= 1
            sent_ring = sent_ring or group.slots is not None
            conn.send(("group", group))
        conn.send(("done", {"torch_imported": "torch" in sys.modules}))
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
        stream: The :class:`~tokenloom.loader.dataset.PackedStream` (detached: no torch class).
        workers: Number of processes (>= 1).
        context: A multiprocessing context or start method (default ``spawn``; ``forkserver``
            works too; ``fork`` is refused: Lance is not fork-safe).
        prefetch: Groups each worker may have queued ahead of the training process.
        timeout: Seconds to wait for one group before giving up (0: no limit; a dead worker is
            detected either way).
        init_fn: Called in each worker with its index before it reads (``worker_init_fn``).
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
    ) -> None:
        if workers < 1:
            raise LoaderError(f"workers must be >= 1, got {workers}")
        self.stream, self.workers = stream, int(workers)
        self.context = multiprocessing_context(context)
        self.prefetch, self.timeout, self.init_fn = max(int(prefetch), 1), float(timeout), init_fn
        self.torch_imported: bool | None = None
        """Whether any worker had torch imported when it finished (``None`` until one did)."""
        self._procs: list[Any] = []

    def __iter__(self) -> Iterator[Any]:
        ctx, W = self.context, self.workers
        forkserver = ctx.get_start_method() == "forkserver"
        pipes = [ctx.Pipe(duplex=True) for _ in range(W)]
        conns = [here for here, _ in pipes]
        procs = [
            ctx.Process(
                target=_worker_main,
                args=(
                    self.stream, w, W, pipes[w][1], self.init_fn, os.getpid(), self.prefetch,
                    forkserver,
                ),
                name=f"tokenloom-loader-{w}",
                daemon=True,
            )
            for w in range(W)
        ]  # fmt: skip
        self._procs = procs
        try:
            with main_not_rerun(not defined_in_main(self.init_fn)):
                for p in procs:
                    p.start()
            for _, there in pipes:
                there.close()  # the workers hold them: a worker's death is an EOF here
            w = 0
            while True:
                kind, payload = self._get(conns[w], procs[w], w)
                if kind == "error":
                    _raise(w, *payload)
                if kind == "done":
                    # groups are dealt round-robin: the first worker without one in its turn
                    # means every later group index is past the epoch's end
                    self.torch_imported = bool(self.torch_imported) or payload["torch_imported"]
                    return
                self._tell(conns[w], procs[w], w, "credit")
                if payload.slots is not None:
                    # its ring is mapped here (unpickling took the descriptor)
                    self._tell(conns[w], procs[w], w, "taken")
                yield payload
                w = (w + 1) % W
        finally:
            self._stop(procs, conns)

    def check(self) -> None:
        """Raise :class:`WorkerError` if a worker has died (a non-zero exit: killed, out of
        memory); a worker that finished its groups exits with 0."""
        for w, p in enumerate(self._procs):
            code = p.exitcode if p.pid is not None else None
            if code:
                raise WorkerError(describe_exit(w, p.pid, code))

    def _tell(self, conn: Any, proc: Any, w: int, message: str) -> None:
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
