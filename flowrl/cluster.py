"""The cluster a launch runs on (``flowrl launch``): how many nodes, this node's rank, processes per node, and the
main node's address and port, read from the command line and from the variables schedulers and launchers set;
the variables each training process starts with; and the check that every node has joined.

Each value is taken from the first source that gives it, in this order:

1. the command line (``--nnodes``, ``--node-rank``, ``--nproc-per-node``, ``--master-addr``, ``--master-port``);
2. torchrun's variables: ``NNODES``, ``NODE_RANK``, ``NPROC_PER_NODE``, ``MASTER_ADDR``, ``MASTER_PORT``;
3. accelerate's: ``NUM_MACHINES``, ``MACHINE_RANK``, ``GPUS_PER_NODE``, ``MAIN_PROCESS_IP``,
   ``MAIN_PROCESS_PORT``;
4. SLURM's: ``SLURM_JOB_NUM_NODES`` (or ``SLURM_NNODES``), ``SLURM_NODEID``, ``SLURM_GPUS_ON_NODE``, and the
   first host of ``SLURM_JOB_NODELIST`` as the main node (run one launch per node: ``srun --ntasks-per-node=1``);
5. defaults: one node, rank 0, one process per visible GPU (one on a CPU), 127.0.0.1, port 29500.

A variable that is set but malformed is refused in one line naming it, never skipped.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import attrs

from flowrl.errors import UserError

DEFAULT_PORT = 29500
FIELDS = ("nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port")
SOURCES: dict[str, tuple[tuple[str, ...], ...]] = {  # per field: the variables of each family, in order
    "nnodes": (("NNODES",), ("NUM_MACHINES",), ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")),
    "node_rank": (("NODE_RANK",), ("MACHINE_RANK",), ("SLURM_NODEID",)),
    "nproc_per_node": (("NPROC_PER_NODE",), ("GPUS_PER_NODE",), ("SLURM_GPUS_ON_NODE",)),
    "master_addr": (("MASTER_ADDR",), ("MAIN_PROCESS_IP",), ("SLURM_JOB_NODELIST", "SLURM_NODELIST")),
    "master_port": (("MASTER_PORT",), ("MAIN_PROCESS_PORT",), ()),
}


class ClusterError(UserError):
    """A cluster that cannot be launched as given: one line naming the option or variable, exit status 2."""


@attrs.frozen
class Cluster:
    """The resolved launch, and where each value came from (``"--nnodes"``, ``"SLURM_NODEID"``, ``"default"``)."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    source: dict[str, str] = attrs.field(factory=dict, eq=False)

    def describe(self) -> str:
        return ", ".join(f"{field} = {getattr(self, field)} ({self.source.get(field, 'default')})" for field in FIELDS)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[03-05,09],cpu1`` -> ``gpu03``; ``a,b`` -> ``a``."""
    match = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match or not match.group(1):
        raise ValueError(f"not a node list: {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    if not first.isdigit():
        raise ValueError(f"not a node list: {nodelist!r}")
    return prefix + first


def _slurm_count(text: str) -> int:
    """SLURM's per-node counts: ``8``, ``gpu:8``, ``a100:4``, ``8(x2)`` -> the first count."""
    match = re.match(r"^(?:[\w-]+:)*(\d+)(?:\(x\d+\))?(?:,.*)?$", text.strip())
    if not match:
        raise ValueError(text)
    return int(match.group(1))


def _parse(field: str, variable: str, text: str) -> int | str:
    try:
        if field == "master_addr":
            value: int | str = first_host(text) if variable.startswith("SLURM_") else text.strip()
            if not value:
                raise ValueError(text)
            return value
        number = _slurm_count(text) if variable == "SLURM_GPUS_ON_NODE" else int(text)
    except ValueError:
        raise ClusterError(f"{variable}={text!r}: expected {'a host' if field == 'master_addr' else 'a whole number'}"
                           f" for {field}") from None
    return number


