"""Every ``benchmarks/bench_*.py`` still runs: a tiny smoke run of each against the suite's server.

No timing is asserted: a smoke run (REPS=2, SCALE=0.01) only proves the script works end to
end, prints its Markdown tables and cleans up its keys. The smoke runs are the main lane's
(and any run outside scripts/test): the other lanes of scripts/test (another Python, or
uvloop; ``AIORATELIMIT_TEST_LANE``) skip them, about 80 s each of what the library's own tests
already cover there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import redis
from support import loops
from support.cluster_fixtures import sync_client

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))
#: A Markdown table's header separator line, e.g. ``|------|---|``.
TABLE_RULE = re.compile(r"^\|(-+\|)+$", re.MULTILINE)


def bench_keys(client: redis.Redis) -> set[bytes]:
    return set(client.scan_iter(match="arlb:*", count=1000))


def cluster_bench_keys(url: str) -> set[bytes]:
    """``bench_keys`` on every master of the cluster at ``url``."""
    with cast(redis.RedisCluster, sync_client(url)) as client:
        return {
            key
            for node in client.get_primaries()
            for key in bench_keys(client.get_redis_connection(node))
        }


#: The smoke runs are the main lane's (tests/support/loops.py).
SMOKE = pytest.mark.skipif(
    not loops.MAIN_LANE, reason="the benchmarks' smoke runs are the main lane's"
)

#: These also measure a cluster, so their smoke runs need one (below).
WITH_CLUSTER = [s for s in SCRIPTS if s.stem in ("bench_cluster", "bench_transport")]
STANDALONE = [s for s in SCRIPTS if s not in WITH_CLUSTER]


def smoke_run(script: Path, sync_redis: redis.Redis, **urls: str) -> str:
    """Run ``script`` tiny with these URL variables; check it exits 0, prints Markdown
    tables and leaves no key of its own behind; return what it printed."""
    before = bench_keys(sync_redis)
    env = {**os.environ, **urls, "REPS": "2", "SCALE": "0.01"}
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("# "), done.stdout[:500]
    assert TABLE_RULE.search(done.stdout), done.stdout[-2000:]
    assert bench_keys(sync_redis) <= before
    return done.stdout


@pytest.mark.slow
@SMOKE
@pytest.mark.parametrize("script", STANDALONE, ids=[s.stem for s in STANDALONE])
def test_benchmark_smoke_run(script: Path, redis_url: str, sync_redis: redis.Redis) -> None:
    """The script exits 0, prints Markdown tables, and leaves no key of its own behind."""
    stdout = smoke_run(script, sync_redis, REDIS_URL=redis_url)
    if script.stem == "bench_attack":
        # Not a timing: its three measurements are all printed.
        for title in ("Denied decisions per second", "A flood of 64 tasks", "breaker open"):
            assert title in stdout, stdout[-3000:]
    if script.stem == "bench_idempotency":
        # Not a timing: the counts must say one round trip per operation on both sides.
        for operation in ("consume_token", "idempotent replay", "issue_token"):
            row = re.search(rf"^\| {operation} +\| ([0-9.]+) +\| ([0-9.]+) +\|$",
                            stdout, re.MULTILINE)  # fmt: skip
            assert row is not None, stdout[-3000:]
            assert row.groups() == ("1.00", "1.00"), row.group(0)


@pytest.mark.slow
@SMOKE
@pytest.mark.parametrize("script", WITH_CLUSTER, ids=[s.stem for s in WITH_CLUSTER])
def test_cluster_benchmark_smoke_run(
    script: Path, redis_url: str, cluster_url: str, sync_redis: redis.Redis
) -> None:
    """These run the same way, their cluster rows too on the suite's shared cluster, and
    leave no key of their own on its masters either."""
    before = cluster_bench_keys(cluster_url)
    stdout = smoke_run(script, sync_redis, REDIS_URL=redis_url, REDIS_CLUSTER_URL=cluster_url)
    assert cluster_bench_keys(cluster_url) <= before
    if script.stem == "bench_transport":
        assert "On the 3+3 cluster" in stdout, stdout[-3000:]


@pytest.mark.slow
@SMOKE
def test_profile_hit_smoke_run(redis_url: str, sync_redis: redis.Redis) -> None:
    """benchmarks/profile_hit.py (the client's CPU per decision) runs tiny, cProfile on,
    prints its one line and the profile, and deletes the keys it wrote."""
    before = bench_keys(sync_redis)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "profile_hit.py"), "--url", redis_url,
         "--tasks", "4", "--decisions", "200", "--limiter", "sw", "--profile", "3"],
        cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.match(r"sw tasks=4 decisions=200 cpu_us=[0-9.]+ per_s=[0-9]+ ", done.stdout)
    assert "tottime" in done.stdout, done.stdout[-2000:]
    assert bench_keys(sync_redis) <= before


def test_every_benchmark_is_found() -> None:
    """The smoke runs above cover at least the rate-limit benchmark (the glob still matches),
    and bench_cluster, named by hand, is among the scripts."""
    assert BENCHMARKS / "bench_ratelimit.py" in STANDALONE
    assert BENCHMARKS / "bench_cluster.py" in SCRIPTS
