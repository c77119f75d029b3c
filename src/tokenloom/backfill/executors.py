"""Executors run work units: inline, in a ``spawn`` process pool (the default), or as Ray tasks.

Lance is not fork-safe, so the local pool always uses ``spawn``. A worker killed mid-unit breaks
the pool; the executor starts a new one and resubmits what is not done (finished units are
checkpointed, so nothing is computed twice).

A worker never outlives its driver, whenever the driver dies (``kill -9`` included, during the
workers' start-up included): see :func:`die_with_parent`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool

from tokenloom.backfill.resources import Resources, infeasible
from tokenloom.backfill.worker import UnitResult, UnitTask, run_unit
from tokenloom.errors import TokenloomError, require
from tokenloom.process import die_with_parent

__all__ = [
    "Executor",
    "InlineExecutor",
    "LocalExecutor",
    "RayExecutor",
    "die_with_parent",
    "make_executor",
]

OnResult = Callable[[UnitResult], None]


class Executor:
    """Runs unit tasks and reports each finished one."""

    name = "abstract"

    def run(self, tasks: Sequence[UnitTask], on_result: OnResult) -> None:
        raise NotImplementedError

    def map(self, fn: Callable, items: Sequence) -> Iterator:
        """``fn(item)`` for each item, results in the order they finish (not the items' order).

        For jobs other than a backfill (the near-dedup band partitions): ``fn`` is a module-level
        function, items and results are small and picklable; work goes through files.
        """
        raise NotImplementedError


class InlineExecutor(Executor):
    """Runs units one after another in this process (``workers=0``; for debugging and tests)."""

    name = "inline"

    def run(self, tasks: Sequence[UnitTask], on_result: OnResult) -> None:
        for task in tasks:
            on_result(run_unit(task))

    def map(self, fn: Callable, items: Sequence) -> Iterator:
        for item in items:
            yield fn(item)


class LocalExecutor(Executor):
    """A pool of ``workers`` spawned processes."""

    name = "local"

    def __init__(self, workers: int, *, max_restarts: int = 3) -> None:
        self.workers = workers
        self.max_restarts = max_restarts

    def run(self, tasks: Sequence[UnitTask], on_result: OnResult) -> None:
        pending = list(tasks)
        restarts = 0
        ctx = multiprocessing.get_context("spawn")
        while pending:
            done: set[str] = set()
            pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=ctx,
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
            try:
                futures = {pool.submit(run_unit, t): t for t in pending}
                remaining = set(futures)
                while remaining:
                    finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        result = fut.result()  # a UDF error propagates from here
                        done.add(futures[fut].unit.name)
                        on_result(result)
                pending = []
            except BrokenProcessPool as exc:
                restarts += 1
                if restarts > self.max_restarts:
                    raise TokenloomError(
                        f"backfill workers died {restarts} times (last: {exc}); finished units "
                        "are checkpointed — run the same command again to continue"
                    ) from exc
                pending = [t for t in pending if t.unit.name not in done]
            finally:
                pool.shutdown(wait=True, cancel_futures=True)

    def map(self, fn: Callable, items: Sequence) -> Iterator:
        if not items:
            return
        pool = ProcessPoolExecutor(
            max_workers=min(self.workers, len(items)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        )
        try:
            for fut in as_completed([pool.submit(fn, item) for item in items]):
                yield fut.result()  # an error in fn propagates from here
        except BrokenProcessPool as exc:
            raise TokenloomError(
                f"a worker died ({exc}); run the same command again (with fewer --workers if "
                "the machine ran out of memory)"
            ) from exc
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor(Executor):
    """Ray tasks: on an existing cluster (``address``) or a local one sized for this machine.

    Each unit is one task asking for the UDF's :class:`~tokenloom.backfill.resources.Resources`
    (one CPU by default), spread over the nodes. Tasks read the table and write their results
    through the table's storage (an object store for a cluster without a shared disk), and
    return only a small :class:`UnitResult` naming the node they ran on.
    """

    name = "ray"

    def __init__(self, workers: int, *, address: str | None = None, max_retries: int = 3) -> None:
        self.workers = workers
        self.address = address
        self.max_retries = max_retries

    def _init(self):  # noqa: ANN202 - returns the ray module
        ray = require("ray", extra="ray")
        if ray.is_initialized():
            return ray
        # Workers must import the modules that define the UDFs, as this process does: its paths
        # first, then the node's own PYTHONPATH (Ray expands ${VAR} from the node's environment;
        # on other machines this process's paths may not exist and the node's are what count).
        paths = [p for p in sys.path if p]
        env = {"PYTHONPATH": os.pathsep.join([*paths, "${PYTHONPATH}"])}
        if self.address:
            ray.init(address=self.address, runtime_env={"env_vars": env}, log_to_driver=False)
        else:
            ray.init(
                num_cpus=self.workers,
                object_store_memory=256 << 20,  # results go to checkpoint files, not the store
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": env},
            )
        return ray

    def run(self, tasks: Sequence[UnitTask], on_result: OnResult) -> None:
        if not tasks:
            return
        ray = self._init()
        udf = tasks[0].udf  # one job: every task runs the same UDF
        self._check_feasible(ray, udf.name, udf.resources)
        remote = ray.remote(
            max_retries=self.max_retries,
            scheduling_strategy="SPREAD",  # units over every node, not the driver's node first
            **udf.resources.ray_options(),
        )(_run_unit_on_ray)
        refs = [remote.remote(t) for t in tasks]
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            try:
                on_result(ray.get(ready[0]))
            except ray.exceptions.RayTaskError as exc:
                for ref in refs:
                    ray.cancel(ref, force=True)
                raise exc.as_instanceof_cause() from None

    def map(self, fn: Callable, items: Sequence) -> Iterator:
        if not items:
            return
        ray = self._init()
        remote = ray.remote(max_retries=self.max_retries, scheduling_strategy="SPREAD", num_cpus=1)(
            fn
        )
        refs = [remote.remote(item) for item in items]
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            try:
                yield ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                for ref in refs:
                    ray.cancel(ref, force=True)
                raise exc.as_instanceof_cause() from None

    def _check_feasible(self, ray, udf_name: str, resources: Resources) -> None:  # noqa: ANN001
        """Refuse a request no node can meet: Ray would leave its tasks pending forever."""
        demand = resources.demand()
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        if not infeasible(demand, nodes):
            return
        have = "; ".join(", ".join(f"{k}={node.get(k, 0):g}" for k in demand) for node in nodes)
        where = f"the Ray cluster at {self.address}" if self.address else "the local Ray"
        raise TokenloomError(
            f"UDF {udf_name} asks Ray for {_fmt(demand)} per unit, but no node of {where} has "
            f"that much (its {len(nodes)} node(s): {have or 'none'}). Start a node that has it "
            "(`ray start --address ... --resources '{\"name\": 1}'`, `--num-gpus N`), or ask "
            "for less: `tokenloom backfill run --num-cpus/--num-gpus/--memory/--resources`, "
            "`UDF.with_resources(...)`"
        )


def _fmt(demand: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in demand.items())


def _run_unit_on_ray(task: UnitTask) -> UnitResult:
    """One unit as a Ray task; the result names the Ray node it ran on."""
    import ray

    result = run_unit(task)
    return dataclasses.replace(result, node=ray.get_runtime_context().get_node_id())


def make_executor(executor: str, workers: int, *, ray_address: str | None = None) -> Executor:
    """Build an executor by name: ``local`` (``workers=0`` runs inline) or ``ray``."""
    if executor == "local":
        return InlineExecutor() if workers == 0 else LocalExecutor(workers)
    if executor == "ray":
        return RayExecutor(max(1, workers), address=ray_address)
    raise TokenloomError(f"executor must be 'local' or 'ray', not {executor!r}")
