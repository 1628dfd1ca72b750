"""`tf_ext.keras`: dynamic embedding's Keras layer and callbacks.

The code lives in tf_ext/dynamic_embedding/keras/; this path is that package itself
(tf_ext/_public_paths.py).
"""

from tf_ext import _public_paths

_public_paths.alias(__name__, "tf_ext.dynamic_embedding.keras")
