"""The retrieval modes: ppr (HippoRAG 2), LightRAG's local/global/hybrid/naive/mix, and bm25.

Every mode returns a `Retrieval` with chunks in rank order (already cut by the token budgets and top_k) and
the entities/relations/facts that led to them. Lexical fusion (BM25 joining the dense chunk scores) applies to
naive, mix and ppr when `query.lexical_fusion` is on and the project has a BM25 index.

ppr beyond HippoRAG 2: entities whose name appears in the query as a proper name also seed the walk
(`entity_name_seeds`, weight `entity_seed_weight` / chunks naming the entity): a multi-hop question names the
entities it is about, which a fact search may miss. BM25 fusion helps naive more than ppr, and only at a small
weight (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from hrag_cli.core.config import QuerySettings, Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.storage.vectors.search import top_order
from hrag_cli.query.context import apply_budgets
from hrag_cli.query.index import QueryIndex
from hrag_cli.query.recognition import check_fact_filter, filter_enabled, recognize
from hrag_cli.graph.chunk_prior import is_rules_graph, load_chunk_prior, walk_scale
from hrag_cli.query.ppr import SeedWeights, build_reset, minmax, passage_walk, seed_walk
from hrag_cli.query.types import RankedChunk, Retrieval

MODES = ("ppr", "local", "global", "hybrid", "naive", "mix", "bm25")
CHUNK_PICKS = ("vector", "weight")


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


def round_robin(*lists: Sequence[Any], key=lambda x: x) -> list[Any]:
    """Interleave lists (first of each, then second of each, ...) keeping the first copy of each key: how
    LightRAG merges rankings whose scores are not comparable."""
    out, seen = [], set()
    for i in range(max((len(lst) for lst in lists), default=0)):
        for lst in lists:
            if i < len(lst):
                k = key(lst[i])
                if k not in seen:
                    seen.add(k)
                    out.append(lst[i])
    return out


def by_score(*lists: Sequence[RankedChunk], key=lambda x: x) -> list[RankedChunk]:
    """Merge ranked lists whose scores share one scale, best first, keeping the first copy of each key."""
    out, seen = [], set()
    for item in sorted((x for lst in lists for x in lst), key=lambda x: -x.score):
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


# ------------------------------------------------------------------------------------------ chunk scores


def ranks_of(scores: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The rank `all_ranks` gives each of a few `items`: the scores above it plus the equal scores at lower
    indices, plus one (one sort of the scores, and a count per tied item)."""
    ordered = np.sort(scores)
    v = scores[items]
    right = np.searchsorted(ordered, v, side="right")
    same = right - np.searchsorted(ordered, v, side="left")
    ties = [np.count_nonzero(scores[:i] == x) if c > 1 else 0 for i, x, c in zip(items.tolist(), v.tolist(), same.tolist())]
    return (len(scores) - right + np.asarray(ties, dtype=np.int64) + 1).astype(np.float64)


def all_ranks(scores: np.ndarray) -> np.ndarray:
    """Every score's rank (1 = best; ties keep index order), as float64."""
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return ranks


def rrf_scores(scores: np.ndarray, rrf_k: float) -> np.ndarray:
    """1 / (rrf_k + rank), rank 1 = best score; ties keep index order."""
    return 1.0 / (rrf_k + all_ranks(scores))


def fuse_lexical(dense: np.ndarray, lexical: np.ndarray | None, s: QuerySettings) -> np.ndarray:
    """One score per chunk in [0, 1] from the dense and (optionally) BM25 scores.

    minmax: (1 - w) * minmax(dense) + w * minmax(bm25).  rrf: (1 - w) / (rrf_k + dense rank) + w / (rrf_k +
    BM25 rank), the BM25 term only where BM25 matched at all, rescaled to [0, 1]. The defaults were chosen on a
    multi-hop dev set (bench/musique.py)."""
    d = minmax(dense)
    if lexical is None or lexical.size == 0 or not s.lexical_fusion or s.lexical_weight <= 0:
        return d
    w = min(max(s.lexical_weight, 0.0), 1.0)
    if s.lexical_method == "rrf":
        return minmax((1.0 - w) * rrf_scores(dense, s.rrf_k) + w * np.where(lexical > 0, rrf_scores(lexical, s.rrf_k), 0.0))
    if s.lexical_method != "minmax":
        raise UsageError(f"query.lexical_method must be minmax or rrf, not {s.lexical_method!r}")
    d *= 1.0 - w                     # in place, the same values as (1 - w) * d + w * minmax(bm25)
    lex = minmax(lexical)
    lex *= w
    d += lex
    return d


def _chunk(ix: QueryIndex, chunk_id: str, score: float) -> RankedChunk | None:
    c = ix.chunks.get(chunk_id)
    if c is None:   # an index row whose chunk has since gone: never show stale text
        return None
    return RankedChunk(chunk_id, c.doc_id, ix.doc_path(c.doc_id), float(score), c.text, c.section, c.page,
                       c.page_end)


