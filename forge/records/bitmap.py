"""A growable set of non-negative record indices, one bit each (10M indices = 1.25 MB)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator


class IndexBitmap:
    """Set of record indices held as bits, so a 10M-line run never needs 10M Python ints."""

    __slots__ = ("_bits", "_count")

    def __init__(self, indices: Iterable[int] = ()) -> None:
        self._bits = bytearray()
        self._count = 0
        for i in indices:
            self.add(i)

    def add(self, index: int) -> bool:
        """Set `index`; True when it was not set before."""
        if index < 0:
            raise ValueError(f"record index must be >= 0, got {index}")
        byte, bit = index >> 3, 1 << (index & 7)
        if byte >= len(self._bits):
            # Grow geometrically so adding ascending indices stays amortised O(1).
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if self._bits[byte] & bit:
            return False
        self._bits[byte] |= bit
        self._count += 1
        return True

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int) or index < 0:
            return False
        byte = index >> 3
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << (index & 7)))

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for byte_no, value in enumerate(self._bits):
            if value:
                base = byte_no << 3
                for bit in range(8):
                    if value & (1 << bit):
                        yield base + bit

    def difference(self, other: IndexBitmap) -> IndexBitmap:
        """Indices here and not in `other`, computed on whole bytes (fast for 10M indices)."""
        n = len(self._bits)
        theirs = bytes(other._bits[:n]).ljust(n, b"\0")
        mask = int.from_bytes(self._bits, "little") & ~int.from_bytes(theirs, "little")
        out = IndexBitmap()
        out._bits = bytearray(mask.to_bytes(n, "little"))
        out._count = mask.bit_count()
        return out

    def missing_below(self, total: int) -> Iterator[int]:
        """Indices in [0, total) that are not set."""
        for i in range(total):
            if i not in self:
                yield i

    def max(self) -> int:
        """Largest index set, -1 when empty."""
        for byte_no in range(len(self._bits) - 1, -1, -1):
            value = self._bits[byte_no]
            if value:
                return (byte_no << 3) + value.bit_length() - 1
        return -1
