"""The Lua scripts, read once at import and run by SHA, and the names of what they answer.

Every Redis operation is one file in ``lua/`` (shipped inside the wheel as
``aioratelimit/lua``), but for the ``HELPERS``, files of functions only, read in front of
the scripts that call them: ``rates_common.lua`` (the rate that binds among several, for
the fixed and sliding windows) and ``semaphore_common.lua`` (for the three semaphore
steps). Each is read here once, its SHA1 computed locally, and the Redis stores run it with
EVALSHA, loading it again on NOSCRIPT. The memory store answers the same
``Script`` objects with a Python twin of the same name.

``Arg`` and ``Reply`` are the types of a call; the small enums below name the codes a
script answers with, next to the script (each compares equal to the bare integer Redis
sends, so a raw reply and a twin's reply compare as they are).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

#: One script argument as sent: RESP bulk strings made from ``str``, ``int`` or ``bytes``.
Arg = int | str | bytes
#: A script's raw reply (an integer, a bulk string, or a list of them).
Reply = Any


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script call as a store made it (one EVALSHA; after NOSCRIPT the EVAL that
    follows is part of the same call; on memory:// the script's twin), handed to the
    backend's ``on_call`` hook once it is over (see ``Backend.from_url``). It names the
    script, never its keys or arguments: they carry the user's keys, tokens and lock names."""

    #: the script's name (the file in ``lua/``), e.g. ``"fixed_window"``
    script: str
    #: the server that answered (or failed to): ``host:port``, a unix socket's path, or
    #: ``"memory"`` (memory://)
    server: str
    #: when the call started, nanoseconds since the epoch (``time.time_ns()``)
    start_ns: int
    #: how long it took, nanoseconds
    duration_ns: int
    #: what it raised (``BackendUnavailable``, ``BackendError``, a cancellation), or None
    error: BaseException | None


