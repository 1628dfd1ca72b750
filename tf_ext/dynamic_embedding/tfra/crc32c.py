"""CRC32C in numpy, for TensorFlow's bundles and tf_ext's snapshot files.

TensorFlow's bundles checksum with CRC32C, masked; tf_ext's snapshot files with CRC32C as is
(Crc32c in snapshot_file.cc). Both come from crc32c_extend, in numpy: the data is cut into lanes
that are checksummed side by side, then combined (CRC is linear), which makes Python checksum at
about 100 MB/s instead of 2.
"""

import math

import numpy as np


def _crc_table():
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC_LIST = _crc_table()
_CRC_TABLE = np.array(_CRC_LIST, np.uint32)
_ZERO_BYTE = [_CRC_LIST[(1 << bit) & 0xFF] ^ ((1 << bit) >> 8) for bit in range(32)]
_ZERO_OPERATORS = {}


def _apply_operator(columns, crc):
  out, bit = 0, 0
  while crc:
    if crc & 1:
      out ^= columns[bit]
    crc >>= 1
    bit += 1
  return out


def _zeros_operator(n):
  """The linear map of a CRC state over n zero bytes, as the images of its 32 bits."""
  cached = _ZERO_OPERATORS.get(n)
  if cached is not None:
    return cached
  result, power, count = [1 << bit for bit in range(32)], _ZERO_BYTE, n
  while count:
    if count & 1:
      result = [_apply_operator(power, column) for column in result]
    power = [_apply_operator(power, column) for column in power]
    count >>= 1
  if len(_ZERO_OPERATORS) > 256:
    _ZERO_OPERATORS.clear()
  _ZERO_OPERATORS[n] = result
  return result


def _shift_all(states, n):
  """Each CRC state of `states` (uint32 array) carried over n zero bytes."""
  columns = _zeros_operator(n)
  out = np.zeros_like(states)
  for bit in range(32):
    out ^= np.where(
      (states >> np.uint32(bit)) & np.uint32(1), np.uint32(columns[bit]), np.uint32(0)
    )
  return out


def crc32c_extend(crc, data):
  """The CRC32C register (Castagnoli, reflected, no inversion) after `data`, from `crc`. The
  CRC32C of data continuing a CRC32C c (tf_ext's Crc32c(c, data), TensorFlow's
  crc32c::Extend) is crc32c_extend(c ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF: standard_crc32c."""
  data = memoryview(data).cast("B")
  piece = 1 << 22  # bounds the lanes' copy (4 bytes a byte)
  for first in range(0, len(data), piece):
    crc = _crc_piece(crc, data[first : first + piece])
  return crc


def _crc_piece(crc, data):
  n = len(data)
  if n < 4096:
    table = _CRC_LIST
    for byte in bytes(data):
      crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc
  lanes = min(1 << 14, 1 << int(math.log2(n // 64)))
  width = n // lanes
  covered = lanes * width
  columns = np.ascontiguousarray(
    np.frombuffer(data, np.uint8, count=covered).reshape(lanes, width).T
  ).astype(np.uint32)
  states = np.zeros(lanes, np.uint32)
  states[0] = crc
  mask = np.uint32(0xFF)
  eight = np.uint32(8)
  for column in columns:
    states = _CRC_TABLE[(states ^ column) & mask] ^ (states >> eight)
  while len(states) > 1:
    states = _shift_all(states[0::2], width) ^ states[1::2]
    width *= 2
  return _crc_piece(int(states[0]), data[covered:])


def standard_crc32c(crc, data):
  return crc32c_extend(crc ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF
