"""`import tf_ext.tfra as de`: TFRA's dynamic_embedding API over tf_ext tables.

The code lives in tf_ext/dynamic_embedding/tfra/; this path is that package itself
(tf_ext/_public_paths.py).
"""

from tf_ext import _public_paths

_public_paths.alias(__name__, "tf_ext.dynamic_embedding.tfra", commands=("convert",))
