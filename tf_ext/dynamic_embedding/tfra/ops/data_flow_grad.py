"""TFRA registers the gradients of its own partition and stitch ops here; tf_ext.tfra uses
TensorFlow's ops, whose gradients TensorFlow registers, so importing this module does nothing."""

__all__ = []
