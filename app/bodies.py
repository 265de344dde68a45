"""A POST's JSON body, read once for every route that takes one (app.http): its media type,
its size, then strict JSON (app.validation.parse_json).

A body whose ``Content-Type`` is not JSON (``text/plain``, ``application/x-www-form-urlencoded``,
which ``curl -d`` sends unless told otherwise, ``multipart/form-data``) is refused with a 400
``unsupported_media_type`` before it is read, as vLLM refuses it; JSON is ``application/json``
or a structured ``application/*+json`` type, with any parameters (``charset=utf-8``). A
request without a ``Content-Type`` is read as JSON, so clients that send none keep working.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from app.validation import parse_json
from replicas.errors import Reason, ScoringError

MAX_BODY_BYTES = 16 * 1024 * 1024


async def read_limited(chunks: AsyncIterator[bytes], limit: int = MAX_BODY_BYTES) -> bytes:
    """Read a request body, refusing (400) bodies larger than ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise ScoringError(Reason.INVALID_REQUEST, f"request body is larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def is_json_media_type(content_type: str | None) -> bool:
    """``content_type`` (a header's value) names JSON, or is absent."""
    if content_type is None or not content_type.strip():
        return True
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def check_media_type(content_type: str | None) -> None:
    """A 400 ``unsupported_media_type`` unless ``content_type`` names JSON (or is absent)."""
    if not is_json_media_type(content_type):
        shown = (content_type or "").strip()[:100]
        raise ScoringError(
            Reason.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {shown!r} is not supported: send the body as JSON with "
            "Content-Type: application/json",
        )


async def json_body(request: Request) -> Any:
    """The request's body as decoded JSON: its media type checked first, then its size and
    its JSON (400s ``unsupported_media_type``, ``invalid_request``, ``invalid_json``)."""
    check_media_type(request.headers.get("content-type"))
    return parse_json(await read_limited(request.stream()))
