"""Draw docs/figures/admissions.png: what FixedWindow, SlidingWindow and TokenBucket admit
under the same bursty arrivals, the classic double burst at a window's edge.

A real run of the three limiters on memory://, on a ``ManualClock`` stepped to each
arrival (so the run is exact and takes no time), then drawn with matplotlib (the ``docs``
extra). Prints one JSON line: per limiter, the hits admitted and the most admitted in any
window.

    python docs/figures/admissions.py                         # rewrites the committed PNG
    python docs/figures/admissions.py --smoke --out /tmp/fig  # small and quick (the tests)
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import aioratelimit as arl
from aioratelimit.testing import ManualClock, memory_backend

HERE = Path(__file__).resolve().parent
RATE = arl.Rate(10, 10.0)  # 10 per 10 seconds: a fixed window opens at the first hit
LIMITERS = ("FixedWindow", "SlidingWindow", "TokenBucket")
COLOURS = {"FixedWindow": "#d62728", "SlidingWindow": "#1f77b4", "TokenBucket": "#2ca02c"}
BIN = 0.5  # seconds per bar


def arrivals() -> list[float]:
    """One request at 0 s (it opens the fixed window), 12 in the last second of that window,
    12 in the first second of the next, then one a second until 30 s."""
    burst = [i * 0.075 for i in range(12)]
    return [0.0, *(9.0 + b for b in burst), *(10.0 + b for b in burst), *map(float, range(11, 30))]


async def run(times: list[float]) -> dict[str, list[tuple[float, bool]]]:
    """Every arrival offered to each limiter in turn: ``{limiter: [(time, admitted)]}``."""
    clock = ManualClock(start=1_700_000_000.0)  # a multiple of 10 s: sub-windows on whole s
    backend = memory_backend(clock=clock)
    limiters: dict[str, arl.Limiter] = {
        "FixedWindow": arl.FixedWindow(RATE, backend=backend),
        "SlidingWindow": arl.SlidingWindow(RATE, backend=backend),
        "TokenBucket": arl.TokenBucket(RATE, backend=backend),
    }
    seen: dict[str, list[tuple[float, bool]]] = {name: [] for name in limiters}
    now = 0.0
    for t in times:
        clock.advance(t - now)
        now = t
        for name, limiter in limiters.items():
            seen[name].append((t, (await limiter.hit("client")).allowed))
    await backend.aclose()
    return seen


def most_in_a_window(admitted: list[float], window: float) -> int:
    """The most admitted hits within any interval of length ``window`` (closed on the left,
    open on the right, as a limiter's window is)."""
    return max((sum(s <= t < s + window for t in admitted) for s in admitted), default=0)


def draw(
    times: list[float], seen: dict[str, list[tuple[float, bool]]], out: Path, dpi: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    end = max(times) + 1.0
    edges = [i * BIN for i in range(int(end / BIN) + 1)]
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(8.0, 8.0), layout="constrained")
    first, *rows = axes
    first.hist(times, bins=edges, color="#7f7f7f")
    first.set_title(f"{len(times)} requests arrive (bars: per {BIN:g} s)", loc="left")
    for ax, name in zip(rows, LIMITERS, strict=True):
        admitted = [t for t, ok in seen[name] if ok]
        ax.hist(times, bins=edges, color="#e0e0e0", label="arrived")
        ax.hist(admitted, bins=edges, color=COLOURS[name], label="admitted")
        # The count a partner would see: admitted hits in the window ending at each instant.
        steps = [i / 20 for i in range(int(end * 20) + 1)]
        trailing = [sum(s - RATE.window < t <= s for t in admitted) for s in steps]
        ax.step(steps, trailing, where="post", color="black", lw=1.2,
                label=f"admitted in the last {RATE.window:g} s")  # fmt: skip
        ax.axhline(RATE.limit, color="black", ls=":", lw=1.0, label=f"limit {RATE.limit}")
        if name == "FixedWindow":  # its windows start at the first hit, at 0 s
            for edge in range(int(RATE.window), int(end), int(RATE.window)):
                ax.axvline(edge, color=COLOURS[name], ls="--", lw=0.8)
        worst = most_in_a_window(admitted, RATE.window)
        ax.set_title(
            f'{name}("{RATE.limit}/{RATE.window:g}s"): {len(admitted)} admitted,'
            f" at most {worst} in any {RATE.window:g} s",
            loc="left",
        )
        ax.set_ylim(0, 2.2 * RATE.limit)
    rows[0].legend(loc="upper right", fontsize="small", ncols=2)
    axes[-1].set_xlabel("time (s), on the store's clock")
    axes[-1].set_xlim(0, end)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="the folder for admissions.png")
    parser.add_argument("--smoke", action="store_true", help="a small, quick image (tests)")
    args = parser.parse_args()
    times = arrivals()
    seen = asyncio.run(run(times))
    draw(times, seen, args.out / "admissions.png", dpi=30 if args.smoke else 110)
    summary = {
        name: {
            "admitted": sum(ok for _, ok in seen[name]),
            "most_in_a_window": most_in_a_window([t for t, ok in seen[name] if ok], RATE.window),
        }
        for name in LIMITERS
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