def _ranked(ix: QueryIndex, ids: Iterable[str], scores: Iterable[float], limit: int) -> list[RankedChunk]:
    out: list[RankedChunk] = []
    for cid, sc in zip(ids, scores):
        rc = _chunk(ix, cid, sc)
        if rc is not None:
            out.append(rc)
            if len(out) >= limit:
                break
    return out


def _top_chunks(ix: QueryIndex, scores: np.ndarray, limit: int) -> list[RankedChunk]:
    order = top_order(scores, limit * 2 + 10)
    ids = ix.chunk_ids
    return _ranked(ix, (ids[i] for i in order), (scores[i] for i in order), limit)


def capped_order(doc_ids: Sequence[str], cap: int) -> list[int]:
    """Positions of a ranked list with at most `cap` items of one document ahead of every other document's
    items: a document's extra items keep their order behind the rest (cap 0: the list as it is)."""
    if cap <= 0:
        return list(range(len(doc_ids)))
    seen: dict[str, int] = {}
    first: list[int] = []
    later: list[int] = []
    for i, d in enumerate(doc_ids):
        seen[d] = seen.get(d, 0) + 1
        (first if seen[d] <= cap else later).append(i)
    return first + later


def _top_chunks_capped(ix: QueryIndex, scores: np.ndarray, limit: int, cap: int) -> list[RankedChunk]:
    """`_top_chunks` with `capped_order` over a deeper pool, so a flooding document's chunks give way to the
    next documents' (their scores stay their own: the list is no longer sorted by score past the cap)."""
    if cap <= 0:
        return _top_chunks(ix, scores, limit)
    pool = _top_chunks(ix, scores, min(len(scores), limit * 4 + 10))
    return [pool[i] for i in capped_order([c.doc_id for c in pool], cap)][:limit]


def _passage_scores(ix: QueryIndex, query: str, qvec: np.ndarray, s: QuerySettings, r: Retrieval) -> np.ndarray:
    return _passage_and_lexical(ix, query, qvec, s, r)[0]


def _passage_and_lexical(ix: QueryIndex, query: str, qvec: np.ndarray, s: QuerySettings,
                         r: Retrieval) -> tuple[np.ndarray, np.ndarray | None]:
    """The fused passage score of every chunk, and the BM25 scores it used (None: fusion off or no index)."""
    dense = ix.dense_chunk_scores(qvec)
    lexical = None
    if s.lexical_fusion:
        t0 = time.perf_counter()
        lexical = ix.bm25_chunk_scores(query)
        r.timings["bm25_ms"] = _ms(t0)
        if lexical is None:
            r.notes.append("no BM25 index in this project: lexical fusion skipped")
    return fuse_lexical(dense, lexical, s), lexical


# ------------------------------------------------------------------------------------------------- naive


def retrieve_naive(ix: QueryIndex, query: str, s: QuerySettings, r: Retrieval, limit: int) -> None:
    t0 = time.perf_counter()
    qvec = ix.embed_query(query)
    r.timings["embed_ms"] = _ms(t0)
    scores = _passage_scores(ix, query, qvec, s, r)
    r.chunks = _top_chunks(ix, scores, limit)


def retrieve_bm25(ix: QueryIndex, query: str, s: QuerySettings, r: Retrieval, limit: int) -> None:
    if ix.bm25 is None:
        raise UsageError("this project has no BM25 index: run 'hrag synonyms' (or 'hrag index') to build it")
    hits = ix.bm25.top_k(query, limit * 2 + 10)
    r.chunks = _ranked(ix, (str(h[0]) for h in hits), (float(h[1]) for h in hits), limit)


# --------------------------------------------------------------------------------------------------- ppr

_TOKEN = re.compile(r"\S+")
COMMON_NAME_MIN_CHUNKS = 10
_INITIALS = re.compile(r"^(?:\w\.)+$")
_EDGE_PUNCT = "\"'`“”‘’«»()[]{}<>,.;:!?"


def _query_words(query: str) -> list[tuple[str, str]]:
    """Each word of the query as typed and as a name's word: edge punctuation stripped ("M." in "Frances M.
    Vega" keeps its full stop)."""
    words = []
    for raw in _TOKEN.findall(query):
        w = raw if _INITIALS.match(raw) else raw.strip(_EDGE_PUNCT)
        if w:
            words.append((raw, w))
    return words


def _name_keys(run: list[tuple[str, str]]) -> list[str]:
    """The names a run of query words may spell, most literal first: as typed inside the run ("The Hobbit: The
    Desolation of Smaug", "Cairo, Illinois", "It's a Wonderful Afterlife"), then word by word without
    punctuation, each also without a final possessive ("Port Ellery's" -> "Port Ellery")."""
    from hrag_cli.core.normalize import normalize_name

    typed = " ".join(raw for raw, _ in run).strip(_EDGE_PUNCT) if len(run) > 1 else run[0][1]
    keys = []
    for text in (typed, " ".join(w for _, w in run)):
        for form in (text, _POSSESSIVE.sub("", text)):
            key = normalize_name(form)
            if key and key not in keys:
                keys.append(key)
    return keys


