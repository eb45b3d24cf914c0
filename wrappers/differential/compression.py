"""Record compression for the outer-join differentials: the ``<K,b>`` and ``<K,b,p>`` formats.

The key ``K`` is kept as is; the rest of the record ``B`` is replaced by ``b``, ``bits``
bits of a hash of a canonical encoding of ``B`` (Labio & Garcia-Molina, section 3.2).
``<K,b,p>`` adds ``p``, a pointer to the full record in the new snapshot's dump (a byte
offset in a CSV file, a row number in a Parquet file), used to fetch the new values of
inserted and updated records after matching.

Two hashes: ``crc32`` (zlib's CRC-32, the default for up to 32 bits, the paper's width)
and ``blake2b`` (any width up to 512 bits, the default above 32). CRC-32 costs about a
third of BLAKE2b per record in CPython, spreads unrelated inputs uniformly, and detects
with certainty every change confined to one 32-bit burst (one edited number, a short
field), so the probability below is an upper bound for it on such edits. Both are
deterministic and the same in every process; Python's ``hash`` is not used because it is
salted per process, and kept state must match across processes.

**What compression can get wrong.** Keys are never compressed, so inserts and deletes are
always found. An unchanged record always gets the same ``b`` (the hash is deterministic and
the same in every process), so no change is ever invented. The only error is a *missed
update*: a record whose rest changed but whose old and new ``b`` collide. For a hash that
spreads values uniformly this happens with probability about ``E = 2**-bits`` per changed
record (the paper's ``((2**B / 2**n) - 1) / 2**B``). A differential over ``N`` records
compares ``N`` pairs, so the chance that it misses nothing is ``(1 - E)**N`` (eq. 1) and the
expected number of differentials before the first miss is ``1 / (1 - (1 - E)**N)`` (eq. 2).
With 32 bits and 1,789,570 records (256 MB of 150-byte records) that is about 2,400
daily runs, 6.6 years; the paper's 2,430 rounds ``E`` to ``2.3e-10``. Each extra bit halves
the risk: 64 bits make a miss practically impossible and cost 4 more bytes per record.

**Canonical encoding.** A rest made only of strings (what a CSV dump gives) is encoded as the
strings joined and terminated by the unit separator ``\\x1f``; anything else (or strings
containing ``\\x1f``) as ``repr`` of the tuple, which is stable across processes for
``str``, ``int``, ``float``, ``bool``, ``None``, ``bytes``, ``Decimal`` and ``datetime``
values. The two encodings cannot coincide: the first always contains ``\\x1f``, ``repr``
never does.

>>> c = Compression(bits=32)
>>> c.format, c.compress(("ann", "10")) == c.compress(("ann", "10")), c.compress(("ann", "10")) == c.compress(("ann", "11"))
('<K,b>', True, False)
>>> checksum(("ann", "10"), bits=12) < 2**12
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

__all__ = [
    "HASHES",
    "K_B",
    "K_B_P",
    "POINTER_BYTES",
    "Compression",
    "canonical",
    "checksum",
    "clean_run_probability",
    "compress_entries",
    "expected_clean_runs",
    "make_batch_compressor",
    "make_compressor",
    "miss_probability",
]

HASHES = ("crc32", "blake2b")
POINTER_BYTES = 8  # nominal size of p: a 64-bit file offset or row number
_US = "\x1f"
_MAX_BITS = 512  # BLAKE2b's largest digest


def canonical(rest: tuple[Any, ...]) -> bytes:
    """The byte encoding of ``rest`` that is hashed (see the module docstring).

    >>> canonical(("a", "b"))
    b'a\\x1fb\\x1f'
    >>> canonical((1, None))
    b'(1, None)'
    """
    try:
        s = _US.join(rest)
        if s.count(_US) == len(rest) - 1:
            return (s + _US).encode()
    except (TypeError, UnicodeEncodeError):
        pass
    return repr(rest).encode("utf-8", "backslashreplace")


def _check_bits(bits: int) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= _MAX_BITS:
        raise ValueError(f"bits must be an integer from 1 to {_MAX_BITS}, got {bits!r}")


def _resolve_hash(bits: int, hash_name: str | None) -> str:
    _check_bits(bits)
    name = hash_name or ("crc32" if bits <= 32 else "blake2b")
    if name not in HASHES:
        raise ValueError(f"hash must be one of {HASHES}, got {hash_name!r}")
    if name == "crc32" and bits > 32:
        raise ValueError(f"crc32 gives at most 32 bits; use hash='blake2b' for {bits} bits")
    return name


def make_compressor(bits: int, hash_name: str | None = None) -> Callable[[tuple[Any, ...]], Any]:
    """A fast function ``rest -> b`` (``b`` is ``bits`` bits of the hash of ``canonical(rest)``).

    With ``crc32`` (the default up to 32 bits) ``b`` is an ``int`` below ``2**bits``. With
    ``blake2b`` it is the digest's first ``bits // 8`` bytes when ``bits`` is a multiple of
    8 (comparing bytes is all that matters, and it saves a conversion), otherwise an
    ``int``. Values from compressors with the same setting compare across processes.

    >>> f = make_compressor(32)
    >>> f(("x",)) == f(("x",)) != f(("y",)), 0 <= f(("x",)) < 2**32
    (True, True)
    >>> len(make_compressor(64)(("x",))), make_compressor(5)(("x",)) < 32
    (8, True)
    """
    name = _resolve_hash(bits, hash_name)
    join = _US.join
    us = _US

    if name == "crc32":
        crc = zlib.crc32
        shift = 32 - bits

        def compress_crc(rest: tuple[Any, ...]) -> Any:
            try:
                s = join(rest)
                if s.count(us) == len(rest) - 1:
                    return crc((s + us).encode()) >> shift
            except (TypeError, UnicodeEncodeError):
                pass
            return crc(canonical(rest)) >> shift

        return compress_crc

    size = (bits + 7) // 8
    blake = hashlib.blake2b
    if size * 8 == bits:

        def compress_blake(rest: tuple[Any, ...]) -> Any:
            try:
                s = join(rest)
                if s.count(us) == len(rest) - 1:
                    return blake((s + us).encode(), digest_size=size).digest()
            except (TypeError, UnicodeEncodeError):
                pass
            return blake(canonical(rest), digest_size=size).digest()

        return compress_blake

    from_bytes = int.from_bytes
    shift_b = size * 8 - bits

    def compress_bits(rest: tuple[Any, ...]) -> Any:
        return from_bytes(blake(canonical(rest), digest_size=size).digest(), "big") >> shift_b

    return compress_bits


def make_batch_compressor(bits: int, hash_name: str | None = None) -> Callable[[Sequence[tuple[Any, ...]]], list[Any]]:
    """Like ``make_compressor`` for a list of rests at once (the same values, faster: one
    check that no string contains the separator, then one comprehension).

    >>> many, one = make_batch_compressor(32), make_compressor(32)
    >>> rests = [("a", "b"), ("c", "d")]
    >>> many(rests) == [one(r) for r in rests]
    True
    >>> many([(1, "x"), ("\\x1f", "y")]) == [one((1, "x")), one(("\\x1f", "y"))]
    True
    """
    name = _resolve_hash(bits, hash_name)
    one = make_compressor(bits, name)
    join = _US.join
    us = _US
    size = (bits + 7) // 8
    if name == "crc32":
        crc = zlib.crc32
        shift = 32 - bits
        if shift:
            fast: Callable[[list[str]], list[Any]] = lambda data: [crc(s.encode()) >> shift for s in data]  # noqa: E731
        else:
            fast = lambda data: [crc(s.encode()) for s in data]  # noqa: E731
    elif size * 8 == bits:
        blake = hashlib.blake2b
        fast = lambda data: [blake(s.encode(), digest_size=size).digest() for s in data]  # noqa: E731
    else:
        return lambda rests: [one(r) for r in rests]

    def many(rests: Sequence[tuple[Any, ...]]) -> list[Any]:
        try:
            data = [join(r) + us for r in rests]
            # every separator is one of ours: no string holds one (and no rest is empty)
            if all(rests) and "".join(data).count(us) == sum(map(len, rests)):
                return fast(data)
        except (TypeError, UnicodeEncodeError):
            pass
        return [one(r) for r in rests]

    return many


def compress_entries(entries: Iterable[tuple[Any, ...]], compression: Compression) -> Iterator[tuple[Any, ...]]:
    """``(k, rest)`` entries as ``(k, b)``, and ``(k, rest, p)`` as ``(k, b, p)``, compressed
    a chunk at a time.

    >>> c = Compression(bits=16)
    >>> [(k, b == c.compress(("x",))) for k, b in compress_entries([((1,), ("x",))], c)]
    [((1,), True)]
    """
    many = compression.compress_many
    it = iter(entries)
    while True:
        chunk = list(islice(it, 4096))
        if not chunk:
            return
        if len(chunk[0]) == 2:
            keys, rests = zip(*chunk)
            yield from zip(keys, many(rests))
        else:
            keys, rests, pointers = zip(*chunk)
            yield from zip(keys, many(rests), pointers)


def checksum(rest: tuple[Any, ...], bits: int = 32, hash_name: str | None = None) -> int:
    """``b`` for ``rest`` as an integer below ``2**bits``.

    >>> 0 <= checksum(("x", 1), bits=32) < 2**32
    True
    >>> checksum(("x",), bits=32) == make_compressor(32)(("x",))
    True
    """
    name = _resolve_hash(bits, hash_name)
    if name == "crc32":
        return zlib.crc32(canonical(rest)) >> (32 - bits)
    size = (bits + 7) // 8
    return int.from_bytes(hashlib.blake2b(canonical(rest), digest_size=size).digest(), "big") >> (size * 8 - bits)


def miss_probability(bits: int) -> float:
    """Probability ``E = 2**-bits`` that one changed record keeps its ``b`` (a missed update).

    >>> f"{miss_probability(32):.2e}"
    '2.33e-10'
    """
    _check_bits(bits)
    return 2.0**-bits


def clean_run_probability(bits: int, records: int) -> float:
    """Probability that a differential comparing ``records`` pairs misses nothing (eq. 1).

    >>> round(clean_run_probability(32, 1_789_570), 5)
    0.99958
    """
    return math.exp(records * math.log1p(-miss_probability(bits)))


def expected_clean_runs(bits: int, records: int) -> float:
    """Expected number of differentials before the first missed update (eq. 2).

    >>> round(expected_clean_runs(32, 1_789_570))
    2400
    """
    p = clean_run_probability(bits, records)
    return math.inf if p >= 1.0 else 1.0 / -math.expm1(records * math.log1p(-miss_probability(bits)))


@dataclass(frozen=True)
class Compression:
    """A compression setting: ``bits`` of ``b``, whether records carry a pointer ``p``, and
    the hash (``"crc32"``, the default up to 32 bits, or ``"blake2b"``).

    >>> Compression(bits=32, pointer=True).format
    '<K,b,p>'
    >>> Compression(bits=32).entry_bytes(key_nbytes=8), Compression(bits=64).hash
    (12.0, 'blake2b')
    """

    bits: int = 32
    pointer: bool = False
    hash: str | None = None
    _fn: Callable[[tuple[Any, ...]], Any] = field(init=False, repr=False, compare=False, hash=False)
    _many: Callable[[Sequence[tuple[Any, ...]]], list[Any]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash", _resolve_hash(self.bits, self.hash))
        object.__setattr__(self, "_fn", make_compressor(self.bits, self.hash))
        object.__setattr__(self, "_many", make_batch_compressor(self.bits, self.hash))

    @property
    def format(self) -> str:
        """``'<K,b>'`` or ``'<K,b,p>'``."""
        return "<K,b,p>" if self.pointer else "<K,b>"

    @property
    def compress(self) -> Callable[[tuple[Any, ...]], Any]:
        """The compressor ``rest -> b`` (see ``make_compressor``)."""
        return self._fn

    @property
    def compress_many(self) -> Callable[[Sequence[tuple[Any, ...]]], list[Any]]:
        """The batch compressor ``[rest, ...] -> [b, ...]`` (see ``make_batch_compressor``)."""
        return self._many

    @property
    def miss_probability(self) -> float:
        """``2**-bits``: the chance one changed record is missed."""
        return miss_probability(self.bits)

    def entry_bytes(self, key_nbytes: float) -> float:
        """Nominal size of one compressed record with a key of ``key_nbytes``."""
        return float(key_nbytes) + self.bits / 8 + (POINTER_BYTES if self.pointer else 0)

    def without_pointer(self) -> Compression:
        """The same checksum in the ``<K,b>`` format (what kept state holds)."""
        return dataclasses.replace(self, pointer=False) if self.pointer else self

    def same_b(self, other: Compression | None) -> bool:
        """Whether ``b`` values of the two settings compare (same bits and hash)."""
        return other is not None and other.bits == self.bits and other.hash == self.hash

    def describe(self) -> str:
        """For messages: ``'<K,b> 32-bit crc32'``."""
        return f"{self.format} {self.bits}-bit {self.hash}"


K_B = Compression(bits=32, pointer=False)
K_B_P = Compression(bits=32, pointer=True)
