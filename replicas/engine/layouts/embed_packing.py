"""How the embedding layout packs inputs into rows and rows into steps (semantics 20).

Inputs are sorted longest first and placed into rows (little padding on mixed lengths),
each row holding at most ``slots(tokens)`` inputs: first-fit, and for an encoder also into
the row its bucket grows least (``plan`` keeps whichever computes fewer tokens). A
decoder's row takes up to the step's capacity: its inputs attend within their window
wherever they sit. An encoder's attention reads its whole row
(``replicas.model.encoder.attend_row``), so its row takes up to about its first (longest)
input's window, ``ENCODER_ROW`` tokens at least, and rows of one limit share a step up to
the capacity in tokens (its weights read once for all of them). A step is ``EmbedDims``
(rows, stream tokens, window).
"""

from __future__ import annotations

from dataclasses import dataclass

from replicas.engine.layouts.common import BucketDims, bucket_for
from replicas.engine.layouts.stream import window_for

MIN_SLOTS = 16
# An encoder's shortest row limit: its attention reads the whole row, so every token of a
# short input pays for the row's keys. Rows of one limit share a step up to the capacity, so
# short rows add few steps: on 64 texts of 1..60 words (MiniLM's shape, 2 CPU cores) rows of
# 64 embedded in 0.72x the time of rows of 256 and 128 in 0.81x (issue 80;
# docs/benchmarks.md, "A served encoder at real lengths").
ENCODER_ROW = 64


