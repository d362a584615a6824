"""The long failover run: clients hold and release one lock in a loop while the Sentinel
master is killed again and again, without and with ``replicas=1``; the checker's table.

Run (it starts a master, two replicas and three sentinels, and stops them by PID)::

    .venv/bin/python benchmarks/failover_holds.py [--seconds 120] [--clients 4]
        [--kill-every 8] [--force [--detach 1.5]] [--hold-min 0.2] [--hold-max 2]
        [--ttl 3] [--gap 0]

Each run (one per option) starts a fresh group. ``--clients`` tasks, each with a backend of
its own, hold the lock (``async with arl.lock``, renewed every ttl/3) for a random while,
release it and pause (``--gap``), recording each hold on their own monotonic clock with its
fence. Every ``--kill-every`` seconds the master is SIGKILLed by its PID; once the sentinels
have promoted a replica, the killed server starts again (the sentinels make it a replica)
and, once the new master has a replica in sync again, the next kill comes. The checker
(tests/support/holds.py) counts the holds, the failovers, and the overlapping holds (two
clients holding at once), and of those the unfenced ones (the later holder with a lower
fence).

Without ``--force`` the failovers are natural: on one machine replication takes
microseconds, and a kill rarely catches a write no replica has. ``--force`` makes it
certain: ``--detach`` seconds before each kill, every replica stops replicating
(``REPLICAOF NO ONE``), so every write in between (acquires, renewals, releases) is lost
with the master. That is the case
``replicas=1`` is for: those acquires are not confirmed, and given back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's deployments and checker

import redis  # noqa: E402
from support.cluster_fixtures import SentinelDeployment, wait_until  # noqa: E402
from support.holds import Hold, Run, table  # noqa: E402
from support.servers import remove_scratch  # noqa: E402

import aioratelimit as arl  # noqa: E402

#: How long a failover, or a replica's sync, may take (seconds).
SETTLE = 60.0


def _info(port: int) -> dict[str, object]:
    with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as client:
        return dict(client.info("replication"))


def _serving(group: SentinelDeployment, victim: int) -> bool:
    """Whether the sentinels name a master other than ``victim`` that says it is one and
    has a replica in sync."""
    try:
        port = group.master_port()
        if port == victim:
            return False
        info = _info(port)
        return info["role"] == "master" and int(str(info.get("connected_slaves", 0))) >= 1
    except (redis.RedisError, OSError, RuntimeError):
        return False


async def client(
    backend: arl.Backend, name: str, who: str, run: Run, until: float, args: argparse.Namespace
) -> None:
    """Hold the lock (``async with``, renewed) for a random while, again and again until
    the loop time ``until``; each hold recorded from the block's start to its end (or to
    its cancellation, when the renewal found the lease lost)."""
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        start = end = fence = None
        try:
            hold = arl.lock(name, ttl=args.ttl, timeout=2.0, backend=backend, replicas=REPLICAS)
            async with hold as lease:
                start, fence = time.monotonic(), lease.fencing_token
                try:
                    await asyncio.sleep(random.uniform(args.hold_min, args.hold_max))
                finally:
                    end = time.monotonic()
        except arl.AioRateLimitError as exc:  # a refusal, an outage, a lease lost
            run.error(exc)
            await asyncio.sleep(0.05)
        if start is not None and end is not None and fence is not None:
            run.holds.append(Hold(start, end, who, fence))
        await asyncio.sleep(random.uniform(0, args.gap))  # (the lock is free now and then)


def detach(group: SentinelDeployment) -> int:
    """Stop every replica replicating (``--force``); the master's port."""
    victim = group.master_port()
    for server in group.servers():
        if server.port != victim and server.proc is not None:
            with contextlib.suppress(redis.RedisError), server.client() as admin:
                admin.execute_command("REPLICAOF", "NO", "ONE")
    return victim


def kill_master(group: SentinelDeployment, victim: int) -> None:
    """SIGKILL the master on ``victim``, wait for the promotion, start the killed server
    again, and wait for the new master to have a replica in sync."""
    server = group.server(victim)
    server.kill()
    wait_until(lambda: _serving(group, victim), SETTLE, "a promoted master with a replica")
    server.extra = ("--repl-diskless-sync-delay", "0")  # the sentinels make it a replica
    server.start()


async def one_run(label: str, args: argparse.Namespace) -> Run:
    run = Run(label)
    group = SentinelDeployment(replicas=2).start()
    print(f"started a Sentinel group for {label!r}", file=sys.stderr)
    backends = [arl.Backend.from_url(group.url) for _ in range(args.clients)]
    try:
        loop = asyncio.get_running_loop()
        until = loop.time() + args.seconds
        name = f"holds-{uuid.uuid4().hex[:8]}"
        tasks = [
            asyncio.create_task(client(b, name, f"c{i}", run, until, args))
            for i, b in enumerate(backends)
        ]
        detached = args.detach if args.force else 0.0
        while loop.time() + args.kill_every < until:
            await asyncio.sleep(args.kill_every - detached)
            if args.force:
                victim = await asyncio.to_thread(detach, group)
                await asyncio.sleep(detached)  # the holds taken now are lost with the master
            else:
                victim = group.master_port()
            await asyncio.to_thread(kill_master, group, victim)
            run.failovers += 1
            print(f"{label}: failover {run.failovers}", file=sys.stderr)
        await asyncio.gather(*tasks)
    finally:
        for b in backends:
            await b.aclose()
        group.stop()
        print(f"stopped the Sentinel group for {label!r}", file=sys.stderr)
    return run


REPLICAS = 0


async def main(args: argparse.Namespace) -> None:
    global REPLICAS
    runs = []
    for replicas in (0, 1):
        REPLICAS = replicas
        runs.append(await one_run(f"replicas={replicas}" if replicas else "no option", args))
    print("# Lock holds across Sentinel failovers\n")
    forced = f", every replica detached {args.detach} s before (--force)" if args.force else ""
    print(
        f"{args.clients} clients holding for {args.hold_min}-{args.hold_max} s (ttl"
        f" {args.ttl} s, renewed), {args.seconds} s a run, the master SIGKILLed every"
        f" {args.kill_every} s{forced}.\n"
    )
    print(table(runs))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=8.0)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--detach", type=float, default=1.5)
    parser.add_argument("--hold-min", type=float, default=0.2)
    parser.add_argument("--hold-max", type=float, default=2.0)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--gap", type=float, default=0.0)
    try:
        asyncio.run(main(parser.parse_args()))
    finally:
        remove_scratch()