def resolve(given: Mapping[str, int | str | None], env: Mapping[str, str], gpus: int) -> Cluster:
    """The cluster from the command line's ``given`` values (None: not given), the environment ``env`` and the
    number of visible GPUs (the default processes per node)."""
    values: dict[str, int | str] = {}
    source: dict[str, str] = {}
    for field in FIELDS:
        if given.get(field) is not None:
            values[field], source[field] = given[field], "--" + field.replace("_", "-")  # type: ignore[assignment]
            continue
        for family in SOURCES[field]:
            variable = next((v for v in family if env.get(v, "").strip()), None)
            if variable is not None:
                values[field], source[field] = _parse(field, variable, env[variable]), variable
                break
    defaults: dict[str, int | str] = {"nnodes": 1, "node_rank": 0, "nproc_per_node": max(1, gpus),
                                      "master_addr": "127.0.0.1", "master_port": DEFAULT_PORT}
    merged = {**defaults, **values}
    cluster = Cluster(int(merged["nnodes"]), int(merged["node_rank"]), int(merged["nproc_per_node"]),
                      str(merged["master_addr"]), int(merged["master_port"]), source)
    _check(cluster)
    return cluster


def _check(cluster: Cluster) -> None:
    def where(field: str) -> str:
        return cluster.source.get(field, "default")

    if cluster.nnodes < 1:
        raise ClusterError(f"nnodes = {cluster.nnodes} ({where('nnodes')}): expected at least 1")
    if cluster.nproc_per_node < 1:
        raise ClusterError(f"nproc_per_node = {cluster.nproc_per_node} ({where('nproc_per_node')}): expected at"
                           " least 1")
    if not 0 <= cluster.node_rank < cluster.nnodes:
        raise ClusterError(f"node_rank = {cluster.node_rank} ({where('node_rank')}) is not below nnodes ="
                           f" {cluster.nnodes} ({where('nnodes')})")
    if not 0 < cluster.master_port < 65536:
        raise ClusterError(f"master_port = {cluster.master_port} ({where('master_port')}): expected 1 to 65535")


def worker_env(cluster: Cluster, local_rank: int) -> dict[str, str]:
    """The variables one training process of this node starts with (what torchrun would set: accelerate and
    ``torch.distributed`` read them)."""
    world = cluster.nnodes * cluster.nproc_per_node
    return {"RANK": str(cluster.node_rank * cluster.nproc_per_node + local_rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(cluster.nproc_per_node),
            "GROUP_RANK": str(cluster.node_rank), "NODE_RANK": str(cluster.node_rank),
            "MASTER_ADDR": cluster.master_addr, "MASTER_PORT": str(cluster.master_port)}


def worker_command(python: str, command: Sequence[str]) -> list[str]:
    """The command line of one training process: ``flowrl COMMAND...``."""
    return [python, "-m", "flowrl.cli.main", *command]


@contextmanager
def _native_stderr_quiet() -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null inside the block (what native code writes there is dropped)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def wait_for_nodes(cluster: Cluster, timeout_s: float) -> None:
    """Every node's launcher checks in at the main node (a TCP store on ``master_port + 1``) before any starts
    training; a node that has not joined within ``timeout_s`` ends every launcher that waits with one line,
    instead of a hang or torchrun's traceback. Nothing to wait for on one node."""
    import datetime
    import time

    from torch.distributed import TCPStore

    if cluster.nnodes == 1:
        return
    where = f"{cluster.master_addr}:{cluster.master_port + 1}"
    advice = ("start flowrl launch on every node with the same --nnodes, --master-addr and --master-port (and a free"
              " port above it)")
    deadline = time.monotonic() + timeout_s
    try:
        with _native_stderr_quiet():  # c10d logs every retry with a C++ stack; the one line below says it all
            store = TCPStore(cluster.master_addr, cluster.master_port + 1, cluster.nnodes, cluster.node_rank == 0,
                             datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    except Exception as error:  # the main node's address is not reachable in time, or its port is taken
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ClusterError(f"node {cluster.node_rank}: cannot reach the main node at {where} within {timeout_s:g} s"
                           f" ({first}); {advice}") from None
    joined = store.add("joined", 1)
    while joined < cluster.nnodes:
        if time.monotonic() > deadline:
            raise ClusterError(f"only {joined} of {cluster.nnodes} nodes joined at {where} within {timeout_s:g} s"
                               f" (--join-timeout); {advice}")
        time.sleep(0.2)
        joined = store.add("joined", 0)
    left = store.add("left", 1)
    if cluster.node_rank == 0:  # the store lives on the main node: keep it until every node has read the count
        while left < cluster.nnodes and time.monotonic() < deadline + 30:
            time.sleep(0.1)
            left = store.add("left", 0)
    del store
