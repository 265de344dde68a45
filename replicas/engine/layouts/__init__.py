"""Layouts: each module packs work into static shapes, holds its jitted step and unpacks.

- ``shared_prefix``: multi-item work: the query once (prefix step, query cache, or extended
  from a cached query's blocks by ``prefix_extension``), items as a flat stream behind it;
  a small work runs ``fused`` instead (query and items in one row, a mask from work ids);
- ``single_item``: every ``query + item`` row (``item_first``: ``item + query``) as its own
  causal row ``[R, L]`` (``dense.causal_step``), rows sorted by length;
- ``packed_reference``: RFC-008's packed row with a dense mask, the reference;
- ``prompts``: PromptWork (prompt log-probs), prompts grouped by shared blocks
  (``prompt_plan``, ``prompt_units``), steps in ``token_steps``;
- ``embed``: EmbedWork, inputs end to end in item-stream rows behind an empty prefix, pooled.
``stream`` is the item-stream step (``shared_prefix``'s; ``prompts``, ``embed`` and
``prefix_extension`` run the same stream attention in steps of their own), ``dense`` the
token-row steps (causal, packed, fused), ``prefix_blocks`` places prefix keys/values on data
shards, ``common`` holds buckets, the LM head over scoring rows and unpacking, ``runner``
what a layout needs from the engine.
"""
