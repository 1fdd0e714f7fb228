"""The `hrag` command: parses flags, calls one method of the Python API (api.Project), prints its result.
Nothing else lives here.

The API and the stage modules are imported inside the commands so `hrag --help` starts fast; litellm is
imported only by the code that calls a model.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hrag_cli.core.errors import EXIT_USAGE, HragError, UsageError

app = typer.Typer(
    name="hrag",
    help="Index a folder of documents into a knowledge-graph retrieval index, then query it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

ProjectOpt = Annotated[Optional[Path], typer.Option(
    "--project", "-p", help="Project directory (default: $HRAG_PROJECT or ./.hrag).", show_default=False)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but warnings and errors.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
LlmModelOpt = Annotated[Optional[str], typer.Option(
    "--llm-model", help="litellm model, e.g. openai/gpt-4o-mini, ollama/qwen2.5 ($HRAG_LLM_MODEL).",
    show_default=False)]
LlmBaseOpt = Annotated[Optional[str], typer.Option(
    "--llm-api-base", help="API base URL for the LLM ($HRAG_LLM_API_BASE).", show_default=False)]
EmbedModelOpt = Annotated[Optional[str], typer.Option(
    "--embed-model", help="builtin, st:NAME_OR_FOLDER, or a litellm embedding model ($HRAG_EMBED_MODEL).",
    show_default=False)]
EmbedBaseOpt = Annotated[Optional[str], typer.Option(
    "--embed-api-base", help="API base URL for the embedding model ($HRAG_EMBED_API_BASE).", show_default=False)]


RerankOpt = Annotated[Optional[str], typer.Option(
    "--rerank", help="Rerank every mode's chunks: a litellm rerank model, or st:FOLDER for a local cross-encoder.",
    show_default=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="A query setting for this run, query.NAME=VALUE (repeatable); nothing is rebuilt.",
    show_default=False)]


def _query_sets(items: Optional[list[str]]) -> dict[str, str]:
    """--set query.NAME=VALUE pairs; only [query] settings, since the others shape the built index."""
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("query.") or len(key) <= len("query."):
            raise UsageError(f"--set {item!r}: write query.NAME=VALUE (only query settings can change per run)")
        out[key.strip()] = value.strip()
    return out


def _project(project: Optional[Path], overrides: dict[str, Any], quiet: bool = True, json_output: bool = False
             ) -> Any:
    """The API's Project for --project with these flags' settings, reporting as the flags ask."""
    from hrag_cli.api import Project
    from hrag_cli.core.progress import Reporter

    return Project(project, overrides, reporter=Reporter.auto(quiet=quiet, json_output=json_output))


def _print_json(obj: Any) -> None:
    from hrag_cli.core.store import dumps

    sys.stdout.write(dumps(obj).decode("utf-8") + "\n")
    sys.stdout.flush()


def _counts_line(counts: dict[str, Any]) -> str:
    """A stage's counts as `k=v, ...` for a person: without `chunk_mark` (the chunks a stage's outputs hold,
    which its next run reads; --json keeps it)."""
    return ", ".join(f"{k}={v}" for k, v in counts.items() if k != "chunk_mark")


def _print_lines(lines: list[str]) -> None:
    """Plain lines on stdout, whole: a cron mail or a log file gets them as they are, never cut to a width."""
    from hrag_cli.core.redact import printable

    for line in lines:
        sys.stdout.write(printable(line) + "\n")
    sys.stdout.flush()


def _print_summary(title: str, summary: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    # values hold user text (paths, --select, names): print them as written, never as rich markup
    from hrag_cli.core.redact import printable

    if not sys.stdout.isatty():   # full lines for cron and pipes: a table would be cut at 80 columns
        rows = [f"{k}: {_counts_line(v) if isinstance(v, dict) else (f'{v:.4f}' if isinstance(v, float) else v)}"
                for k, v in summary.items()]
        _print_lines([title, *rows])
        return
    table = Table(title=escape(printable(title)), show_header=False, box=None)
    for key, value in summary.items():
        if isinstance(value, dict):
            value = _counts_line(value)
        elif isinstance(value, float):
            value = f"{value:.4f}"
        table.add_row(escape(printable(str(key))), escape(printable(str(value))))
    from hrag_cli.core.progress import stdout_console

    stdout_console().print(table)


@app.command()
def index(
    docs: Annotated[Optional[list[Path]], typer.Argument(
        help="Folders or files to index (default: the ones indexed last time).", show_default=False)] = None,
    project: ProjectOpt = None,
    include: Annotated[Optional[list[str]], typer.Option("--include", help="Glob of paths to take (repeatable).")] = None,
    exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Glob of paths to skip (repeatable).")] = None,
    text_field: Annotated[Optional[str], typer.Option("--text-field", help="Text field of .jsonl records.")] = None,
    extractor: Annotated[Optional[str], typer.Option("--extractor", help="auto, llm or rules.")] = None,
    llm_model: LlmModelOpt = None,
    llm_api_base: LlmBaseOpt = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="LLM requests in flight (default 8; 1 for a server on this machine).")] = None,
    chunk_tokens: Annotated[Optional[int], typer.Option("--chunk-tokens", help="Tokens per chunk (default 1200).")] = None,
    chunk_overlap: Annotated[Optional[int], typer.Option("--chunk-overlap", help="Overlap tokens (default 100).")] = None,
    max_gleanings: Annotated[Optional[int], typer.Option("--max-gleanings", help="Extra extraction rounds (default 1).")] = None,
    glean_min_tokens: Annotated[Optional[int], typer.Option("--glean-min-tokens", help="Glean only chunks of at least this many tokens (default 500).")] = None,
    entity_types: Annotated[Optional[str], typer.Option("--entity-types", help="Comma-separated entity types.")] = None,
    language: Annotated[Optional[str], typer.Option("--language", help="Language of descriptions.")] = None,
    schema: Annotated[Optional[str], typer.Option("--schema", help="A schema file (TOML or JSON) of entity and relation types; remembered ('' to stop using one).", show_default=False)] = None,
    embed_model: EmbedModelOpt = None,
    embed_api_base: EmbedBaseOpt = None,
    stop_after: Annotated[Optional[str], typer.Option("--stop-after", help="chunk, extract or resolve.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count chunks, estimate tokens and cost; call nothing.")] = False,
    max_cost: Annotated[Optional[float], typer.Option("--max-cost", help="Stop (resumably) when this run's LLM spend reaches USD.")] = None,
    reparse: Annotated[bool, typer.Option("--reparse", help="Re-parse cached LLM responses without calling the LLM.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Extract again the chunks that failed or are partial (listed by 'hrag status').")] = False,
    rehash: Annotated[bool, typer.Option("--rehash", help="Read every document file again, even those whose size, times and inode are unchanged.")] = False,
    import_openie: Annotated[Optional[Path], typer.Option("--import-openie", help="Take extractions from a HippoRAG openie_results_ner_*.json instead of an extractor.")] = None,
    import_lightrag: Annotated[Optional[Path], typer.Option("--import-lightrag", help="Build the project from a LightRAG working directory (its documents, chunks and cached extractions; no LLM call) instead of DOCS.")] = None,
    import_graphrag: Annotated[Optional[Path], typer.Option("--import-graphrag", help="Build the project from a GraphRAG output folder (documents, text units, entities, relationships tables; needs hrag[graphrag]) instead of DOCS.")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="Extract on a Ray cluster: auto (the one this machine joined) or its address; remembered ('' for this process only). Needs pip install 'hrag[ray]'.", show_default=False)] = None,
    quiet: QuietOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Load, chunk and extract DOCS, then bring resolve and synonyms up to date."""
    overrides = {
        "documents.include": include or None, "documents.exclude": exclude or None,
        "documents.jsonl_text_field": text_field, "extract.extractor": extractor,
        "llm.model": llm_model, "llm.api_base": llm_api_base, "llm.concurrency": concurrency,
        "chunk.tokens": chunk_tokens, "chunk.overlap": chunk_overlap, "extract.max_gleanings": max_gleanings,
        "extract.glean_min_tokens": glean_min_tokens,
        "extract.entity_types": entity_types, "extract.language": language,
        "extract.schema": schema,
        "embed.model": embed_model, "embed.api_base": embed_api_base, "cluster.ray": ray,
    }
    t0 = time.monotonic()
    p = _project(project, overrides, quiet, json_output)
    result = p.index(
        docs, stop_after=stop_after, dry_run=dry_run, max_cost=max_cost, reparse=reparse,
        retry_failed=retry_failed, rehash=rehash, import_openie=import_openie, import_lightrag=import_lightrag,
        import_graphrag=import_graphrag)
    if json_output:
        from hrag_cli.pipeline import index_failure

        failure = index_failure(result.summary, result.exit_code)
        _print_json({**result.summary, "failure": failure} if failure else result.summary)
    elif not quiet:
        from hrag_cli.report import index_lines

        rec = p.dir.stage("resolve") if p.root.exists() else None
        title = "hrag index" + (" (dry run)" if dry_run else "")
        _print_lines([title, *index_lines(result.summary, rec.counts if rec else None, time.monotonic() - t0)])
    raise typer.Exit(result.exit_code)


