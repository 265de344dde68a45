"""The model families: a file each (its ``Family``, ``entry``) and ``registry``, a line each;
``fields``: what the families' config readers share."""