def slots(tokens: int) -> int:
    """Inputs one row of ``tokens`` stream tokens may hold (pooled outputs per row)."""
    return max(MIN_SLOTS, tokens // 4)


def embed_window(longest: int, tokens: int) -> int:
    """The item window of a step of ``tokens``: the longest input's (``window_for``), at
    least a quarter of the row, so a row length has at most three windows to compile."""
    return max(window_for(longest, tokens), min(tokens, window_for(tokens // 4, tokens)))


@dataclass(frozen=True, order=True)
class EmbedDims(BucketDims):
    """One embedding step: ``batch`` rows of ``tokens`` stream tokens, inputs <= ``window``."""

    batch: int
    tokens: int
    window: int

    @property
    def cost(self) -> int:
        return self.batch * self.tokens * 64 + self.window


@dataclass(frozen=True)
class Piece:
    """One input of one work: ``(work, index)`` and where its pooling starts."""

    work: int
    index: int
    tokens: tuple[int, ...]
    skip: int  # leading tokens left out of the pooling (the prompt without include_prompt)
    second: int = 0  # a cross-encoder pair's first token of type 1 (its length: none)
    normalize: bool = True  # its work's EmbedWork.normalize
    query_only: int = 0  # its last tokens no token reads (EmbedWork.query_only)


Row = list[Piece]


@dataclass(frozen=True)
class EmbedPacking:
    """The packer of one engine's embedding steps."""

    capacity: int  # stream tokens a step takes (``step_capacity``)
    token_buckets: tuple[int, ...]  # item_token_buckets
    batch_sizes: tuple[int, ...]  # the batch buckets as multiples of the data axis
    encoder: bool  # the model attends bidirectionally across its rows (an encoder)

    def plan(self, pieces: list[Piece]) -> list[tuple[EmbedDims, list[Row]]]:
        """``pieces`` in steps: a decoder's first-fit; an encoder's first-fit or least-padding
        rows (each longest row first), whichever computes fewer tokens (then fewer steps).
        A ColBERT query of 32 tokens beside 100 documents of 154-187: first-fit adds it to
        the longest document, padding that step's 4 rows by 32 (1.055); least padding adds it
        to the shortest, whose row then sorts among rows of its bucket (1.048)."""
        first = self.steps(self.rows(pieces))
        if not self.encoder:
            return first
        least = self.steps(self.rows(pieces, least_padding=True))
        return min(least, first, key=_computed)

    def rows(self, pieces: list[Piece], least_padding: bool = False) -> list[Row]:
        """``pieces``, longest first, into rows of at most their ``row_limit``: first-fit, or
        (``least_padding``) into the row whose bucket grows least, then the shortest; an
        encoder's rows longest first within each limit."""
        pieces = sorted(pieces, key=lambda p: -len(p.tokens))
        rows: list[Row] = []
        used: list[int] = []
        limits: list[int] = []  # each row's most tokens, set by its first (longest) input
        for piece in pieces:
            length = len(piece.tokens)
            r = self._row_for(length, rows, used, limits, least_padding)
            if r is None:
                rows.append([piece])
                used.append(length)
                limits.append(self.row_limit(length))
            else:
                rows[r].append(piece)
                used[r] += length
        if not self.encoder:
            return rows
        order = sorted(range(len(rows)), key=lambda r: (-limits[r], -used[r]))
        return [rows[r] for r in order]

    def _row_for(
        self, length: int, rows: list[Row], used: list[int], limits: list[int], least: bool
    ) -> int | None:
        """The row an input of ``length`` tokens joins (None: a new row)."""
        best: tuple[tuple[int, int], int] | None = None
        for r, row in enumerate(rows):
            total = used[r] + length
            if total > limits[r] or len(row) >= slots(self._bucket(total)):
                continue
            if not least:
                return r
            key = (self._bucket(total) - self._bucket(used[r]), total)
            if best is None or key < best[0]:
                best = (key, r)
        return None if best is None else best[1]

    def row_limit(self, longest: int) -> int:
        """The most tokens of a row whose longest input has ``longest``: the capacity for a
        decoder; an encoder's input's window, ``ENCODER_ROW`` at least."""
        if not self.encoder:
            return self.capacity
        return min(self.capacity, max(ENCODER_ROW, window_for(longest, self.capacity)))

    def steps(self, rows: list[Row]) -> list[tuple[EmbedDims, list[Row]]]:
        """``rows`` (as ``rows`` orders them) in steps, each with its signature."""
        steps, start = [], 0
        while start < len(rows):
            count, full = self._rows_per_step(rows, start)
            chunk = rows[start : start + count]
            tokens = full or self._bucket(max(sum(len(p.tokens) for p in row) for row in chunk))
            batch = count if full else bucket_for(len(chunk), self.batch_sizes, "batch")
            longest = max(len(p.tokens) for row in chunk for p in row)
            window = tokens if self.encoder else embed_window(longest, tokens)
            steps.append((EmbedDims(batch, tokens, window), chunk))
            start += count
        return steps

    def _rows_per_step(self, rows: list[Row], start: int) -> tuple[int, int]:
        """Rows of the step from ``rows[start]``, and 0 or the row length they are padded to:
        the largest batch size; an encoder's rows of one limit doubled from there while
        there are that many and they would fill at most the capacity at their limit's
        bucket, so a step of short rows reads the weights once for about a full step's
        tokens (a CPU's ``batch_buckets: [1]`` too), each padded to the bucket of the
        longest of them (rows of one 180-token input: ~1.05, not their limit's 256;
        ``full_row_steps`` warms the full rows, the rest compile as traffic brings them)."""
        count = most = self.batch_sizes[-1]
        if not self.encoder:
            return count, 0
        limit = self.row_limit(len(rows[start][0].tokens))  # its first input is its longest
        full = self._bucket(limit)
        same = start
        while same < len(rows) and self.row_limit(len(rows[same][0].tokens)) == limit:
            same += 1
        while start + 2 * count <= same and 2 * count * full <= self.capacity:
            count *= 2
        if count <= most:
            return count, 0
        longest = max(sum(len(p.tokens) for p in row) for row in rows[start : start + count])
        return count, self._bucket(longest)

    def full_row_steps(self) -> list[EmbedDims]:
        """An encoder's steps of full rows (each ``row_limit``: ``ENCODER_ROW`` doubled up to
        the capacity), as many rows as ``_rows_per_step`` puts in one: the signatures most of
        its steps run; none for a decoder."""
        dims: list[EmbedDims] = []
        limit = ENCODER_ROW
        while self.encoder and limit < self.capacity:
            tokens, batch = self._bucket(limit), self.batch_sizes[-1]
            while 2 * batch * tokens <= self.capacity:
                batch *= 2
            dims.append(EmbedDims(batch, tokens, tokens))
            limit *= 2
        return dims

    def _bucket(self, tokens: int) -> int:
        return bucket_for(tokens, self.token_buckets, "item_token_buckets")


def _computed(steps: list[tuple[EmbedDims, list[Row]]]) -> tuple[int, int]:
    """Steps' stream tokens computed, then their count."""
    return sum(dims.batch * dims.tokens for dims, _ in steps), len(steps)
