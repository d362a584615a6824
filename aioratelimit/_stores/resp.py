"""RESP, as the wire writes it: a script call (``pack``), a batch of decisions
(``pack_batch``) or any command (``pack_command``), encoded as redis-py's default encoder
encodes arguments, with what repeats from call to call formatted once and kept."""

from __future__ import annotations

from collections.abc import Sequence

from .._scripts import Arg

#: RESP of the integer arguments seen so far: a script's are nearly all constants (a
#: limiter's cost, limit and window; numkeys), and a lookup costs a third of the formatting.
_INTS: dict[int, bytes] = {}
_INTS_MAX = 4096


def _bulk(arg: Arg) -> bytes:
    """One argument as a RESP bulk string, encoded as redis-py's default encoder does."""
    if type(arg) is str:
        data = arg.encode()
    elif type(arg) is int:
        packed = _INTS.get(arg)
        if packed is None:
            packed = b"$%d\r\n%d\r\n" % (len(b"%d" % arg), arg)
            if len(_INTS) < _INTS_MAX:
                _INTS[arg] = packed
        return packed
    elif type(arg) is bytes:
        data = arg
    else:
        raise TypeError(f"a script argument must be str, int or bytes, not {type(arg).__name__}")
    return b"$%d\r\n%b\r\n" % (len(data), data)


#: RESP of whole argument tuples made of ints only, seen so far: a limiter sends the same
#: (cost, mode, limits, windows) on nearly every call, and one lookup instead of a
#: ``_bulk`` per argument is about 1 µs less client CPU per decision (of about 11 at 64
#: concurrent callers). Only the library builds these tuples (never a bool or a float in
#: them, which would compare equal to an int here).
_ARGS: dict[tuple[Arg, ...], bytes] = {}
_ARGS_MAX = 4096


def _packed_args(args: Sequence[Arg]) -> bytes:
    if type(args) is tuple:
        packed = _ARGS.get(args)
        if packed is not None:
            return packed
    packed = b"".join(map(_bulk, args))
    if type(args) is tuple and len(_ARGS) < _ARGS_MAX and all(type(arg) is int for arg in args):
        _ARGS[args] = packed
    return packed


#: RESP headers of the sizes a script call has, formatted once: ``bytes`` ``%`` formatting is
#: the slowest step of packing, and these per call (the array, the key's length) cost about
#: 0.4 µs of pack's 1.05 (timed side by side; 4 % of a decision's client CPU at 64 tasks).
#: (The key count is an int argument: ``_bulk`` has it from ``_INTS``.)
_ARRAYS = [b"*%d\r\n" % n for n in range(64)]
_SIZES = [b"$%d\r\n" % n for n in range(512)]


def pack(head: bytes, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
    """``<command> <sha or source> <numkeys> keys... args...`` in RESP, ``head`` being the
    packed command and script (``Script.evalsha_head`` or ``Script.eval_head``)."""
    n = 3 + len(keys) + len(args)
    parts = [_ARRAYS[n] if n < 64 else b"*%d\r\n" % n, head, _bulk(len(keys))]
    for key in keys:  # always str (``_keys``): no type test
        data = key.encode()
        size = len(data)
        parts.append(_SIZES[size] if size < 512 else b"$%d\r\n" % size)
        parts.append(data)
        parts.append(b"\r\n")
    parts.append(_packed_args(args))
    return b"".join(parts)


def pack_batch(
    head: bytes, groups: Sequence[tuple[int, int, Sequence[Arg], Sequence[Sequence[str]]]]
) -> bytes:
    """``lua/batch.lua``'s call in RESP (``head``: its ``evalsha_head`` or ``eval_head``):
    every decision's keys, then per group its id, key count, argument count, decision
    count and arguments (a group: one script's calls with the same arguments, each on its
    keys). The group's arguments go through ``_packed_args``: a limiter's constant
    arguments cost a lookup here as they do in ``pack``."""
    keys: list[bytes] = []
    args: list[bytes] = []
    nkeys = nargs = 0
    for ident, nk, group_args, calls in groups:
        for call_keys in calls:
            for key in call_keys:
                data = key.encode()
                size = len(data)
                keys.append(_SIZES[size] if size < 512 else b"$%d\r\n" % size)
                keys.append(data)
                keys.append(b"\r\n")
        nkeys += nk * len(calls)
        nargs += 4 + len(group_args)
        args.append(_packed_args((ident, nk, len(group_args), len(calls))))
        args.append(_packed_args(group_args))
    n = 3 + nkeys + nargs
    return b"".join([b"*%d\r\n" % n, head, _bulk(nkeys), *keys, *args])


def pack_command(*parts: Arg) -> bytes:
    """Any command in RESP (the handshake's, ASKING)."""
    return b"*%d\r\n%b" % (len(parts), b"".join(map(_bulk, parts)))