schema_app = typer.Typer(help="Graph schema files.", no_args_is_help=True)
app.add_typer(schema_app, name="schema")


@schema_app.command("suggest")
def schema_suggest(
    docs: Annotated[list[Path], typer.Argument(help="Files or folders to sample.", show_default=False)],
    llm_model: LlmModelOpt = None,
    llm_api_base: LlmBaseOpt = None,
    sample: Annotated[int, typer.Option("--sample", help="Chunks to sample; one LLM request each.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample: the same seed, the same chunks.")] = 0,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the draft here (never over a file); default: stdout.")] = None,
    project: ProjectOpt = None,
    quiet: QuietOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Draft a schema file (TOML) from a sample of DOCS, with how often each type was seen, for you to edit."""
    p = _project(project, {"llm.model": llm_model, "llm.api_base": llm_api_base}, quiet, json_output)
    draft, summary, code = p.suggest_schema(docs, sample=sample, seed=seed, out=out)
    if json_output:
        _print_json(summary)
    elif out is None:
        sys.stdout.write(draft)
    elif not quiet:
        _print_summary("hrag schema suggest", summary)
    raise typer.Exit(code)


@app.command()
def resolve(
    project: ProjectOpt = None,
    llm_model: LlmModelOpt = None,
    llm_api_base: LlmBaseOpt = None,
    summary_min_fragments: Annotated[Optional[int], typer.Option("--summary-min-fragments", help="Summarise a description of at least this many fragments with the LLM (default 8).")] = None,
    summary_max_input_tokens: Annotated[Optional[int], typer.Option("--summary-max-input-tokens", help="Summarise a description whose fragments exceed this many tokens (default 1200).")] = None,
    quiet: QuietOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Merge the current extraction records into entities, relations, facts and the graph."""
    overrides = {"llm.model": llm_model, "llm.api_base": llm_api_base,
                 "resolve.summary_min_fragments": summary_min_fragments,
                 "resolve.summary_max_input_tokens": summary_max_input_tokens}
    summary = _project(project, overrides, quiet, json_output).resolve()
    if json_output:
        _print_json(summary)
    elif not quiet:
        _print_summary("hrag resolve", summary)


@app.command()
def synonyms(
    project: ProjectOpt = None,
    embed_model: EmbedModelOpt = None,
    embed_api_base: EmbedBaseOpt = None,
    threshold: Annotated[Optional[float], typer.Option("--threshold", help="Cosine similarity for a SYNONYM edge (default 0.8).")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Neighbours looked at per entity (default 10).")] = None,
    review: Annotated[Optional[Path], typer.Option("--review", help="Write candidate pairs to this TSV instead of applying them.")] = None,
    accept: Annotated[Optional[Path], typer.Option("--accept", help="Apply a reviewed TSV.")] = None,
    quiet: QuietOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Embed entities, relations, facts and chunks, build the vector indices and add SYNONYM edges."""
    overrides = {"embed.model": embed_model, "embed.api_base": embed_api_base,
                 "synonyms.threshold": threshold, "synonyms.top_k": top_k}
    summary = _project(project, overrides, quiet, json_output).synonyms(review=review, accept=accept)
    if json_output:
        _print_json(summary)
    elif not quiet:
        _print_summary("hrag synonyms", summary)
    if review is not None and not json_output:
        n = summary.get("synonyms", {}).get("review_pairs", 0)
        print(f"wrote {n} candidate pairs to {review}; set each action to link, merge or skip, then run "
              f"'hrag synonyms --accept {review}'", file=sys.stderr)


def _print_first(console: Any, lines: list[str]) -> None:
    """The first 20 lines, indented and escaped (they hold file names and provider text), then how many more."""
    from hrag_cli.core.redact import printable

    for line in lines[:20]:
        console.print(printable(f"  {line}"), highlight=False, markup=False)
    if len(lines) > 20:
        console.print(f"  … (+{len(lines) - 20}; 'hrag status --json' lists all)")


@app.command()
def status(project: ProjectOpt = None, json_output: JsonOpt = False,
           verify: Annotated[bool, typer.Option("--verify", help="Hash every artifact whole (slower) instead of sampling it.")] = False) -> None:
    """Each stage (fresh/stale/missing/damaged), counts, failed chunks, and LLM tokens and cost so far."""
    p = _project(project, {})
    info = p.status(verify=verify)
    if json_output:
        _print_json(info)
        return
    from rich.markup import escape
    from rich.table import Table

    from hrag_cli.core.redact import printable

    from hrag_cli.core.progress import stdout_console

    console = stdout_console()
    table = Table(title=escape(printable(f"hrag project {p.root}")))
    for col in ("stage", "state", "finished", "counts"):
        table.add_column(col)
    for name, st in info["stages"].items():
        counts = _counts_line(st.get("counts", {}))
        color = {"fresh": "green", "stale": "yellow", "missing": "red", "damaged": "red"}.get(st["state"], "white")
        table.add_row(name, f"[{color}]{st['state']}[/{color}]", st.get("finished_at", ""), escape(printable(counts)))
    console.print(table)
    for key, value in info.items():
        if key == "stages":
            continue
        if key == "failed_chunks":
            from hrag_cli.extract.stage import iter_failed

            lines = list(iter_failed(info))
            console.print(f"failed chunks: {len(lines)}" + (" (retry with 'hrag index --retry-failed')" if lines else ""),
                          highlight=False)
            _print_first(console, lines)
            continue
        if key == "ungrounded_chunks":
            from hrag_cli.extract.prune import iter_ungrounded

            n = info["stages"].get("prune", {}).get("counts", {}).get("chunks_with_ungrounded", 0)
            console.print(f"chunks with ungrounded names: {n}" + (", the most first:" if n else ""), highlight=False)
            _print_first(console, iter_ungrounded(info))
            continue
        if key == "not_indexed":
            from hrag_cli.report import by_ext

            files = value.get("files", [])
            reasons = ", ".join(f"{r} {n}" for r, n in value.get("by_reason", {}).items())
            console.print(printable(f"files not indexed: {len(files)}" + (f" ({reasons}; by type: "
                                    f"{by_ext(value.get('by_ext', {}))})" if files else "")),
                          markup=False, highlight=False)
            _print_first(console, files)
            continue
        if key == "dropped_chunks":
            from hrag_cli.extract.stage import iter_dropped

            lines = list(iter_dropped(info))
            console.print(f"chunks with dropped rows: {len(lines)}", highlight=False)
            _print_first(console, lines)
            continue
        if isinstance(value, dict):
            value = _counts_line(value)
        elif isinstance(value, list):
            value = ", ".join(map(str, value[:20])) + (f" … (+{len(value) - 20})" if len(value) > 20 else "")
        console.print(printable(f"{key}: {value}"), markup=False)


@app.command()
def query(
    text: Annotated[Optional[str], typer.Argument(help="The question.", show_default=False)] = None,
    project: ProjectOpt = None,
    mode: Annotated[Optional[str], typer.Option("--mode", "-m", help="ppr, local, global, hybrid, naive, mix or bm25.")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", "-k", help="Chunks to return (default 5).")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", help="Queries, one per line or JSONL {id, query}; one JSON line out per query.")] = None,
    context: Annotated[bool, typer.Option("--context", help="Print the token-budgeted context text.")] = False,
    answer: Annotated[bool, typer.Option("--answer", help="Let the LLM answer from the context, citing [n].")] = False,
    no_lexical: Annotated[bool, typer.Option("--no-lexical", help="Turn off BM25 fusion.")] = False,
    rerank: RerankOpt = None,
    response_type: Annotated[Optional[str], typer.Option(
        "--response-type", help="With --answer: the form of the reply, e.g. 'one paragraph', 'a bulleted list'.",
        show_default=False)] = None,
    user_prompt: Annotated[Optional[str], typer.Option(
        "--user-prompt", help="With --answer: your own instructions for the answer.", show_default=False)] = None,
    history: Annotated[Optional[Path], typer.Option(
        "--history", help="With --answer: earlier turns, a JSON list or JSONL of {role, content}.",
        show_default=False)] = None,
    llm_model: LlmModelOpt = None,
    llm_api_base: LlmBaseOpt = None,
    embed_model: EmbedModelOpt = None,
    embed_api_base: EmbedBaseOpt = None,
    set_: SetOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Retrieve the chunks that answer a question, from the project as it is (nothing is rebuilt)."""
    from hrag_cli.query.run import as_json, print_table, read_history, read_queries

    if (response_type is not None or user_prompt is not None) and not answer:
        raise UsageError("--response-type and --user-prompt shape the answer: add --answer")
    overrides = {"query.mode": mode, "query.top_k": top_k, "llm.model": llm_model, "llm.api_base": llm_api_base,
                 "embed.model": embed_model, "embed.api_base": embed_api_base,
                 "query.lexical_fusion": False if no_lexical else None, "query.rerank": rerank,
                 "query.response_type": response_type, "query.user_prompt": user_prompt, **_query_sets(set_)}
    p = _project(project, overrides)
    p.settings()   # the project and every setting checked before the inputs are read
    if (text is None) == (file is None):
        raise UsageError("give either a question or --file QUERIES")
    if history is not None and not answer:
        raise UsageError("--history gives the answer earlier turns: add --answer")
    queries = read_queries(file) if file is not None else [("1", text or "")]
    turns = read_history(history) if history is not None else None
    results = p.retrieve([q for _, q in queries], context=context, answer=answer, history=turns)
    for (qid, _), (r, extra) in zip(queries, results):
        if file is not None:    # one JSON line per query, each written as it is answered
            _print_json(as_json(r, extra, qid))
        elif json_output:
            _print_json(as_json(r, extra))
        elif context and not answer:
            from hrag_cli.core.redact import printable

            sys.stdout.write((printable(extra["context"]) if sys.stdout.isatty() else extra["context"]) + "\n")
        else:
            print_table(r, extra)


@app.command(name="eval")
def eval_cmd(
    qa: Annotated[Path, typer.Argument(help="JSONL: question and gold passages per line.")],
    project: ProjectOpt = None,
    modes: Annotated[str, typer.Option("--modes", help="Comma-separated modes.")] = "ppr,naive",
    k: Annotated[str, typer.Option("-k", help="Comma-separated cut-offs.")] = "2,5",
    no_lexical: Annotated[bool, typer.Option("--no-lexical", help="Turn off BM25 fusion.")] = False,
    embed_model: EmbedModelOpt = None,
    rerank: RerankOpt = None,
    llm_model: LlmModelOpt = None,
    llm_api_base: LlmBaseOpt = None,
    set_: SetOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Recall@k of each retrieval mode against gold passages."""
    from hrag_cli.query.evaluate import parse_list

    overrides = {"embed.model": embed_model, "query.lexical_fusion": False if no_lexical else None,
                 "query.rerank": rerank, "llm.model": llm_model, "llm.api_base": llm_api_base, **_query_sets(set_)}
    p = _project(project, overrides, quiet=False, json_output=json_output)
    p.settings()   # the project and every setting checked before the flags' lists
    mode_list = parse_list(modes, "--modes")
    try:
        k_list = [int(x) for x in parse_list(k, "-k")]
    except ValueError:
        raise UsageError(f"-k takes comma-separated integers, not {k!r}") from None
    result = p.evaluate(qa, mode_list, k_list)
    if json_output:
        _print_json(result)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from hrag_cli.core.progress import stdout_console

    k_list = sorted(set(k_list))
    table = Table(title=escape(f"Recall@k over {result['questions']} questions ({qa.name})"), title_justify="left")
    table.add_column("mode")
    for n in k_list:
        table.add_column(f"R@{n}", justify="right")
    table.add_column("ms/query", justify="right")
    for name, rec in result["modes"].items():
        table.add_row(name, *(f"{100 * rec['recall'][str(n)]:.1f}" for n in k_list), f"{rec['ms_per_query']:.1f}")
    stdout_console().print(table)
    if result["unresolved_gold"]:
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {result['unresolved_gold']} gold passages matched no chunk")


@app.command()
def export(
    fmt: Annotated[str, typer.Option("--format", "-f", help="graphml, jsonl, csv, cypher or falkordb.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="File (graphml, cypher; - for standard output) or folder (jsonl, csv).")] = None,
    project: ProjectOpt = None,
    url: Annotated[Optional[str], typer.Option("--url", help="FalkorDB URL, e.g. redis://127.0.0.1:6379.")] = None,
    graph: Annotated[str, typer.Option("--graph", help="FalkorDB graph name.")] = "hrag",
    select: Annotated[Optional[str], typer.Option("--select", help="Subgraph: 'entities', 'top:N' (the N most connected entities), 'around:NAME', or several: 'top:500,around:NAME'.")] = None,
    hops: Annotated[int, typer.Option("--hops", help="Neighbourhood radius for --select around:NAME.")] = 1,
    progress: Annotated[bool, typer.Option("--progress", help="Show a progress bar.")] = False,
    quiet: QuietOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Write the graph as GraphML, JSONL, CSV (neo4j-admin), Cypher, or load it into FalkorDB."""
    from hrag_cli.export.run import STDOUT

    to_stdout = output is not None and Path(output) == STDOUT
    if to_stdout and json_output:
        raise UsageError("--json and --output - both write to standard output: choose one")
    summary = _project(project, {}, quiet or not progress or to_stdout, json_output).export(
        fmt, output, url=url, graph=graph, select=select, hops=hops, progress=progress)
    if to_stdout:
        return
    if json_output:
        _print_json(summary)
    elif not quiet:
        _print_summary(f"hrag export --format {fmt}", summary)


@app.command()
def view(
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("graph.html"),
    project: ProjectOpt = None,
    select: Annotated[Optional[str], typer.Option("--select", help="Subgraph, as for 'hrag export': 'entities', 'top:N', 'around:NAME'.")] = None,
    hops: Annotated[int, typer.Option("--hops", help="Neighbourhood radius for --select around:NAME.")] = 1,
    max_nodes: Annotated[int, typer.Option("--max-nodes", help="Draw the whole graph up to this many nodes, else this many of the most connected entities.")] = 2000,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the page in your web browser.")] = False,
    quiet: QuietOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Write the graph as one self-contained HTML page (no network needed): search, details, legend."""
    summary = _project(project, {}).view(output, select=select, hops=hops, max_nodes=max_nodes,
                                         open_browser=open_browser)
    if json_output:
        _print_json(summary)
    elif not quiet:
        _print_summary("hrag view", summary)


def _json_wanted(argv: list[str]) -> bool:
    """--json among the options (not after `--`, where it would be an argument)."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in args


def _fail(code: int, line: str, exc: BaseException | None = None) -> None:
    """One line on stderr and, under --json, one failure object on stdout: the cause, the fix, the exit code,
    and the counts of what the run did before it failed (a failed index run: its stage summaries)."""
    print(f"hrag: error: {line}", file=sys.stderr)
    if _json_wanted(sys.argv[1:]):
        cause, fix = getattr(exc, "cause", "") or "", getattr(exc, "fix", "") or ""
        if not cause:
            cause, _, fix = line.rpartition("; ") if "; " in line else (line, "", "")
        counts = getattr(exc, "counts", None) or {}
        _print_json({**counts, "failure": {"cause": _one_line(cause), "fix": _one_line(fix), "exit_code": code}})
    sys.exit(code)


def _one_line(exc: BaseException | str) -> str:
    """An error as one printable line with anything key-like masked (provider text can echo headers)."""
    from hrag_cli.core.redact import printable, scrub

    return printable(scrub(str(exc)), keep_newlines=False)


def _interrupted() -> None:
    """One line for a run stopped by SIGINT or SIGTERM (and under --json the failure object), exit 128 + the
    signal."""
    import atexit
    import gc

    from hrag_cli.core.interrupt import stopped

    stop = stopped()
    name, code = (stop.name, stop.exit_code) if stop is not None else ("SIGINT", 130)
    print(f"hrag: interrupted by {name}; everything finished so far is saved, run the same command to resume",
          file=sys.stderr)
    if _json_wanted(sys.argv[1:]):
        _print_json({**(stop.counts if stop is not None else {}),
                     "failure": {"cause": f"interrupted by {name}", "fix": "run the same command to resume",
                                 "exit_code": code}})
    # everything is written and closed by now: the collector's last pass over all the run made (seconds) is
    # not worth waiting for when asked to stop (at exit, so an in-process caller keeps its collector)
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    sys.exit(code)


def main() -> None:
    """Entry point: one line on stderr and a meaningful exit code for every failure we know about."""
    from hrag_cli.core.offline import setup

    from hrag_cli.cli_args import install
    from hrag_cli.core.heap import keep_freed_memory
    from hrag_cli.core.interrupt import handled

    setup()
    keep_freed_memory()
    install()
    try:
        with handled():                      # SIGINT and SIGTERM stop a run at once (core/interrupt.py)
            rc = app(standalone_mode=False)  # click returns a typer.Exit's code here instead of raising it
        if rc == 130:                        # typer's Exit(130) for a KeyboardInterrupt
            raise KeyboardInterrupt
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except HragError as exc:
        _fail(exc.exit_code, _one_line(exc), exc)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:  # command-line parsing errors and the unexpected
        # typer vendors its own copy of click, so match its exception classes by name, not identity
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "Abort" in kinds:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, EOFError):   # click turns any EOFError into Abort: a truncated file, not Ctrl-C
                _fail(1, f"a file ended early ({_one_line(cause) or 'EOFError'}); 'hrag status' names damaged files")
            print("hrag: aborted", file=sys.stderr)
            sys.exit(130)
        if "NoArgsIsHelpError" in kinds:  # bare `hrag`: the help, not an error line
            print(exc.format_message(), file=sys.stderr)  # type: ignore[attr-defined]
            sys.exit(EXIT_USAGE)
        if "UsageError" in kinds:
            _fail(EXIT_USAGE, _one_line(exc.format_message()))  # type: ignore[attr-defined]
        if "ClickException" in kinds:
            _fail(getattr(exc, "exit_code", 1), _one_line(exc.format_message()))  # type: ignore[attr-defined]
        if os.environ.get("HRAG_DEBUG"):
            raise
        _fail(1, f"{type(exc).__name__}: {_one_line(exc)} (set HRAG_DEBUG=1 for the traceback)")


if __name__ == "__main__":
    main()
