"""Reading an OpenAI chat-completions reply: a JSON body, or a server-sent-event stream."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from flowledger.adapters.llm.config import DEFAULT_REPLY_BYTES
from flowledger.adapters.llm.reply_limit import read_body, read_lines
from flowledger.adapters.llm.reported_usage import ReportedUsage, parse_usage
from flowledger.adapters.llm.retry import (
    INSUFFICIENT_QUOTA,
    QUOTA_EXHAUSTED,
    AttemptError,
    names_exhausted_quota,
    status_is_retryable,
)
from flowledger.adapters.llm.sse import DONE, UnreadableEvent, event_payloads, is_event_stream, is_json_object

# What an error sent inside a stream would have been as an HTTP status, by its ``type`` or
# ``code`` (OpenAI, Anthropic, OpenRouter and LiteLLM names); one named by neither is taken
# for a server error: a stream that began was a request the endpoint took, and failed on.
_STATUS_OF_ERROR = {
    "invalid_request_error": 400,
    "invalid_request": 400,
    "bad_request": 400,
    "context_length_exceeded": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "permission_denied": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "requests": 429,
    "tokens": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "api_error": 500,
    "internal_error": 500,
    "overloaded_error": 503,
    "overloaded": 503,
}


_ENDED = object()
"""The body's end, as ``read_stream`` is told it (a stream cut before ``[DONE]``, or whole)."""


def one_line(text: str, limit: int) -> str:
    """``text`` as a failure's reason may hold it: its whitespace runs (line breaks included)
    one space, what is left that cannot be printed (NUL, DEL, a terminal's ESC) U+FFFD, at most
    ``limit`` characters (the last an ellipsis when cut). What an endpoint sent reached
    reasons as it came, its escapes recolouring a terminal that printed them."""
    folded = " ".join(text.split())
    if not folded.isprintable():
        folded = "".join(c if c.isprintable() else "\ufffd" for c in folded)
    return folded if len(folded) <= limit else folded[: limit - 1] + "…"


@dataclass(frozen=True, kw_only=True)
class ParsedCompletion:
    """What one successful attempt returned."""

    content: str
    response_model: str
    response_id: str
    finish_reasons: tuple[str, ...]
    tokens: ReportedUsage
    refusal: str = ""
    time_to_first_token_ms: float | None = None
    chunks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def read_completion(
    body: bytes, media_type: str = "application/json", charset: str | None = None, status: int = 200
) -> ParsedCompletion:
    """A non-streamed reply's body (answered with ``status``), read in the ``charset`` its
    content type names; one that is not JSON is a malformed response, or a page (``not_json``)."""
    try:
        data = _json_of(body, charset)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser
        raise not_json(body, media_type, status) from None
    return parse_completion(data)


def _json_of(body: bytes, charset: str | None) -> Any:
    """``body`` as JSON: in the UTF it is in (``json.loads`` tells UTF-8, -16 and -32 apart),
    else in the charset it declares, else as UTF-8 with its bytes that are not UTF-8 read as
    U+FFFD, as a stream's are (``reply_limit.read_lines``). Such a byte (a proxy's Latin-1
    ``caf\xe9``) failed the paid answer as ``malformed_response``, its cost unknown though the
    body stated its usage, and a body in the charset it declared (``charset=iso-8859-1``) was
    not read at all. UTF-8 is tried first whatever the label: a server that labels its UTF-8
    ISO-8859-1 (an old servlet default) is commoner than JSON in Latin-1, and read by its label
    its "café" became "cafÃ©"."""
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        if charset is not None and not charset.lower().startswith("utf"):
            with suppress(LookupError):  # a charset Python does not know: read as if not named
                return json.loads(body.decode(charset, errors="replace"))
        return json.loads(body.decode("utf-8", errors="replace"))


PAGE_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/xml", "application/xml"})
"""Media types of a page, which no chat-completions API answers with."""
_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)


def media_type_of(response: httpx.Response) -> str:
    """The response's media type, lower-cased, without its parameters ("" when it names none)."""
    return str(response.headers.get("content-type", "")).partition(";")[0].strip().lower()


def not_json(body: bytes, media_type: str, status: int = 200) -> AttemptError:
    """The attempt error for a 2xx (``status``) body that is not JSON.

    A page (labelled HTML or XML, or beginning with ``<``: a proxy's login page, a captive
    portal, a gateway's notice) came from something in front of the API, not from the model:
    ``not_an_api_reply``, retried as an unreadable reply is (``connection_error``), and counted
    by the breaker. It names no usage and none is made up; whether the request went past that
    in front is not known, so the attempt's cost is unknown (the call ``unpriced``; a budget
    counts the most it could have cost), and its reason says so. Any other body that is not
    JSON (one cut short) came from the endpoint: ``malformed_response``, not retried, as the
    SDK does not retry a 2xx it cannot read. An empty body is that too, and says it is empty:
    it was "reply body is not JSON", as if something had been sent.
    """
    if not body.strip():
        said = "an empty body" if not body else f"a body of only white space ({len(body)} bytes)"
        return _malformed(
            f"HTTP {status} with {said} ({media_type or 'no content-type'}): no completion and no"
            " usage, so its cost is not known"
        )
    page = page_named(body, media_type)
    if page is not None:
        return AttemptError(
            f"HTTP 2xx with {page}, not the API's JSON: a proxy or gateway answered; its cost is not known",
            error_type="not_an_api_reply",
            retryable=True,
        )
    return _malformed("reply body is not JSON")