OnCall = Callable[[ScriptCall], None]
"""``on_call=`` of ``Backend.from_url`` and ``testing.memory_backend``: called with each
``ScriptCall`` once it is over."""


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua file: its name (the file stem), source and SHA1, and the first two RESP
    arguments of its EVALSHA and of its EVAL, packed once (``_stores.resp.pack``).

    ``repeatable``: running it twice with the same arguments does what running it once
    does, and its reply says so (a release that leaves a tombstone): the one kind of
    script ``Backend._run_repeatable`` sends again after a lost reply.
    """

    name: str
    source: str
    sha: str
    evalsha_head: bytes
    eval_head: bytes
    repeatable: bool = False

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


def script(name: str, source: str, *, repeatable: bool = False) -> Script:
    """The ``Script`` for Lua ``source`` (the files in ``lua/``, or a test's own script)."""
    sha = hashlib.sha1(source.encode()).hexdigest()
    data = source.encode()
    return Script(
        name,
        source,
        sha,
        b"$7\r\nEVALSHA\r\n$40\r\n%b\r\n" % sha.encode(),
        b"$4\r\nEVAL\r\n$%d\r\n%b\r\n" % (len(data), data),
        repeatable,
    )


#: Where the scripts are read, whatever the install: the package's ``lua`` resource. In the
#: repository, ``aioratelimit/lua`` is a symlink to the top-level ``lua/`` (so a checkout and
#: an editable install read the files being edited); the wheel and the sdist hold the files.
LUA: Traversable = files("aioratelimit") / "lua"


def _read(name: str) -> str:
    try:
        return (LUA / f"{name}.lua").read_text(encoding="utf-8")
    except OSError as exc:  # a broken install: say so at import, not at the first call
        raise ImportError(f"aioratelimit: cannot read the Lua script {name}.lua: {exc}") from exc


#: The files in ``lua/`` that are not scripts: functions only (loading one does nothing),
#: read in front of the scripts that call them.
HELPERS = ("rates_common", "semaphore_common")


def _load(name: str, *, after: str | tuple[str, ...] = (), repeatable: bool = False) -> Script:
    """The script in ``lua/<name>.lua``; with ``after`` (one or several of ``HELPERS``),
    those files' Lua first, in the same chunk (a Redis script cannot include another)."""
    helpers = (after,) if isinstance(after, str) else after
    for helper in helpers:
        if helper not in HELPERS:
            raise ValueError(f"{helper}.lua is not a helper file")
    return script(name, "".join(map(_read, (*helpers, name))), repeatable=repeatable)


#: ``{allowed, limit, remaining, reset_after_us, retry_after_us, now_us, granted}``: read
#: by ``_rates.Decision.from_reply``. ARGV[2] is a ``Mode``.
FIXED_WINDOW = _load("fixed_window", after="rates_common")
SLIDING_WINDOW = _load("sliding_window", after="rates_common")
TOKEN_BUCKET = _load("token_bucket")

#: Files read in front of a whole script to make a variant of it: ``policy_stamp.lua``
#: checks (and converts) a key's counters against the rates a call carries, then hands
#: the script its usual KEYS and ARGV.
PREAMBLES = ("policy_stamp",)


def _variant(base: Script, preamble: str) -> Script:
    """``base`` with ``preamble`` (one of ``PREAMBLES``) in front, named ``<base>_policy``."""
    return script(f"{base.name}_policy", _read(preamble) + base.source)


#: The limiters made with ``policies=``: ``{-1, stamp version}`` when the call's view of
#: the policies is older than the key's stamp, else the script's own reply.
FIXED_WINDOW_POLICY = _variant(FIXED_WINDOW, "policy_stamp")
SLIDING_WINDOW_POLICY = _variant(SLIDING_WINDOW, "policy_stamp")
TOKEN_BUCKET_POLICY = _variant(TOKEN_BUCKET, "policy_stamp")
#: a limiter's policies: ``{version, done}`` (``lua/policy_write.lua``)
POLICY_WRITE = _load("policy_write")
#: ``{version, {name, record, ...}, {override per key}}``; reads only
POLICY_READ = _load("policy_read", repeatable=True)

#: Files read after a whole script to make a variant of it: the script becomes the body of
#: a function the file calls (``ban_common.lua`` counts a denial as a strike towards a ban).
WRAPPERS = ("ban_common",)
#: The lines around the script (a function of no arguments; its ``return`` is its reply).
_WRAP_OPEN, _WRAP_CLOSE = "local function ban_decide()\n", "\nend\n"


def _wrapped(base: Script, wrapper: str) -> Script:
    """``base`` as the body of ``ban_decide``, then ``wrapper`` (one of ``WRAPPERS``),
    named ``<base>_ban``."""
    source = _WRAP_OPEN + base.source + _WRAP_CLOSE + _read(wrapper)
    return script(f"{base.name}_ban", source)


#: The limiters made with ``ban=``: the script's reply, and on the denial that bans, the
#: ban's (``{0, limit, 0, ban_us, ban_us, now_us, 0, block index, 1}``).
FIXED_WINDOW_BAN = _wrapped(FIXED_WINDOW, "ban_common")
SLIDING_WINDOW_BAN = _wrapped(SLIDING_WINDOW, "ban_common")
TOKEN_BUCKET_BAN = _wrapped(TOKEN_BUCKET, "ban_common")


def banned(base: Script) -> Script:
    """The ban variant of a limiter script (``FIXED_WINDOW`` -> ``FIXED_WINDOW_BAN``)."""
    return SCRIPTS[f"{base.name}_ban"]


#: ``{µs the block still runs, now_us, strikes, bans, ms the record lives}``; reads only
BAN_STATE = _load("ban_state", repeatable=True)


class Mode(IntEnum):
    """ARGV[2] of the limiter scripts; ``PARTIAL`` is added to one of the other three."""

    PEEK = 0  # write nothing
    HIT = 1  # count when admitted
    HIT_COUNT_DENIED = 2  # count a denied hit too
    PARTIAL = 4  # admit as much of the cost as every rate allows


#: ``{microseconds until the block in place ends, now_us}``
LIMITER_BLOCK = _load("limiter_block")
#: ``{µs the block still runs or 0, now_us}``; reads only
LIMITER_BLOCKED = _load("limiter_blocked", repeatable=True)
#: ``{the most hits (tokens) given back or charged under any one rate, now_us, applied}``:
#: a refund, or a reservation's settlement (``_limits.reservation``). Repeatable as a
#: settlement sends them, with a record (its last KEY): a repeat finds it and answers
#: applied 0; a plain refund, sent without one, is never sent twice.
FIXED_WINDOW_REFUND = _load("fixed_window_refund", repeatable=True)
SLIDING_WINDOW_REFUND = _load("sliding_window_refund", repeatable=True)
TOKEN_BUCKET_REFUND = _load("token_bucket_refund", repeatable=True)
#: ``{1 added / 0 refused (full), entries held, now_us}``: an access list's entry
LIST_ADD = _load("list_add")
#: 1 removed, 0 not there (a repeat after a lost reply answers 0 and changes nothing)
LIST_REMOVE = _load("list_remove", repeatable=True)
#: ``{now_us, field, µs left or 0, ...}``: an access list's live entries; reads only
LIST_READ = _load("list_read", repeatable=True)
#: the number of keys that existed
DELETE = _load("delete")
#: a limiter's reset (and the deny caches' invalidation): the number of keys removed
RATE_INVALIDATE = _load("rate_invalidate")

TOKEN_ISSUE = _load("token_issue")  # 1 stored, 0 a record of that token exists already
TOKEN_CONSUME = _load("token_consume")


class Consumed(IntEnum):
    """What ``token_consume`` answers."""

    WRONG_SUBJECT = -1  # issued for another subject: left in place
    UNKNOWN = 0  # never issued, expired or used already
    CONSUMED = 1


IDEM_CLAIM = _load("idem_claim")


class Claim(IntEnum):
    """The first element of ``idem_claim``'s reply; the second depends on it."""

    CLAIMED = 0  # {0, lease deadline_us}: run the call
    IN_PROGRESS = 1  # {1, retry_us}: another owner's lease still runs
    COMPLETED = 2  # {2, result}: replay it
    MISMATCH = 3  # {3, 0}: the key was first used with another fingerprint


IDEM_RENEW = _load("idem_renew")  # 1 renewed, 0 not held by this owner
IDEM_COMPLETE = _load("idem_complete")  # 1 stored, 0 not held by this owner
#: 1 released, 0 not held by this owner (also what a repeat after a lost reply answers)
IDEM_RELEASE = _load("idem_release", repeatable=True)
IDEM_STATE = _load("idem_state")  # {IdemState, pttl_ms, lease_left_us, result}; reads only


class IdemState(IntEnum):
    """The first element of ``idem_state``'s reply."""

    NONE = 0  # no record
    IN_PROGRESS = 1  # the owner's lease still runs
    COMPLETED = 2  # a result is stored
    ABANDONED = 3  # in progress, but the lease has passed


#: ``{1, fence}`` held, ``{0, wait_ms}`` held by another (also ``semaphore_acquire``)
LOCK_ACQUIRE = _load("lock_acquire")
#: Releases are repeatable: a repeat answers ``RELEASED_BEFORE`` (the tombstone).
LOCK_RELEASE = _load("lock_release", repeatable=True)


class Released(IntEnum):
    """What ``lock_release`` and ``semaphore_release`` answer."""

    HELD_BY_OTHER = -1  # nothing changed (locks only)
    NOT_HELD = 0  # expired, or the acquire never arrived
    RELEASED = 1
    RELEASED_BEFORE = 2  # a repeated release by the same token


LOCK_EXTEND = _load("lock_extend")  # 1 extended, 0 not held by the token
LOCK_LOCKED = _load("lock_locked")  # 1 held, 0 free
#: Leader election: ``{1, epoch}`` leads, ``{0, wait_ms}`` another leads (a term is renewed
#: by ``LOCK_EXTEND`` and resigned by ``LOCK_RELEASE``, which read only its token).
LEADER_CLAIM = _load("leader_claim")
LEADER_STATE = _load("leader_state")  # {leads 1/0, epoch, pttl_ms, who}; reads only
#: ``{1, slot, left_us}`` this interval is claimed, ``{0, slot, left_us}`` claimed before
EVERY_CLAIM = _load("every_claim")
SEMAPHORE_ACQUIRE = _load("semaphore_acquire", after="semaphore_common")
SEMAPHORE_RELEASE = _load("semaphore_release", after="semaphore_common", repeatable=True)
SEMAPHORE_EXTEND = _load("semaphore_extend", after="semaphore_common")
SEMAPHORE_HOLDERS = _load("semaphore_holders")  # the number of live holders
#: A read/write lock: a semaphore's holders and fences, plus its waiting writers' intents
#: (``{1, fence}`` / ``{0, wait_ms}``; a release answers ``Released``; extends are the
#: semaphore's own script, which reads the same two keys).
RWLOCK_ACQUIRE = _load("rwlock_acquire", after="semaphore_common")
RWLOCK_RELEASE = _load("rwlock_release", after="semaphore_common", repeatable=True)
#: ``{readers, writer_fence, writer_ttl_ms, waiting_writers}``; reads only
RWLOCK_STATE = _load("rwlock_state")
#: A fair lock: a lock's value plus a queue of waiters and their heartbeats
#: (``{1, fence}`` / ``{0, wait_ms}``; a release answers ``Released``; extends are
#: ``LOCK_EXTEND``, which reads the first key only).
FAIR_ACQUIRE = _load("fair_acquire")
FAIR_RELEASE = _load("fair_release", repeatable=True)
FAIR_STATE = _load("fair_state")  # {held 1/0, fence, pttl_ms, waiters}; reads only
#: ``{code, fence or wait_ms, free, <fixed_window's reply>}``: an in-flight slot and the
#: rates' hit, all-or-nothing (``_web.inflight``); its slot is a semaphore's
INFLIGHT_ACQUIRE = _load("inflight_acquire", after=("rates_common", "semaphore_common"))

# What an operator reads and forces (``aioratelimit inspect``, ``reset --force``, ``doctor``).
LOCK_HOLDER = _load("lock_holder")  # {held 1/0, fence, pttl_ms}; reads only
LOCK_FORCE_RELEASE = _load("lock_force_release")  # {1, fence} released, {0, 0} not held
SEMAPHORE_LIST = _load("semaphore_list")  # {fence, ttl_ms, ...} per live holder; reads only
SERVER_CHECK = _load("server_check")  # {time_s, time_us, version, mode, undeclared}

#: The oldest Redis the scripts run on (SET PXAT; fixed_window.lua reads PTTL where there is
#: no PEXPIRETIME), and the oldest a cluster needs (sharded pub/sub: SPUBLISH, SSUBSCRIBE):
#: the one place they are written (the connection's server check and ``doctor`` read them).
MIN_REDIS_VERSION = (6, 2)
MIN_CLUSTER_VERSION = (7, 0)


#: Every script by name: what the memory store must have a twin for (a test checks it).
SCRIPTS: dict[str, Script] = {s.name: s for s in list(globals().values()) if isinstance(s, Script)}

#: The scripts a Redis store may put several calls of in one ``batch.lua`` call: the
#: decisions made on the hot path (limiters, locks, semaphores, tokens, idempotency keys).
#: Each follows the batched-script contract: it reads and checks before its first write
#: (an error ends its own decision, never half-written past what it would be alone), and
#: it never writes to its KEYS or ARGV (the decisions of a group share one ARGV table).
#: The limiters with ``policies=`` are not here: their preamble (``policy_stamp``) takes
#: its own arguments off ARGV. Their ids in a batch are their places here, from 1; the
#: limiters come first (``batch.lua`` hands the first three their numbers as numbers).
BATCHED: tuple[Script, ...] = (
    FIXED_WINDOW,
    SLIDING_WINDOW,
    TOKEN_BUCKET,
    LOCK_ACQUIRE,
    LOCK_EXTEND,
    LOCK_RELEASE,
    SEMAPHORE_ACQUIRE,
    SEMAPHORE_EXTEND,
    SEMAPHORE_RELEASE,
    TOKEN_ISSUE,
    TOKEN_CONSUME,
    IDEM_CLAIM,
    IDEM_RENEW,
    IDEM_COMPLETE,
    IDEM_RELEASE,
)
#: A batched script's id by its name (a ``str`` key: its hash is cached).
BATCH_IDS: dict[str, int] = {s.name: i for i, s in enumerate(BATCHED, 1)}


def _batch(flags: str) -> Script:
    """``batch.lua`` with every script of ``BATCHED`` in front of it, each the body of a
    function of its own ``KEYS`` and ``ARGV`` reading the batch's one clock (``batch_head``)
    instead of calling ``TIME``: the composition ``batch.lua``'s header describes. The
    pieces of Lua written here are that wrapping only, the same for every script."""
    parts = [flags, _read("batch_head")]
    for batched in BATCHED:
        body = batched.source.replace("redis.call('TIME')", "batch_time")
        parts += ["decisions[#decisions + 1] = function(KEYS, ARGV)\n", body, "\nend\n"]
    parts.append(_read("batch"))
    return script("batch", "".join(parts))


#: Several decisions in one call (``_stores.batch``): ``{reply or error per decision}``.
BATCH = _batch("")
#: The same on a Redis Cluster (7.0+): the keys of one call may be in several slots of the
#: node that serves them all, which a script may touch only when it says so.
BATCH_CLUSTER = _batch("#!lua flags=allow-cross-slot-keys\n")
