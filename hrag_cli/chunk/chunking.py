"""Token-window chunking with overlap (tiktoken), section by section.

Each window holds at most `tokens` tokens; when the text goes on past the window, the cut moves back to the
last paragraph break in the last quarter of the window, else the last sentence end, else the last line break,
so a chunk ends mid-sentence only when one sentence is longer than a window. The next window starts at the
first sentence start at most `overlap` tokens before the cut, never mid-sentence. The text is encoded once and
cut on byte offsets of token boundaries, so a megabyte chunks in a fraction of a second and the same text always
gives the same chunks. A text that fits one window is one chunk, as it is.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
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
_SENTENCE_RE = re.compile(rb"[.!?][\"')\]\xe2\x80\x9d\xe2\x80\x99]*(?:[ \t]+|\n)")
_LINE_RE = re.compile(rb"\n")


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


@dataclass
class SectionChunk:
    text: str
    n_tokens: int
    trail: tuple[str, ...]
    page: int           # the PDF page the chunk starts on; 0 for other files
    page_end: int = 0   # the PDF page it ends on when that is a later one, else 0


def chunk_sections(sections: Iterable[Any], tokens: int = 1200, overlap: int = 100,
                   encoding: str = DEFAULT_ENCODING) -> Iterator[SectionChunk]:
    """Chunks of a document's sections (readers.Section) in order. Whole sections that fit together are packed
    into one chunk (a page of short sections costs one extraction request, not one per heading); a section
    too big for one chunk is cut on its own, so a cut never falls inside one section and the next. A chunk's
    trail is what its sections share; its pages, where its text starts and ends."""
    if tokens < 1:
        raise ValueError("chunk size must be at least 1 token")
    packed: list[tuple[Any, str, int, int]] = []    # (section, stripped text, its offset in the section, tokens)
    used = 0
    for sec in sections:
        text = sec.text
        stripped = text.strip()
        if not stripped:
            continue
        # a text many times longer than a window in characters cannot fit one: not counted, cut below
        n = count_tokens(stripped, encoding) if len(stripped) <= PACK_CHARS_PER_TOKEN * tokens else tokens + 1
        if n <= tokens and used + n + 1 <= tokens:
            packed.append((sec, stripped, len(text) - len(text.lstrip()), n))
            used += n + 1
            continue
        yield from _packed(packed, encoding)
        packed, used = [], 0
        if n <= tokens:
            packed, used = [(sec, stripped, len(text) - len(text.lstrip()), n)], n + 1
            continue
        for a, b in (segments(text) if len(text) > SEGMENT_CHARS else [(0, len(text))]):
            for start, piece in _chunk_spans(text[a:b], tokens, overlap, encoding):
                first = _page_at(sec.pages, a + start)
                last = _page_at(sec.pages, a + start + len(piece.text) - 1)
                yield SectionChunk(piece.text, piece.n_tokens, tuple(sec.trail), first, last if last > first else 0)
    yield from _packed(packed, encoding)


PACK_CHARS_PER_TOKEN = 20


def _packed(packed: list[tuple[Any, str, int, int]], encoding: str) -> Iterator[SectionChunk]:
    """One chunk of whole sections, separated by a blank line."""
    if not packed:
        return
    if len(packed) == 1:
        text, n = packed[0][1], packed[0][3]
    else:
        text = "\n\n".join(p[1] for p in packed)
        n = count_tokens(text, encoding)
    trail = tuple(packed[0][0].trail)
    for sec, *_ in packed[1:]:
        k = 0
        while k < min(len(trail), len(sec.trail)) and trail[k] == sec.trail[k]:
            k += 1
        trail = trail[:k]
    first_sec, _, lead, _ = packed[0]
    last_sec, last_text, last_lead, _ = packed[-1]
    first = _page_at(first_sec.pages, lead)
    last = _page_at(last_sec.pages, last_lead + len(last_text) - 1)
    yield SectionChunk(text, n, trail, first, last if last > first else 0)


def _page_at(pages: list[tuple[int, int]], offset: int) -> int:
    """The page holding character `offset`, from (start offset, page number) marks in order."""
    if not pages:
        return 0
    i = bisect_right(pages, offset, key=lambda p: p[0]) - 1
    return pages[max(i, 0)][1]


def _chunk_segment(text: str, tokens: int, overlap: int, encoding: str) -> list[TextChunk]:
    return [piece for _, piece in _chunk_spans(text, tokens, overlap, encoding)]


def _chunk_spans(text: str, tokens: int, overlap: int, encoding: str) -> list[tuple[int, TextChunk]]:
    """(character offset where the stripped chunk starts, chunk) of each window. A window ends at the last
    paragraph break in its last quarter, else at its last sentence end, else at its last line break, and only
    cuts a sentence that is longer than a whole window. The next window starts at the first sentence start
    at most `overlap` tokens before the end, so no chunk starts mid-sentence."""
    overlap = max(0, min(overlap, tokens // 2))
    enc = get_encoder(encoding)
    ids = enc.encode(text, disallowed_special=())
    n = len(ids)
    if n == 0:
        return []
    if n <= tokens:
        stripped = text.strip()
        return [(len(text) - len(text.lstrip()), TextChunk(stripped, n))] if stripped else []
    data = text.encode("utf-8")
    # offsets[i] = byte offset where token i starts; offsets[n] = len(data)
    offsets = [0, *accumulate(len(b) for b in enc.decode_tokens_bytes(ids))]

    def token_at(byte: int) -> int:
        """The token boundary nearest a break at `byte`: a token straddling it (" The", ".\n\n") goes to the
        side that keeps the break's text whole: back when only white space is before the break, else on."""
        t = bisect_right(offsets, byte) - 1
        if offsets[t] < byte and data[offsets[t]:byte].strip() and t < n:
            t += 1
        return t

    # sentence starts as token indices, where the overlap may begin
    starts = sorted({token_at(m.end()) for m in _SENTENCE_RE.finditer(data)}
                    | {token_at(m.end()) for m in _PARAGRAPH_RE.finditer(data)})
    out: list[tuple[int, TextChunk]] = []
    start = 0
    at_byte, at_char = 0, 0     # a byte offset and its character offset, moved forward chunk by chunk
    search = max(1, int(tokens * BOUNDARY_SEARCH_FRACTION))
    while start < n:
        end = min(start + tokens, n)
        whole = end == n        # the window ends at a sentence end or the text's end: overlap by sentences
        if end < n:
            lo, hi = offsets[start + 1], offsets[end]
            for pattern, lo_b in ((_PARAGRAPH_RE, offsets[max(start + 1, end - search)]), (_SENTENCE_RE, lo),
                                  (_LINE_RE, lo)):
                cut = _last_match_end(pattern, data, lo_b, hi)
                t = token_at(cut) if cut > 0 else -1
                if start < t <= end:
                    end, whole = t, pattern is not _LINE_RE
                    break
        b0 = _char_start(data, offsets[start])
        b1 = _char_start(data, offsets[end]) if end < n else len(data)
        raw = data[b0:b1].decode("utf-8", errors="replace")
        piece = raw.strip()
        if piece:
            at_char += len(data[at_byte:b0].decode("utf-8", errors="replace"))
            at_byte = b0
            out.append((at_char + len(raw) - len(raw.lstrip()), TextChunk(piece, end - start)))
        if end >= n:
            break
        if whole:
            i = bisect_left(starts, end - overlap)
            start = starts[i] if overlap and i < len(starts) and start < starts[i] < end else end
        else:                   # cut inside a sentence longer than a window: overlap by tokens
            start = max(end - overlap, start + 1)
    return out