def page_title(body: bytes) -> str:
    """A page's title, on one line and at most 80 characters ("" when it has none)."""
    found = _TITLE.search(body[:65_536])
    return " ".join(found[1].decode("utf-8", "replace").split())[:80] if found else ""


def page_named(body: bytes, media_type: str) -> str | None:
    """A page (labelled HTML or XML, or beginning with ``<``) as a reason names it, by its
    title and content type (``an HTML page 'Sign in' (text/html)``); None for another body."""
    if media_type not in PAGE_TYPES and body.lstrip()[:1] != b"<":
        return None
    title = page_title(body)
    kind = "an XML page" if "xml" in media_type and "html" not in media_type else "an HTML page"
    return f"{kind}{f' {title!r}' if title else ''} ({media_type or 'no content-type'})"


def parse_completion(data: Any) -> ParsedCompletion:
    """A non-streamed reply body; a body without choices is a malformed response."""
    tokens = parse_usage(data.get("usage") or data.get("usageMetadata")) if isinstance(data, dict) else None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if isinstance(data, dict) and data.get("error"):
            # A proxy's error answered 2xx (OpenRouter, LiteLLM): failed as an error sent inside
            # a stream is. It was "reply has no choices", not retried, its message lost.
            raise stream_error(
                data["error"], tokens if tokens is not None and tokens.reported else None, "reply"
            )
        raise _malformed("reply has no choices", tokens)
    message = choices[0].get("message") or {}
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        content = text_of_parts(content)
    if content is not None and not isinstance(content, str):
        raise _malformed("message content is not a string", tokens)
    refusal = message.get("refusal") if isinstance(message, dict) else None
    reasons = tuple(
        str(c["finish_reason"]) for c in choices if isinstance(c, dict) and c.get("finish_reason")
    )
    return ParsedCompletion(
        content=content or "",
        response_model=str(data.get("model") or ""),
        response_id=str(data.get("id") or ""),
        finish_reasons=reasons,
        tokens=tokens or ReportedUsage(),
        refusal=refusal if isinstance(refusal, str) else "",
    )


TEXT_PARTS = frozenset({"text", "output_text"})
"""The content parts that are the answer's text; others (a reasoning model's ``thinking``,
an image) are not the answer."""


def text_of_parts(parts: list[Any]) -> str:
    """The text of a content sent as a list of parts (``[{"type": "text", "text": ...}]``,
    as Mistral's reasoning models and some gateways send it): it was ``malformed_response``,
    the step failed and its paid answer was lost."""
    return "".join(
        part["text"]
        for part in parts
        if isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)
    )


@dataclass
class AttemptProgress:
    """How far one attempt got: whether it is ``awaiting_reply`` (its request went out and no
    answer has come: the provider may have the whole prompt, and bill it), whether its stream
    ``began`` (its 2xx answer came: the provider took the request, and bills it from there),
    its usage once the usage chunk came, and the characters of content streamed.

    An attempt that ended (failed, timed out, cancelled) after its stream's usage chunk was
    billed for it: the attempt keeps it. One that ended while awaiting its reply, or after its
    stream began and before that chunk, was billed for what is not known (``billed_unreported``).
    """

    awaiting_reply: bool = False
    began: bool = False
    tokens: ReportedUsage | None = None
    streamed_chars: int = 0

    @property
    def billed_unreported(self) -> bool:
        """The attempt ended after the provider had its request and before its usage came."""
        return (self.awaiting_reply or self.began) and self.tokens is None


