"""TFRA's `shadow_embedding_ops` path: the names of `de.shadow_ops`."""

from tf_ext.dynamic_embedding.tfra.shadow_ops import (
  DEResourceVariable,
  HvdVariable,
  ShadowVariable,
  embedding_lookup,
  embedding_lookup_unique,
  embedding_lookup_unique_base,
)

__all__ = [
  "DEResourceVariable",
  "HvdVariable",
  "ShadowVariable",
  "embedding_lookup",
  "embedding_lookup_unique",
  "embedding_lookup_unique_base",
]
