"""Operating long-running flows on a Ray cluster from a shell: start, list, status, stop.

    ray start --head
    driftstream start myflows:orders -p 2 --guarantee exactly-once --snapshot-dir /data/snaps
    driftstream list
    driftstream status orders --watch
    driftstream rescale orders -p 4               # final snapshot, restart at 4 instances, go on
    driftstream stop orders                       # final snapshot, then shut down
    driftstream start myflows:orders -p 3 --guarantee exactly-once --snapshot-dir /data/snaps --resume

Each command connects to the cluster at ``--address``, else ``$RAY_ADDRESS``, else the one
``ray start`` runs on this machine; under Ray Jobs (``ray job submit -- driftstream start ...``)
the job's driver finds it the same way. A started flow is detached: it outlives the command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Optional

from driftstream.engine.cli.status_view import duration, flow_table, status_view


def cluster_address(address: Optional[str]) -> str:
    """``--address``, else ``$RAY_ADDRESS``, else ``auto`` (never a new local Ray: a detached
    flow on an instance that ends with this command would end with it)."""
    return address or os.environ.get("RAY_ADDRESS") or "auto"


def _connect(args: argparse.Namespace) -> None:
    from driftstream.engine.runtime.ray_session import ensure_ray

    ensure_ray(cluster_address(args.address))


def start(args: argparse.Namespace, load_flow: Callable) -> int:
    from driftstream.engine.api.handle import start_on_ray

    flow = load_flow(args.flow)
    options = dict(guarantee=args.guarantee, snapshot_interval=args.snapshot_interval, resume=args.resume, standbys=args.standbys,
                   fresh=args.fresh, allow_state_changes=args.allow_state_changes, allow_new_partitions=args.allow_new_partitions)
    if args.snapshot_dir:
        # The coordinator runs in another process (maybe on another node): a relative path would be its own.
        options["snapshot_dir"] = args.snapshot_dir if "://" in args.snapshot_dir else os.path.abspath(args.snapshot_dir)
    if args.tls_ca or args.tls_cert or args.tls_key:
        options["data_plane_tls"] = {"ca": os.path.abspath(args.tls_ca or ""), "cert": os.path.abspath(args.tls_cert or ""),
                                     "key": os.path.abspath(args.tls_key or "")}
    plan = flow.plan(args.parallelism)  # an invalid flow fails here, before any cluster is touched
    print(plan.describe())
    handle = start_on_ray(plan, address=cluster_address(args.address), detached=True, **options)
    info = handle.describe()
    print(f"started flow {info['name']!r}: {info['state']}, guarantee {info['guarantee']}, snapshots in {info['snapshot_dir']}")
    print(f"see it with `driftstream status {info['name']}`, stop it with `driftstream stop {info['name']}`")
    return 0


def list_(args: argparse.Namespace) -> int:
    from driftstream.engine.api.handle import list_flows

    _connect(args)
    print(flow_table(list_flows()))
    return 0


def status(args: argparse.Namespace) -> int:
    from driftstream.engine.api.handle import attach

    _connect(args)
    handle = attach(args.name)
    if args.json:
        print(json.dumps({"flow": handle.describe(), "status": handle.status()}, default=str, indent=1))
        return 0
    before, before_at = handle.status(), time.time()
    while True:
        time.sleep(args.interval)
        now = handle.status()
        view = status_view(handle.describe(), now, before, time.time() - before_at)
        if args.watch:
            sys.stdout.write("\x1b[2J\x1b[H" if sys.stdout.isatty() else "\n")
        print(view, flush=True)
        if not args.watch or not now.get("running", True):
            return 0
        before, before_at = now, time.time()


def stop(args: argparse.Namespace) -> int:
    from driftstream.engine.api.handle import attach

    _connect(args)
    handle = attach(args.name)
    result = handle.stop(timeout=args.timeout)
    print(f"stopped flow {args.name!r} after a final snapshot ({result.metrics.snapshots} snapshots in this run)")
    print(result.metrics.summary())
    return 0


def rescale(args: argparse.Namespace) -> int:
    from driftstream.engine.api.handle import attach

    _connect(args)
    report = attach(args.name).rescale(args.parallelism, timeout=args.timeout)
    print(f"flow {args.name!r} rescaled from {report['from']} to {report['to']} instances: snapshot {report['snapshot']} "
          f"(drained in {duration(report['drain_s'])}), restarted in {duration(report['restart_s'])}, first output "
          f"{duration(report['first_output_s'])} after reading stopped")
    return 0


def add_commands(sub: argparse._SubParsersAction, load_flow: Callable) -> None:
    """The subcommands start, list, status, rescale and stop of the ``driftstream`` parser."""
    address_help = "Ray cluster address HOST:PORT (default: $RAY_ADDRESS, else the cluster `ray start` runs here)"
    p = sub.add_parser("start", help="start a flow detached on a Ray cluster; returns once it runs")
    p.add_argument("flow", help="package.module:flow (importable on the cluster's nodes)")
    p.add_argument("--parallelism", "-p", type=int, default=1)
    p.add_argument("--guarantee", default="exactly-once", choices=["exactly-once", "at-least-once", "at-most-once", "none"])
    p.add_argument("--snapshot-interval", type=float, default=1.0, help="seconds between snapshots (default 1)")
    p.add_argument("--snapshot-dir", default=None, help="where snapshots go (a path every node sees, for recovery on any node)")
    p.add_argument("--standbys", type=int, default=0, help="spare actors that replace a lost one without starting a process")
    p.add_argument("--resume", action="store_true", help="continue from the newest snapshot in --snapshot-dir (at any parallelism)")
    p.add_argument("--fresh", action="store_true", help="discard the snapshots in --snapshot-dir (this flow's or another's) and "
                   "start from the beginning; without --resume or --fresh a directory holding snapshots is refused")
    p.add_argument("--allow-state-changes", action="store_true",
                   help="resume although stateful steps were added (they start empty) or removed (their state is dropped)")
    for what, text in (("ca", "the CA that signs every node's certificate"), ("cert", "the certificate actors present"),
                       ("key", "its private key")):
        p.add_argument(f"--tls-{what}", default=None, help=f"data-plane TLS: {text} (PEM, the same path on every node; "
                       "give all three)")
    p.add_argument("--allow-new-partitions", action="store_true",
                   help="resume although a source has more partitions than the snapshot knows (read from their start)")
    p.add_argument("--address", default=None, help=address_help)
    p.set_defaults(fn=lambda a: start(a, load_flow))
    p = sub.add_parser("list", help="the flows on a Ray cluster")
    p.add_argument("--address", default=None, help=address_help)
    p.set_defaults(fn=list_)
    p = sub.add_parser("status", help="a running flow's figures: throughput, lags, latency, snapshots, recoveries")
    p.add_argument("name", help="the flow's name (driftstream list)")
    p.add_argument("--watch", action="store_true", help="refresh until the flow ends (Ctrl-C to leave)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes, and over which rates are taken")
    p.add_argument("--json", action="store_true", help="the raw status as JSON")
    p.add_argument("--address", default=None, help=address_help)
    p.set_defaults(fn=status)
    p = sub.add_parser("rescale", help="change a running flow's parallelism: a final snapshot, then a restart at N")
    p.add_argument("name")
    p.add_argument("--parallelism", "-p", type=int, required=True, help="the new parallelism (up to the flow's max_parallelism)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the rescale")
    p.add_argument("--address", default=None, help=address_help)
    p.set_defaults(fn=rescale)
    p = sub.add_parser("stop", help="stop a flow: a final snapshot, then shut down (start --resume continues)")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the final snapshot")
    p.add_argument("--address", default=None, help=address_help)
    p.set_defaults(fn=stop)
