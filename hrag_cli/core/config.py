"""Settings: defaults < hrag.toml < environment < flags.

Every tunable of every stage lives here, one dataclass per section, so a stage fingerprint can hash exactly
the settings that shape its output and `hrag.toml` documents them all in one place.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass, asdict
from pathlib import Path
from typing import Any

from hrag_cli.core.errors import UsageError


@dataclass
class DocumentSettings:
    include: list[str] = field(default_factory=list)     # glob patterns on paths relative to DOCS
    exclude: list[str] = field(default_factory=list)
    jsonl_text_field: str = "text"
    jsonl_id_field: str = "id"
    jsonl_title_field: str = "title"                     # prepended to the text when present


@dataclass
class ChunkSettings:
    tokens: int = 1200
    overlap: int = 100
    encoding: str = "cl100k_base"


@dataclass
class LLMSettings:
    model: str = ""                 # litellm model name, e.g. openai/gpt-4o-mini; empty = no LLM
    api_base: str = ""
    temperature: float = 0.0
    max_tokens: int = 4096          # the most any request may ask for (extraction caps it per chunk, see below)
    # 0 = auto: 120 s and 8 in flight for a remote API; 600 s and 1 at a time for a server on this machine
    # (loopback api_base, or ollama/ without one), which answers one request at a time and would otherwise keep
    # computing answers for clients that gave up waiting in its queue
    timeout: float = 0.0            # seconds per request
    concurrency: int = 0            # requests in flight
    max_retries: int = 6
    backoff_base: float = 1.0       # seconds; doubled per retry, with jitter
    backoff_max: float = 60.0
    context_tokens: int = 16000     # what one request may carry (map-reduce summaries split beyond it)


@dataclass
class ExtractSettings:
    extractor: str = "auto"         # auto (llm when a model is set, else rules), llm, rules
    entity_types: list[str] = field(default_factory=lambda: [
        "person", "organization", "location", "event", "artifact", "concept", "date", "quantity"])
    language: str = "English"
    max_gleanings: int = 1
    glean_min_tokens: int = 500     # gleaning rounds only for chunks of at least this many tokens
    # max_tokens of an extraction request: answer_tokens_min + answer_tokens_per_token * chunk tokens, at most
    # [llm] max_tokens. Real answers run about 1.5 tokens per chunk token, so this leaves twice that
    # and stops a model that loops from filling its whole context.
    answer_tokens_min: int = 512
    answer_tokens_per_token: float = 3.0
    schema: str = ""                # a schema file (TOML or JSON): its types replace entity_types (extract/schema.py)
    # names of an LLM extraction that cannot be found in their chunk: off, flag (counted) or drop (with the
    # relations that depend on them); the rules extractor and imported OpenIE are never checked
    grounding: str = "drop"
    # how answers are asked for: json (a JSON object the server must follow, for providers that take a JSON
    # schema: OpenAI-compatible servers, Ollama, hosted APIs that litellm knows to), delimited (our line format,
    # for any model), or auto (json where the provider takes a schema); remembered with the project
    format: str = "auto"
    # candidate names given to the model with each chunk, for it to check, correct and complete: "rules" (the
    # offline rules extractor's names: a small model misses names it is not shown) or "none"; remembered
    hints: str = "rules"


@dataclass
class SchemaSettings:
    # an entity of a type outside the schema (and not one of its synonyms), or a relation breaking its patterns:
    # strict drops it; lenient keeps the entity as "unknown" and the relation without a relation type
    mode: str = "strict"


@dataclass
class ResolveSettings:
    summary_min_fragments: int = 8
    summary_max_input_tokens: int = 1200
    summary_target_tokens: int = 600
    description_separator: str = " | "


@dataclass
class EmbedSettings:
    model: str = "builtin"          # builtin, st:NAME_OR_FOLDER, or a litellm embedding model
    api_base: str = ""
    batch_size: int = 64
    concurrency: int = 4
    idf_refresh_growth: float = 0.2  # builtin: refit IDF when the corpus grew by this fraction
    precision: str = "bf16"          # st: models: "bf16" (bfloat16 autocast, less CPU) or "float32"


@dataclass
class VectorSettings:
    m: int = 16
    ef_construction: int = 200
    ef_search: int = 128
    exact_below: int = 50_000        # below this many items an index has no HNSW graph: exact float16 matrix search
    # Vectors of the relations themselves (LightRAG's global mode searches them): "on", "off", or "auto" = on
    # only for an LLM extractor, whose relations carry descriptions and keywords of their own. Rules and OpenIE
    # relations restate their facts, so global mode ranks them through the fact vectors instead (embed/texts.py).
    relations: str = "auto"


@dataclass
class SynonymSettings:
    top_k: int = 10
    threshold: float = 0.8
    # Only pairs at least as similar as the nearest neighbour of the best-matched `top_share` of the entities:
    # a rank on the embedder's own scale, so the floor means the same for every embedder (the builtin one gives
    # short unrelated names 0.99, a sentence model its own spread); `threshold` stays an absolute lower bound.
    top_share: float = 0.4
    min_name_chars: int = 3
    # The k-NN pass over entity-name vectors joins each entity with those sharing one of its
    # `cells_per_entity` nearest k-means cells (cells.py); up to cells_per_entity * cell_size entities it is
    # exact; beyond, it finds nearly every neighbour at or above the threshold (bench/synonyms_scale.py). More
    # cells per entity: higher recall, cost grows linearly.
    cells_per_entity: int = 10
    cell_size: int = 1250


@dataclass
class QuerySettings:
    mode: str = "ppr"
    top_k: int = 5
    fact_top_k: int = 5
    passage_node_weight: float = 0.05
    passage_node_top_k: int = 1000   # ppr: chunks keeping their own passage weight (the rest: their mean; 0: all)
    damping: float = 0.5
    entity_top_k: int = 40           # local mode: entities taken from the entity index
    relation_top_k: int = 40         # global mode: relations taken from the relation index
    chunk_pick: str = "vector"       # local/global: chunks of the chosen entities/relations by query similarity
                                     # (vector) or by how many of them carry the chunk (weight), as LightRAG
    # vector pick: + this x the chunk's share of the chosen entities/relations' votes (one each in local and
    # global; in hybrid each votes with its score against the query); the second with the builtin embedder,
    # whose weaker similarity ranking the graph's evidence helps more (bench/retrieval.py)
    chunk_pick_boost: float = 0.1
    builtin_chunk_pick_boost: float = 1.0
    chunk_top_k: int = 20            # local/global: chunks taken from the graph before the budgets
    rerank: str = ""                 # every mode: a litellm rerank model or st:FOLDER (cross-encoder); "" = none
    rerank_api_base: str = ""        # API base URL for the rerank model (e.g. a local vLLM/Infinity server)
    rerank_top_k: int = 20           # chunks the reranker reorders (at least top_k)
    rerank_chunk_tokens: int = 480   # longer chunks are split into pieces this long; a chunk scores its best piece
    response_type: str = ""          # --answer: the form of the reply, e.g. "one paragraph", "a bulleted list"
    user_prompt: str = ""            # --answer: the user's own instructions for the answer
    entity_tokens: int = 6000
    relation_tokens: int = 8000
    context_tokens: int = 30000
    lexical_fusion: bool = True      # BM25 joins dense scores in naive, mix and ppr
    lexical_weight: float = 0.15     # chosen on a multi-hop dev set; much more hurts naive (bench/musique.py)
    entity_name_seeds: bool = True   # ppr: entity names found in the query seed their entities
    lexical_method: str = "minmax"   # minmax (score mix) or rrf (reciprocal rank), chosen on a dev set
    rrf_k: int = 60                  # rrf: 1 / (rrf_k + rank)
    entity_seed_weight: float = 3.0  # ppr: seed weight of an entity named in the query (before / its chunks)
    fact_filter: str = "auto"        # ppr: the LLM keeps the facts that bear on the query (auto: when one is set)
    # ppr's final ranking: the first `fusion_head` ranks are the best of a reciprocal-rank fusion (1 / (fusion_k +
    # rank)) of the walk (its share: walk_weight, or rules_walk_weight on a rules-extractor graph) with the passage
    # scores and BM25 (fusion_lexical of the non-walk part); the rest follow the walk. Chosen on the dev sets
    # (bench/retrieval.py). walk_weight = 1 is the walk alone.
    walk_weight: float = 0.9
    rules_walk_weight: float = 0.55
    fusion_head: int = 2
    fusion_k: float = 1.0
    fusion_lexical: float = 0.75
    seed_confidence: float = 0.0     # ppr: best fact cosine below which the walk's share shrinks (0 = never)
    # ppr on a rules-extractor graph: the walk's share of the first ranks when no entity of the query is named
    # (the seeds are then co-occurrence facts only); 1 = rules_walk_weight as for a named one
    rules_unnamed_walk_weight: float = 0.0
    # ppr: a fact seeds with its score x (score / the best fact's score) ** this: facts far below the best
    # match count less (0 = the raw score). Chosen on the dev sets, builtin and MiniLM embedders together
    # (bench/retrieval.py)
    fact_seed_sharpness: float = 2.0
    rules_synonym_weight: float = 0.0   # ppr on a rules-extractor graph: SYNONYM edge weights x this in the walk
    # ppr: at most this many chunks of one document among the first ranks while other documents have candidates
    # (0 = no cap): one long file whose names the walk keeps reaching cannot fill the answer
    doc_cap: int = 1
    # ppr: an entity the query names that more than this share of the chunks mention does not count as naming
    # the question's subject (0 = every named entity counts)
    common_name_share: float = 0.05
    # ppr on a rules-extractor graph, when the question names an entity (one in at most common_name_share of the
    # chunks): the facts that seed the walk are those of the best this many that touch a named entity (0 = the
    # best fact_top_k, whatever they touch). Chosen on the dev sets and docs-mixed (bench/retrieval.py)
    rules_anchor_fact_top_k: int = 10
    # ppr: when the question names an entity (as above) that at most this many chunks mention, the first ranks
    # fuse the walk from the seeds alone, without the passage weights, and then the whole walk's picks (0 = the
    # whole walk's only). Chosen on the dev sets and docs-mixed (bench/retrieval.py)
    head_seed_chunks: int = 1


@dataclass
class ClusterSettings:
    # "" = this process only; "auto" = the Ray cluster this machine belongs to (ray start); else its address
    ray: str = ""


@dataclass
class Settings:
    documents: DocumentSettings = field(default_factory=DocumentSettings)
    chunk: ChunkSettings = field(default_factory=ChunkSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    extract: ExtractSettings = field(default_factory=ExtractSettings)
    schema: SchemaSettings = field(default_factory=SchemaSettings)
    resolve: ResolveSettings = field(default_factory=ResolveSettings)
    embed: EmbedSettings = field(default_factory=EmbedSettings)
    vectors: VectorSettings = field(default_factory=VectorSettings)
    synonyms: SynonymSettings = field(default_factory=SynonymSettings)
    query: QuerySettings = field(default_factory=QuerySettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)

    def section(self, name: str) -> Any:
        return getattr(self, name)

    def to_dict(self) -> dict:
        return asdict(self)


# Allowed range of every numeric setting, both ends inclusive (None: open). Checked after all layers are applied,
# before any command writes anything: an out-of-range value would crash late (hnswlib m = 0 segfaults), silently
# disable a limit (NaN) or exhaust memory after rewriting vectors/ (a top_k of 1e8).
_BIG = 1 << 31
RANGES: dict[str, tuple[float | None, float | None]] = {
    "chunk.tokens": (1, 1_000_000), "chunk.overlap": (0, 999_999),
    "llm.temperature": (0, 2), "llm.max_tokens": (1, 10_000_000), "llm.timeout": (0, 86_400),
    "llm.concurrency": (0, 1024), "llm.max_retries": (0, 100), "llm.backoff_base": (0, 3600),
    "llm.backoff_max": (0, 86_400), "llm.context_tokens": (1, 100_000_000),
    "extract.max_gleanings": (0, 100), "extract.glean_min_tokens": (0, _BIG),
    "extract.answer_tokens_min": (1, _BIG), "extract.answer_tokens_per_token": (0, 1000),
    "resolve.summary_min_fragments": (0, _BIG), "resolve.summary_max_input_tokens": (1, 100_000_000),
    "resolve.summary_target_tokens": (1, 10_000_000),
    "embed.batch_size": (1, 1_000_000), "embed.concurrency": (1, 1024), "embed.idf_refresh_growth": (0, 1_000_000),
    "vectors.m": (2, 512), "vectors.ef_construction": (1, 1_000_000), "vectors.ef_search": (1, 1_000_000),
    "vectors.exact_below": (0, _BIG),
    "synonyms.top_k": (1, 1000), "synonyms.threshold": (-1, 1), "synonyms.top_share": (0, 1),
    "synonyms.min_name_chars": (0, 10_000),
    "synonyms.cells_per_entity": (1, 100_000), "synonyms.cell_size": (2, _BIG),
    "query.top_k": (1, 100_000), "query.fact_top_k": (0, 100_000), "query.passage_node_weight": (0, 1_000_000),
    "query.passage_node_top_k": (0, _BIG),
    "query.damping": (0, 0.999), "query.entity_top_k": (0, 1_000_000), "query.relation_top_k": (0, 1_000_000),
    "query.entity_tokens": (0, 100_000_000), "query.relation_tokens": (0, 100_000_000),
    "query.context_tokens": (1, 100_000_000), "query.lexical_weight": (0, 1), "query.rrf_k": (0, 1_000_000),
    "query.entity_seed_weight": (0, 1_000_000),
    "query.walk_weight": (0, 1), "query.rules_walk_weight": (0, 1), "query.rules_unnamed_walk_weight": (0, 1),
    "query.fusion_head": (0, 100_000),
    "query.fusion_k": (0, 1_000_000), "query.fusion_lexical": (0, 1), "query.seed_confidence": (0, 1_000_000),
    "query.fact_seed_sharpness": (0, 100),
    "query.chunk_pick_boost": (0, 1_000_000), "query.builtin_chunk_pick_boost": (0, 1_000_000),
    "query.chunk_top_k": (1, 100_000), "query.rules_synonym_weight": (0, 1_000_000), "query.doc_cap": (0, 100_000),
    "query.common_name_share": (0, 1), "query.rules_anchor_fact_top_k": (0, 100_000),
    "query.head_seed_chunks": (0, 1_000_000),
    "query.rerank_top_k": (1, 100_000), "query.rerank_chunk_tokens": (16, 1_000_000),
}


RELATION_VECTORS = ("auto", "on", "off")     # vectors.relations
EMBED_PRECISIONS = ("bf16", "float32")       # embed.precision (st: models)


def check_ranges(settings: Settings) -> None:
    """Every numeric setting finite and inside RANGES, vectors.relations and embed.precision one of their
    choices; a usage error naming the setting and what it takes."""
    for key, (lo, hi) in RANGES.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(settings, section), name)
        ok = value == value and value not in (float("inf"), float("-inf"))   # NaN and infinities never pass
        ok = ok and (lo is None or value >= lo) and (hi is None or value <= hi)
        if not ok:
            raise UsageError(f"setting {key}: {value!r} is out of range; use a value from {lo} to {hi}")
    if settings.vectors.relations.strip().lower() not in RELATION_VECTORS:
        raise UsageError(f"setting vectors.relations: {settings.vectors.relations!r} must be one of "
                         f"{', '.join(RELATION_VECTORS)}")
    if settings.embed.precision.strip().lower() not in EMBED_PRECISIONS:
        raise UsageError(f"setting embed.precision: {settings.embed.precision!r} must be one of "
                         f"{', '.join(EMBED_PRECISIONS)}")
    if settings.chunk.overlap >= settings.chunk.tokens:
        raise UsageError(f"setting chunk.overlap: {settings.chunk.overlap} must be smaller than chunk.tokens "
                         f"({settings.chunk.tokens})")


# Environment variables that override a setting (below flags, above hrag.toml).
ENV_VARS: dict[str, str] = {
    "HRAG_LLM_MODEL": "llm.model",
    "HRAG_LLM_API_BASE": "llm.api_base",
    "HRAG_EMBED_MODEL": "embed.model",
    "HRAG_EMBED_API_BASE": "embed.api_base",
}


def _coerce(key: str, current: Any, value: Any) -> Any:
    """Turn a toml/env/flag value into the type the default has, or fail with the setting's name."""
    try:
        if isinstance(current, bool):
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if isinstance(value, bool):
                return value
            raise ValueError(value)
        if isinstance(current, int) and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(current, float) and not isinstance(value, bool):
            return float(value)
        if isinstance(current, list):
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if isinstance(value, (list, tuple)):
                return [str(v) for v in value]
            raise ValueError(value)
        if isinstance(current, str):
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError(value)
            return str(value)
    except (TypeError, ValueError):
        raise UsageError(f"setting {key}: {value!r} is not a valid {type(current).__name__}") from None
    return value


