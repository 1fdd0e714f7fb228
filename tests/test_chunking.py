"""Token-window chunking: sizes, overlap, preferred cut points, determinism, odd input."""

from __future__ import annotations

import pytest

from hrag_cli.chunk.chunking import chunk_text, count_tokens, get_encoder

SENTENCE = "The survey crew measured the river again after the spring flood had passed."


def paragraphs(n: int, sentences: int = 5) -> str:
    return "\n\n".join(" ".join(f"{SENTENCE[:-1]} number {p}-{s}." for s in range(sentences)) for p in range(n))


def test_short_text_is_one_chunk() -> None:
    [c] = chunk_text("  Just a short note.\n", tokens=100, overlap=10)
    assert c.text == "Just a short note." and c.n_tokens == count_tokens("  Just a short note.\n")
    assert chunk_text("", 100, 10) == [] and chunk_text("   \n\n ", 100, 10) == []


@pytest.mark.parametrize("size,overlap", [(50, 0), (64, 8), (200, 40), (1200, 100)])
def test_windows_respect_size_and_cover_the_text(size: int, overlap: int) -> None:
    text = paragraphs(40)
    chunks = chunk_text(text, size, overlap)
    assert all(c.n_tokens <= size for c in chunks)
    assert all(count_tokens(c.text) <= size + 2 for c in chunks)
    # every sentence of the text is in some chunk
    for p in range(40):
        for s in range(5):
            assert any(f"number {p}-{s}." in c.text for c in chunks)
    total = count_tokens(text)
    if total > size:
        assert len(chunks) >= total // size


def test_overlap_repeats_the_end_of_the_previous_chunk() -> None:
    text = " ".join(f"word{i}" for i in range(3000))      # no sentence ends: pure token windows
    chunks = chunk_text(text, 100, 20)
    assert all(c.n_tokens == 100 for c in chunks[:-1])
    for a, b in zip(chunks, chunks[1:]):
        tail = a.text.split()[-3:]
        assert " ".join(tail) in b.text
    no_overlap = chunk_text(text, 100, 0)
    assert len(no_overlap) < len(chunks)
    assert sum(c.n_tokens for c in no_overlap) == count_tokens(text)


def test_cut_prefers_paragraph_then_sentence_end() -> None:
    text = paragraphs(30, sentences=3)
    for c in chunk_text(text, 120, 0)[:-1]:
        assert c.text.endswith(".")               # never mid-sentence
    # a paragraph break in the last quarter wins over a later sentence end in the same window
    first = " ".join(f"{SENTENCE[:-1]} number {i}." for i in range(5))       # about 85 tokens
    assert 76 <= count_tokens(first) <= 95
    text = first + "\n\n" + "It rained. " * 60
    c0 = chunk_text(text, 100, 0)[0]
    assert c0.text == first
    # one long paragraph: cut at a sentence end inside the last quarter
    one_para = " ".join(f"Sentence {i} is here and it has some words in it." for i in range(200))
    for c in chunk_text(one_para, 100, 0)[:-1]:
        assert c.text.endswith("in it.")
        assert c.n_tokens >= 75


def test_deterministic() -> None:
    text = paragraphs(25)
    a = chunk_text(text, 150, 30)
    b = chunk_text(text, 150, 30)
    assert [(c.text, c.n_tokens) for c in a] == [(c.text, c.n_tokens) for c in b]


def test_multibyte_text_is_never_split_inside_a_character() -> None:
    text = "Zoë Almqvist — 北京 ☃ 😀 Łódź. " * 400
    chunks = chunk_text(text, 64, 8)
    assert len(chunks) > 5
    assert all("\ufffd" not in c.text for c in chunks)


def test_encoder_loads_offline_and_is_cached() -> None:
    assert get_encoder() is get_encoder()
    assert count_tokens("hello world") == 2
    assert count_tokens("<|endoftext|>") > 1      # special tokens in documents are plain text


def test_unknown_encoding_is_a_one_line_usage_error() -> None:
    from hrag_cli.core.errors import UsageError

    with pytest.raises(UsageError, match="unknown chunk encoding 'nope'") as info:
        chunk_text("Some text.", encoding="nope")
    assert "\n" not in str(info.value)
