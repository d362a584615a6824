"""What confirming a lock's writes costs: acquire + release with and without ``replicas=1``.

Run (it starts a redis-server and a replica of it on free loopback ports and stops both by
PID at the end)::

    .venv/bin/python benchmarks/bench_replicas.py

Two measurements, each condition interleaved in blocks inside every repetition, medians of
the repetitions:

1. Sequential: one task, acquire + release on one name, plain and with ``replicas=1`` (the
   acquire's script and ``WAIT 1 1000`` in one write on a connection of the confirmed-write
   pool; the release is not confirmed). The replica is on the same machine, so the
   figures are WAIT's own cost (a round trip of the replication stream to the replica and
   its acknowledgement back), not a network's.
2. 32 tasks, each on a name of its own: the confirmed acquires share the pool's eight
   connections (each carries one write and its WAIT at a time); the plain ones the shared
   multiplexed wire.

The server's CPU is the master's (the replica's is not metered).
"""

from __future__ import annotations

import harness as h

import aioratelimit as arl

TTL = 30.0
SEQ_N = h.scaled(2000, 20)
SEQ_BLOCK = min(100, SEQ_N)
TASKS = 32
PER_TASK = h.scaled(20, 2)
CHUNKS = h.scaled(10, 1)


def pair(backend: arl.Backend, name: str, replicas: int) -> h.Op:
    """One acquire + release of ``name`` (``replicas``: what the acquire waits for)."""
    lock = arl.Lock(name, ttl=TTL, backend=backend, replicas=replicas)

    async def op(i: int) -> None:
        lease = await lock.acquire()
        await lease.release()

    return op


def per_task(backend: arl.Backend, head: str, replicas: int) -> h.Op:
    """Acquire + release, each task (``i // PER_TASK`` of its chunk) on a name of its own."""
    locks = [
        arl.Lock(f"{head}:{t}", ttl=TTL, backend=backend, replicas=replicas) for t in range(TASKS)
    ]

    async def op(i: int) -> None:
        lease = await locks[(i // PER_TASK) % TASKS].acquire()
        await lease.release()

    return op


async def body(lab: h.Lab) -> None:
    replica = h.RedisServer(lab.scratch, "--replicaof", "127.0.0.1", str(lab.redis.port))
    try:

        def synced() -> bool:
            with replica.client() as client:
                return bool(client.info("replication").get("master_link_status") == "up")

        h.wait_for(synced, "the replica to sync")
        backend = h.our_backend(lab.url, lab.prefix)
        try:
            await measure(lab, backend)
        finally:
            await backend.aclose()
    finally:
        replica.stop()


async def measure(lab: h.Lab, backend: arl.Backend) -> None:
    seq = {
        "plain": pair(backend, f"{lab.prefix}:seq-plain", 0),
        "replicas=1": pair(backend, f"{lab.prefix}:seq-wait", 1),
    }
    crowd = {
        "plain": per_task(backend, f"{lab.prefix}:crowd-plain", 0),
        "replicas=1": per_task(backend, f"{lab.prefix}:crowd-wait", 1),
    }
    for op in (*seq.values(), *crowd.values()):  # warm-up: scripts loaded, pool open
        await op(0)
    seq_reps, crowd_reps = h.Reps(), h.Reps()
    for rep in range(h.REPS):
        h.progress(f"repetition {rep + 1}/{h.REPS}")
        seq_reps.append(await h.interleave(seq, SEQ_N, SEQ_BLOCK, rep, lab.meter))
        crowd_reps.append(await h.crowds(crowd, TASKS, PER_TASK, CHUNKS, rep, lab.meter))
    header = ["condition", "acquire+release/s", "µs each", "vs plain", "server CPU µs"]
    for title, reps in (
        ("Sequential acquire + release (one task)", seq_reps),
        (f"Acquire + release, {TASKS} tasks on names of their own", crowd_reps),
    ):
        rows = [
            [
                name,
                reps.rate(name),
                reps.latency(name),
                reps.speed(name, "plain"),
                reps.server(name),
            ]
            for name in ("plain", "replicas=1")
        ]
        h.print_table(title, header, rows)
    h.print_notes(
        "`replicas=1`: the acquire's script and `WAIT 1 1000` go in one write on a"
        " connection of the confirmed-write pool; the release goes on the shared wire,"
        " unconfirmed. Server CPU is the master's."
    )


if __name__ == "__main__":
    h.run(body, "Locks confirmed by a replica (WAIT) against plain locks")
