"""Token-window chunking with overlap (tiktoken).

Each window holds at most `tokens` tokens; when the text goes on past the window, the cut moves back to the
last paragraph break, else the last sentence end, found in the last quarter of the window, so chunks rarely
stop mid-sentence. The next window starts `overlap` tokens before the cut. The text is encoded once and cut
on byte offsets of token boundaries, so a megabyte chunks in a fraction of a second and the same text always
gives the same chunks.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Any

DEFAULT_ENCODING = "cl100k_base"
# Where the cut may move back to: the last quarter of the window.
BOUNDARY_SEARCH_FRACTION = 0.25

_PARAGRAPH_RE = re.compile(rb"\n[ \t]*\n")
# A sentence end: . ! ? (or a line break), optionally followed by closing quotes/brackets, then whitespace.
_SENTENCE_RE = re.compile(rb"(?:[.!?][\"')\]\xe2\x80\x9d\xe2\x80\x99]*[ \t]+|\n)")


@lru_cache(maxsize=4)
def get_encoder(name: str = DEFAULT_ENCODING) -> Any:
    """The tiktoken encoding, loaded once; offline.setup() first so it comes from litellm's bundled copy."""
    from hrag_cli.core.offline import setup

    setup()
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except ValueError:      # tiktoken's message spans several lines and lists its plugins
        from hrag_cli.core.errors import UsageError

        raise UsageError(f"unknown chunk encoding '{name}': chunk.encoding takes a tiktoken encoding such as "
                         f"{DEFAULT_ENCODING}") from None


def count_tokens(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    return len(get_encoder(encoding).encode(text, disallowed_special=()))


@dataclass
class TextChunk:
    text: str
    n_tokens: int


def _char_start(data: bytes, pos: int) -> int:
    """Move a byte offset back to the start of a UTF-8 character (tokens may split a multi-byte char)."""
    while 0 < pos < len(data) and (data[pos] & 0xC0) == 0x80:
        pos -= 1
    return pos


def _last_match_end(pattern: re.Pattern[bytes], data: bytes, lo: int, hi: int) -> int:
    """End offset of the last match of `pattern` inside data[lo:hi], or -1."""
    end = -1
    for m in pattern.finditer(data, lo, hi):
        end = m.end()
    return end


# Texts longer than this are chunked a segment at a time, each segment ending at a paragraph break (else a line
# break, else a space) in its second half: the token ids, their byte strings and offsets of a whole large file
# take many times its size; per segment they stay small. Shorter texts are one segment, so their chunks are
# unchanged.
SEGMENT_CHARS = 1 << 22


def _segment_end(text: str, start: int, n: int, size: int) -> int:
    """Where the segment starting at `start` ends: at most `size` on, at a break in its second half."""
    end = min(start + size, n)
    if end < n:
        for sep in ("\n\n", "\n", " "):
            cut = text.rfind(sep, start + size // 2, end)
            if cut > start:
                return cut + len(sep)
    return end


def segments(text: str, size: int = SEGMENT_CHARS) -> list[tuple[int, int]]:
    """(start, end) character ranges covering `text`, each at most `size` long."""
    out, start, n = [], 0, len(text)
    while start < n:
        end = _segment_end(text, start, n, size)
        out.append((start, end))
        start = end
    return out


def stream_segments(pieces: Iterable[str], size: int = SEGMENT_CHARS) -> Iterator[str]:
    """The same segments as `segments` over the concatenation of `pieces`, holding at most about two
    segments of text at once (a huge file read a block at a time)."""
    buf, it, eof = "", iter(pieces), False
    while True:
        while not eof and len(buf) <= size:
            piece = next(it, None)
            eof = piece is None
            buf += piece or ""
        if not buf:
            return
        end = len(buf) if len(buf) <= size else _segment_end(buf, 0, len(buf), size)
        yield buf[:end]
        buf = buf[end:]


def chunk_text(text: str, tokens: int = 1200, overlap: int = 100,
               encoding: str = DEFAULT_ENCODING) -> list[TextChunk]:
    """Split `text` into overlapping token windows; chunks are stripped and empty ones dropped."""
    if tokens < 1:
        raise ValueError("chunk size must be at least 1 token")
    if len(text) > SEGMENT_CHARS:
        return [c for a, b in segments(text) for c in _chunk_segment(text[a:b], tokens, overlap, encoding)]
    return _chunk_segment(text, tokens, overlap, encoding)


def _chunk_segment(text: str, tokens: int, overlap: int, encoding: str) -> list[TextChunk]:
    overlap = max(0, min(overlap, tokens // 2))
    enc = get_encoder(encoding)
    ids = enc.encode(text, disallowed_special=())
    n = len(ids)
    if n == 0:
        return []
    data = text.encode("utf-8")
    if n <= tokens:
        stripped = text.strip()
        return [TextChunk(stripped, n)] if stripped else []
    # offsets[i] = byte offset where token i starts; offsets[n] = len(data)
    offsets = [0, *accumulate(len(b) for b in enc.decode_tokens_bytes(ids))]
    out: list[TextChunk] = []
    start = 0
    search = max(1, int(tokens * BOUNDARY_SEARCH_FRACTION))
    while start < n:
        end = min(start + tokens, n)
        if end < n:
            lo_tok = max(start + 1, end - search)
            lo, hi = offsets[lo_tok], offsets[end]
            cut = _last_match_end(_PARAGRAPH_RE, data, lo, hi)
            if cut < 0:
                cut = _last_match_end(_SENTENCE_RE, data, lo, hi)
            if cut > 0:
                # the token boundary at or before the cut (a token may straddle it, e.g. " The")
                t = bisect_right(offsets, cut, lo=start + 1, hi=end + 1) - 1
                if t > start:
                    end = t
        b0 = _char_start(data, offsets[start])
        b1 = _char_start(data, offsets[end]) if end < n else len(data)
        piece = data[b0:b1].decode("utf-8", errors="replace").strip()
        if piece:
            out.append(TextChunk(piece, end - start))
        if end >= n:
            break
        start = max(end - overlap, start + 1)
    return out
