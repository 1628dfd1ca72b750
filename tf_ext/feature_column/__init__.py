"""`tf_ext.feature_column`: feature columns over dynamic embedding tables.

The code lives in tf_ext/dynamic_embedding/feature_column/; this path is that package itself
(tf_ext/_public_paths.py).
"""

from tf_ext import _public_paths

_public_paths.alias(__name__, "tf_ext.dynamic_embedding.feature_column")