async def read_stream(
    response: httpx.Response,
    started: float,
    clock: Callable[[], float] = time.perf_counter,
    progress: AttemptProgress | None = None,
    *,
    limit: int = DEFAULT_REPLY_BYTES,
) -> ParsedCompletion:
    """Consume an SSE stream sent with ``stream_options.include_usage``; ``ReplyTooLarge``
    once more than ``limit`` bytes of it (decoded) came.

    The time to first token is taken when the first non-empty content delta arrives;
    usage comes in the last chunk (with an empty ``choices`` list), and is put on
    ``progress`` as soon as it is read (as is the content's length, as it comes). A stream
    whose body ends without ``[DONE]`` is cut (retried), unless a finish reason and the usage
    chunk came: then it is whole, as the OpenAI SDK reads it (it stops at the body's end), and
    retrying it paid for the answer again. A chunk
    with an ``error`` fails the attempt (``stream_error``); a chunk that cannot be read fails
    it as a malformed response, retried when good chunks came before it (``_unreadable_chunk``).
    A JSON answer is read as a non-streamed reply: some proxies ignore ``stream``, and some
    label a JSON body ``text/event-stream`` (its first line that is not blank begins ``{``).
    """
    if progress is not None:
        progress.began = True
    media_type = media_type_of(response)
    # A whole reply, not a stream; a page (``not_json``) is read as one, so that a completion
    # mislabelled as a page is taken, as it is when not streamed.
    if media_type == "application/json" or media_type in PAGE_TYPES:
        body = await read_body(response, limit)
        if is_event_stream(body):  # a stream labelled as JSON: it failed as "reply body is not JSON"
            return await read_stream(
                _as_stream(body, response.status_code), started, clock, progress, limit=limit
            )
        parsed = read_completion(body, media_type, response.charset_encoding, response.status_code)
        # Its first token came with the whole body.
        return replace(parsed, time_to_first_token_ms=(clock() - started) * 1000)
    parts: list[str] = []
    refused: list[str] = []
    reasons: list[str] = []
    model = response_id = ""
    tokens = ReportedUsage()
    first_token_ms: float | None = None
    chunks = 0
    done = False
    lines = read_lines(response, limit)
    head = [line async for line in _to_first_text(lines)]
    if head and is_json_object(head[-1]):
        # A whole JSON body under a stream's label (a proxy that labels every answer so): read
        # as event lines it was a stream with no event, "stream ended before [DONE]", retried,
        # each attempt billed. Its lines are rejoined: a line break in JSON is white space.
        body = "\n".join([*head, *[line async for line in lines]]).encode()
        parsed = read_completion(body, media_type, "utf-8", response.status_code)
        return replace(parsed, time_to_first_token_ms=(clock() - started) * 1000)
    payloads = event_payloads(_chained(head, lines))
    while True:
        try:
            chunk = await anext(payloads, _ENDED)
        except UnreadableEvent:
            raise _unreadable_chunk("stream chunk is not JSON", chunks, tokens) from None
        if chunk is _ENDED:
            break
        if chunk is DONE:
            done = True
            break
        if not isinstance(chunk, dict):
            raise _unreadable_chunk("stream chunk is not an object", chunks, tokens)
        chunks += 1
        model = str(chunk.get("model") or model)
        response_id = str(chunk.get("id") or response_id)
        if chunk.get("usage"):
            tokens = parse_usage(chunk["usage"])
            if progress is not None and tokens.reported:
                progress.tokens = tokens
        if chunk.get("error"):  # the SDK raises APIError on it: the attempt failed
            raise stream_error(chunk["error"], tokens if tokens.reported else None)
        choices = chunk.get("choices") or []
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(text, list):
                text = text_of_parts(text)
            refusal = delta.get("refusal") if isinstance(delta, dict) else None
            if isinstance(refusal, str):
                refused.append(refusal)
            if isinstance(text, str) and text:
                if first_token_ms is None:
                    first_token_ms = (clock() - started) * 1000
                parts.append(text)
                if progress is not None:
                    progress.streamed_chars += len(text)
            if choice.get("finish_reason"):
                reasons.append(str(choice["finish_reason"]))
    if not done and not (reasons and tokens.reported):
        # Cut: no [DONE], and not both the finish reason and the usage chunk that come last.
        # Billed when the usage chunk came: the attempt keeps it.
        # One that sent nothing says so, with its status: it read as any stream cut short.
        empty = "" if chunks else f" with no chunk in it (HTTP {response.status_code}, an empty stream)"
        raise AttemptError(
            f"stream ended before [DONE]{empty}",
            error_type="connection_error",
            retryable=True,
            usage=tokens if tokens.reported else None,
        )
    return ParsedCompletion(
        content="".join(parts),
        response_model=model,
        response_id=response_id,
        finish_reasons=tuple(reasons),
        tokens=tokens,
        refusal="".join(refused),
        time_to_first_token_ms=first_token_ms,
        chunks=chunks,
    )


