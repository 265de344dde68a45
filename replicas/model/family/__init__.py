"""The model families: one file each (its ``Family``: what selects it from a checkpoint, its
config fields from Hugging Face's, its tensor names, its model class) and ``registry``, one
line per family. ``entry`` (Family), ``tensors`` (TensorMapping), ``fields`` (what the
families' config readers share)."""
