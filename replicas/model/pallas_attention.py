"""Pallas flash attention for the item stream: one kernel per attention part, merged by LSE.

Shapes use B batch, S query tokens, T key tokens, H query heads, K key/value heads,
G = H // K, Dh head dim, bq = bk = ``block``, nq = S'/bq and nk = T'/bk (S', T' padded).

Design: grid (B, H, nq), all "parallel". Each step holds one query block [bq, Dh] and the
whole padded key/value sequence of its kv head h // G, laid out as [nk, bk, Dh] blocks so the
kernel indexes a leading axis only, and runs an online softmax over the kv blocks it can see
in a ``fori_loop`` with dynamic bounds: causal parts stop at the diagonal block, and windowed
causal parts start at the block holding key s - window + 1, so the own-item part costs
O(S * window). Consecutive heads of one kv head keep the same K/V block index, so K/V are
copied from HBM once per (batch, kv head). VMEM: 2 buffers x (K + V) of T' x Dh each plus the
[nk, 1, bk] kv segment ids (padded to 8 sublanes), e.g. T' = 8192, Dh = 128, bf16: ~9 MiB.

Segment ids follow the library's flash attention: queries as [B, S', 128] lanes, keys as
[B, nk, 1, bk] rows. A sliding window (Gemma, Mistral) travels the same way, folded into two
more such arrays so the per-layer (traced) window needs no scalar input: each query's lowest
visible position ``p - window`` and each key's position; key s is inside iff its position is
above the query's low bound. Logit scale and soft-cap are static.
The LSE leaves the kernel as [B, H, 1, S'] (a lane-major row per query
block) rather than [B, H, S', 128], which would cost 128x its size in HBM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from replicas.model.masks import reader_ids

Array = jax.Array
LANES = 128
NT_DIMS = (((1,), (1,)), ((), ()))  # contract the last dims: [m, d] x [n, d] -> [m, n]


def _kv_range(qi: Array, *, causal: bool, window: int | None, block: int, nk: int):
    """Kv blocks [lo, hi) that may hold keys visible to query block qi."""
    if not causal:
        return 0, nk
    hi = qi + 1
    if window is None:
        return 0, hi
    # lax.div, not //: floor division lowers through sign, which needs a live TPU to lower.
    return jax.lax.div(jnp.maximum(qi * block - window + 1, 0), block), hi


def _visible(qseg: Array, kvseg: Array, qi: Array, j: Array, *, causal, window, block):
    """[bq, 1] and [1, bk] segment ids of query block qi and kv block j -> [bq, bk] bool."""
    mask = (qseg == kvseg) & (qseg >= 0)
    if causal:
        shape = (qseg.shape[0], kvseg.shape[1])
        row = jax.lax.broadcasted_iota(jnp.int32, shape, 0) + qi * block
        col = jax.lax.broadcasted_iota(jnp.int32, shape, 1) + j * block
        mask = mask & (col <= row)
        if window is not None:
            mask = mask & (col > row - window)
    return mask


def _kernel(*refs, scale, softcap, causal, window, sliding):
    """refs: qseg, kvseg, (qlow, kvpos when ``sliding``), q, k, v -> o, lse."""
    qseg_ref, kvseg_ref = refs[:2]
    qlow_ref, kvpos_ref = refs[2:4] if sliding else (None, None)
    q_ref, k_ref, v_ref, o_ref, lse_ref = refs[4:] if sliding else refs[2:]
    block, head_dim = q_ref.shape[-2:]
    qi = pl.program_id(2)
    q = q_ref[0, 0]  # [bq, Dh]
    qseg = qseg_ref[0][:, :1]  # [bq, 1]
    qlow = qlow_ref[0][:, :1] if sliding else None  # [bq, 1]
    lo, hi = _kv_range(qi, causal=causal, window=window, block=block, nk=k_ref.shape[2])

    def step(j, carry):
        m, denom, acc = carry  # [bq, 1], [bq, 1], [bq, Dh] float32
        k = k_ref[0, 0, j]  # [bk, Dh]
        s = jax.lax.dot_general(q, k, NT_DIMS, preferred_element_type=jnp.float32) * scale
        if softcap is not None:
            s = softcap * jnp.tanh(s / softcap)
        mask = _visible(qseg, kvseg_ref[0, j], qi, j, causal=causal, window=window, block=block)
        if sliding:
            mask = mask & (kvpos_ref[0, j] > qlow)  # [1, bk] vs [bq, 1]
        s = jnp.where(mask, s, -jnp.inf)  # [bq, bk]
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # no (-inf) - (-inf)
        p = jnp.exp(s - m_safe)  # [bq, bk], 0 where masked
        alpha = jnp.exp(m - m_safe)  # [bq, 1]
        v = v_ref[0, 0, j]  # [bk, Dh]
        pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, alpha * denom + jnp.sum(p, axis=1, keepdims=True), alpha * acc + pv

    init = (
        jnp.full((block, 1), -jnp.inf, jnp.float32),
        jnp.zeros((block, 1), jnp.float32),
        jnp.zeros((block, head_dim), jnp.float32),
    )
    m, denom, acc = jax.lax.fori_loop(lo, hi, step, init)
    empty = denom == 0.0  # [bq, 1]: no visible key
    denom = jnp.where(empty, 1.0, denom)
    o_ref[0, 0] = (acc / denom).astype(o_ref.dtype)
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(denom))  # [bq, 1]
    lse_ref[0, 0] = jnp.transpose(jnp.broadcast_to(lse, (block, LANES)))[:1]  # [1, bq]


def _pad_to(x: Array, length: int, axis: int, value: int = 0) -> Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, pad, constant_values=value)


def _blocks_visited(nq: int, nk: int, *, causal: bool, window: int | None, block: int) -> int:
    """(query block, kv block) pairs the kernel's loops run: what the cost estimate counts."""
    if not causal:
        return nq * nk
    if window is None:
        return sum(qi + 1 for qi in range(nq))
    return sum(qi + 1 - max(qi * block - window + 1, 0) // block for qi in range(nq))


def _cost(qt, kb, vb, qseg, kvseg, *, causal, window) -> pl.CostEstimate:
    """What one call computes and moves, so XLA's cost analysis (and the TPU projections
    read from it) count the kernel instead of a zero-cost custom call."""
    batch, heads, length, head_dim = qt.shape
    nk, block = kb.shape[2], kb.shape[3]
    pairs = _blocks_visited(length // block, nk, causal=causal, window=window, block=block)
    scores = batch * heads * pairs * block * block
    moved = sum(x.size * x.dtype.itemsize for x in (qt, kb, vb, qseg, kvseg))
    moved += qt.size * qt.dtype.itemsize + batch * heads * length * 4  # out, lse
    return pl.CostEstimate(
        flops=4 * scores * head_dim, transcendentals=scores, bytes_accessed=int(moved)
    )


def _flash(qt, kb, vb, qseg, kvseg, sliding_arrays, *, options, causal, window, interpret):
    """qt [B, H, S', Dh]; kb, vb [B, K, nk, bk, Dh]; qseg [B, S', 128]; kvseg [B, nk, 1, bk];
    sliding_arrays: () or (qlow [B, S', 128], kvpos [B, nk, 1, bk]); options: (scale or
    None, softcap or None) -> out [B, H, S', Dh] (q's dtype), lse [B, H, 1, S'] float32."""
    batch, heads, length, head_dim = qt.shape
    _, kv_heads, nk, block, _ = kb.shape
    groups = heads // kv_heads
    scale, softcap = options
    kernel = functools.partial(
        _kernel, scale=head_dim**-0.5 if scale is None else scale, softcap=softcap,
        causal=causal, window=window, sliding=bool(sliding_arrays),
    )  # fmt: skip
    kv_spec = pl.BlockSpec(
        (1, 1, nk, block, head_dim), lambda b, h, i: (b, jax.lax.div(h, groups), 0, 0, 0)
    )
    q_rows = pl.BlockSpec((1, block, LANES), lambda b, h, i: (b, i, 0))
    kv_rows = pl.BlockSpec((1, nk, 1, block), lambda b, h, i: (b, 0, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(batch, heads, length // block),
        in_specs=[
            q_rows,
            kv_rows,
            *((q_rows, kv_rows) if sliding_arrays else ()),
            pl.BlockSpec((1, 1, block, head_dim), lambda b, h, i: (b, h, i, 0)),
            kv_spec,
            kv_spec,
        ],
        out_specs=[
            pl.BlockSpec((1, 1, block, head_dim), lambda b, h, i: (b, h, i, 0)),
            pl.BlockSpec((1, 1, 1, block), lambda b, h, i: (b, h, 0, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(qt.shape, qt.dtype),
            jax.ShapeDtypeStruct((batch, heads, 1, length), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")
        ),
        cost_estimate=_cost(qt, kb, vb, qseg, kvseg, causal=causal, window=window),
        interpret=interpret,
    )(qseg, kvseg, *sliding_arrays, qt, kb, vb)


def attention_part(
    q: Array,
    k: Array,
    v: Array,
    q_segments: Array,
    kv_segments: Array,
    *,
    causal: bool,
    window: int | None,
    interpret: bool,
    block: int = 128,
    options: tuple[float | None, float | None] = (None, None),
    sliding: tuple[Array, Array] | None = None,
) -> tuple[Array, Array]:
    """One softmax-normalized attention part and its log-sum-exp.

    q: [B, S, H, Dh]; k, v: [B, T, K, Dh]; q_segments: [B, S] int; kv_segments: [B, T] int.
    Key t is visible to query s iff q_segments[s] == kv_segments[t] >= 0, and when causal
    (S == T) t <= s and, with ``window``, t > s - window; with ``sliding`` (q_low [B, S],
    kv_positions [B, T]) also kv_positions[t] > q_low[s]. ``options``: logit scale (None:
    Dh ** -0.5) and soft-cap. Returns out [B, S, H, Dh] in q's dtype (0 where nothing is
    visible) and lse [B, S, H] float32 (-inf there). On TPU ``block`` must be a multiple of
    128; interpret mode takes any multiple of 8.
    """
    batch, length, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    if heads % kv_heads or (causal and length != kv_len) or block % 8:
        raise ValueError(f"bad shapes q {q.shape}, k {k.shape}, causal {causal}, block {block}")
    if not interpret and block % LANES:
        raise ValueError(f"block {block} must be a multiple of {LANES} on TPU")
    s_pad, t_pad = -(-length // block) * block, -(-kv_len // block) * block
    qt = _pad_to(jnp.swapaxes(q, 1, 2), s_pad, 2)  # [B, H, S', Dh]
    kv_shape = (batch, kv_heads, t_pad // block, block, head_dim)
    kb = _pad_to(jnp.swapaxes(k, 1, 2), t_pad, 2).reshape(kv_shape)  # [B, K, nk, bk, Dh]
    vb = _pad_to(jnp.swapaxes(v, 1, 2), t_pad, 2).reshape(kv_shape)

    def query_lanes(x: Array, fill: int = 0) -> Array:  # [B, S] -> [B, S', 128]
        x = _pad_to(x.astype(jnp.int32), s_pad, 1, fill)
        return jnp.broadcast_to(x[:, :, None], (batch, s_pad, LANES))

    def key_rows(x: Array, fill: int = 0) -> Array:  # [B, T] -> [B, nk, 1, bk]
        x = _pad_to(x.astype(jnp.int32), t_pad, 1, fill)
        return x.reshape(batch, t_pad // block, 1, block)

    qseg, kvseg = query_lanes(q_segments, -1), key_rows(kv_segments, -2)
    sliding_arrays = () if sliding is None else (query_lanes(sliding[0]), key_rows(sliding[1]))
    out, lse = _flash(
        qt, kb, vb, qseg, kvseg, sliding_arrays,
        options=options, causal=causal, window=window, interpret=interpret,
    )  # fmt: skip
    out = jnp.swapaxes(out[:, :, :length], 1, 2)  # [B, S, H, Dh]
    return out, jnp.swapaxes(lse[:, :, 0, :length], 1, 2)  # [B, S, H]


def merge_parts(parts: list[tuple[Array, Array]]) -> Array:
    """Exact LSE merge of parts (out [B, S, H, Dh], lse [B, S, H]) -> [B, S, H, Dh] float32.

    Rows where every part is -inf come out 0."""
    lses = jnp.stack([lse for _, lse in parts])  # [P, B, S, H]
    top = jnp.max(lses, axis=0)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weights = jnp.exp(lses - top)  # [P, B, S, H], 0 for -inf parts
    total = jnp.sum(weights, axis=0)
    out = sum(
        w[..., None] * o.astype(jnp.float32) for w, (o, _) in zip(weights, parts, strict=True)
    )
    return out / jnp.where(total > 0, total, 1.0)[..., None]


def item_stream_attention(
    q: Array,
    prefix_k: Array,
    prefix_v: Array,
    prefix_valid: Array,
    k: Array,
    v: Array,
    item_ids: Array,
    window: int,
    scale: float | None = None,
    softcap: float | None = None,
    positions: Array | None = None,
    sliding_window: Array | None = None,
    *,
    interpret: bool = False,
    block: int = 128,
) -> Array:
    """Pallas twin of ``layers.attend_item_stream`` (equal on rows with item_ids >= 0),
    with the same scale, soft-cap and sliding window.

    q: [B, S, H, Dh]; prefix_k/v: [B, T, K, Dh]; prefix_valid: [B, T] bool; k, v:
    [B, S, K, Dh]; item_ids: [B, S] int (-1 padding) -> [B, S, H, Dh] in q's dtype.
    """
    item_ids = item_ids.astype(jnp.int32)
    prefix_q = jnp.where(item_ids >= 0, 0, -1)  # [B, S]
    prefix_kv = jnp.where(prefix_valid, 0, -1)  # [B, T]
    part = functools.partial(
        attention_part, interpret=interpret, block=block, options=(scale, softcap)
    )
    prefix_sliding = own_sliding = None
    if sliding_window is not None:
        q_low = positions - sliding_window  # [B, S]: lowest position outside the window
        prefix_pos = jnp.broadcast_to(
            jnp.arange(prefix_k.shape[1], dtype=jnp.int32), prefix_valid.shape
        )  # [B, T]: a prefix key's position is its index
        prefix_sliding, own_sliding = (q_low, prefix_pos), (q_low, positions)
    prefix = part(
        q, prefix_k, prefix_v, prefix_q, prefix_kv, causal=False, window=None,
        sliding=prefix_sliding,
    )  # fmt: skip
    own = part(q, k, v, item_ids, item_ids, causal=True, window=window, sliding=own_sliding)
    return merge_parts([prefix, own]).astype(q.dtype)


def segment_attention(
    q: Array, k: Array, v: Array, item_ids: Array, *, interpret: bool, block: int = 128
) -> Array:
    """An encoder's attention through one Pallas part: each query attends bidirectionally to
    the keys of its own sequence (``encoder.attend_segments``' contract without a local
    window). q, k, v: [B, S, H, Dh] (H query and key heads alike); item_ids: [B, S] (-1
    padding, whose rows come out 0; ``masks.reader_ids``' query-only ids: read by none)
    -> [B, S, H, Dh] in q's dtype."""
    readers = reader_ids(item_ids.astype(jnp.int32))
    out, _ = attention_part(
        q, k, v, readers, item_ids, causal=False, window=None, interpret=interpret, block=block
    )
    return out.astype(q.dtype)
