"""A real multi-node Ray cluster on this machine, for the scale-out tests.

A head and further nodes are started with ``ray start`` (``--address`` for the others), each with
its own ``--temp-dir``, one CPU, a small object store, every port chosen free, the dashboard and the
log monitor off (one process fewer to start), and a custom resource naming it. Each node's processes
also carry ``TOKENLOOM_TEST_NODE=<name>`` in their environment, so a task can tell which node ran
it.

Every node shares one fresh token (``RAY_AUTH_MODE=token``), so nothing outside the test can
talk to the cluster and the cluster never reads ``~/.ray``. :meth:`RayCluster.stop` kills the
cluster's processes by PID (those whose command line names one of its temp dirs, and every
process below them): ``ray stop`` would stop every Ray cluster of the machine, other people's too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenloom.dev.s3 import free_ports

__all__ = ["RayCluster", "start_cluster"]

_RAY = [sys.executable, "-m", "ray.scripts.scripts"]


@dataclass
class RayCluster:
    """A running cluster: its GCS address and what a driver needs in its environment."""

    address: str = ""
    env: dict[str, str] = field(default_factory=dict)
    """``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` for drivers connecting to it."""
    temp_dirs: list[str] = field(default_factory=list)

    def pids(self) -> list[int]:
        """Every process of the cluster: those naming a temp dir, and all below them."""
        cmdlines, children = _processes()
        roots = [pid for pid, cmd in cmdlines.items() if any(d in cmd for d in self.temp_dirs)]
        out, todo = set(roots), list(roots)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in out:
                    out.add(child)
                    todo.append(child)
        out.discard(os.getpid())
        return sorted(out)

    def stop(self) -> None:
        """Kill every process of the cluster (SIGKILL, by PID) and remove its temp dirs."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        for d in self.temp_dirs:
            shutil.rmtree(d, ignore_errors=True)


def start_cluster(nodes: Mapping[str, Mapping[str, float]]) -> RayCluster:
    """Start one Ray node per entry of ``nodes`` (name → custom resources); the first is the head.

    Raises:
        RuntimeError: naming the node that failed to start, with the tail of its output; the
            nodes already started are stopped first.
    """
    cluster = RayCluster()
    token = secrets.token_hex(16)
    cluster.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base.update(cluster.env, RAY_USAGE_STATS_ENABLED="0")
    try:
        for i, (name, resources) in enumerate(nodes.items()):
            # short: Ray's Unix sockets live below it (a path is at most 107 bytes)
            temp = tempfile.mkdtemp(prefix="tlray-", dir="/tmp")
            cluster.temp_dirs.append(temp)
            port, dash, agent, agent_grpc, runtime_env, metrics = free_ports(6)
            args = [
                "start", "--node-ip-address", "127.0.0.1", "--temp-dir", temp,
                "--num-cpus", "1", "--object-store-memory", str(80 << 20),
                "--resources", json.dumps(dict(resources)),
                "--dashboard-agent-listen-port", str(agent),
                "--dashboard-agent-grpc-port", str(agent_grpc),
                "--runtime-env-agent-port", str(runtime_env),
                "--metrics-export-port", str(metrics),
                "--disable-usage-stats",
                "--include-log-monitor", "false",  # drivers run with log_to_driver=False
            ]  # fmt: skip
            if i == 0:
                args += ["--head", "--port", str(port), "--include-dashboard", "false"]
                args += ["--dashboard-port", str(dash)]
                cluster.address = f"127.0.0.1:{port}"
            else:
                args += ["--address", cluster.address]
            env = {**base, "TOKENLOOM_TEST_NODE": name}
            proc = subprocess.run(
                [*_RAY, *args], env=env, capture_output=True, text=True, timeout=90, check=False
            )
            if proc.returncode != 0:
                raise RuntimeError(
                    f"ray start of node {name!r} failed ({proc.returncode}):\n"
                    f"{(proc.stdout + proc.stderr)[-3000:]}"
                )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _processes() -> tuple[dict[int, str], dict[int, list[int]]]:
    """Command line of every process, and the children of each."""
    cmdlines: dict[int, str] = {}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdlines[pid] = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    return cmdlines, children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