def apply(settings: Settings, key: str, value: Any) -> None:
    """Set `section.name` on settings, checking the name and the type."""
    section, _, name = key.partition(".")
    sec = getattr(settings, section, None)
    if not name or sec is None or not is_dataclass(sec) or name not in {f.name for f in fields(sec)}:
        raise UsageError(f"unknown setting '{key}'")
    setattr(sec, name, _coerce(key, getattr(sec, name), value))


def load_settings(toml_path: Path | None, overrides: dict[str, Any] | None = None,
                  environ: dict[str, str] | None = None, remembered: dict[str, Any] | None = None) -> Settings:
    """defaults < remembered < hrag.toml < environment < flags (`overrides`, None values ignored).

    `remembered` holds what a project was last built with (extractor, LLM model and API base, embedder; see
    ProjectDir.remembered): a plain command reuses it, anything given explicitly wins. A model given explicitly
    does not inherit the remembered API base (nor, for an embedder, the precision) of another model."""
    settings = Settings()
    for key, value in (remembered or {}).items():
        apply(settings, key, value)
    if remembered and remembered.get("extract.extractor") == "llm" and "extract.hints" not in remembered:
        settings.extract.hints = "none"    # remembered without hints: built without them, its extractions stay
    explicit: set[str] = set()
    if toml_path is not None and Path(toml_path).exists():
        try:
            data = tomllib.loads(Path(toml_path).read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{toml_path}: not valid TOML ({exc})") from None
        for section, values in data.items():
            if not isinstance(values, dict):
                raise UsageError(f"{toml_path}: '{section}' must be a [section]")
            for name, value in values.items():
                apply(settings, f"{section}.{name}", value)
                explicit.add(f"{section}.{name}")
    env = os.environ if environ is None else environ
    for var, key in ENV_VARS.items():
        if env.get(var):
            apply(settings, key, env[var])
            explicit.add(key)
    for key, value in (overrides or {}).items():
        if value is not None:
            apply(settings, key, value)
            explicit.add(key)
    if remembered and "llm.model" in explicit and settings.llm.model != remembered.get("llm.model"):
        if "llm.api_base" not in explicit:
            settings.llm.api_base = LLMSettings.api_base
        if "extract.extractor" not in explicit:
            settings.extract.extractor = ExtractSettings.extractor   # auto: a model given means "use it"
        if "extract.format" not in explicit:
            settings.extract.format = ExtractSettings.format          # another model: what it supports
    if remembered and "embed.model" in explicit and settings.embed.model != remembered.get("embed.model"):
        for key in ("api_base", "precision"):      # another embedder starts from its own defaults
            if f"embed.{key}" not in explicit:
                setattr(settings.embed, key, getattr(EmbedSettings, key))
    check_ranges(settings)
    return settings


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    s = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def default_toml() -> str:
    """The hrag.toml written on first run: every setting, commented out at its default, so a user edits the
    ones they mean and later releases' better defaults still reach the rest."""
    lines = ["# hrag settings: uncomment a line to change it. Flags override these for one run; environment variables",
             "# (HRAG_LLM_MODEL, HRAG_LLM_API_BASE, HRAG_EMBED_MODEL, HRAG_EMBED_API_BASE) override them too.",
             "# API keys are never stored here: they come from the provider's environment variables.", ""]
    for f in fields(Settings):
        lines.append(f"[{f.name}]")
        for sf in fields(getattr(Settings(), f.name)):
            lines.append(f"# {sf.name} = {_toml_value(getattr(getattr(Settings(), f.name), sf.name))}")
        lines.append("")
    return "\n".join(lines)
