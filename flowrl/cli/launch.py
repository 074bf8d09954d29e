"""``flowrl launch [cluster options] -- COMMAND ...``: run a flowrl command on every process of this node with
torchrun, the cluster read from the command line and the scheduler's variables (:mod:`flowrl.cluster`)."""

from __future__ import annotations

import argparse

from flowrl.cli.options import Text, Whole


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a flowrl command (train, eval, suite run, ...) on every process of this node with torchrun. Nodes,"
        " this node's rank, processes per node and the main node's address come from the options, else from"
        " torchrun's, accelerate's or SLURM's variables, else one node with a process per GPU. Run it once on"
        " each node."
    )
    parser.add_argument("command", nargs="+", type=Text(), metavar="COMMAND",
                        help="the flowrl command and its arguments, after --: flowrl launch -- train RECIPE")
    parser.add_argument("--nnodes", type=Whole(1), default=None, metavar="N", help="nodes in the job")
    parser.add_argument("--node-rank", type=Whole(0), default=None, metavar="R", help="this node's rank, 0 to N-1")
    parser.add_argument("--nproc-per-node", type=Whole(1), default=None, metavar="K",
                        help="processes on this node (default: one per visible GPU, one on a CPU)")
    parser.add_argument("--master-addr", type=Text(), default=None, metavar="HOST", help="the rank-0 node's address")
    parser.add_argument("--master-port", type=Whole(1, 65536), default=None, metavar="PORT",
                        help="a free port on the rank-0 node (default 29500)")
    parser.add_argument("--join-timeout", type=Whole(1), default=300, metavar="S",
                        help="seconds to wait for every node before giving up with one line (default 300)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved cluster and the command; run nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the cluster, then replace this process with torchrun (signals reach it directly)."""
    import os
    import shlex
    import sys

    from flowrl.cluster import ClusterError, launch_command, resolve, wait_for_nodes

    command = list(args.command)
    if command[0] == "flowrl":
        command = command[1:]
    if not command or command[0] in ("launch", "-h", "--help"):
        raise ClusterError("flowrl launch: give the flowrl command to run after --, e.g. flowrl launch -- train RECIPE")
    import torch

    given = {"nnodes": args.nnodes, "node_rank": args.node_rank, "nproc_per_node": args.nproc_per_node,
             "master_addr": args.master_addr, "master_port": args.master_port}
    cluster = resolve(given, os.environ, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    argv = launch_command(sys.executable, cluster, command, args.join_timeout)
    print(f"flowrl launch: {cluster.describe()}", file=sys.stderr)
    if args.dry_run:
        print(shlex.join(argv))
        return 0
    wait_for_nodes(cluster, args.join_timeout)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached
