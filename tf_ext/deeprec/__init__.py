"""`import tf_ext.deeprec`: DeepRec's EmbeddingVariable API over tf_ext tables.

The code lives in tf_ext/dynamic_embedding/deeprec/; this path is that package itself
(tf_ext/_public_paths.py).
"""

from tf_ext import _public_paths

_public_paths.alias(__name__, "tf_ext.dynamic_embedding.deeprec")
