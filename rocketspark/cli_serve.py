"""``rocketspark serve``: a store directory as a RocketMQ NameServer and broker.

    rocketspark serve --store DIR [--listen HOST:PORT] [--broker-port N] [--advertise HOST]
                      [--config broker.conf]

Binds 127.0.0.1 unless ``--listen`` names another host; the NameServer listens
on ``--listen`` (default 127.0.0.1:9876), the broker on ``--broker-port``
(default 10911) of the same host. Routes and cluster info tell clients to reach
the broker at ``--advertise`` (RocketMQ's brokerIP1), by default the listen
host; a wildcard listen host (0.0.0.0, ::) binds every address of the machine
and names none, so it needs ``--advertise``: the server does not guess one
(a guess, RocketMQ's first non-loopback address, is wrong on a machine with
several, and clients then find the NameServer but time out on the broker).
Prints one line when both are up; SIGTERM or
SIGINT stops the servers and closes the store cleanly (flush, checkpoint).
One server per store directory: a second one is refused (StoreLockedError);
embedded readers and writers in other processes may use the store meanwhile.

ACL: when ``DIR/config/plain_acl.yml`` exists (RocketMQ's plain ACL format, see
``remoting/plain_acl.py``), the broker checks every request as a RocketMQ broker
with ``aclEnable`` does (``remoting/access.py``): the signature under the
account's secret key and the account's permissions; a refused request is
answered NO_PERMISSION and touches nothing. The NameServer's requests are not
checked (RocketMQ's NameServer has none). The file is read once, at start: a bad
one stops serve before it listens; edit it, then restart. Serve prints that ACL
is on and how many accounts it has; no secret is ever printed or logged. The
file may be written before the store exists: a directory holding nothing but a
config/ of RocketMQ's config files becomes a new store.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rocketspark.errors import ConfigError, RocketSparkError, StoreLockedError
from rocketspark.remoting.access import AccessControl, acl_path
from rocketspark.remoting.connection import split_address
from rocketspark.remoting.processors import serve
from rocketspark.remoting.server import is_wildcard
from rocketspark.store.message_store import MessageStore

__all__ = ["build_parser", "main", "run"]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:9876"
DEFAULT_BROKER_PORT = 10911
LOCK_NAME = "rocketspark-serve.lock"  # under the store's config/ directory
EXIT_STATUS = """\
exit status:
  0    stopped by SIGTERM or Ctrl-C, cleanly (flushed, checkpointed)
  2    bad usage or input: a wrong option or address, no store directory, a store
       another rocketspark serve serves already, an address in use, a bad
       config/plain_acl.yml"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rocketspark serve",
        description="Serve a rocketspark store as a RocketMQ NameServer and broker, bound to "
        "127.0.0.1 unless --listen names another address. ACL: when DIR/config/plain_acl.yml "
        "exists (RocketMQ's plain ACL format: accounts with accessKey, secretKey and their "
        "topic and group permissions), the broker serves only requests signed by one of its "
        "accounts and permitted to it, and answers others NO_PERMISSION; the file is read at "
        "start (a bad one stops serve before it listens). Without that file every request is "
        "served: bind other addresses only on a network you trust.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--store", help="store directory (default: $ROCKETSPARK_STORE)")
    p.add_argument("--config", help="a broker.conf whose settings the store opens with")
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"the NameServer's HOST:PORT (default {DEFAULT_LISTEN}); the broker binds the "
        "same host",
    )
    p.add_argument(
        "--broker-port",
        type=int,
        default=DEFAULT_BROKER_PORT,
        help=f"the broker's port (default {DEFAULT_BROKER_PORT}; the NameServer's port: one "
        "port serves both)",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST",
        help="the address clients are told to reach the broker at, in routes and cluster "
        "info (RocketMQ's brokerIP1); an IP address also becomes the store host of new "
        "records and msgIds. Default: the --listen host. Required with --listen 0.0.0.0 or "
        "[::]: give the address of this machine that clients reach",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="what the server logs on stderr (default INFO)",
    )
    return p


