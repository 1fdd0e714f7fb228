"""`hrag index --dry-run`: which chunks an extraction would send and what it would cost, without calling or
writing anything."""

from __future__ import annotations

from typing import Any

from hrag_cli.core.config import Settings
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import Chunk
from hrag_cli.extract import cache_index
from hrag_cli.extract.stage import extractor_kind, settings_fingerprint


def _cost_of(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """litellm's local price for these tokens; None when the model is not in its cost map."""
    from hrag_cli.core import offline

    offline.setup()
    try:
        import litellm

        p, c = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return float(p + c)
    except Exception:
        return None


# Completion tokens per chunk token, from real answers of small local models with one gleaning round: a
# description per entity and per relation makes an answer longer than its passage. Split between the first
# answer and the gleaning round; each is capped by the request's max_tokens (answer_budget).
COMPLETION_RATIO = 1.5
GLEAN_COMPLETION_RATIO = 0.8
MESSAGE_OVERHEAD_TOKENS = 4       # per chat message (role, separators)


def estimate(project: ProjectDir, settings: Settings, chunk_outcome: Any) -> dict:
    """--dry-run: which chunks would be extracted and what it would cost; calls and writes nothing."""
    chunks: list[Chunk] = list(chunk_outcome.chunks)
    kind = extractor_kind(settings)
    extractor = settings_fingerprint(settings)
    latest = cache_index.latest(project, {extractor})
    todo = [c for c in chunks if (c.chunk_id, extractor) not in latest]
    out: dict[str, Any] = {"extractor": extractor, "chunks": len(chunks), "to_extract": len(todo),
                           "cached": len(chunks) - len(todo), "llm_requests": 0, "prompt_tokens": 0,
                           "completion_tokens": 0, "cost": 0.0}
    if kind == "rules" or not todo:
        return out
    from hrag_cli.chunk.chunking import count_tokens
    from hrag_cli.extract.candidates import candidates_of
    from hrag_cli.extract.llm_extractor import answer_budget, answer_format, frame_of, glean_rounds_for
    from hrag_cli.extract.prompts import build_extraction_messages, build_gleaning_message, hints_line

    frame = frame_of(settings.extract, answer_format(settings.extract, settings.llm))
    hinted = frame.hints != "none"
    base = build_extraction_messages("", frame.types, settings.extract.language, frame.schema, frame.fmt,
                                     [] if hinted else None)
    overhead = sum(count_tokens(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in base)
    glean_msg = count_tokens(build_gleaning_message(frame.fmt)["content"]) + MESSAGE_OVERHEAD_TOKENS
    requests = prompt = completion = 0
    for ch in todo:
        cap = answer_budget(ch, settings.extract, settings.llm.max_tokens)
        p = overhead + ch.n_tokens
        if hinted:      # the chunk's own candidate names, beyond the empty list counted in the overhead
            names = [e.name for e in candidates_of(ch.text, frame.hints) or []]
            p += count_tokens(hints_line(names)) - count_tokens(hints_line([]))
        c = min(cap, max(64, int(COMPLETION_RATIO * ch.n_tokens)))
        requests += 1
        prompt += p
        completion += c
        for _ in range(glean_rounds_for(ch, settings.extract)):
            p = p + c + MESSAGE_OVERHEAD_TOKENS + glean_msg
            c = min(cap, max(16, int(GLEAN_COMPLETION_RATIO * ch.n_tokens)))
            requests += 1
            prompt += p
            completion += c
    cost = _cost_of(settings.llm.model, prompt, completion)
    out.update(llm_requests=requests, prompt_tokens=prompt, completion_tokens=completion,
               cost=round(cost, 4) if cost is not None else "unknown")
    return out
