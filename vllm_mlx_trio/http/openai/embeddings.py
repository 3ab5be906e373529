"""``POST /v1/embeddings`` as OpenAI defines it, on an embedding model (``engine.mode = "embed"``).

``input`` is a string, an array of strings, an array of token ids, or an array of arrays of
token ids (at most :data:`MAX_INPUTS` items; none empty). Strings are tokenized with the
model's special tokens (vLLM's ``add_special_tokens``, default true). Every input must fit the
context (``max_model_len``). ``dimensions`` cuts each vector to its first N floats and
renormalises it, only on a model trained for it (Matryoshka: ``is_matryoshka`` or
``matryoshka_dimensions`` in its config.json, as vLLM reads them). ``encoding_format`` is
``float`` (arrays of numbers) or ``base64`` (each vector's little-endian float32 bytes, what
the official clients ask for and decode).
"""

from __future__ import annotations

import base64
from functools import partial
from typing import Any, Literal

import msgspec
import numpy as np
import quart

from ...actors.admission.chat_template import Tokenizer, call_tokenizer
from ...engine import Engine
from ...errors import InvalidRequestError, PromptTooLongError
from ...messages import EmbeddingInfo
from ..body import read_json_body
from ..request_log import REQUEST_ID_HEADER, RequestRecord, request_id_from
from ..tokenize_routes import check_model, decode
from ..tokenizer_access import TokenizerAccess
from .schema_errors import bad

#: Most inputs in one request (OpenAI's limit).
MAX_INPUTS = 2048


class EmbeddingsBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    #: vLLM's extension: add the tokenizer's special tokens to string inputs.
    add_special_tokens: bool = True


def register_embeddings_route(app: quart.Quart, engine: Engine) -> None:
    access = TokenizerAccess(engine.model_info.tokenizer)

    @app.post("/v1/embeddings")
    async def embeddings():
        request_id = quart.g.get("request_id") or request_id_from(quart.request.headers.get(REQUEST_ID_HEADER))
        record = RequestRecord(request_id, quart.request.path, engine.metrics, on_finish=lambda: None)
        with record.outcome():
            raw = await read_json_body()
            if isinstance(raw, dict) and "model" not in raw:
                raise bad("model is required and must be a string.", "model")
            body: EmbeddingsBody = decode(raw, EmbeddingsBody)
            check_model(body.model, engine)
            info = _embedding_info(engine)
            dimensions = check_dimensions(body.dimensions, info, body.model)
            rows = await _token_rows(body, access, engine)
            record.input_tokens = num_tokens = sum(len(row) for row in rows)
            vectors = await engine.embed(rows, dimensions=dimensions)
            record.finish("ok")
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encoded(vector, body.encoding_format)}
                for i, vector in enumerate(vectors)
            ],
            "model": body.model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }


def _embedding_info(engine: Engine) -> EmbeddingInfo:
    info = engine.model_info.embedding
    if info is None:
        raise InvalidRequestError(
            "This model does not support the Embeddings API: it is not an embedding model "
            '(serve one with engine.mode = "embed").',
            param="model",
        )
    return info


def check_dimensions(dimensions: int | None, info: EmbeddingInfo, model: str) -> int | None:
    """The dimensions to cut to (None: all), or the 400 that says why not (vLLM's words)."""
    if dimensions is None or dimensions == info.dims:
        return None
    if dimensions < 1:
        raise bad(f"dimensions must be at least 1, got {dimensions}.", "dimensions")
    if dimensions > info.dims:
        raise bad(
            f"dimensions must be at most {info.dims} (the model's embedding size), got {dimensions}.", "dimensions"
        )
    if not info.matryoshka:
        raise bad(
            f'Model "{model}" does not support matryoshka representation, changing output dimensions '
            "will lead to poor results.",
            "dimensions",
        )
    if info.matryoshka_dimensions and dimensions not in info.matryoshka_dimensions:
        raise bad(
            f'Model "{model}" only supports {list(info.matryoshka_dimensions)} matryoshka dimensions, '
            "use other output dimensions will lead to poor results.",
            "dimensions",
        )
    return dimensions


async def _token_rows(body: EmbeddingsBody, access: TokenizerAccess, engine: Engine) -> list[list[int]]:
    """The inputs as rows of token ids, each checked against the vocabulary and the context."""
    items = _input_items(body.input)
    texts = [item for item in items if isinstance(item, str)]
    encode = partial(_encode_all, special=body.add_special_tokens)
    encoded = iter(await access.run(partial(encode, texts=texts), sum(map(len, texts))) if texts else [])
    rows = [next(encoded) if isinstance(item, str) else item for item in items]
    vocab, context = engine.model_info.vocab_size, engine.model_info.max_context_tokens
    for i, row in enumerate(rows):
        if not row:
            raise bad(f"input[{i}] gives no tokens.", "input")
        if any(not 0 <= token < vocab for token in row):
            raise bad(f"input[{i}] holds a token id outside the vocabulary (0..{vocab - 1}).", "input")
        if len(row) > context:
            raise PromptTooLongError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{len(row)} tokens in the input for embedding generation. Please reduce the length of the input.",
                param="input",
            )
    return rows


def _input_items(value: Any) -> list[str | list[int]]:
    """``input`` as a list of strings and token-id lists; anything else is a 400."""
    shape_error = bad(
        "input must be a string, an array of strings, an array of token ids or an array of arrays of token ids.",
        "input",
    )
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_token(t) for t in value):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise shape_error
    if not items:
        raise bad("input must not be empty.", "input")
    if len(items) > MAX_INPUTS:
        raise bad(f"input may hold at most {MAX_INPUTS} items, got {len(items)}.", "input")
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad("input must not contain an empty string.", "input")
        elif not (isinstance(item, list) and all(_is_token(t) for t in item)):
            raise shape_error
    return items


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encode_all(tokenizer: Tokenizer, *, texts: list[str], special: bool) -> list[list[int]]:
    return [
        list(call_tokenizer(lambda t=text: tokenizer.encode(t, add_special_tokens=special), "input")) for text in texts
    ]


def encoded(vector: tuple[float, ...], encoding_format: str) -> list[float] | str:
    """A vector as ``encoding_format`` says: the floats, or base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return list(vector)
