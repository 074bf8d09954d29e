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

A variable that is set but malformed is refused in one line naming it, never skipped. ``SLURM_JOB_NODELIST`` is
read with SLURM's whole host-list grammar (:func:`expand_hosts`); a training process reads its own rank through
:func:`process_rank`, which checks ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` together.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import string
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from flowrl.core.errors import UserError

if TYPE_CHECKING:
    from torch.distributed import Store

DEFAULT_PORT = 29500
MAX_PORT = 65534  # the join check listens on the port above the main node's
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


HOST_CHARS = frozenset(string.ascii_letters + string.digits + "._-")
Part = str | tuple[tuple[int, int, int], ...]  # a host name's literal text, or a bracket: (first, last, width)s


def _host_list(nodelist: str) -> list[list[Part]]:
    """SLURM's host list parsed: comma-separated host expressions, each literal text and bracket groups (``[1-3,7]``:
    comma-separated numbers and ranges ``first-last``, last not below first); a ValueError for anything else."""
    text = nodelist.strip()
    hosts: list[list[Part]] = []
    parts: list[Part] = []
    i = 0
    while i <= len(text):
        char = text[i] if i < len(text) else ","
        if char == ",":
            if not parts:
                raise _bad(f"an empty host name at character {i + 1}")
            hosts.append(parts)
            parts = []
        elif char == "[":
            close = text.find("]", i)
            if close < 0:
                raise _bad(f"the [ at character {i + 1} is not closed")
            parts.append(tuple(_bracket_item(item, text[i:close + 1]) for item in text[i + 1:close].split(",")))
            i = close
        elif char == "]":
            raise _bad(f"the ] at character {i + 1} closes no [")
        elif char in HOST_CHARS:
            if parts and isinstance(parts[-1], str):
                parts[-1] += char
            else:
                parts.append(char)
        else:
            raise _bad(f"{char!r} at character {i + 1} cannot be in a host name")
        i += 1
    return hosts


def _bad(why: str) -> ValueError:
    return ValueError(f"not a SLURM host list ({why})")


def _bracket_item(item: str, bracket: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", item)
    if not match:
        what = "an empty []" if bracket == "[]" else f"{item!r} in {bracket} is not a number or a range"
        raise _bad(what)
    first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if last < first:
        raise _bad(f"the range {item} in {bracket} ends below its start")
    return first, last, len(match.group(1))  # the start's width: zero padding kept as written there


def _names(parts: Sequence[Part], prefix: str = "") -> Iterator[str]:
    """The host names of one expression, in order, one at a time (a range is never held whole)."""
    if not parts:
        yield prefix
        return
    head, rest = parts[0], parts[1:]
    if isinstance(head, str):
        yield from _names(rest, prefix + head)
        return
    for first, last, width in head:
        for number in range(first, last + 1):
            yield from _names(rest, prefix + str(number).zfill(width))


def expand_hosts(nodelist: str) -> Iterator[str]:
    """Every host of a SLURM host list, in order: ``gpu[01-02,07],login`` -> gpu01, gpu02, gpu07, login;
    ``rack[1-2]-n[1-2]`` -> rack1-n1, rack1-n2, rack2-n1, rack2-n2. The whole list is checked first: a
    ValueError (``not a SLURM host list (...)``) for an unclosed or empty bracket, a blank, an empty host name, a
    range that ends below its start, or a character that cannot be in a host name."""
    hosts = _host_list(nodelist)  # here, before the first name is asked for
    return (name for parts in hosts for name in _names(parts))


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list (the main node): ``gpu[03-05,09],cpu1`` -> ``gpu03``."""
    return next(expand_hosts(nodelist))


def _whole(text: str) -> int | None:
    """A whole number written in ASCII digits (a leading minus allowed, blanks around it); None for anything else
    (``1.0``, ``1_0``, ``+1``, ``''``)."""
    return int(text) if re.fullmatch(r"\s*-?[0-9]+\s*", text) else None


def _slurm_count(text: str) -> int:
    """SLURM's per-node counts: ``8``, ``gpu:8``, ``a100:4``, ``8(x2)`` -> the first count."""
    match = re.match(r"^(?:[\w-]+:)*(\d+)(?:\(x\d+\))?(?:,.*)?$", text.strip())
    if not match:
        raise ValueError(text)
    return int(match.group(1))


def _parse(field: str, variable: str, text: str) -> int | str:
    if field == "master_addr":
        if not variable.startswith("SLURM_"):
            if re.search(r"\s", text.strip()):
                raise ClusterError(f"{variable}={text!r}: expected one host name or address, without blanks")
            return text.strip()
        try:
            return first_host(text)
        except ValueError as error:
            raise ClusterError(f"{variable}={text!r}: {error}") from None
    try:
        number = _slurm_count(text) if variable == "SLURM_GPUS_ON_NODE" else _whole(text)
    except ValueError:
        number = None
    if number is None:
        raise ClusterError(f"{variable}={text!r}: expected a whole number for {field}")
    if field == "master_port" and not 1 <= number <= MAX_PORT:
        raise ClusterError(f"{variable}={text!r}: expected a port from 1 to {MAX_PORT} (the join check listens on the"
                           " port above it)")
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
    if not 1 <= cluster.master_port <= MAX_PORT:
        raise ClusterError(f"master_port = {cluster.master_port} ({where('master_port')}): expected a port from 1 to"
                           f" {MAX_PORT} (the join check listens on the port above it)")


def worker_env(cluster: Cluster, local_rank: int) -> dict[str, str]:
    """The variables one training process of this node starts with (what torchrun would set: accelerate and
    ``torch.distributed`` read them)."""
    world = cluster.nnodes * cluster.nproc_per_node
    return {"RANK": str(cluster.node_rank * cluster.nproc_per_node + local_rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(cluster.nproc_per_node),
            "GROUP_RANK": str(cluster.node_rank), "NODE_RANK": str(cluster.node_rank),
            "MASTER_ADDR": cluster.master_addr, "MASTER_PORT": str(cluster.master_port)}


def process_rank(environ: Mapping[str, str]) -> tuple[int, int]:
    """This process's rank and the number of processes, ``(RANK, WORLD_SIZE)``, from the variables a launcher
    (``flowrl launch``, torchrun, accelerate) sets; ``(0, 1)`` when none is set. Each one set is checked, with
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` when they are set: whole numbers, ``WORLD_SIZE`` at least 1, ``RANK``
    from 0 to ``WORLD_SIZE`` - 1, ``LOCAL_WORLD_SIZE`` from 1 to ``WORLD_SIZE``, ``LOCAL_RANK`` below
    ``LOCAL_WORLD_SIZE`` (else ``WORLD_SIZE``), and ``RANK`` set whenever ``WORLD_SIZE`` is above 1. Anything else
    is a :class:`ClusterError` naming the variable and its value."""

    def read(name: str, low: int, high: int | None, expected: str) -> int | None:
        if name not in environ:
            return None
        value = _whole(environ[name])
        if value is None or value < low or (high is not None and value > high):
            raise ClusterError(f"{name}={environ[name]!r}: expected {expected}")
        return value

    world = read("WORLD_SIZE", 1, None, "a whole number of processes, at least 1") or 1
    of_world = f"WORLD_SIZE={environ['WORLD_SIZE']!r}" if "WORLD_SIZE" in environ else "WORLD_SIZE unset: one process"
    rank = read("RANK", 0, world - 1, f"a whole number from 0 to {world - 1} ({of_world})")
    if rank is None and world > 1:
        raise ClusterError(f"RANK is unset but {of_world}: a launcher sets both (flowrl launch, torchrun, accelerate)")
    local_world = read("LOCAL_WORLD_SIZE", 1, world, f"a whole number from 1 to {world} ({of_world})")
    node = world if local_world is None else local_world
    of_node = of_world if local_world is None else f"LOCAL_WORLD_SIZE={environ['LOCAL_WORLD_SIZE']!r}"
    read("LOCAL_RANK", 0, node - 1, f"a whole number from 0 to {node - 1} ({of_node})")
    return rank or 0, world


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


COMPARED = ("nnodes", "nproc_per_node", "master_port", "command", "flowrl", "torch", "device")  # must agree


def node_facts(cluster: Cluster, command: Sequence[str]) -> dict[str, object]:
    """What this node brings to the join check: its rank and host, and what every node must agree on
    (:data:`COMPARED`: the cluster's shape, the command its processes run, flowrl's and torch's versions and the
    kind of device), with where each cluster value came from."""
    import shlex
    import socket

    import torch

    from flowrl.core.version import __version__

    return {"node_rank": cluster.node_rank, "host": socket.gethostname(), "nnodes": cluster.nnodes,
            "nproc_per_node": cluster.nproc_per_node, "master_port": cluster.master_port,
            "command": shlex.join(command), "flowrl": __version__, "torch": torch.__version__,
            "device": "cuda" if torch.cuda.is_available() else "cpu", "source": dict(cluster.source)}


def disagreement(nodes: Sequence[Mapping[str, object]], nnodes: int) -> str | None:
    """The one line that ends every node when the nodes that have joined so far (their :func:`node_facts`) cannot
    form one job of ``nnodes`` nodes: a value of :data:`COMPARED` that differs (naming it and what each node
    said), more nodes than ``nnodes``, or a node rank given twice; None while they may (some may not have joined)."""

    def who(facts: Mapping[str, object], key: str) -> str:
        source = facts.get("source")
        where = f", {source.get(key, 'default')}" if key in FIELDS and isinstance(source, Mapping) else ""
        return f"node {facts['node_rank']} (host {facts['host']}{where})"

    def shown(value: object) -> str:
        return repr(value) if isinstance(value, str) else str(value)

    ordered = sorted(nodes, key=lambda facts: facts["node_rank"] if isinstance(facts["node_rank"], int) else -1)
    for facts in ordered[1:]:
        for key in COMPARED:
            if facts[key] != ordered[0][key]:
                return (f"the nodes disagree: {key} = {shown(ordered[0][key])} on {who(ordered[0], key)} but"
                        f" {shown(facts[key])} on {who(facts, key)}; start flowrl launch on every node with the same"
                        " --nnodes, --nproc-per-node, --master-port and command, and the same flowrl and torch")
    if len(ordered) > nnodes:
        named = ", ".join(f"node {f['node_rank']} on host {f['host']}" for f in ordered)
        return f"{len(ordered)} nodes joined but nnodes = {nnodes} ({named}); start flowrl launch once on each node"
    for before, facts in itertools.pairwise(ordered):
        if facts["node_rank"] == before["node_rank"]:
            return (f"node rank {facts['node_rank']} is given by two nodes (host {before['host']} and host"
                    f" {facts['host']}); give each node its own --node-rank, 0 to {nnodes - 1}")
    return None


def wait_for_nodes(cluster: Cluster, timeout_s: float, command: Sequence[str] = ()) -> None:
    """Every node's launcher checks in at the main node (a TCP store on ``master_port + 1``) before any starts
    training, with what it brings (:func:`node_facts`, ``command`` being the flowrl command its processes will
    run). Nodes that disagree (:func:`disagreement`) end every node that has joined with the same line; a node that
    has not joined within ``timeout_s`` ends every launcher that waits with one line, instead of a hang or
    torchrun's traceback. Nothing to wait for on one node."""
    import datetime
    import time

    from torch.distributed import TCPStore

    if cluster.nnodes == 1:
        return
    where = f"{cluster.master_addr}:{cluster.master_port + 1}"
    advice = ("start flowrl launch on every node with the same --nnodes, --master-addr and --master-port (and a free"
              " port above it)")
    facts = node_facts(cluster, command)
    deadline = time.monotonic() + timeout_s
    with _native_stderr_quiet():  # c10d logs every retry with a C++ stack; the one line below says it all
        try:
            store = TCPStore(cluster.master_addr, cluster.master_port + 1, cluster.nnodes, cluster.node_rank == 0,
                             datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        except Exception as error:  # the main node's address is not reachable in time, or its port is taken
            raise ClusterError(f"node {cluster.node_rank}: cannot reach the main node at {where} within"
                               f" {timeout_s:g} s ({_first_line(error)}); {advice}") from None
        try:
            _join(store, cluster, facts, deadline, f"at {where} within {timeout_s:g} s (--join-timeout); {advice}")
        except ClusterError:
            raise
        except Exception as error:  # the main node's launcher ended (its own line says why) while this one waited
            raise ClusterError(f"node {cluster.node_rank}: lost the main node at {where} during the join check"
                               f" ({_first_line(error)}); see the main node's output") from None
        finally:
            del store


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _join(store: Store, cluster: Cluster, facts: Mapping[str, object], deadline: float, late: str) -> None:
    """The join check on the store: each node takes a slot, writes its facts there and reads everyone's until
    ``nnodes`` have joined and agree; the first node to find a disagreement writes its line under ``error`` and
    every node ends with that line. The main node keeps the store until every node has read what it needed."""
    import time

    slot = store.add("slots", 1) - 1
    store.set(f"node/{slot}", json.dumps(facts))
    store.add("joined", 1)
    seen: dict[int, dict[str, object]] = {}
    problem = None
    while problem is None:
        if store.check(["error"]):
            problem = store.get("error").decode()
            break
        for other in range(store.add("slots", 0)):
            if other not in seen and store.check([f"node/{other}"]):
                seen[other] = json.loads(store.get(f"node/{other}"))
        found = disagreement(list(seen.values()), cluster.nnodes)
        if found is not None:  # the first line written wins: every node ends with the same one
            problem = store.compare_set("error", "", found).decode()
            break
        if len(seen) >= cluster.nnodes:
            break
        if time.monotonic() > deadline:
            problem = f"only {len(seen)} of {cluster.nnodes} nodes joined {late}"
            break
        time.sleep(0.2)
    key = "left" if problem is None else "told"
    done = store.add(key, 1)
    if cluster.node_rank == 0:  # the store lives on the main node: keep it until the others have read it
        others = cluster.nnodes if problem is None else store.add("slots", 0)
        until = deadline + 30 if problem is None else time.monotonic() + 10
        while done < others and time.monotonic() < until:
            time.sleep(0.1)
            done = store.add(key, 0)
    if problem is not None:
        raise ClusterError(problem)
