"""The documented limits of a dynamic embedding table (docs/dynamic_embedding.md, Limits), for
Python's early checks. Their home is kernels/dynamic_embedding/core/limits.h, which the kernels
enforce; tests/dynamic_embedding/test_limits.py checks that each value here is the header's."""

MAX_DIM = 4096  # kMaxDim: floats per row
MAX_SHARDS = 65536  # kMaxShards: shards of a sharded table
MAX_TABLE_ROWS = 1 << 31  # kMaxTableRows: rows of one table
MAX_KEY_BYTES = 1 << 20  # kMaxKeyBytes: bytes of one string key
MAX_IDS_PER_CALL = (1 << 31) - 1  # kMaxIdsPerCall: ids in one lookup or update call, per table
MAX_SNAPSHOT_FILE_BYTES = 1 << 40  # kMaxSnapshotFileBytes: bytes of one snapshot file