@contextmanager
def serve_lock(root: str) -> Iterator[None]:
    """Hold the store's serve lock: one server per store directory (StoreLockedError)."""
    directory = os.path.join(root, "config")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(
                f"store {root} is already served by another rocketspark serve ({path} is locked)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def run(
    store: MessageStore,
    *,
    host: str,
    namesrv_port: int,
    broker_port: int,
    stop: threading.Event,
    out: TextIO,
    advertise: str | None = None,
) -> None:
    """Serve ``store`` until ``stop`` is set; the caller closes the store.

    Routes name the broker at ``advertise`` (default ``host``, which must then not be
    a wildcard: ConfigError)."""
    with serve_lock(store.root):
        acl = AccessControl.for_store(store.root)  # a bad file stops serve before it listens
        with serve(
            store,
            host=host,
            namesrv_port=namesrv_port,
            broker_port=broker_port,
            advertised_host=advertise,
            acl=acl,
        ) as served:
            advertised = served.broker.broker.address
            listening = ""
            if advertised != served.broker_address:
                listening = f" (listening on {served.broker_address})"
            print(
                f"serving {store.root}: NameServer {served.namesrv_address}, "
                f"broker {store.config.broker_name} at {advertised}{listening}",
                file=out,
                flush=True,
            )
            if acl is None:
                log.info("no %s: every request is served", acl_path(store.root))
            else:
                print(_acl_line(acl), file=out, flush=True)
            stop.wait()
            log.info("stopping")


def _acl_line(acl: AccessControl) -> str:
    """What serve prints when ACL is on: the file and its number of accounts."""
    n = len(acl.acl.accounts)
    line = f"ACL on: {n} account{'' if n == 1 else 's'} from {acl.acl.path}"
    if not n and not acl.acl.global_white:
        line += " (no account: every broker request is refused)"
    return line


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``serve`` with ``argv`` (without the subcommand); returns the exit status."""
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    path = args.store or os.environ.get("ROCKETSPARK_STORE")
    try:
        host, port = split_address(args.listen)
        if not 0 < args.broker_port < 65536:
            raise ConfigError(f"--broker-port must be 1..65535, got {args.broker_port}")
        if path is None and args.config is None:
            raise ConfigError("give the store directory with --store (or $ROCKETSPARK_STORE)")
        overrides: dict[str, Any] = {"listenPort": args.broker_port}
        advertise: str | None = None
        if args.advertise is not None:
            advertise = args.advertise.strip()
            if advertise.startswith("[") and advertise.endswith("]"):
                advertise = advertise[1:-1]
            if not advertise or is_wildcard(advertise) or any(c.isspace() for c in advertise):
                raise ConfigError(
                    f"--advertise is the address clients reach the broker at, got "
                    f"{args.advertise!r}"
                )
            if _is_ip(advertise):
                overrides["brokerIP1"] = advertise
        elif is_wildcard(host):
            raise ConfigError(_needs_advertise(args.listen))
        elif _is_ip(host):  # routes name the listen host: so do new msgIds
            overrides["brokerIP1"] = host
        stop = threading.Event()
        previous = {
            sig: signal.signal(sig, lambda *_: stop.set())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            # Records and msgIds name the store host brokerIP1:listenPort; clients reach a
            # message's broker by its msgId, so that is the broker port (and the advertised
            # address, when it is an IP).
            with MessageStore.open(path, config_file=args.config, **overrides) as store:
                run(
                    store,
                    host=host,
                    namesrv_port=port,
                    broker_port=args.broker_port,
                    stop=stop,
                    out=out,
                    advertise=advertise,
                )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    except (RocketSparkError, OSError) as e:
        print(f"rocketspark serve: {e}", file=sys.stderr)
        return 2
    return 0


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _needs_advertise(listen: str) -> str:
    """The error for a wildcard --listen without --advertise: what to do, with this
    machine's addresses as candidates when it can name some."""
    try:
        found = {
            str(info[4][0])
            for info in socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
        }
        candidates = sorted(a for a in found if not ipaddress.ip_address(a).is_loopback)
    except (OSError, ValueError):
        candidates = []
    hint = f" (this machine's: {', '.join(candidates)})" if candidates else ""
    return (
        f"--listen {listen} binds every address of this machine, and routes must name one: "
        f"give the address clients reach the broker at with --advertise HOST{hint}"
    )


if __name__ == "__main__":
    sys.exit(main())
