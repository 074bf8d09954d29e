"""``flowrl serve REWARD``: build one reward (a registered name or ``module:Class``, with ``--set key=value``
settings) and serve it over HTTP until interrupted.

It listens on 127.0.0.1 unless ``--host`` says otherwise; with ``FLOWRL_SERVE_TOKEN`` set, every request must
carry ``Authorization: Bearer <token>``. ``--port 0`` takes a free port; the first line on stdout names the
address either way (``serving REWARD at http://HOST:PORT``). Module-level imports stay light (``flowrl --help``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from typing import Any

from flowrl.cli.options import KeyValue, Text, Whole
from flowrl.core.errors import UserError

DEFAULT_PORT = 8700


class ServeError(UserError, ValueError):
    """The server cannot start as asked (the port is taken, the address is not this machine's)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reward", type=Text(), help="a registered reward (flowrl ls reward) or module:Class")
    parser.add_argument("--set", action="append", default=[], type=KeyValue(), metavar="KEY=VALUE",
                        help="a setting of the reward's table (strict=true)")
    parser.add_argument("--host", default="127.0.0.1", type=Text(), help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", default=DEFAULT_PORT, type=Whole(0, 65536),
                        help=f"port (default {DEFAULT_PORT}; 0: a free one)")
    parser.add_argument("--max-body-mb", default=256, type=Whole(1), help="largest request body, MiB (default 256)")
    parser.add_argument("--quiet", action="store_true", help="no access log")
    parser.set_defaults(func=run)


def build_reward(name: str, settings: list[str]) -> Any:
    """The reward ``name`` with ``key=value`` settings (``reward.key=value`` too), validated and checked."""
    from flowrl.config.recipe import apply_override
    from flowrl.core.convert import ConfigError, structure
    from flowrl.core.group_rewards import GroupReward
    from flowrl.core.registry import registry

    cls: Any = registry("reward").get(name)
    if issubclass(cls, GroupReward):  # the client sends chunks of batch_size images, which can split a group
        raise ConfigError([("reward", f"'{name}' is a group-wise reward, which scores each group of a rollout "
                                      "together and cannot be served (a served reward gets chunks of images that "
                                      "may split a group); use it in the training process")])
    data: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for item in settings:
        key = item.removeprefix("reward.")
        apply_override(data, key, problems)
    if problems:
        raise ConfigError(problems)
    config = structure(cls.Config, data)
    found = [(key, message) for key, message in cls.check_config(config)]
    if found:
        raise ConfigError(found)
    reward = cls(config)
    reward.check()
    return reward


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``; a :class:`ServeError` naming the address when it cannot be."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {error.strerror or error} (--host, --port)") from None
    sock.listen(128)
    return sock


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from flowrl.serve.app import create_app

    reward = build_reward(args.reward, args.set)
    token = os.environ.get("FLOWRL_SERVE_TOKEN", "")
    app = create_app(reward, args.reward, token=token, max_body_bytes=args.max_body_mb * 1024 * 1024)
    sock = listening_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {args.reward} at http://{shown}:{port}", flush=True)
    if not is_loopback(args.host) and not token:
        print(f"warning: listening on {args.host} without a token: anyone who reaches it can use the reward "
              "(set FLOWRL_SERVE_TOKEN)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=not args.quiet, timeout_keep_alive=30)
    if not args.quiet:  # the access log is uvicorn's INFO: shown unless --quiet, with its other logs at warning
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
