"""Reading ``RateLimit`` and ``RateLimit-Policy`` with an independent Structured Fields parser.

``http_sfv`` (RFC 8941/9651) parses the fields as a client would; ``read_fields`` then holds
them to draft-ietf-httpapi-ratelimit-headers-11: both are Lists of Items whose value is a
String, ``q`` a non-negative Integer, ``w`` a positive Integer, ``r`` and ``t`` non-negative
Integers, and every ``RateLimit`` item names a policy of ``RateLimit-Policy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from http_sfv.item import Item
from http_sfv.list import List


@dataclass(frozen=True)
class Fields:
    #: policy name -> its parameters (``q``, ``w``...)
    policies: dict[str, dict[str, object]]
    #: the policy ``RateLimit`` reports, its available quota and effective window
    policy: str
    r: int
    t: int | None


def _items(text: str) -> list[Item]:
    parsed = List()
    parsed.parse(text.encode("ascii"))  # raises on anything that is not a List
    return list(parsed)


def _int(value: object, minimum: int) -> int:
    assert isinstance(value, int), value
    assert not isinstance(value, bool), value
    assert value >= minimum, value
    return value


def read_fields(headers: Mapping[str, str]) -> Fields:
    """The two fields of a response (header names in any case), checked."""
    lower = {k.lower(): v for k, v in headers.items()}
    policies: dict[str, dict[str, object]] = {}
    for item in _items(lower["ratelimit-policy"]):
        assert type(item.value) is str, item.value  # a String, not a Token
        params = dict(item.params)
        _int(params["q"], 0)
        if "w" in params:
            _int(params["w"], 1)
        assert "pk" not in params  # a partition key would echo the client's key
        policies[item.value] = params
    (limit,) = _items(lower["ratelimit"])  # one service limit: the binding policy's
    assert type(limit.value) is str, limit.value
    assert limit.value in policies, limit.value
    params = dict(limit.params)
    assert "pk" not in params
    t = params.get("t")
    return Fields(
        policies,
        limit.value,
        _int(params["r"], 0),
        None if t is None else _int(t, 0),
    )
