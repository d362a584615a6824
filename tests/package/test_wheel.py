"""The built wheel is complete: installed alone in a fresh venv, it decides on a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Run inside the fresh venv: import the installed package, make one decision, report.
PROBE = """
import asyncio, json, sys
from pathlib import Path
import aioratelimit as arl
from aioratelimit import _scripts

async def main(url, key):
    async with arl.Backend.from_url(url) as backend:
        d = await arl.FixedWindow("3/minute", backend=backend).hit(key)
    print(json.dumps({
        "file": arl.__file__,
        "lua_dir": str(_scripts.LUA_DIR),
        "lua": sorted(p.name for p in Path(_scripts.LUA_DIR).glob("*.lua")),
        "allowed": d.allowed,
        "remaining": d.remaining,
    }))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def sh(*args: str | Path, cwd: Path) -> str:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_wheel_installs_alone_and_decides_on_a_real_server(tmp_path: Path, redis_url: str) -> None:
    """The wheel carries every Lua script; installed in a fresh venv, it makes a decision."""
    dist = tmp_path / "dist"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
       "-w", dist, ROOT, cwd=tmp_path)  # fmt: skip
    (wheel,) = dist.glob("aioratelimit-*.whl")

    expected = sorted(p.name for p in (ROOT / "lua").glob("*.lua"))
    assert expected, "no Lua scripts in the source tree"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "aioratelimit = aioratelimit._cli.main:main" in zf.read(entry_points).decode()
    assert {f"aioratelimit/lua/{name}" for name in expected} <= names
    assert {"aioratelimit/__init__.py", "aioratelimit/py.typed"} <= names
    assert not any(n.startswith(("tests/", "lua/")) for n in names)

    # A fresh venv without pip; the wheel is installed into it by this interpreter's pip,
    # without its dependencies, which come from this test environment through a .pth file
    # (no network). That path is appended after the venv's own site-packages, so the
    # wheel's copy of aioratelimit is the one imported; the probe checks it is.
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(sh(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                   cwd=tmp_path).strip())  # fmt: skip
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    sh(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
       "-q", wheel, cwd=tmp_path)  # fmt: skip

    key = f"wheel-{uuid.uuid4().hex[:12]}"
    # -I: no current directory or PYTHON* variables on the path, so nothing from the checkout.
    report = json.loads(sh(python, "-I", "-c", PROBE, redis_url, key, cwd=tmp_path))
    installed = site / "aioratelimit"
    assert Path(report["file"]) == installed / "__init__.py"
    assert Path(report["lua_dir"]) == installed / "lua"
    assert report["lua"] == expected
    assert (report["allowed"], report["remaining"]) == (True, 2)

    # The console script is installed too.
    version = sh(venv / "bin" / "aioratelimit", "--version", cwd=tmp_path)
    assert version.startswith("aioratelimit ")
