"""`tf_ext.graph_optimizations`: the graph passes for recommendation models (the graph
capability).

The code lives in tf_ext/graph/; this path is that package itself
(tf_ext/_public_paths.py).
"""

from tf_ext import _public_paths

_public_paths.alias(__name__, "tf_ext.graph")
