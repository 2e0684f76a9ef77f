"""The TFRecord framing of TensorBoard's event files, in pure Python (no SDK).

Each record is its length (little-endian uint64), the masked CRC-32C of those 8 bytes, the
data, and the masked CRC-32C of the data: what ``tensorboard.summary.writer.record_writer``
writes. Framed here because importing that writer loads ``tensorboard.summary`` and the
TensorFlow stub (numpy included): about half a second of every export to TensorBoard, for four
lines of framing. The CRC is the same table-driven loop TensorBoard's stub runs.
"""

from __future__ import annotations

import struct

_CASTAGNOLI = 0x82F63B78  # CRC-32C's polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8


def _crc_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ _CASTAGNOLI if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """The CRC-32C (Castagnoli) of ``data``."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant (modulo 2**32)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One record framing ``data``."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
