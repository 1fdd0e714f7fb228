"""Structured (JSON) extraction answers and the delimited format, through the real CLI and the stub server:
which format a provider gets, what the request carries, and that both formats parse, glean, continue,
cache and re-parse alike."""

from __future__ import annotations

import json
from pathlib import Path

from hrag_cli.core.config import ExtractSettings, LLMSettings
from hrag_cli.core.llm import supports_schema
from hrag_cli.extract.json_answer import NOT_JSON, parse_json_extraction
from hrag_cli.extract.llm_extractor import ANSWER_FRAME_TOKENS, ITEM_TOKENS, answer_format
from tests.stub_server import CHAT, StubReply, wants_schema
from tests.test_index_e2e import extraction_lines, fake_extraction, index, is_gleaning, run, summary

TEXT = ("Mara Quint built the Selby Lighthouse for the Harbour Trust of Oldport in 1901, with stone from the "
        "Calder Quarry.")


def corpus(tmp_path: Path, toml: str = "", n: int = 2) -> tuple[Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(n):
        (docs / f"d{i}.txt").write_text(TEXT.replace("1901", str(1901 + i)))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hrag.toml").write_text("[llm]\nmax_retries = 1\nbackoff_base = 0.01\n" + toml)
    return docs, proj


def chats(stub) -> list[dict]:
    return [body for path, body in stub.requests if path == CHAT]


def test_the_provider_decides_the_format_under_auto() -> None:
    auto = ExtractSettings()
    assert supports_schema(LLMSettings(model="openai/m", api_base="http://127.0.0.1:8080/v1"))
    assert supports_schema(LLMSettings(model="ollama/qwen2.5"))
    assert supports_schema(LLMSettings(model="gpt-4o-mini"))            # litellm's model list says so
    assert not supports_schema(LLMSettings(model="openai/m"))           # no server named: litellm's list
    assert answer_format(auto, LLMSettings(model="openai/m", api_base="http://127.0.0.1:8080/v1")) == "json"
    assert answer_format(ExtractSettings(format="delimited"), LLMSettings(model="ollama/x")) == "delimited"
    assert answer_format(ExtractSettings(format="json"), LLMSettings(model="openai/m")) == "json"


def test_json_answers_through_the_stub_carry_the_schema_and_build_records(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path, '[extract]\nentity_types = ["person", "place"]\n')
    proc = index(docs, proj, stub)
    assert proc.returncode == 0, proc.stderr
    first = chats(stub)[0]
    schema = wants_schema(first)
    assert first["response_format"]["type"] == "json_schema"
    entity = schema["properties"]["entities"]["items"]["properties"]
    assert entity["type"]["enum"] == ["person", "place"]
    # a model that repeats rows fills its lists before the token cap: the object closes, nothing is cut
    items = schema["properties"]["entities"]["maxItems"] + schema["properties"]["relations"]["maxItems"]
    assert items >= 8 and items * ITEM_TOKENS + ANSWER_FRAME_TOKENS <= first["max_tokens"]
    assert "JSON object" in first["messages"][0]["content"]
    recs = extraction_lines(proj)
    assert [r["status"] for r in recs] == ["ok", "ok"] and all(len(r["entities"]) >= 5 for r in recs)
    assert summary(proc)["extract"]["dropped_rows"] == 0
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert "(JSON answers)" in status["built_with"]


def test_a_schema_files_types_are_the_enums_of_the_answer_schema(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path, n=1)
    schema_file = tmp_path / "schema.toml"
    schema_file.write_text('[entities.person]\ndescription = "A human being."\n[entities.place]\ndescription = "A '
                           'named place."\n[relations.lives_in]\ndescription = "Where a person lives."\n'
                           'patterns = [["person", "place"]]\n')
    proc = index(docs, proj, stub, "--schema", str(schema_file), "--max-gleanings", "0")
    assert proc.returncode == 0, proc.stderr
    schema = wants_schema(chats(stub)[0])
    assert schema["properties"]["entities"]["items"]["properties"]["type"]["enum"] == ["person", "place"]
    assert schema["properties"]["relations"]["items"]["properties"]["relation_type"]["enum"] == ["lives_in"]
    assert "lives_in" in chats(stub)[0]["messages"][0]["content"]


def test_delimited_format_sends_no_schema(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path, '[extract]\nformat = "delimited"\n')
    proc = index(docs, proj, stub)
    assert proc.returncode == 0, proc.stderr
    assert all("response_format" not in body for body in chats(stub))
    assert all(r["status"] == "ok" and len(r["entities"]) >= 5 for r in extraction_lines(proj))


def test_a_server_that_refuses_json_schema_gets_llama_cpp_pythons_form(stub, tmp_path: Path) -> None:
    stub.json_shapes = {"json_object"}
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 0, proc.stderr
    kinds = [body["response_format"]["type"] for body in chats(stub)]
    assert kinds == ["json_object", "json_object"]      # the refused request never reached the responder
    assert wants_schema(chats(stub)[0])["required"] == ["entities", "relations"]


def test_a_cut_json_answer_keeps_closed_items_and_is_continued(stub, tmp_path: Path) -> None:
    def respond(body: dict):
        if len(body["messages"]) > 2:       # the continuation round
            return {"entities": [{"name": "Calder Quarry", "type": "location", "description": "A quarry."}],
                    "relations": []}
        cut = ('{"entities": [{"name": "Mara Quint", "type": "person", "description": "Builder."}, '
               '{"name": "Selby Lighthouse", "type": "artifact", "descr')
        return StubReply(content=cut, finish_reason="length")

    stub.set_chat(respond)
    docs, proj = corpus(tmp_path, n=1)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 0, proc.stderr
    (rec,) = extraction_lines(proj)
    assert rec["status"] == "ok" and rec["continuations"] == 1 and rec["dropped"] == {"truncated": 1}
    # Mara Quint, Calder Quarry (the grounding check keeps both), and the candidate 1901 nobody rejected
    assert [e["name"] for e in rec["entities"]] == ["Mara Quint", "Calder Quarry", "1901"]
    assert "JSON object" in chats(stub)[1]["messages"][-1]["content"]


def test_gleaning_in_json_asks_for_more_and_reads_empty_lists_as_done(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path, "[extract]\nglean_min_tokens = 0\n", n=1)
    proc = index(docs, proj, stub, "--max-gleanings", "2")
    assert proc.returncode == 0, proc.stderr
    bodies = chats(stub)
    assert len(bodies) == 2 and is_gleaning(bodies[1]) and wants_schema(bodies[1]) is not None
    (rec,) = extraction_lines(proj)
    assert rec["status"] == "ok" and rec["gleaning_rounds"] == 1


def test_cached_answers_of_either_format_reparse_without_the_network(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path)
    assert index(docs, proj, stub, "--max-gleanings", "0").returncode == 0          # JSON answers
    (proj / "hrag.toml").write_text((proj / "hrag.toml").read_text() + '[extract]\nformat = "delimited"\n')
    sent = stub.count(CHAT)
    again = index(docs, proj, stub, "--max-gleanings", "0", "--reparse")
    assert again.returncode == 0, again.stderr
    assert stub.count(CHAT) == sent                   # the JSON answers were read back, nothing was sent
    assert summary(again)["extract"]["reparse_from_earlier"] == 2
    assert all(len(r["entities"]) >= 5 for r in extraction_lines(proj)[-2:])


def test_json_parser_reads_fences_bad_items_and_prose() -> None:
    fenced = '```json\n{"entities": [{"name": "A", "type": "person", "description": "x"}, "B"], "relations": []}\n```'
    result, truncated = parse_json_extraction(fenced, ["person"])
    assert [e.name for e in result.entities] == ["A"] and result.dropped == {"bad_item": 1} and result.complete
    prose, _ = parse_json_extraction("I could not find any entities.", ["person"])
    assert prose.dropped == {NOT_JSON: 1}
    rel = ('{"entities": [], "relations": [{"source": "A", "target": "A", "predicate": "is", "keywords": "",'
           ' "description": "", "strength": 3}, {"source": "A", "target": "B", "predicate": "knows",'
           ' "keywords": "k", "description": "d", "strength": 12}]}')
    got, _ = parse_json_extraction(rel, ["person"])
    assert got.dropped == {"self_relation": 1} and got.relations[0].strength == 10.0



def test_hints_show_the_rules_extractors_names_and_are_remembered(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path, '[extract]\nhints = "rules"\n', n=1)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 0, proc.stderr
    (first,) = chats(stub)
    user = first["messages"][-1]["content"]
    candidates = user.split("Candidates: ", 1)[1].split("\n", 1)[0].split("; ")
    assert "Mara Quint" in candidates and "Calder Quarry" in candidates
    assert user.index("Candidates: ") < user.index("Passage:")       # the passage stays last, as before
    assert "rule-based tagger" in first["messages"][0]["content"]
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert "shown the rules extractor's names" in status["built_with"]
    hinted = extraction_lines(proj)[0]["extractor"]
    # switching them off is another extraction: the chunk is asked again, without candidates
    (proj / "hrag.toml").write_text((proj / "hrag.toml").read_text().replace('"rules"', '"none"'))
    again = index(docs, proj, stub, "--max-gleanings", "0")
    assert again.returncode == 0, again.stderr
    assert len(chats(stub)) == 2 and "Candidates" not in json.dumps(chats(stub)[1]["messages"])
    assert extraction_lines(proj)[-1]["extractor"] != hinted
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert "names" not in status["built_with"]


def test_a_project_remembered_without_hints_keeps_extracting_without_them() -> None:
    from hrag_cli.core.config import load_settings

    assert load_settings(None).extract.hints == "rules"
    older = {"extract.extractor": "llm", "llm.model": "openai/m"}
    assert load_settings(None, remembered=older).extract.hints == "none"
    assert load_settings(None, remembered={**older, "extract.hints": "rules"}).extract.hints == "rules"
    assert load_settings(None, {"extract.hints": "rules"}, remembered=older).extract.hints == "rules"


def test_an_unknown_hint_source_is_a_usage_error(stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, '[extract]\nhints = "gazetteer"\n', n=1)
    proc = index(docs, proj, stub)
    assert proc.returncode == 2 and "[extract] hints takes rules, none" in proc.stderr
    assert stub.count(CHAT) == 0


def correcting(fmt: str):
    """A model given the candidates Mara Quint, 1901 and Calder Quarry: lists Mara Quint and Calder Quarry (with
    a type of its own), adds Selby Lighthouse, and leaves 1901 out."""
    ents = [("Mara Quint", "person", "builder of the lighthouse"),
            ("Selby Lighthouse", "artifact", "lighthouse built for the Harbour Trust"),
            ("Calder Quarry", "location", "quarry the stone came from")]

    def respond(body: dict):
        if is_gleaning(body):
            return {"entities": [], "relations": []} if fmt == "json" else "<|COMPLETE|>"
        if fmt == "json":
            return {"entities": [{"name": n, "type": t, "description": d} for n, t, d in ents],
                    "relations": [{"source": "Mara Quint", "predicate": "built", "target": "Selby Lighthouse"}]}
        return "\n".join([*(f"entity<|#|>{n}<|#|>{t}<|#|>{d}" for n, t, d in ents),
                          "relation<|#|>Mara Quint<|#|>Selby Lighthouse<|#|>built<|#|>building<|#|>she built it"
                          "<|#|>8", "<|COMPLETE|>"])
    return respond


def test_candidates_the_model_leaves_out_stay_in_either_format(stub, tmp_path: Path) -> None:
    for fmt in ("json", "delimited"):
        stub.set_chat(correcting(fmt))
        (tmp_path / fmt).mkdir()
        docs, proj = corpus(tmp_path / fmt, f'[extract]\nformat = "{fmt}"\nhints = "rules"\n', n=1)
        proc = index(docs, proj, stub, "--max-gleanings", "0")
        assert proc.returncode == 0, proc.stderr
        body = chats(stub)[-1]
        assert (wants_schema(body) is None) == (fmt == "delimited")
        assert "kept beside your entities" in body["messages"][0]["content"]
        (rec,) = extraction_lines(proj)
        got = {e["name"]: e["type"] for e in rec["entities"]}
        # 1901: a candidate the model left out, kept with the rules extractor's type; the model's own type wins
        # for one it listed (Calder Quarry: the rules say person)
        assert got == {"Mara Quint": "person", "Selby Lighthouse": "artifact", "Calder Quarry": "location",
                       "1901": "date"}, got
        assert rec["status"] == "ok" and rec["dropped_rows"] == 0
        # re-parsing the cached answers rebuilds the same record without the network
        sent = stub.count(CHAT)
        again = index(docs, proj, stub, "--max-gleanings", "0", "--reparse")
        assert again.returncode == 0, again.stderr
        assert stub.count(CHAT) == sent and extraction_lines(proj)[-1]["entities"] == rec["entities"]


def test_a_candidate_inside_a_longer_name_of_the_model_or_its_alias_is_not_added() -> None:
    from hrag_cli.core.records import ExtractedEntity
    from hrag_cli.extract.candidates import keep_candidates
    from hrag_cli.extract.parser import ParseResult

    def ent(name: str, aliases: tuple[str, ...] = ()) -> ExtractedEntity:
        return ExtractedEntity(name, "location", "", list(aliases))

    said = ParseResult(entities=[ent("Lakeland, Florida"), ent("Irmãos Faria", ("Faria Brothers",))])
    cands = [ent("Lakeland"), ent("faria brothers"), ent("Land"), ent("Florida Keys")]
    kept = keep_candidates(said, cands)
    # "Land" is no whole word of "Lakeland": it stays, as does a name that only overlaps
    assert [e.name for e in kept.entities] == ["Lakeland, Florida", "Irmãos Faria", "Land", "Florida Keys"]
    assert keep_candidates(said, None) is said
    assert keep_candidates(ParseResult(), cands).entities == []     # an answer with no row kept nothing
