"""`tf_ext.saved_model`: SavedModel export of models with dynamic embedding tables, for
stock TF Serving.

The code lives in tf_ext/dynamic_embedding/saved_model/; this path is that package itself
(tf_ext/_public_paths.py).
"""

from tf_ext import _public_paths

_public_paths.alias(__name__, "tf_ext.dynamic_embedding.saved_model")
