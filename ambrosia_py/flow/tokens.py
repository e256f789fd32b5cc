"""Tokens: the 128-bit UIDs that name a message's recipient (seed 004, *Endpoint / token
/ UID layout*; reference, *Tokens and endpoints*).

A token is two u64, ``first`` and ``second``, each written little-endian, ``first`` first.
The low 32 bits of ``second`` index the receiver's endpoint table; bit 0 of ``first``
(:data:`TOKEN_STREAM_FLAG`) marks a stream endpoint.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs

from .constants import TOKEN_STREAM_FLAG, WELL_KNOWN_FIRST, Buffer
from .errors import TruncatedFrameError

__all__ = ["TOKEN_LENGTH", "Token"]

TOKEN_LENGTH = 16
_TOKEN = struct.Struct("<QQ")
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF


def _u64(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int):
        raise TypeError(f"Token.{attribute.name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _U64:
        raise ValueError(f"Token.{attribute.name} {value} is not a u64")


def _hex(value: int) -> str:
    return f"{value:#018x}"


def _u32_arg(name: str, value: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= _U32:
        raise ValueError(f"{name} must be an int in 0..2**32-1, not {value!r}")
    return int(value)


@attrs.frozen
class Token:
    """A recipient token: two u64 halves, ``first`` and ``second``."""

    first: int = attrs.field(validator=_u64, repr=_hex)
    second: int = attrs.field(validator=_u64, repr=_hex)

    @classmethod
    def well_known(cls, index: int) -> Token:
        """The well-known token with endpoint index ``index`` (first = all ones)."""
        return cls(WELL_KNOWN_FIRST, _u32_arg("well-known index", index))

    def adjusted(self, i: int) -> Token:
        """The token ``i`` endpoints on from this one (``getAdjustedEndpoint``).

        ``first`` gains ``i << 32`` (mod 2**64); the low 32 bits of ``second`` gain ``i``
        (mod 2**32) and its high 32 bits stay as they are (reference, Tokens and endpoints).
        """
        i = _u32_arg("adjustment", i)
        first = (self.first + (i << 32)) & _U64
        low = (self.second + i) & _U32
        return Token(first, (self.second & ~_U32 & _U64) | low)

    @property
    def endpoint_index(self) -> int:
        """The low 32 bits of ``second``: the index in the receiver's endpoint table."""
        return self.second & _U32

    @property
    def is_stream(self) -> bool:
        """Bit 0 of ``first`` (:data:`TOKEN_STREAM_FLAG`): a stream endpoint."""
        return bool(self.first & TOKEN_STREAM_FLAG)

    def encode(self) -> bytes:
        """The 16 wire bytes: ``first`` then ``second``, each a little-endian u64."""
        return _TOKEN.pack(self.first, self.second)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Token:
        """The token in the 16 bytes of ``buf`` at ``offset``."""
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        with memoryview(buf) as mv, mv.cast("B") as data:
            if len(data) - offset < TOKEN_LENGTH:
                raise TruncatedFrameError(
                    f"a token needs {TOKEN_LENGTH} bytes, {max(len(data) - offset, 0)} present",
                    offset=offset,
                )
            first, second = _TOKEN.unpack_from(data, offset)
        return cls(first, second)