_POSSESSIVE = re.compile(r"['’][sS]$")


def _looks_like_a_name(words: list[str], start: int) -> bool:
    """A run of query words that reads as a proper name: some word (not the question's first) starts with a
    capital or a digit (the question's first word only when more than its first letter is: "PCRE2", not "Users").
    OpenIE graphs hold entities such as "state", "author" or "currency", and seeding those from every question
    that uses the word only adds noise."""
    return any((w[:1].isupper() or w[:1].isdigit()) and (start + i > 0 or (len(words) == 1 and not w[1:].islower()))
               for i, w in enumerate(words))


def name_seeds(ix: QueryIndex, query: str, max_words: int = 8, min_chars: int = 3) -> list[str]:
    """Entities whose normalised name occurs as a run of words in the query that looks like a name, longest
    first; a shorter name inside a longer matched one is skipped ("Port Ellery" does not also seed "Ellery")."""
    from hrag_cli.core.textnorm import STOP_WORDS

    words = _query_words(query)
    taken = [False] * len(words)
    found: list[str] = []
    for n in range(min(max_words, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            if any(taken[i:i + n]) or not _looks_like_a_name([w for _, w in words[i:i + n]], i):
                continue
            key = next((k for k in _name_keys(words[i:i + n]) if k in ix.entities), "")
            if len(key) < min_chars or key in STOP_WORDS or key in found:
                continue
            found.append(key)
            for j in range(i, i + n):
                taken[j] = True
    return found


def _fact_entity(ix: QueryIndex, name: str, relation_id: str, end: str) -> str | None:
    """The entity a fact's subject/object names; the relation's endpoint only when the name does not resolve
    (so relations.jsonl is read only in that rare case)."""
    from hrag_cli.core.normalize import normalize_name

    eid = normalize_name(name)
    if eid in ix.entities:
        return eid
    rel = ix.relations.get(relation_id)
    eid = getattr(rel, end, "") if rel is not None else ""
    return eid if eid in ix.entities else None


def _fact_ends(ix: QueryIndex, fact: Any) -> tuple[str | None, str | None]:
    """The entities a fact's subject and object name (None where neither the name nor the relation resolves)."""
    return (_fact_entity(ix, fact.subject, fact.relation_id, "src"),
            _fact_entity(ix, fact.object, fact.relation_id, "tgt"))


def _seed_facts(ix: QueryIndex, qvec: np.ndarray, s: QuerySettings, anchors: set[str]) -> list[tuple[str, float, Any]]:
    """The facts that seed the walk, best first, as (id, score, fact): the best `fact_top_k`; with `anchors`
    (on a rules graph, the entities the question names) and `rules_anchor_fact_top_k` > 0, those of the best
    `rules_anchor_fact_top_k` that touch one of them. A rules fact is two names that share a sentence, found
    by the words it shares with the question: one that touches none of the question's names seeds an entity
    the question is not about, while a named entity's own facts lead to its neighbours, the second hop
    (bench/retrieval.py compares the settings)."""
    anchored = bool(anchors) and s.fact_top_k > 0 and s.rules_anchor_fact_top_k > 0
    k = s.rules_anchor_fact_top_k if anchored else s.fact_top_k
    facts = [(fid, score, fact) for fid, score in (ix.search("facts", qvec, k) if k > 0 else [])
             if (fact := ix.facts.get(fid)) is not None]
    if anchored:
        facts = [f for f in facts if anchors.intersection(_fact_ends(ix, f[2]))]
    return facts


def fuse_ranks(walk: np.ndarray, passage: np.ndarray, lexical: np.ndarray | None, w: float, s: QuerySettings,
               seeds_only: np.ndarray | None = None) -> np.ndarray:
    """The final ppr scores: the first `fusion_head` ranks go to the best of a weighted reciprocal-rank
    fusion of the walk (share `w`) with the passage scores and BM25 (`fusion_lexical` of the rest), the
    ranks below them follow the walk. Ranks, not scores, because PageRank mass, cosine and BM25 live on
    scales that change from query to query. Why a head: on multi-hop questions the first gold passage is
    usually the one naming the question's entity, which lexical/dense scoring place well, and the second
    hop is what the walk finds (bench/retrieval.py). With `seeds_only` (the walk from the seeds alone,
    `ppr.seed_walk`), the head is that walk's fusion, then the whole walk's picks it does not hold."""
    if w >= 1.0 or s.fusion_head <= 0:
        return walk
    k = max(s.fusion_k, 1e-6)
    lw = min(max(s.fusion_lexical, 0.0), 1.0) if lexical is not None else 0.0
    lex = lexical if lw > 0 else None
    head = _fused_head(walk, passage, lex, max(w, 0.0), lw, k, s.fusion_head)
    if seeds_only is not None:
        first = _fused_head(seeds_only, passage, lex, max(w, 0.0), lw, k, s.fusion_head)
        head = np.concatenate([first, head[~np.isin(head, first)]])
    out = minmax(walk)                          # below the head: the walk's order, scores in [0, 0.5]
    out *= 0.5
    out[head] = 1.0 - np.arange(len(head)) / (2.0 * max(len(head), 1))   # the head: above every walk score
    return out


def _fused(ranks: list[np.ndarray], lexical_hit: np.ndarray | None, w: float, lw: float, k: float) -> np.ndarray:
    """w x rrf(walk) + (1 - w) x ((1 - lw) x rrf(passage) + lw x rrf(BM25) where BM25 matched), from ranks."""
    rest = (1.0 - lw) * (1.0 / (k + ranks[1]))
    if lexical_hit is not None:
        rest = rest + lw * np.where(lexical_hit, 1.0 / (k + ranks[2]), 0.0)
    return w * (1.0 / (k + ranks[0])) + (1.0 - w) * rest


def _fused_head(walk: np.ndarray, passage: np.ndarray, lexical: np.ndarray | None, w: float, lw: float,
                k: float, head: int, reach: int = 32, window: int = 1024) -> np.ndarray:
    """The first `head` chunks of the rank fusion (`_fused`; ties to the lower index) without ranking every chunk
    (three stable sorts of every chunk's scores would be much of a query). A chunk outside the best `reach` of every
    list scores at most the fusion of rank reach + 1 everywhere; a candidate ranked below the best `window` of a
    list at most as if it were next after them. When the head's last score beats both, the candidates ranked within
    the windows hold the head, with the very scores ranking every chunk gives; otherwise the candidates' ranks are
    counted exactly."""
    lists = [walk, passage] + ([lexical] if lexical is not None else [])
    reach = max(reach, head)
    orders = [top_order(x, min(window, len(x))) for x in lists]
    cand = np.unique(np.concatenate([o[:reach] for o in orders]))
    hit = lexical[cand] > 0 if lexical is not None else None
    ranks = []
    for x, o in zip(lists, orders):
        place = np.zeros(len(x), dtype=np.int64)
        place[o] = np.arange(1, len(o) + 1)
        ranks.append(place[cand].astype(np.float64))
    known = np.all([r > 0 for r in ranks], axis=0)
    fused = _fused([np.where(r > 0, r, len(o) + 1.0) for r, o in zip(ranks, orders)], hit, w, lw, k)  # exact where known
    outside = _fused([np.full(1, reach + 1.0)] * 3, np.ones(1, bool) if lexical is not None else None, w, lw, k)[0]
    best = np.sort(fused[known])[::-1]
    if len(best) >= head and best[head - 1] > outside * (1 + 1e-9) and not np.any(fused[~known] >= best[head - 1]):
        cand, fused = cand[known], fused[known]
    else:
        fused = _fused([r if r.all() else ranks_of(x, cand) for r, x in zip(ranks, lists)], hit, w, lw, k)
        if not (len(fused) >= head and np.sort(fused)[::-1][head - 1] > outside * (1 + 1e-9)):
            cand = np.arange(len(walk))
            fused = _fused([all_ranks(x) for x in lists], lexical > 0 if lexical is not None else None, w, lw, k)
    return cand[np.lexsort((cand, -fused))[:head]]


def lexical_fusion(passage: np.ndarray, lexical: np.ndarray | None, s: QuerySettings) -> np.ndarray:
    """The ranking ppr's first ranks give when the walk has no share, for every rank: a reciprocal-rank fusion
    of the passage scores with BM25 (share `fusion_lexical` where BM25 matched)."""
    lw = min(max(s.fusion_lexical, 0.0), 1.0) if lexical is not None else 0.0
    if lw <= 0:
        return passage
    k = max(s.fusion_k, 1e-6)
    return _fused([all_ranks(passage), all_ranks(passage), all_ranks(lexical)], lexical > 0, 0.0, lw, k)


def walk_share(s: QuerySettings, rules_graph: bool, seeds: SeedWeights, fact_scores: list[float]) -> float:
    """How much the walk's ranking counts in the head fusion: `walk_weight` on a graph from an LLM or
    imported OpenIE, `rules_walk_weight` on one from the rules extractor, whose co-occurrence edges make
    the walk drift; lower when the seeds are weak, because then the walk starts from entities the question
    is not about. Weak: on a rules graph, no entity named in the query (its facts are co-occurrences, so a
    fact that matches the question's words is no sign of its entity: at most `rules_unnamed_walk_weight`);
    on any graph, no name and the best fact's cosine under `seed_confidence` (scaled by best / confidence)."""
    w = s.rules_walk_weight if rules_graph else s.walk_weight
    w = min(max(w, 0.0), 1.0)
    named = any("name in query" in src for src in seeds.sources.values())
    if named:
        return w
    if rules_graph:
        w = min(w, max(s.rules_unnamed_walk_weight, 0.0))
    if s.seed_confidence <= 0:
        return w
    best = max(fact_scores, default=0.0)
    return w * min(max(best / s.seed_confidence, 0.0), 1.0)


def fact_seed_weights(scores: list[float], sharpness: float) -> list[float]:
    """Each fact's seed weight: its score x (score / the best score) ** `sharpness` (negative scores: 0). The
    best match keeps its weight and weaker ones fall off faster than their cosine says: the top facts' cosines
    sit close together, so raw scores seed a loosely matching fact almost as strongly as the fact the question
    is about. The default was chosen on the dev sets with both embedders (bench/retrieval.py)."""
    best = max(scores, default=0.0)
    if sharpness <= 0 or best <= 0:
        return [max(sc, 0.0) for sc in scores]
    return [max(sc, 0.0) * (max(sc, 0.0) / best) ** sharpness for sc in scores]


def retrieve_ppr(ix: QueryIndex, query: str, s: QuerySettings, r: Retrieval, limit: int,
                 fact_filter: Any = None) -> None:
    """HippoRAG 2's walk, fused with the passage scores for the first ranks; `fact_filter`: the LLM that
    keeps the facts bearing on the query before they seed the walk (None: no filter)."""
    t0 = time.perf_counter()
    qvec = ix.embed_query(query)
    r.timings["embed_ms"] = _ms(t0)
    passage, lexical = _passage_and_lexical(ix, query, qvec, s, r)

    t0 = time.perf_counter()
    seeds = SeedWeights()
    graph = ix.walk
    rules_graph = is_rules_graph(ix.extractor)
    # a name most of the corpus mentions ("Flask" in Flask's manual) seeds the walk but says nothing about
    # which passages the question is about: it does not make the seeds strong (`walk_share`)
    # (a name in at most COMMON_NAME_MIN_CHUNKS chunks still points at them, however small the corpus)
    common = (max(s.common_name_share * len(ix.chunk_ids), COMMON_NAME_MIN_CHUNKS) if s.common_name_share > 0
              else float("inf"))
    names = name_seeds(ix, query) if s.entity_name_seeds and s.entity_seed_weight > 0 else []
    named = {eid for eid in names if ix.entity_chunk_counts.get(eid, 1) <= common}
    facts = _seed_facts(ix, qvec, s, named if rules_graph else set())
    if facts and fact_filter is not None:
        t1 = time.perf_counter()
        kept = recognize(fact_filter, query, [(f.subject, f.predicate, f.object) for _, _, f in facts], r.notes)
        facts = [facts[i] for i in kept]
        r.timings["fact_filter_ms"] = _ms(t1)
    weights = fact_seed_weights([score for _, score, _ in facts], s.fact_seed_sharpness)
    for (fid, score, fact), weight in zip(facts, weights):
        r.facts.append({"id": fid, "subject": fact.subject, "predicate": fact.predicate, "object": fact.object,
                        "score": round(score, 4)})
        for eid in _fact_ends(ix, fact):
            v = graph.vertex(eid) if eid else None
            if v is None:
                continue
            seeds.entity[v] = seeds.entity.get(v, 0.0) + weight / ix.entity_chunk_counts.get(eid, 1)
            seeds.sources.setdefault(v, []).append(fid)
    for eid in names:
        v = graph.vertex(eid)
        if v is None:
            continue
        seeds.entity[v] = seeds.entity.get(v, 0.0) + s.entity_seed_weight / ix.entity_chunk_counts.get(eid, 1)
        seeds.sources.setdefault(v, []).append("name in query" if eid in named else "common name in query")
    seeds.entity = {v: w for v, w in seeds.entity.items() if w > 0}
    r.timings["seed_ms"] = _ms(t0)

    if not seeds.entity or graph.ecount() == 0:
        why = "no facts or entity names matched the query" if not seeds.entity else "the graph has no edges"
        r.notes.append(f"{why}: fell back to dense chunk ranking")
        r.chunks = _top_chunks_capped(ix, passage, limit, s.doc_cap)
        return

    w = walk_share(s, rules_graph, seeds, [sc for _, sc, _ in facts])
    full = min(s.rules_walk_weight if rules_graph else s.walk_weight, 1.0)
    if w <= 0 < full:
        # the question names nothing the graph holds in a few chunks: a walk from loosely matching facts (or
        # from a name half the corpus mentions) ranks noise, so every rank is what the first ranks are without it
        r.notes.append("weak seeds: the question names nothing the graph holds in a few chunks only, so ranked by "
                       "passage similarity fused with BM25, not by the walk")
        r.chunks = _top_chunks_capped(ix, lexical_fusion(passage, lexical, s), limit, s.doc_cap)
        _list_seeds(ix, seeds, r)
        return
    t0 = time.perf_counter()
    cv = ix.chunk_vertices
    ok = cv >= 0
    reset, floor = build_reset(seeds, cv[ok], passage[ok] * s.passage_node_weight,
                               s.passage_node_top_k)
    scale = walk_scale(rules_graph, s.rules_synonym_weight)
    if floor > 0:
        load_chunk_prior(ix.project, graph, s.damping, scale)
    walk = np.full(len(cv), -1.0)
    walk[ok] = passage_walk(graph, reset, floor, s.damping, scale, vertices=cv[ok])
    # a name the graph holds in very few chunks points at them, and the walk from it at their neighbours: the
    # passage weights in the whole walk's reset only blur that, and the head fuses the passage scores anyway
    specific = s.head_seed_chunks > 0 and any(ix.entity_chunk_counts.get(e, 1) <= s.head_seed_chunks for e in named)
    alone = None
    if specific and w < 1.0 and s.fusion_head > 0:
        alone = np.full(len(cv), -1.0)
        alone[ok] = seed_walk(graph, seeds, s.damping, scale, vertices=cv[ok])
    r.timings["ppr_ms"] = _ms(t0)
    if w < full:
        r.notes.append(f"weak seeds: the walk counts {w:.2f} of its usual {full:.2f} in the first ranks")
    r.chunks = _top_chunks_capped(ix, fuse_ranks(walk, passage, lexical, w, s, alone), limit, s.doc_cap)
    _list_seeds(ix, seeds, r)


def _list_seeds(ix: QueryIndex, seeds: SeedWeights, r: Retrieval) -> None:
    """The seed entities, strongest first, with what seeded each (fact ids, "name in query")."""
    for v in sorted(seeds.entity, key=lambda v: -seeds.entity[v]):
        e = ix.entities.get(ix.walk.key(v))
        if e is not None:
            r.entities.append({"id": e.id, "name": e.name, "type": e.type, "description": e.description,
                               "score": round(seeds.entity[v], 6), "seeded_by": seeds.sources.get(v, [])})


# ------------------------------------------------------------------------------------------ LightRAG


def _entity_json(ix: QueryIndex, eid: str, score: float) -> dict | None:
    e = ix.entities.get(eid)
    if e is None:
        return None
    return {"id": e.id, "name": e.name, "type": e.type, "description": e.description, "score": round(score, 4)}


def _relation_json(ix: QueryIndex, rid: str, score: float) -> dict | None:
    rel = ix.relations.get(rid)
    if rel is None:
        return None
    out = {"id": rel.id, "src": rel.src, "tgt": rel.tgt, "predicates": list(rel.predicates),
           "keywords": list(rel.keywords), "description": rel.description, "weight": rel.weight,
           "score": round(score, 4)}
    if rel.rel_type:     # only with a schema: untyped projects' --json keeps its shape
        out["rel_type"] = rel.rel_type
    return out


def _relations_by_entity(ix: QueryIndex) -> dict[str, list[str]]:
    adj = ix.__dict__.get("_rel_adj")
    if adj is None:
        adj = {}
        for rid, rel in ix.relations.raw.items():   # the parsed dicts: no record built per relation
            adj.setdefault(rel["src"], []).append(rid)
            adj.setdefault(rel["tgt"], []).append(rid)
        ix.__dict__["_rel_adj"] = adj
    return adj


ChunkPicker = Callable[[Iterable[tuple[Sequence[str], float]], int], list[RankedChunk]]


def pick_by_weight(ix: QueryIndex) -> ChunkPicker:
    """LightRAG's `weight` pick: chunks by how many of the selected entities/relations carry them (ties: the
    summed similarity of those items, then first seen)."""
    def pick(sources: Iterable[tuple[Sequence[str], float]], limit: int) -> list[RankedChunk]:
        count: dict[str, int] = {}
        total: dict[str, float] = {}
        for source_ids, sc in sources:
            for cid in dict.fromkeys(source_ids):
                count[cid] = count.get(cid, 0) + 1
                total[cid] = total.get(cid, 0.0) + sc
        order = sorted(count, key=lambda c: (-count[c], -total[c]))
        return _ranked(ix, order, (float(count[c]) for c in order), limit)
    return pick


def pick_by_vector(ix: QueryIndex, passage: np.ndarray, boost: float = 0.0, by_match: bool = False) -> ChunkPicker:
    """LightRAG's `vector` pick: the chunks the selected entities/relations carry, and the `limit` chunks most
    similar to the query (so the graph reorders what naive would find instead of replacing it), ranked by
    their own similarity to the query (`passage`: the dense score, BM25-fused as in naive when lexical fusion
    is on) plus `boost` x the chunk's share of the selected items' votes. An item votes once (LightRAG's
    count: local's or global's items), or with `by_match` with its own score against the query (negative as
    0): how hybrid weighs the items it pools from three selections (entities like the query, their relations
    by degree, relations like the query), where counting alone lets a chunk carried by many loosely matching
    items pass one carried by the few that match well."""
    def pick(sources: Iterable[tuple[Sequence[str], float]], limit: int) -> list[RankedChunk]:
        row, ids = ix.chunk_row, ix.chunk_ids
        vote: dict[int, float] = {}
        total = 0.0
        for source_ids, sc in sources:
            w = max(float(sc), 0.0) if by_match else 1.0
            total += w
            for cid in dict.fromkeys(source_ids):
                if cid in row:
                    vote[row[cid]] = vote.get(row[cid], 0.0) + w
        similar = (int(i) for i in top_order(passage, limit))
        share = boost / total if total > 0 else 0.0
        score = {i: float(passage[i]) + share * vote.get(i, 0.0) for i in [*vote, *similar]}
        order = sorted(score, key=lambda i: -score[i])
        return _ranked(ix, (ids[i] for i in order), (score[i] for i in order), limit)
    return pick


def chunk_pick_boost(settings: Settings) -> float:
    """The vector pick's graph boost for this project's embedder: `builtin_chunk_pick_boost` for the builtin
    one, `chunk_pick_boost` for a model. The graph's evidence is worth more beside a weak similarity: with the
    builtin embedder a large boost lifts hybrid over naive, while beside a sentence model's better ranking it
    pushes hybrid under naive (bench/retrieval.py)."""
    builtin = (settings.embed.model or "builtin").strip() == "builtin"
    return settings.query.builtin_chunk_pick_boost if builtin else settings.query.chunk_pick_boost


def retrieve_local(ix: QueryIndex, qvec: np.ndarray, s: QuerySettings, r: Retrieval, limit: int,
                   pick: ChunkPicker, names_in: str = "") -> list[tuple[Sequence[str], float]]:
    """Entities like the low-level keywords (first, any entity `names_in` names outright: without an LLM the
    whole question is the keyword, and its vector finds the names in it poorly); their relations ranked by
    (endpoint degree sum, weight); the chunks that mention those entities."""
    found = dict.fromkeys(name_seeds(ix, names_in) if names_in else [], 1.0)
    for eid, sc in ix.search("entities", qvec, s.entity_top_k):
        if eid in ix.entities:
            found.setdefault(eid, sc)
    ents = list(found.items())
    r.entities = [j for eid, sc in ents if (j := _entity_json(ix, eid, sc))]
    adj = _relations_by_entity(ix)
    deg = {eid: len(rids) for eid, rids in adj.items()}
    # each relation made a record once (ix.relations builds one per lookup)
    rel = {rid: ix.relations[rid] for eid, _ in ents for rid in adj.get(eid, [])}
    rels = sorted(rel, key=lambda rid: (-(deg.get(rel[rid].src, 0) + deg.get(rel[rid].tgt, 0)), -rel[rid].weight))
    r.relations = [j for rid in rels if (j := _relation_json(ix, rid, rel[rid].weight))]
    # the chunks naming the entities, then those the entities' strongest relations came from (LightRAG reads
    # both: a fact about an entity is often stated where only its neighbour is named)
    # a relation scores as the better of its selected endpoints: it was reached through them
    sources = [*((ix.entities[eid].source_ids, sc) for eid, sc in ents),
               *((rel[rid].source_ids, max(found.get(rel[rid].src, 0.0), found.get(rel[rid].tgt, 0.0)))
                 for rid in rels[: s.relation_top_k])]
    r.chunks = pick(sources, limit)
    return sources


FACTS_PER_RELATION = 3      # facts searched per relation wanted when relations are ranked through their facts


def relation_hits(ix: QueryIndex, qvec: np.ndarray, k: int) -> list[tuple[str, float]]:
    """The k relations most like the query: from their own vectors when the project embedded them
    (`vectors.relations`), else through the fact vectors, a relation scoring as its best fact (a rules or OpenIE
    relation restates its facts, so the synonyms stage embeds only those)."""
    if ix.vector_index("relations") is not None:
        return [(rid, sc) for rid, sc in ix.search("relations", qvec, k) if rid in ix.relations]
    best: dict[str, float] = {}
    for fid, sc in ix.search("facts", qvec, k * FACTS_PER_RELATION):   # best first: a relation's first is its max
        fact = ix.facts.get(fid)
        rid = fact.relation_id if fact is not None else ""
        if rid in ix.relations and rid not in best:
            best[rid] = sc
            if len(best) == k:
                break
    return list(best.items())


def retrieve_global(ix: QueryIndex, qvec: np.ndarray, s: QuerySettings, r: Retrieval, limit: int,
                    pick: ChunkPicker) -> list[tuple[Sequence[str], float]]:
    """Relations like the high-level keywords; their endpoint entities; the chunks the relations came from."""
    hits = relation_hits(ix, qvec, s.relation_top_k)
    r.relations = [j for rid, sc in hits if (j := _relation_json(ix, rid, sc))]
    seen: dict[str, float] = {}
    for rid, sc in hits:
        for eid in (ix.relations[rid].src, ix.relations[rid].tgt):
            seen.setdefault(eid, sc)
    r.entities = [j for eid, sc in seen.items() if (j := _entity_json(ix, eid, sc))]
    sources = [(ix.relations[rid].source_ids, sc) for rid, sc in hits]
    r.chunks = pick(sources, limit)
    return sources


def _keyword_vectors(ix: QueryIndex, query: str, keywords: dict[str, list[str]], r: Retrieval) -> tuple[np.ndarray, np.ndarray]:
    t0 = time.perf_counter()
    low = ", ".join(keywords.get("low") or []) or query
    high = ", ".join(keywords.get("high") or []) or query
    lv = ix.embed_query(low)
    hv = lv if high == low else ix.embed_query(high)
    r.timings["embed_ms"] = _ms(t0)
    return lv, hv


# ---------------------------------------------------------------------------------------------- dispatch


def retrieve(ix: QueryIndex, query: str, settings: Settings, *, mode: str | None = None,
             keywords: dict[str, list[str]] | None = None, llm: Any = None, reranker: Any = None) -> Retrieval:
    """Run one query. `keywords` may be given (tests, batch); otherwise LightRAG modes ask the LLM when one
    is configured (one cached call) and fall back to the query text. `reranker` (query/rerank.py) reorders
    the mode's best `rerank_top_k` chunks before the budgets cut them."""
    s = settings.query
    mode = (mode or s.mode).lower()
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    if not query.strip():
        raise UsageError("empty query")
    if s.top_k < 1:
        raise UsageError("--top-k must be at least 1")
    if s.chunk_pick not in CHUNK_PICKS:
        raise UsageError(f"setting query.chunk_pick: {s.chunk_pick!r} must be one of {', '.join(CHUNK_PICKS)}")
    check_fact_filter(s.fact_filter)
    if mode == "ppr":
        # damping 1 never converges (igraph spins forever), > 1 is an igraph internal error, and a negative
        # passage weight empties the reset vector: say which setting is wrong instead
        if not 0.0 <= s.damping < 1.0:
            raise UsageError(f"setting query.damping: {s.damping!r} must be at least 0 and below 1")
        if s.passage_node_weight < 0:
            raise UsageError(f"setting query.passage_node_weight: {s.passage_node_weight!r} must not be negative")
        fact_filter = llm if filter_enabled(s.fact_filter, llm) else None
    t_start = time.perf_counter()
    r = Retrieval(query=query, mode=mode)
    limit = max(s.top_k, 1)
    # gather more than top_k so the budgets cut in rank order, never below what top_k asked for
    pool = max(limit * 4, 20)
    # the budgets keep the first top_k chunks at most: a mode that ranks chunks itself reads those records alone
    # (a chunk record is a gzip member read, a noticeable part of a ppr query each), unless a reranker reorders
    # the pool
    reads = pool if reranker is not None else limit
    if mode == "ppr":
        retrieve_ppr(ix, query, s, r, reads, fact_filter=fact_filter)
    elif mode == "naive":
        retrieve_naive(ix, query, s, r, reads)
    elif mode == "bm25":
        retrieve_bm25(ix, query, s, r, reads)
    else:
        if keywords is None:
            from hrag_cli.query.keywords import extract_keywords

            t0 = time.perf_counter()
            keywords = extract_keywords(ix.project, settings, query, llm=llm, notes=r.notes)
            r.timings["keywords_ms"] = _ms(t0)
        r.keywords = keywords
        lv, hv = _keyword_vectors(ix, query, keywords, r)
        # one dense (+ BM25) pass over every chunk, shared by the vector pick and mix's naive side
        passage = (_passage_scores(ix, query, ix.embed_query(query), s, r)
                   if s.chunk_pick == "vector" or mode == "mix" else None)
        pick = (pick_by_vector(ix, passage, chunk_pick_boost(settings)) if s.chunk_pick == "vector"
                else pick_by_weight(ix))
        graph_limit = max(s.chunk_top_k, 1)
        low_text = ", ".join(keywords.get("low") or []) or query
        if mode == "local":
            retrieve_local(ix, lv, s, r, graph_limit, pick, low_text)
        elif mode == "global":
            retrieve_global(ix, hv, s, r, graph_limit, pick)
        else:
            loc, glo = Retrieval(query, "local"), Retrieval(query, "global")
            sources = retrieve_local(ix, lv, s, loc, graph_limit, pick, low_text)
            sources += retrieve_global(ix, hv, s, glo, graph_limit, pick)
            r.entities = round_robin(loc.entities, glo.entities, key=lambda e: e["id"])
            r.relations = round_robin(loc.relations, glo.relations, key=lambda x: x["id"])
            # vector pick scores every chunk on one scale, so hybrid picks once from both sides' items, each
            # voting with its match to the query; weight counts are not comparable across the two lists, so
            # those interleave as LightRAG does
            if s.chunk_pick == "vector":
                by_match = pick_by_vector(ix, passage, chunk_pick_boost(settings), by_match=True)
                r.chunks = by_match(sources, graph_limit)
            else:
                r.chunks = round_robin(loc.chunks, glo.chunks, key=lambda c: c.chunk_id)
            merge = by_score if s.chunk_pick == "vector" else round_robin
            if mode == "mix":
                r.chunks = merge(r.chunks, _top_chunks(ix, passage, pool), key=lambda c: c.chunk_id)
    if reranker is not None:
        from hrag_cli.query.rerank import rerank

        t0 = time.perf_counter()
        rerank(reranker, r, max(s.rerank_top_k, limit), s.rerank_chunk_tokens)
        r.timings["rerank_ms"] = _ms(t0)
    apply_budgets(r, s, limit)
    r.timings["retrieve_ms"] = _ms(t_start)
    return r
