"""One decision over three keys (``hit_all``) against three separate hits.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_multikey.py

Each operation admits one request limited per user, per IP and per tenant (``FixedWindow``,
``SlidingWindow`` and ``TokenBucket`` at limits every hit is admitted by, over 100 users,
100 IPs and 10 tenants), three ways:

- **hit_all**: ``arl.hit_all([(per_user, u), (per_ip, ip), (per_tenant, t)])``, one script
  call, all or nothing;
- **3 hits, chained**: ``per_user.hit``, then ``per_ip.hit``, then ``per_tenant.hit``, one
  after another (three round trips; not all or nothing: a refusal by the second would
  leave the first counted);
- **3 hits, gathered**: the three hits at once with ``asyncio.gather`` (written together
  on the backend's one connection; not all or nothing either).

Sequential (one operation at a time) and 64 tasks at once, the conditions interleaved in
blocks whose order rotates; medians over the repetitions, the ratio the median of the
per-repetition ratios to **3 hits, chained**; this process's CPU and the server's per
operation (for three hits: all three) beside each.
"""

from __future__ import annotations

import asyncio

import harness as h

import aioratelimit as arl

USERS, IPS, TENANTS = 100, 100, 10
RATE = "1000000000/hour"  # every hit admitted: the same path each time
TASKS = 64
CHAINED = "3 hits, chained"


KINDS = {"FixedWindow": arl.FixedWindow, "SlidingWindow": arl.SlidingWindow,
         "TokenBucket": arl.TokenBucket}  # fmt: skip


def limiters(kind: str, backend: arl.Backend) -> list[arl.Limiter]:
    return [KINDS[kind](RATE, backend=backend, name=name) for name in ("user", "ip", "tenant")]


def keys(i: int) -> tuple[str, str, str]:
    return f"u{i % USERS}", f"10.0.{i % IPS}.1", f"t{i % TENANTS}"


def cases(lims: list[arl.Limiter]) -> dict[str, h.Op]:
    per_user, per_ip, per_tenant = lims

    async def hit_all(i: int) -> None:
        u, ip, t = keys(i)
        await arl.hit_all([(per_user, u), (per_ip, ip), (per_tenant, t)])

    async def chained(i: int) -> None:
        u, ip, t = keys(i)
        await per_user.hit(u)
        await per_ip.hit(ip)
        await per_tenant.hit(t)

    async def gathered(i: int) -> None:
        u, ip, t = keys(i)
        await asyncio.gather(per_user.hit(u), per_ip.hit(ip), per_tenant.hit(t))

    return {"hit_all": hit_all, CHAINED: chained, "3 hits, gathered": gathered}


async def main(lab: h.Lab) -> None:
    backend = h.our_backend(lab.url, lab.prefix)
    header = [
        "condition", "requests/s", "µs/request", "÷ chained (speed)", "client CPU µs",
        "server CPU µs",
    ]  # fmt: skip
    try:
        for kind in KINDS:
            ops = cases(limiters(kind, backend))
            await h.interleave(ops, 30, 30)  # warm-up: connections, scripts
            sequential, crowd = h.Reps(), h.Reps()
            for rep in range(h.REPS):
                h.progress(f"{kind}: repetition {rep + 1}/{h.REPS}")
                sequential.append(await h.interleave(ops, h.scaled(3_000, 30), 250, rep, lab.meter))
                crowd.append(await h.crowds(ops, TASKS, h.scaled(30, 1), 4, rep, lab.meter))
            for title, reps in (("sequential", sequential), (f"{TASKS} tasks", crowd)):
                h.print_table(
                    f"{kind}, user + IP + tenant, {title}",
                    header,
                    [
                        [case, reps.rate(case), reps.latency(case), reps.speed(case, CHAINED),
                         reps.client(case), reps.server(case)]
                        for case in ops
                    ],
                )  # fmt: skip
        h.print_notes(
            "hit_all decides and counts the three keys in one script call, all or nothing;"
            " the three hits are three script calls and are not: under a limit that refuses,"
            " the keys hit before the refusal stay counted. Ratios are throughput relative to"
            " the chained hits (the median of the per-repetition ratios)."
        )
    finally:
        await backend.aclose()


if __name__ == "__main__":
    h.run(main, "Several keys in one decision: hit_all against three hits")
