"""The offline rules extractor on a few sentences: names, types, dates, quantities, relations."""

from __future__ import annotations

from pathlib import Path

from hrag_cli.extract.rules import RULES_FINGERPRINT, extract_rules


def ents(text: str) -> dict[str, str]:
    return {e.name: e.type for e in extract_rules("c", text).entities}


def rels(text: str) -> dict[tuple[str, str], str]:
    return {(r.src, r.tgt): r.predicate for r in extract_rules("c", text).relations}


def test_multi_word_names_keep_connectors_and_get_types() -> None:
    e = ents("In 1921 the Bank of Ellery lent money to the Harrowgate Institute in Port Ellery.")
    assert e["Bank of Ellery"] == "organization"
    assert e["Harrowgate Institute"] == "organization"
    assert e["Port Ellery"] == "location"
    assert e["1921"] == "date"
    assert "In" not in e and "The" not in e


def test_sentence_initial_common_words_are_not_entities() -> None:
    e = ents("The bridge opened. After the flood, Marisol Venkat measured the Tessaly River. "
             "Crowds gathered on the quay. However, nobody came.")
    assert set(e) == {"Marisol Venkat", "Tessaly River"}
    assert e["Marisol Venkat"] == "person" and e["Tessaly River"] == "location"


def test_initial_word_confirmed_elsewhere_and_surnames_and_titles() -> None:
    e = ents("Gullhaven is a village. Boats sail to Gullhaven daily. Ruth Calloway led the strike. "
             "Calloway spoke at every meeting. Mrs Calloway told the crowd to wait.")
    # "Calloway" and "Mrs Calloway" are the Ruth Calloway named earlier; "to Gullhaven" makes it a place
    assert e == {"Gullhaven": "location", "Ruth Calloway": "person"}


def test_dates_quantities_and_acronyms() -> None:
    e = ents("Łukasz Brandt (8 May 1936 – 19 February 2014) designed a span of 14 km for the Port Ellery "
             "Salt Company (PESC) in March 1987, carrying 3,200 tonnes a day, at a cost of £4.2 million.")
    assert e["8 May 1936"] == "date" and e["19 February 2014"] == "date" and e["March 1987"] == "date"
    assert e["14 km"] == "quantity" and e["3,200 tonnes"] == "quantity" and e["£4.2 million"] == "quantity"
    assert e["PESC"] == "organization" and e["Port Ellery Salt Company"] == "organization"
    assert e["Łukasz Brandt"] == "person"
    r = rels("The Port Ellery Salt Company (PESC) employed 700 workers.")
    assert r[("Port Ellery Salt Company", "PESC")] == "also known as"


def test_relations_use_the_connecting_phrase() -> None:
    r = rels("Łukasz Brandt joined Corvane Works in 1958. Zoë Almqvist married Łukasz Brandt in Sankt Orrin.")
    assert r[("Łukasz Brandt", "Corvane Works")] == "joined"
    assert r[("Corvane Works", "1958")] == "in"
    assert r[("Zoë Almqvist", "Łukasz Brandt")] == "married"
    assert r[("Zoë Almqvist", "Sankt Orrin")] == "in"
    assert not any({"Corvane Works", "Sankt Orrin"} == set(pair) for pair in r)   # never across sentences
    rec = extract_rules("c", "Marisol Venkat taught hydraulics at the University of Miravel for many long "
                             "and productive years before she retired to Kestrel Island.")
    by_pair = {(x.src, x.tgt): x for x in rec.relations}
    rel = by_pair[("University of Miravel", "Kestrel Island")]
    assert len(rel.predicate.split()) <= 6 and rel.predicate.endswith("retired to")
    assert "retired" in rel.keywords
    assert rel.description.startswith("Marisol Venkat taught")
    assert by_pair[("Marisol Venkat", "Kestrel Island")].strength < 1.0


