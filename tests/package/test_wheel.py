"""The built distributions are complete: the wheel, installed alone in a fresh venv, reads
every Lua script of the repository and decides on a real server; the sdist carries the
scripts twice (``lua/`` and ``aioratelimit/lua``) and builds the same wheel; an editable
install carries none and reads the checkout's."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import sysconfig
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest

from aioratelimit import _scripts

ROOT = Path(__file__).resolve().parents[2]

#: Run inside the fresh venv: read every script the way the package reads them, make one
#: decision, report.
PROBE = """
import asyncio, hashlib, json, sys
import aioratelimit as arl
from aioratelimit import _scripts

async def main(url, key):
    async with arl.Backend.from_url(url) as backend:
        d = await arl.FixedWindow("3/minute", backend=backend).hit(key)
    names = sorted(p.name for p in _scripts.LUA.iterdir() if p.name.endswith(".lua"))
    print(json.dumps({
        "file": arl.__file__,
        "lua": str(_scripts.LUA),
        "files": {
            n: hashlib.sha1(_scripts._read(n[:-4]).encode()).hexdigest() for n in names
        },
        "scripts": {name: s.sha for name, s in _scripts.SCRIPTS.items()},
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


def repository_lua() -> dict[str, bytes]:
    """The repository's scripts: file name -> contents."""
    found = {p.name: p.read_bytes() for p in sorted((ROOT / "lua").glob("*.lua"))}
    assert found, "no Lua scripts in the source tree"
    return found


def sha1s(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha1(data).hexdigest() for name, data in files.items()}


def wheel_lua(wheel: Path) -> dict[str, bytes]:
    """The scripts a wheel carries: file name -> contents."""
    with zipfile.ZipFile(wheel) as zf:
        return {
            n.removeprefix("aioratelimit/lua/"): zf.read(n)
            for n in zf.namelist()
            if n.startswith("aioratelimit/lua/")
        }


def hatchling(target: str, source: Path, out: Path) -> Path:
    """Build ``target`` (wheel or sdist) of the project at ``source`` into ``out``."""
    sh(sys.executable, "-m", "hatchling", "build", "-t", target, "-d", out, cwd=source)
    (built,) = out.iterdir()
    return built


@pytest.mark.slow
def test_wheel_installs_alone_and_decides_on_a_real_server(tmp_path: Path, redis_url: str) -> None:
    """The wheel carries every Lua script; installed in a fresh venv, the package reads each
    one as the repository has it (same SHA1s, the scripts' too) and makes a decision."""
    dist = tmp_path / "dist"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
       "-w", dist, ROOT, cwd=tmp_path)  # fmt: skip
    (wheel,) = dist.glob("aioratelimit-*.whl")

    expected = repository_lua()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "aioratelimit = aioratelimit._cli.main:main" in zf.read(entry_points).decode()
    assert wheel_lua(wheel) == expected
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
    assert Path(report["lua"]) == installed / "lua"
    assert report["files"] == sha1s(expected)
    assert report["scripts"] == {name: s.sha for name, s in _scripts.SCRIPTS.items()}
    assert (report["allowed"], report["remaining"]) == (True, 2)

    # The console script is installed too.
    version = sh(venv / "bin" / "aioratelimit", "--version", cwd=tmp_path)
    assert version.startswith("aioratelimit ")


@pytest.mark.slow
def test_the_sdist_has_the_scripts_and_builds_the_same_wheel(tmp_path: Path) -> None:
    """The sdist holds ``lua/`` (the repository's layout) and ``aioratelimit/lua`` as plain
    files, not the repository's symlink; the wheel built from it carries every script."""
    sdist = hatchling("sdist", ROOT, tmp_path / "sdist")
    expected = repository_lua()
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tf:
        members = {m.name: m for m in tf.getmembers()}
        for where in ("lua", "aioratelimit/lua"):
            held = {
                name.rpartition("/")[2]: m
                for name, m in members.items()
                if name.rpartition("/")[0] == f"{top}/{where}"
            }
            assert sorted(held) == sorted(expected), where
            assert all(m.isfile() for m in held.values()), where
            for name, member in held.items():
                contents = tf.extractfile(member)
                assert contents is not None
                assert contents.read() == expected[name], f"{where}/{name}"
        tf.extractall(tmp_path / "unpacked", filter="data")
    wheel = hatchling("wheel", tmp_path / "unpacked" / top, tmp_path / "wheel")
    assert wheel_lua(wheel) == expected


def test_an_editable_install_reads_the_checkout() -> None:
    """``aioratelimit/lua`` is the repository's ``lua/`` (a symlink), so a checkout and an
    editable install read the files as they are edited: the package reads from there."""
    link = ROOT / "aioratelimit" / "lua"
    assert link.is_symlink()
    assert link.resolve() == (ROOT / "lua").resolve()
    if Path(_scripts.__file__).resolve().parents[1] == ROOT.resolve():
        assert Path(str(_scripts.LUA)).resolve() == (ROOT / "lua").resolve()


def test_an_editable_wheel_carries_no_copy_of_the_scripts() -> None:
    """Hatchling's editable wheel is a ``.pth`` pointing at the checkout plus the wheel's
    forced inclusions: there must be none, or the scripts would be copied into
    site-packages and go stale the moment one is edited."""
    from hatchling.builders.wheel import WheelBuilder

    assert WheelBuilder(str(ROOT)).config.get_force_include() == {}
