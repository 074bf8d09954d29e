"""``flowrl launch [cluster options] -- COMMAND ...``: run a flowrl command on every process of this node, the
cluster read from the command line and the scheduler's variables (:mod:`flowrl.utils.cluster`).

The launcher starts this node's processes itself (with the variables torchrun would set), passes SIGINT,
SIGTERM and SIGHUP on to them, and exits with their status: a stop signal to any process of any node ends every
process after one checkpoint, so every launcher exits 128 + the signal (143 for SIGTERM). A process that fails
while the others wait in a collective would hang them: they get :data:`GRACE_S` seconds, then SIGTERM, then
SIGKILL.
"""

from __future__ import annotations

import argparse

from flowrl.cli.options import Text, Whole

GRACE_S = 60  # after one process failed, how long the others may take to end on their own


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a flowrl command (train, eval, suite run, ...) on every process of this node. Nodes, this node's"
        " rank, processes per node and the main node's address come from the options, else from torchrun's,"
        " accelerate's or SLURM's variables, else one node with a process per GPU. Run it once on each node."
    )
    parser.add_argument("command", nargs="+", type=Text(), metavar="COMMAND",
                        help="the flowrl command and its arguments, after --: flowrl launch -- train RECIPE")
    parser.add_argument("--nnodes", type=Whole(1), default=None, metavar="N", help="nodes in the job")
    parser.add_argument("--node-rank", type=Whole(0), default=None, metavar="R", help="this node's rank, 0 to N-1")
    parser.add_argument("--nproc-per-node", type=Whole(1), default=None, metavar="K",
                        help="processes on this node (default: one per visible GPU, one on a CPU)")
    parser.add_argument("--master-addr", type=Text(), default=None, metavar="HOST", help="the rank-0 node's address")
    parser.add_argument("--master-port", type=Whole(1, 65535), default=None, metavar="PORT",
                        help="a free port on the rank-0 node, with the one above it (default 29500)")
    parser.add_argument("--join-timeout", type=Whole(1), default=300, metavar="S",
                        help="seconds to wait for every node before giving up with one line (default 300)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved cluster and each process's command; run nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the cluster, wait for every node, then run this node's processes to their end."""
    import os
    import shlex
    import sys

    import torch

    from flowrl.utils.cluster import ClusterError, resolve, wait_for_nodes, worker_command, worker_env

    command = list(args.command)
    if command[0] == "flowrl":
        command = command[1:]
    if not command or command[0] in ("launch", "-h", "--help"):
        raise ClusterError("flowrl launch: give the flowrl command to run after --, e.g. flowrl launch -- train RECIPE")
    given = {"nnodes": args.nnodes, "node_rank": args.node_rank, "nproc_per_node": args.nproc_per_node,
             "master_addr": args.master_addr, "master_port": args.master_port}
    cluster = resolve(given, os.environ, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    print(f"flowrl launch: {cluster.describe()}", file=sys.stderr)
    argv = worker_command(sys.executable, command)
    envs = [worker_env(cluster, k) for k in range(cluster.nproc_per_node)]
    if args.dry_run:
        for env in envs:
            print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(argv))
        return 0
    wait_for_nodes(cluster, args.join_timeout, command)  # the nodes compare what they bring, command included
    return supervise(argv, envs)


def supervise(argv: list[str], envs: list[dict[str, str]]) -> int:
    """Start one process per environment, pass stop signals on, and return their exit status."""
    import os
    import signal
    import subprocess
    import time

    # each in its own session: a terminal's Ctrl-C reaches only this launcher, which passes it on once (twice
    # would be "stop at once, without a checkpoint")
    # as torchrun does: several processes on one node start with one OpenMP thread each unless told otherwise
    threads = {"OMP_NUM_THREADS": "1"} if len(envs) > 1 and "OMP_NUM_THREADS" not in os.environ else {}
    procs = [subprocess.Popen(argv, env={**os.environ, **threads, **env}, start_new_session=True) for env in envs]

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    stops = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    previous = {s: signal.signal(s, forward) for s in stops}
    try:
        failed_at = None
        while any(p.poll() is None for p in procs):
            codes = [p.returncode for p in procs if p.returncode is not None]
            if failed_at is None and any(codes):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                forward(signal.SIGTERM, None)
                time.sleep(30)
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
            time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    codes = [p.wait() for p in procs]
    code = next((c for c in codes if c), 0)
    return 128 - code if code < 0 else code  # a process killed by signal N: 128 + N, as a shell reports it