async def _to_first_text(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """``lines`` up to and with the first that is not blank (a byte-order mark is blank here)."""
    async for line in lines:
        yield line
        if line.strip("\ufeff \t"):
            return


async def _chained(head: list[str], rest: AsyncIterator[str]) -> AsyncIterator[str]:
    """The lines ``head`` already read, then ``rest``."""
    for line in head:
        yield line
    async for line in rest:
        yield line


UNASKED_STREAM = "the endpoint answered a stream (SSE) to a request that asked for none"
"""What the reason of a stream that answered a request for no stream, and could not be read
whole, begins with: it was "reply body is not JSON" when the stream came labelled as JSON."""


async def read_unasked_stream(
    body: bytes,
    status: int,
    started: float,
    clock: Callable[[], float],
    progress: AttemptProgress,
    *,
    limit: int,
) -> ParsedCompletion:
    """A stream (``body``, whole) that answered a request that asked for none: read as the
    stream it is (a proxy that streams whatever it is asked, whatever it labels it), its answer
    and usage taken; one that cannot be read whole (cut, or chunks that are not OpenAI's) fails
    as such a stream would, its reason saying a stream came (``UNASKED_STREAM``)."""
    try:
        return await read_stream(_as_stream(body, status), started, clock, progress, limit=limit)
    except AttemptError as error:
        if error.error_type not in ("malformed_response", "connection_error"):
            raise  # an error the stream sent: it says what it is
        raise AttemptError(
            f"{UNASKED_STREAM}: {error}",
            error_type=error.error_type,
            retryable=error.retryable,
            usage=error.usage,
        ) from None


def _as_stream(body: bytes, status: int) -> httpx.Response:
    """``body``, read whole, as an event stream's response to read it through ``read_stream``."""
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=body)


def stream_error(error: Any, usage: ReportedUsage | None, where: str = "stream") -> AttemptError:
    """An error sent inside a stream (or, ``where="reply"``, as a 2xx body), failed as the HTTP
    error it stands for would be: a server error (retried, and counted by the breaker), a rate
    limit (retried) or a rejected request (not retried, but for 408 and 409); ``usage`` is what
    the stream said it used before it. The headers came with the 2xx, before the error: they
    say nothing of it. Its message is put on one line (it came over lines as sent)."""
    fields = error if isinstance(error, dict) else {}
    message = fields.get("message") if isinstance(error, dict) else error
    text = one_line(message, 300) if isinstance(message, str) else ""
    if names_exhausted_quota(fields):  # no rate limit: retrying will not help
        return AttemptError(
            f"error in {where}: {text or 'no message'}: {QUOTA_EXHAUSTED}",
            error_type=INSUFFICIENT_QUOTA,
            retryable=False,
            usage=usage,
        )
    status = _status_of(fields)
    kind = "rate_limited" if status == 429 else "server_error" if status >= 500 else "request_error"
    return AttemptError(
        f"error in {where}: {text or 'no message'}",
        error_type=f"{where}_{kind}",
        retryable=status_is_retryable(status, {}, None),
        usage=usage,
    )


def _status_of(error: dict[str, Any]) -> int:
    """The HTTP status an error object names (a number in ``code`` or ``status``), else the one
    its ``type`` or ``code`` stands for; 500 for an error that names neither."""
    for key in ("code", "status"):
        value = error.get(key)
        if isinstance(value, str) and len(value) == 3 and value.isascii() and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
            return value
    for key in ("type", "code"):
        value = error.get(key)
        if isinstance(value, str) and value.lower() in _STATUS_OF_ERROR:
            return _STATUS_OF_ERROR[value.lower()]
    return 500


def estimate_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """A prompt's rough size in tokens, for the tokens-per-minute limits and a budget's hold:
    four characters a token for ASCII text (English averages about that), and more for other
    scripts, by their UTF-8 length: a character of two bytes (an accented letter, Cyrillic)
    about three quarters of a token, of three (Chinese, Japanese, Korean) one and a quarter,
    of four (an emoji) one and three quarters. OpenAI's tokenizers make a token or more of
    each Chinese character; at four characters a token such a prompt was held at a quarter
    of its cost, and a budget let through a call that cost twice its limit."""
    total = 0
    for message in messages:
        text = str(message.get("content") or "")
        wide = 0 if text.isascii() else len(text.encode("utf-8", "surrogatepass")) - len(text)
        total += (len(text) + 2 * wide) // 4
    return total + 4 * len(messages)


def _unreadable_chunk(message: str, read: int, tokens: ReportedUsage) -> AttemptError:
    """A stream chunk that cannot be read: after ``read`` good chunks, the stream broke in
    transit (a chunk cut or garbled, as llmock's ``corrupt`` does) and the attempt is retried,
    as one cut before ``[DONE]`` is; as the first chunk, the endpoint does not send this format
    at all, and a retry would only be paid for again (a malformed response, not retried)."""
    error = _malformed(f"{message} (after {read} good chunk(s))", tokens)
    error.retryable = read > 0
    return error


def _malformed(message: str, tokens: ReportedUsage | None = None) -> AttemptError:
    # The SDK does not retry a 2xx it cannot read; neither do we. A body that still says
    # what it used was billed: the attempt keeps that.
    usage = tokens if tokens is not None and tokens.reported else None
    return AttemptError(message, error_type="malformed_response", retryable=False, usage=usage)
