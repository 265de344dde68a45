"""Layouts: each module packs work into static shapes, holds its jitted step and unpacks.

- ``shared_prefix``: the query once (prefix step, query cache), items as a flat stream;
- ``single_item``: every ``query + item`` row (``item_first``: ``item + query``) on its own,
  rows end to end in the same item-stream step with an empty prefix;
- ``packed_reference``: RFC-008's packed row with a dense mask, the reference.
``stream`` is the item-stream step the first two share; ``common`` holds buckets, the LM head
over scoring rows and unpacking.
"""
