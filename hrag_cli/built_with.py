"""What a project remembers of the settings it was built with (extractor, LLM, schema, embedder), so a plain
`hrag index` (a cron job) keeps them instead of silently falling back to the defaults; a change is only ever
explicit and is said in one line."""

from __future__ import annotations

from pathlib import Path

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir

EMBED_KEYS = ("embed.model", "embed.api_base", "embed.precision")
WHERE_KEYS = ("cluster.ray",)      # where the work runs, not what it makes: no change to announce


def built_with(settings: Settings, *, openie: bool = False) -> dict[str, str]:
    """What a project remembers of a run's settings (ProjectDir.remember): never an API key."""
    from hrag_cli.extract.candidates import hint_source
    from hrag_cli.extract.llm_extractor import answer_format
    from hrag_cli.extract.stage import extractor_kind

    kind = "auto" if openie else extractor_kind(settings)
    fmt = {"extract.format": answer_format(settings.extract, settings.llm),
           "extract.hints": hint_source(settings.extract)} if kind == "llm" else {}
    return {"extract.extractor": kind, **fmt,
            "llm.model": settings.llm.model, "llm.api_base": settings.llm.api_base,
            **({"extract.schema": settings.extract.schema} if settings.extract.schema else {}),
            **embedded_with(settings),
            **({"cluster.ray": settings.cluster.ray} if settings.cluster.ray else {})}


def embedded_with(settings: Settings) -> dict[str, str]:
    e = settings.embed
    return {"embed.model": e.model, "embed.api_base": e.api_base, "embed.precision": e.precision}


def describe_built_with(values: dict) -> str:
    kind = values.get("extract.extractor", "")
    schema = f" with the schema {values['extract.schema']}" if values.get("extract.schema") else ""
    if kind != "llm":
        return {"auto": "imported extractions"}.get(kind, f"the {kind} extractor") + schema
    where = f" at {values['llm.api_base']}" if values.get("llm.api_base") else ""
    answers = " (JSON answers)" if values.get("extract.format") == "json" else ""
    source = values.get("extract.hints", "none")
    hints = f", shown the {source} extractor's names" if source != "none" else ""
    return f"the LLM {values.get('llm.model', '')}{where}{answers}{hints}{schema}"


def describe_embedder(values: dict) -> str:
    model = values.get("embed.model", "builtin")
    where = f" at {values['embed.api_base']}" if values.get("embed.api_base") else ""
    precision = f" ({values['embed.precision']})" if model.startswith("st:") and values.get("embed.precision") else ""
    return f"the embedder {model}{where}{precision}"


def remember(project: ProjectDir, settings: Settings, reporter: Reporter, summary: dict | None = None, *,
             openie: bool | None) -> None:
    """Remember this run's extractor, model and API base, and its embedder; a change (only ever explicit, since a
    plain run reuses what is remembered) is said in one line. `openie` None: a run that does not extract
    (`hrag synonyms`) remembers its embedder only."""
    before = project.remembered()
    now = {**before, **embedded_with(settings)} if openie is None else built_with(settings, openie=openie)
    if summary is not None:
        summary["built_with"] = describe_built_with(now)
    if before == now:
        return
    extract_keys = [k for k in now if k not in EMBED_KEYS + WHERE_KEYS]
    if before and any(before.get(k) != now.get(k) for k in extract_keys):
        reporter.info(f"extracting with {describe_built_with(now)} from now on, as given "
                      f"(was {describe_built_with(before)})")
    # a project remembered before embedders were (no embed key yet) is not told of a change it did not make
    if any(k in before for k in EMBED_KEYS) and any(before.get(k) != now[k] for k in EMBED_KEYS):
        reporter.info(f"embedding with {describe_embedder(now)} from now on, as given (was "
                      f"{describe_embedder(before)}): every vector is embedded again")
    project.remember(now)


def previous_import(project: ProjectDir, settings: Settings, reporter: Reporter) -> Path | None:
    """A project built with --import-openie keeps its imported extractions on a plain `hrag index` (a cron
    job must not silently swap them for the rules extractor); an explicit --extractor switches."""
    recorded = project.recorded("extract", "openie_file")
    if not recorded or settings.extract.extractor != "auto":
        return None
    if not Path(recorded).is_file():
        raise UsageError(f"this project's extractions were imported from {recorded}, which is gone: "
                         "pass --import-openie FILE again, or --extractor rules/llm to switch")
    reporter.info(f"re-importing OpenIE extractions from {recorded} (pass --extractor to switch)")
    return Path(recorded)