def test_entity_description_is_the_first_sentence_mentioning_it() -> None:
    rec = extract_rules("c", "Miravel lies on a river. The Tessaly Bridge crosses it at Miravel.\n\n"
                             "# Heading Of A Section\n- **Ferry:** boats leave Miravel hourly.")
    d = {e.name: e.description for e in rec.entities}
    assert d["Tessaly Bridge"] == "The Tessaly Bridge crosses it at Miravel."
    assert d["Miravel"] == "The Tessaly Bridge crosses it at Miravel." or d["Miravel"] == "Miravel lies on a river."
    assert "Heading Of A Section" not in d and "Ferry" not in d
    assert rec.extractor == RULES_FINGERPRINT and rec.status == "ok"


def test_deterministic_and_robust() -> None:
    corpus = Path(__file__).resolve().parent.parent / "sample_corpus"
    texts = [p.read_text(encoding="utf-8") for p in sorted(corpus.rglob("*.txt"))]
    assert [extract_rules("c", t).to_json() for t in texts] == [extract_rules("c", t).to_json() for t in texts]
    empty = extract_rules("c", "")
    assert empty.entities == [] and empty.relations == []
    weird = extract_rules("c", "((( ))) ### --- 12 ... A. B. C. ŁŁŁ \x00 \ufffd")
    assert weird.status == "ok"


def test_titles_regnal_names_works_and_awards_get_types() -> None:
    """Names the rules once typed unknown (most of the UNKNOWN entities of a 2Wiki build)."""
    e = ents('Archduke Leopold Salvator married Maria of Nassau. Maximilian I of Mexico died in 1867. '
             'The band released the album "Prisoner" and won the Golden Globe Award for Best Actor. '
             'She studied at the London College of Printing.')
    assert e["Archduke Leopold Salvator"] == "person" and e["Maria of Nassau"] == "person"
    assert e["Maximilian I of Mexico"] == "person"
    assert e["Prisoner"] == "work" and e["Golden Globe Award for Best Actor"] == "award"
    assert e["London College of Printing"] == "organization"


def test_life_dates_and_nationality_adjectives_get_types() -> None:
    """The cues after a name: a birth or death date makes a person, a lone word used as an adjective before a
    lowercase word (a demonym's ending, or after "a"/"an") a nationality; a lone name with no cue stays unknown."""
    e = ents("The queen Jewapa (died 11 November 875) ruled. Kerrigan Vale( born 3 May 1950) is an American film "
             "director. It was a British crime film. Bihoz is a Niki professional club. They played for Bihoz.")
    assert e["Jewapa"] == "person" and e["Kerrigan Vale"] == "person"
    assert e["American"] == "nationality" and e["British"] == "nationality" and e["Niki"] == "nationality"
    assert e["Bihoz"] == "unknown"


def test_forked_map_yields_every_result_in_order(monkeypatch) -> None:
    from hrag_cli.core.forkpool import forked_map

    monkeypatch.setattr("os.cpu_count", lambda: 2)       # forked workers even on a one-core machine

    assert list(forked_map(pow, 3, iter(range(37)))) == [3 ** i for i in range(37)]    # a stream of tasks
    assert list(forked_map(pow, 3, [])) == []


def test_rules_extract_in_forked_workers_writes_what_one_process_writes(tmp_path: Path, monkeypatch) -> None:
    """Records come back from the workers in chunk order: the cache is byte for byte the in-process one."""
    from hrag_cli.extract import stage
    from hrag_cli.pipeline import IndexOptions, run_index
    from hrag_cli.core.progress import Reporter
    from hrag_cli.core.project import ProjectDir

    corpus = Path(__file__).resolve().parent.parent / "sample_corpus"
    caches = []
    for parallel_min in (1 << 30, 1):               # in this process; then forked, 2 chunks per job
        monkeypatch.setattr(stage, "RULES_PARALLEL_MIN", parallel_min)
        monkeypatch.setattr(stage, "RULES_BATCH", 2)
        proj = ProjectDir(tmp_path / f"p{parallel_min}")
        proj.init()
        run_index(proj, proj.settings(), Reporter("quiet"), IndexOptions(docs=[corpus], stop_after="extract"))
        caches.append(proj.extractions_path.read_bytes())
    assert caches[0] == caches[1] and caches[0].count(b"\n") > 4
