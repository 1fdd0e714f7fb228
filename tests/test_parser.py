"""Parser tests: clean formats, a table of malformed model outputs, gleaning merges and a no-raise fuzz loop."""

from __future__ import annotations

import random
import signal
import time

import pytest

from hrag_cli.extract.checks import check_extraction
from hrag_cli.extract.parser import ParseResult, merge_gleaning, parse_extraction
from hrag_cli.extract.prompts import (
    COMPLETION_MARKER, DEFAULT_ENTITY_TYPES, FIELD_DELIMITER, PROMPT_VERSION, build_answer_messages,
    build_extraction_messages, build_gleaning_message, build_keywords_messages, build_summary_messages,
    worked_example)
from hrag_cli.core.records import ExtractedEntity, ExtractedRelation

D = "<|#|>"


def ents(res: ParseResult) -> list[tuple[str, str]]:
    return [(e.name, e.type) for e in res.entities]


def rels(res: ParseResult) -> list[tuple[str, str, str, float]]:
    return [(r.src, r.tgt, r.predicate, r.strength) for r in res.relations]


# --------------------------------------------------------------------------------------------- clean formats


def test_our_format_clean() -> None:
    text = "\n".join(
        [
            f"entity{D}Ada Lovelace{D}person{D}Mathematician who wrote about the Analytical Engine.",
            f"entity{D}Analytical Engine{D}artifact{D}A proposed mechanical computer.",
            f"relation{D}Ada Lovelace{D}Analytical Engine{D}wrote notes on{D}computing, mathematics{D}"
            f"She published notes on the engine.{D}9",
            "<|COMPLETE|>",
        ]
    )
    res = parse_extraction(text)
    assert res.complete and res.dropped == {}
    assert res.entities == [
        ExtractedEntity("Ada Lovelace", "person", "Mathematician who wrote about the Analytical Engine."),
        ExtractedEntity("Analytical Engine", "artifact", "A proposed mechanical computer."),
    ]
    assert res.relations == [
        ExtractedRelation(
            "Ada Lovelace",
            "Analytical Engine",
            "wrote notes on",
            ["computing", "mathematics"],
            "She published notes on the engine.",
            9.0,
        )
    ]


def test_lightrag_format_clean() -> None:
    text = "\n".join(
        [
            f"entity{D}Tesla{D}organization{D}Car maker.",
            f"entity{D}Elon Musk{D}person{D}Its CEO.",
            f"relation{D}Elon Musk{D}Tesla{D}leadership, management{D}Musk runs Tesla.",
            "<|COMPLETE|>",
        ]
    )
    res = parse_extraction(text)
    assert res.complete and res.dropped == {}
    assert ents(res) == [("Tesla", "organization"), ("Elon Musk", "person")]
    assert res.relations == [
        ExtractedRelation("Elon Musk", "Tesla", "leadership", ["leadership", "management"], "Musk runs Tesla.", 1.0)
    ]


def test_lightrag_legacy_tuples() -> None:
    text = (
        '("entity"<|>"ALEX"<|>"PERSON"<|>"Alex is a scientist.")##\n'
        '("entity"<|>"TAYLOR"<|>"PERSON"<|>"Taylor leads the team.")##\n'
        '("relationship"<|>"ALEX"<|>"TAYLOR"<|>"Alex reports to Taylor."<|>"hierarchy, teamwork"<|>7)##\n'
        '("content_keywords"<|>"science, teamwork")<|COMPLETE|>'
    )
    res = parse_extraction(text)
    assert res.complete and res.dropped == {}
    assert ents(res) == [("ALEX", "person"), ("TAYLOR", "person")]
    assert res.relations == [
        ExtractedRelation("ALEX", "TAYLOR", "hierarchy", ["hierarchy", "teamwork"], "Alex reports to Taylor.", 7.0)
    ]


def test_prompt_example_round_trips() -> None:
    """The worked example inside our own prompt must parse cleanly (it is what models imitate)."""
    system = build_extraction_messages("x", DEFAULT_ENTITY_TYPES)[0]["content"]
    example = system.split("Output:\n", 1)[1]
    res = parse_extraction(example)
    assert res.complete and res.dropped == {}
    assert len(res.entities) == 7 and len(res.relations) == 6
    assert all(r.strength >= 5 for r in res.relations)
    assert {e.type for e in res.entities} <= set(DEFAULT_ENTITY_TYPES)


# --------------------------------------------------------------------------------------------- malformed table

E = list[tuple[str, str]]
R = list[tuple[str, str, str, float]]

CASES: list[tuple[str, str, E, R, dict[str, int]]] = [
    # id, model output, expected (name, type), expected (src, tgt, predicate, strength), dropped
    ("legacy_delim", f"entity<|>A<|>person<|>d\nrelation<|>A<|>B<|>met<|>k<|>d<|>5", [("A", "person")], [("A", "B", "met", 5.0)], {}),
    ("double_bar", "entity<||>A<||>person<||>d", [("A", "person")], [], {}),
    ("missing_close_bar", "entity<|#>A<|#>place<|#>d", [("A", "place")], [], {}),
    ("missing_open_bar", "entity<#|>A<#|>place<#|>d", [("A", "place")], [], {}),
    ("bare_bars", "entity|#|A|#|person|#|d", [("A", "person")], [], {}),
    ("double_hash", "entity<|##|>A<|##|>person<|##|>d", [("A", "person")], [], {}),
    ("spaced_delim", "entity < | # | > A < | # | > person < | # | > d", [("A", "person")], [], {}),
    ("fullwidth_bars", "entity<｜#｜>A<｜#｜>person<｜#｜>d\n<｜COMPLETE｜>", [("A", "person")], [], {}),
    ("trailing_open_delim", f"entity{D}A{D}person{D}d<|#|\nentity{D}B{D}person{D}e<|#|", [("A", "person"), ("B", "person")], [], {}),
    ("hash_record_sep", f"entity{D}A{D}person{D}d##entity{D}B{D}org{D}e##relation{D}A{D}B{D}works at{D}job{D}x{D}6##",
     [("A", "person"), ("B", "org")], [("A", "B", "works at", 6.0)], {}),
    ("rows_in_parens_and_quotes", f'("entity"{D}"A"{D}"person"{D}"desc")\n("relation"{D}"A"{D}"B"{D}"knows"{D}"k"{D}"d"{D}"4")',
     [("A", "person")], [("A", "B", "knows", 4.0)], {}),
    ("row_wrapped_in_quotes", f'"entity{D}A{D}person{D}desc"', [("A", "person")], [], {}),
    ("glued_rows", f"entity{D}A{D}person{D}first desc entity{D}B{D}place{D}second desc relation{D}A{D}B{D}visited{D}travel{D}went{D}3",
     [("A", "person"), ("B", "place")], [("A", "B", "visited", 3.0)], {}),
    ("glued_rows_with_delim", f"entity{D}A{D}person{D}d{D}entity{D}B{D}person{D}e", [("A", "person"), ("B", "person")], [], {}),
    ("type_called_entity_not_split", f"entity{D}Acme{D}entity{D}A legal entity.", [("Acme", "entity")], [], {}),
    ("code_fence", f"```\nentity{D}A{D}person{D}d\n```", [("A", "person")], [], {}),
    ("code_fence_lang", f"```text\nentity{D}A{D}person{D}d\n<|COMPLETE|>\n```", [("A", "person")], [], {}),
    ("no_completion_marker", f"entity{D}A{D}person{D}d\nrelation{D}A{D}B{D}owns{D}k{D}d{D}2", [("A", "person")], [("A", "B", "owns", 2.0)], {}),
    ("keyword_variants", f"Entity{D}A{D}person{D}d\nENTITY{D}B{D}person{D}d\nrelationship{D}A{D}B{D}likes{D}k{D}d{D}5\nrel{D}B{D}A{D}ignores{D}k{D}d{D}5",
     [("A", "person"), ("B", "person")], [("A", "B", "likes", 5.0), ("B", "A", "ignores", 5.0)], {}),
    ("bullets_and_numbers", f"- entity{D}A{D}person{D}d\n1. entity{D}B{D}person{D}d\n2) relation{D}A{D}B{D}met{D}k{D}d{D}8\n* entity{D}C{D}place{D}d",
     [("A", "person"), ("B", "person"), ("C", "place")], [("A", "B", "met", 8.0)], {}),
    ("headers_and_prose_ignored", f"Here are the entities:\n## Entities\n\nentity{D}A{D}person{D}d\n\n### Relationships\nrelation{D}A{D}B{D}met{D}k{D}d{D}8\nI hope this helps!",
     [("A", "person")], [("A", "B", "met", 8.0)], {}),
    ("entity_extra_fields", f"entity{D}A{D}person{D}first part{D}second part", [("A", "person")], [], {}),
    ("relation_extra_fields_numeric_last", f"relation{D}A{D}B{D}founded{D}k{D}part one{D}part two{D}9", [], [("A", "B", "founded", 9.0)], {}),
    ("entity_no_description", f"entity{D}A{D}person", [("A", "person")], [], {}),
    ("entity_name_only", f"entity{D}A", [], [], {"name_only": 1}),
    ("relation_src_tgt_only", f"relation{D}A{D}B", [], [("A", "B", "related to", 1.0)], {}),
    ("relation_predicate_and_strength_only", f"relation{D}A{D}B{D}married{D}7", [], [("A", "B", "married", 7.0)], {}),
    ("entity_no_name", f"entity{D}{D}person{D}d\nentity{D}\nentity{D}  \"\" {D}person", [], [], {"no_name": 3}),
    ("relation_missing_target", f"relation{D}A\nrelation{D}{D}B{D}x{D}k{D}d{D}5", [], [], {"missing_endpoint": 2}),
    ("self_loop", f"relation{D}Acme Corp{D}acme  corp{D}is{D}k{D}d{D}5\nrelation{D}A{D}B{D}is{D}k{D}d{D}5", [], [("A", "B", "is", 5.0)], {"self_relation": 1}),
    ("strength_not_number", f"relation{D}A{D}B{D}met{D}k{D}d{D}high", [], [("A", "B", "met", 1.0)], {}),
    ("strength_clamped_high", f"relation{D}A{D}B{D}met{D}k{D}d{D}42", [], [("A", "B", "met", 10.0)], {}),
    ("strength_clamped_low", f"relation{D}A{D}B{D}met{D}k{D}d{D}-3", [], [("A", "B", "met", 0.0)], {}),
    ("strength_out_of_ten", f"relation{D}A{D}B{D}met{D}k{D}d{D}8/10", [], [("A", "B", "met", 8.0)], {}),
    ("type_normalised", f"entity{D}A{D}Research Institute{D}d\nentity{D}B{D}{D}d\nentity{D}C{D}**PERSON**{D}d",
     [("A", "research_institute"), ("B", "unknown"), ("C", "person")], [], {}),
    ("names_cleaned", f'entity{D}"**Marie  Curie**"{D}person{D}d\nentity{D}[Paris]{D}place{D}d\nentity{D}_Radium_{D}concept{D}d\n'
     f"relation{D}'Marie Curie'{D}(Paris){D}lived in{D}k{D}d{D}6",
     [("Marie Curie", "person"), ("Paris", "place"), ("Radium", "concept")], [("Marie Curie", "Paris", "lived in", 6.0)], {}),
    ("name_parenthetical_kept", f"entity{D}Mercury (planet){D}location{D}d", [("Mercury (planet)", "location")], [], {}),
    ("duplicate_entity_longer_desc_wins", f"entity{D}Acme{D}organization{D}short\nentity{D}ACME{D}organization{D}a much longer description",
     [("Acme", "organization")], [], {}),
    ("duplicate_relation", f"relation{D}A{D}B{D}founded{D}k{D}d{D}5\nrelation{D}a{D}b{D}Founded{D}k2{D}longer d{D}8", [], [("A", "B", "founded", 8.0)], {}),
    ("complete_marker_variants", f"entity{D}A{D}person{D}d\n<COMPLETE>", [("A", "person")], [], {}),
    ("complete_marker_bars_lower", f"entity{D}A{D}person{D}d\n|complete|", [("A", "person")], [], {}),
    ("content_keywords_ignored", f"content_keywords{D}a, b, c\nentity{D}A{D}person{D}d", [("A", "person")], [], {}),
    ("template_echo_ignored", f"entity{D}NAME{D}TYPE{D}DESCRIPTION\nrelation{D}SOURCE{D}TARGET{D}PREDICATE{D}K{D}D{D}S\nentity{D}A{D}person{D}d",
     [("A", "person")], [], {}),
    ("legacy_no_sep_newlines", '("entity"<|>"A"<|>"ORG"<|>"d")\n("relationship"<|>"A"<|>"B"<|>"A supplies B with parts."<|>"supply, trade"<|>6)',
     [("A", "org")], [("A", "B", "supply", 6.0)], {}),
    ("lightrag_keywords_desc_swapped", f"relation{D}A{D}B{D}A sold its shares to B in a long deal.{D}finance, sale", [], [("A", "B", "finance", 1.0)], {}),
    ("semicolon_keywords", f"relation{D}A{D}B{D}acquired{D}merger; finance;  merger ;{D}d{D}7", [], [("A", "B", "acquired", 7.0)], {}),
    ("prefix_prose_before_row", f"Output: entity{D}A{D}person{D}d", [("A", "person")], [], {}),
    ("bold_keyword", f"**entity**{D}A{D}person{D}d", [("A", "person")], [], {}),
    ("inline_fence", f"```entity{D}A{D}person{D}d```", [("A", "person")], [], {}),
    ("ours_without_strength", f"relation{D}A{D}B{D}founded{D}k{D}d", [], [("A", "B", "founded", 1.0)], {}),
    ("relation_sentence_only", f"relation{D}A{D}B{D}A and B worked together for many years.", [], [("A", "B", "related to", 1.0)], {}),
    ("entity_type_slot_sentence", f"entity{D}A{D}a small company based in Lyon", [("A", "unknown")], [], {}),
    ("strength_labelled_float", f"relation{D}A{D}B{D}met{D}k{D}d{D}strength: 7.5", [], [("A", "B", "met", 7.5)], {}),
    ("numeric_target_short_row", f"relation{D}Acme{D}1990", [], [("Acme", "1990", "related to", 1.0)], {}),
    ("unknown_row_keyword_counted", f"node{D}A{D}person{D}d\nedge{D}A{D}B\nnote{D}x", [], [], {"unknown_record": 2}),
    ("unicode_names", f"entity{D}東京{D}location{D}日本の首都\nentity{D}Zürich{D}Location{D}d", [("東京", "location"), ("Zürich", "location")], [], {}),
    ("empty_output", "", [], [], {}),
    ("only_prose", "I could not find any entities in this text.", [], [], {}),
    ("crlf_lines", f"entity{D}A{D}person{D}d\r\nentity{D}B{D}person{D}d\r\n<|COMPLETE|>\r\n", [("A", "person"), ("B", "person")], [], {}),
]


@pytest.mark.parametrize("text,exp_ents,exp_rels,exp_dropped", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed(text: str, exp_ents: E, exp_rels: R, exp_dropped: dict[str, int]) -> None:
    res = parse_extraction(text)
    assert ents(res) == exp_ents
    assert rels(res) == exp_rels
    assert res.dropped == exp_dropped


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


# ---------------------------------------------------------------------------------------- models' row defects
# Each defect class seen in real model answers, with its examples and variants of our own; exact records out:
# (name, type, description) and (src, tgt, predicate, keywords, description, strength), plus drops by reason.

FullE = list[tuple[str, str, str]]
FullR = list[tuple[str, str, str, list[str], str, float]]

DEFECTS: list[tuple[str, str, FullE, FullR, dict[str, int]]] = [
    # 1 keyword at the end of a field
    ("kw_in_field_issue_v2", f"relation{D}Norwell{D}Tarsis Labs{D}business relationship{D}Norwell is a research entity inside Tarsis Labs.",
     [],
     [('Norwell', 'Tarsis Labs', 'business relationship', ['business relationship'], 'Norwell is a research entity inside Tarsis Labs.', 1.0)],
     {}),
    ("kw_in_field_issue_v1", '("relationship"<|>"Acme"<|>"Acme Holdings"<|>"Acme is a subsidiary entity"<|>"ownership"<|>8)##',
     [],
     [('Acme', 'Acme Holdings', 'ownership', ['ownership'], 'Acme is a subsidiary entity', 8.0)],
     {}),
    ("kw_in_field_entities", f"relation{D}Orla Fenn{D}Vext Council{D}advisory, member entities{D}Orla Fenn advises the Vext Council.{D}6",
     [],
     [('Orla Fenn', 'Vext Council', 'advisory', ['advisory', 'member entities'], 'Orla Fenn advises the Vext Council.', 6.0)],
     {}),
    ("kw_in_field_rel", f"entity{D}Brook Rel{D}person{D}Engineer.\nrelation{D}Brook Rel{D}Lumen Yard{D}works at{D}employment, work rel{D}Brook works at Lumen Yard.{D}7",
     [('Brook Rel', 'person', 'Engineer.')],
     [('Brook Rel', 'Lumen Yard', 'works at', ['employment', 'work rel'], 'Brook works at Lumen Yard.', 7.0)],
     {}),
    ("kw_in_field_relations", '("relationship"<|>"Kaya"<|>"Dorn Press"<|>"Kaya handles public relations"<|>"media"<|>5)##',
     [],
     [('Kaya', 'Dorn Press', 'media', ['media'], 'Kaya handles public relations', 5.0)],
     {}),
    # 2 bare |>
    ("bare_close_issue", '("entity"<|>"SEO"|>"category"|>"A practice.")##',
     [('SEO', 'category', 'A practice.')],
     [],
     {}),
    ("bare_close_relation", '("relationship"<|>"Mira"|>"Osk Lab"|>"Mira runs Osk Lab."|>"leadership"|>9)##',
     [],
     [('Mira', 'Osk Lab', 'leadership', ['leadership'], 'Mira runs Osk Lab.', 9.0)],
     {}),
    ("bare_close_v2", f"entity|>Tallow Inn|>location|>An inn by the river.",
     [('Tallow Inn', 'location', 'An inn by the river.')],
     [],
     {}),
    ("bare_close_code_pipe_kept", f"entity{D}Elixir{D}concept{D}Chains calls as x |> f |> g.",
     [('Elixir', 'concept', 'Chains calls as x |> f |> g.')],
     [],
     {}),
    # 3 v2 delimiter mutations
    ("mut_bracket_issue", f"relation<[#|>A Co{D}B Co{D}supply{D}A Co supplies B Co.",
     [],
     [('A Co', 'B Co', 'supply', ['supply'], 'A Co supplies B Co.', 1.0)],
     {}),
    ("mut_star_issue", f"entity{D}EV{D}artifact<|*|>An electric vehicle.",
     [('EV', 'artifact', 'An electric vehicle.')],
     [],
     {}),
    ("mut_brace", f"entity<{{#|>Harl Pike{D}person<|#]>A ferry captain.",
     [('Harl Pike', 'person', 'A ferry captain.')],
     [],
     {}),
    ("mut_star_v1", '("entity"<|*|>"Nessa Vale"<|*|>"person"<|*|>"A painter.")##',
     [('Nessa Vale', 'person', 'A painter.')],
     [],
     {}),
    ("mut_unreadable_counted", "relation<~~>A<~~>B<~~>k<~~>d\nentity<{@}>C<{@}>person<{@}>d",
     [],
     [],
     {'unreadable_row': 2}),
    # 4 ## inside the closing paren
    ("hash_in_paren_issue", '("entity"<|>"Brightly"<|>"organization"<|>"Sells lamps."##)',
     [('Brightly', 'organization', 'Sells lamps.')],
     [],
     {}),
    ("hash_in_paren_unquoted", "(entity<|>Brightly<|>organization<|>Sells lamps.##)",
     [('Brightly', 'organization', 'Sells lamps.')],
     [],
     {}),
    ("hash_in_paren_relation", '("relationship"<|>"Brightly"<|>"Lumo"<|>"Brightly buys glass from Lumo."<|>"supply"<|>6##)',
     [],
     [('Brightly', 'Lumo', 'supply', ['supply'], 'Brightly buys glass from Lumo.', 6.0)],
     {}),
    ("hash_paren_spaced", '("entity"<|>"Gale Hart"<|>"person"<|>"A sailor." ## )',
     [('Gale Hart', 'person', 'A sailor.')],
     [],
     {}),
    # 5 names keep punctuation
    ("names_issue", f"entity{D}(*){D}artifact{D}An album.\nentity{D}(1){D}artifact{D}A song.\nentity{D}Only My Heart Talkin'{D}artifact{D}A song.\nentity{D}6'11\"{D}quantity{D}A height.\nentity{D}*NSYNC{D}organization{D}A band.",
     [('(*)', 'artifact', 'An album.'), ('(1)', 'artifact', 'A song.'), ("Only My Heart Talkin'", 'artifact', 'A song.'), ('6\'11"', 'quantity', 'A height.'), ('*NSYNC', 'organization', 'A band.')],
     [],
     {}),
    ("names_quoted_keep_inner", f"entity{D}\"Rock 'n' Roll\"{D}concept{D}A genre.\nentity{D}'Allo 'Allo!{D}artifact{D}A sitcom.\nentity{D}**C++**{D}concept{D}A language.",
     [("Rock 'n' Roll", 'concept', 'A genre.'), ("'Allo 'Allo!", 'artifact', 'A sitcom.'), ('C++', 'concept', 'A language.')],
     [],
     {}),
    ("names_relation_punct", f"entity{D}(*){D}artifact{D}An album.\nentity{D}*NSYNC{D}organization{D}A band.\nrelation{D}*NSYNC{D}(*){D}recorded{D}music{D}*NSYNC recorded (*).{D}8",
     [('(*)', 'artifact', 'An album.'), ('*NSYNC', 'organization', 'A band.')],
     [('*NSYNC', '(*)', 'recorded', ['music'], '*NSYNC recorded (*).', 8.0)],
     {}),
    ("names_wrapping_still_removed", f"entity{D}[Oslo]{D}location{D}A city.\nentity{D}\"Talkin'\"{D}artifact{D}A song.\nentity{D}`Kade`{D}person{D}A man.",
     [('Oslo', 'location', 'A city.'), ("Talkin'", 'artifact', 'A song.'), ('Kade', 'person', 'A man.')],
     [],
     {}),
    # 6 type-keyword rows
    ("type_kw_issue_v2", f"event{D}Spring Fair{D}online event{D}A fair held online.",
     [('Spring Fair', 'event', 'A fair held online.')],
     [],
     {}),
    ("type_kw_issue_v1", '("event"<|>"Free Return Week"<|>"event"<|>"A week of free returns.")##',
     [('Free Return Week', 'event', 'A week of free returns.')],
     [],
     {}),
    ("type_kw_person", f"person{D}Ilse Mohr{D}person{D}A chemist.\nlocation{D}Tarn{D}A lake town in the hills.",
     [('Ilse Mohr', 'person', 'A chemist.'), ('Tarn', 'location', 'A lake town in the hills.')],
     [],
     {}),
    ("type_kw_bullet", f"1. organization{D}Vell Corp{D}company{D}A maker of valves.",
     [('Vell Corp', 'organization', 'A maker of valves.')],
     [],
     {}),
    ("type_kw_custom_type_unknown_counted", f"gadget{D}Zed Phone{D}gadget{D}A phone.",
     [],
     [],
     {'unknown_record': 1}),
    # 7 template header
    ("header_issue", f"entity{D}EntityName{D}EntityType{D}Description\nentity{D}Ona{D}person{D}A pilot.",
     [('Ona', 'person', 'A pilot.')],
     [],
     {}),
    ("header_no_kw", f"entity_name{D}entity_type{D}entity_description\nrelation{D}source_entity{D}target_entity{D}relationship_keywords{D}relationship_description",
     [],
     [],
     {}),
    ("header_placeholders", f"entity{D}<entity_name>{D}<entity_type>{D}<description>\nentity{D}Target{D}organization{D}A retailer.",
     [('Target', 'organization', 'A retailer.')],
     [],
     {}),
    # 8 debris around fields
    ("debris_issue", '("relationship"<|>"Help Desk"<|>"Refund Portal"<|>"Lets users ask for refunds.")<|>"platform"<|>9)##',
     [],
     [('Help Desk', 'Refund Portal', 'platform', ['platform'], 'Lets users ask for refunds.', 9.0)],
     {}),
    ("debris_pipe", f'entity{D}Rowan{D}person{D}"A baker."|',
     [('Rowan', 'person', 'A baker.')],
     [],
     {}),
    ("debris_lt", f'entity{D}Rowan{D}person{D}"A baker."<',
     [('Rowan', 'person', 'A baker.')],
     [],
     {}),
    ("debris_hash_field_sep", '("entity"<|>"Quill"<|>"organization"##"A publisher.")',
     [('Quill', 'organization', 'A publisher.')],
     [],
     {}),
    ("debris_hash_field_sep_single", "('entity'<|>'Quill'<|>'organization' ## 'A publisher.')",
     [('Quill', 'organization', 'A publisher.')],
     [],
     {}),
    ("debris_unquoted_trailing", f'entity{D}Rowan{D}person{D}A baker."|',
     [('Rowan', 'person', 'A baker.')],
     [],
     {}),
    # 9 (linear time: separate test) -- 10 long names
    ("long_name_entity", f"entity{D}{'QUJD' * 100}{D}artifact{D}A blob.\nentity{D}Ok{D}person{D}Fine.",
     [('Ok', 'person', 'Fine.')],
     [],
     {'name_too_long': 1}),
    ("long_name_v1_base64", '("entity"<|>"' + "QUJD" * 70 + '=="<|>"artifact"<|>"A blob.")##',
     [],
     [],
     {'name_too_long': 1}),
    ("long_name_relation", f"relation{D}Ok{D}{'x' * 300}{D}has{D}k{D}d{D}5",
     [],
     [],
     {'name_too_long': 1}),
    ("long_name_at_limit_kept", f"entity{D}{'a' * 256}{D}artifact{D}Long but allowed.",
     [("a" * 256, 'artifact', 'Long but allowed.')],
     [],
     {}),
    # 11 short nano-graphrag descriptions
    ("nano_issue", '("relationship"<|>"Harry"<|>"Hedwig"<|>"Harry owns Hedwig"<|>8)##',
     [],
     [('Harry', 'Hedwig', 'owns', [], 'Harry owns Hedwig', 8.0)],
     {}),
    ("nano_other_order", '("relationship"<|>"Rona"<|>"Kell Bank"<|>"Rona banks with Kell Bank"<|>4)##',
     [],
     [('Rona', 'Kell Bank', 'banks with', [], 'Rona banks with Kell Bank', 4.0)],
     {}),
    ("nano_no_predicate", '("relationship"<|>"Ivo"<|>"Tess"<|>"Tess and Ivo are twins"<|>9)##',
     [],
     [('Ivo', 'Tess', 'related to', [], 'Tess and Ivo are twins', 9.0)],
     {}),
    ("nano_short_predicate_kept", f"relation{D}Ivo{D}Tess{D}sibling of{D}9",
     [],
     [('Ivo', 'Tess', 'sibling of', [], '', 9.0)],
     {}),
    # 12 keywords/description swap guess
    ("swap_issue_not_swapped", f"relation{D}CESE{D}North Works{D}Similar requirements to the tender{D}Relevant project demonstration",
     [],
     [('CESE', 'North Works', 'Similar requirements to the tender', ['Similar requirements to the tender'], 'Relevant project demonstration', 1.0)],
     {}),
    ("swap_two_phrases_not_swapped", f"relation{D}Ada{D}Bel{D}Joint research programme{D}Shared lab space",
     [],
     [('Ada', 'Bel', 'Joint research programme', ['Joint research programme'], 'Shared lab space', 1.0)],
     {}),
    ("swap_sentence_first_swapped", f"relation{D}Ada{D}Bel{D}Ada and Bel share a lab.{D}research, space",
     [],
     [('Ada', 'Bel', 'research', ['research', 'space'], 'Ada and Bel share a lab.', 1.0)],
     {}),
    ("swap_v1_sentence_second", '("relationship"<|>"Ada"<|>"Bel"<|>"research, space"<|>"Ada and Bel share a lab."<|>6)',
     [],
     [('Ada', 'Bel', 'research', ['research', 'space'], 'Ada and Bel share a lab.', 6.0)],
     {}),
    # name-only rows
    ("name_only_issue", f"Entity{D}2023\nentity{D}Nara\nentity{D}\"Kol\"{D}{D}",
     [],
     [],
     {'name_only': 3}),
    ("name_only_glued_and_v1", f"entity{D}Ivo{D}person{D}A man.{D}entity{D}2024\n(\"entity\"<|>\"Page 3\")##",
     [('Ivo', 'person', 'A man.')],
     [],
     {'name_only': 2}),
    ("name_with_type_kept", f"entity{D}Nara{D}location",
     [('Nara', 'location', '')],
     [],
     {}),

]


@pytest.mark.parametrize("text,exp_ents,exp_rels,exp_dropped", [c[1:] for c in DEFECTS], ids=[c[0] for c in DEFECTS])
def test_defect(text: str, exp_ents: FullE, exp_rels: FullR, exp_dropped: dict[str, int]) -> None:
    res = parse_extraction(text)
    assert [(e.name, e.type, e.description) for e in res.entities] == exp_ents
    assert [(r.src, r.tgt, r.predicate, r.keywords, r.description, r.strength) for r in res.relations] == exp_rels
    assert res.dropped == exp_dropped


def test_defect_table_covers_every_class() -> None:
    assert len({c[0] for c in DEFECTS}) == len(DEFECTS)
    for prefix in ("kw_in_field", "bare_close", "mut_", "hash_", "names_", "type_kw", "header", "debris", "long_name",
                   "nano", "swap", "name_"):
        assert sum(c[0].startswith(prefix) for c in DEFECTS) >= 3, prefix


def test_configured_type_as_row_keyword() -> None:
    """A row keyed by a configured type is an entity of that type; the same row is unknown without it."""
    text = f"gadget{D}Zed Phone{D}device{D}A phone.\ngadget{D}Zed Watch{D}gadget{D}A watch."
    res = parse_extraction(text, ["person", "gadget"])
    assert [(e.name, e.type) for e in res.entities] == [("Zed Phone", "gadget"), ("Zed Watch", "gadget")]
    assert parse_extraction(text).dropped == {"unknown_record": 2}


def test_duplicate_rows_prefer_the_unshifted_type() -> None:
    """'Longest description wins' must not pick a row whose fields moved (type slot holding a name/sentence)."""
    text = (f"entity{D}Acme{D}organization{D}A firm.\n"
            f"entity{D}Acme{D}Acme Anvil Works of the Desert{D}organization{D}A firm making anvils in the desert.\n"
            f"entity{D}Bo{D}An inventor who sold many rockets to the coyote over the years\n"
            f"entity{D}Bo{D}person{D}An inventor.")
    res = parse_extraction(text)
    assert [(e.name, e.type, e.description) for e in res.entities] == [
        ("Acme", "organization", "A firm."), ("Bo", "person", "An inventor.")]
    glean = merge_gleaning(parse_extraction(f"entity{D}Acme{D}organization{D}A firm."),
                           parse_extraction(f"entity{D}ACME{D}a firm with a long story{D}A firm with a long story."))
    assert [(e.name, e.type, e.description) for e in glean.entities] == [("Acme", "organization", "A firm.")]


def test_completion_flags() -> None:
    body = f"entity{D}A{D}person{D}d\n"
    for marker in ("<|COMPLETE|>", "<COMPLETE>", "|COMPLETE|", "<|complete|>", "<| Complete |>", "<｜COMPLETE｜>"):
        assert parse_extraction(body + marker).complete, marker
    assert not parse_extraction(body).complete
    assert not parse_extraction(body + "The extraction is complete.").complete


def test_field_details() -> None:
    res = parse_extraction(
        f"entity{D}A{D}person{D}first part{D}second part\n"
        f"entity{D}Acme{D}organization{D}short\nentity{D}ACME{D}organization{D}a much longer description\n"
        f"relation{D}A{D}B{D}acquired{D}merger; finance;  Merger ;{D}\"quoted desc\"{D}7\n"
        f"relation{D}A{D}C{D}founded{D}k{D}part one{D}part two{D}9"
    )
    by_name = {e.name: e for e in res.entities}
    assert by_name["A"].description == "first part; second part"
    assert by_name["Acme"].description == "a much longer description"
    assert res.relations[0].keywords == ["merger", "finance"]
    assert res.relations[0].description == "quoted desc"
    assert res.relations[1].description == "part one; part two"
    assert res.relations[1].keywords == ["k"]


def test_legacy_relation_field_order() -> None:
    res = parse_extraction('("relationship"<|>"A"<|>"B"<|>"A supplies B with parts."<|>"supply, trade"<|>6)')
    (r,) = res.relations
    assert r.description == "A supplies B with parts."
    assert r.keywords == ["supply", "trade"]


def test_lightrag_swapped_fields_repaired() -> None:
    (r,) = parse_extraction(f"relation{D}A{D}B{D}A sold its shares to B in a long deal.{D}finance, sale").relations
    assert r.keywords == ["finance", "sale"]
    assert r.description == "A sold its shares to B in a long deal."


def test_non_string_input_does_not_raise() -> None:
    assert parse_extraction(None) == ParseResult([], [], {}, False)  # type: ignore[arg-type]
    res = parse_extraction(f"entity{D}A{D}person{D}d".encode())  # type: ignore[arg-type]
    assert ents(res) == [("A", "person")]


# --------------------------------------------------------------------------------------------- gleaning merge


def test_merge_gleaning() -> None:
    base = parse_extraction(
        f"entity{D}Acme{D}organization{D}A company.\nentity{D}Bob{D}person{D}Founder.\n"
        f"relation{D}Bob{D}Acme{D}founded{D}business{D}Bob founded Acme.{D}9\n<|COMPLETE|>"
    )
    extra = parse_extraction(
        f"entity{D}ACME{D}organization{D}A company making anvils, founded by Bob.\n"
        f"entity{D}Bob{D}person{D}x\n"
        f"entity{D}Desert{D}location{D}Where Acme sells.\n"
        f"relation{D}Acme{D}Bob{D}founded{D}business{D}Acme was founded by Bob in the desert.{D}8\n"
        f"relation{D}Acme{D}Desert{D}sells in{D}market{D}Acme sells in the desert.{D}5\n"
        f"relation{D}Bob{D}Acme{D}runs{D}management{D}Bob runs it.{D}6\n"
        f"entity{D}{D}x{D}y\n"
    )
    before = (list(base.entities), [e.description for e in base.entities], [r.description for r in base.relations])
    merged = merge_gleaning(base, extra)

    assert ents(merged) == [("Acme", "organization"), ("Bob", "person"), ("Desert", "location")]
    by = {e.name: e for e in merged.entities}
    assert by["Acme"].description == "A company making anvils, founded by Bob."
    assert by["Bob"].description == "Founder."
    assert rels(merged) == [
        ("Bob", "Acme", "founded", 9.0),
        ("Acme", "Desert", "sells in", 5.0),
        ("Bob", "Acme", "runs", 6.0),
    ]
    assert merged.relations[0].description == "Acme was founded by Bob in the desert."
    assert merged.dropped == {"no_name": 1}
    assert merged.complete is False  # the gleaning answer had no marker
    # inputs untouched
    assert (list(base.entities), [e.description for e in base.entities], [r.description for r in base.relations]) == before
    assert base.entities[0].description == "A company."


def test_merge_gleaning_empty_rounds() -> None:
    base = parse_extraction(f"entity{D}A{D}person{D}d\n<|COMPLETE|>")
    empty = parse_extraction("<|COMPLETE|>")
    merged = merge_gleaning(base, empty)
    assert merged == base and merged is not base
    assert merge_gleaning(empty, base).entities == base.entities


# --------------------------------------------------------------------------------------------- robustness

_FUZZ_PIECES = [
    "<|#|>", "<|>", "<||>", "<|#>", "<#|>", "|#|", "<|##|>", "< | # | >", "｜", "<|#|", "##", "#", "|", "<", ">",
    "entity", "Entity", '"entity"', "relationship", "relation", "rel", "content_keywords", "(", ")", '"', "'",
    "<|COMPLETE|>", "<COMPLETE>", "|complete|", "```", "```text", "\n", "\r\n", " ", "\t", "- ", "1. ", "**", "_",
    ",", ";", "7", "-3", "1e308", "nan", "inf", "8/10", "Ünïcödé", "名前", "😀", "\x00", "\x1f", "\ue000", "\u200b", "A", "B",
]


def test_fuzz_never_raises() -> None:
    rng = random.Random(0)
    for i in range(2000):
        if i % 4 == 0:
            text = bytes(rng.randrange(256) for _ in range(rng.randrange(200))).decode("utf-8", errors="replace")
        elif i % 4 == 1:
            text = "".join(chr(rng.randrange(1, 0x2FFFF)) for _ in range(rng.randrange(120)))
        else:
            text = "".join(rng.choice(_FUZZ_PIECES) for _ in range(rng.randrange(60)))
        res = parse_extraction(text)
        assert isinstance(res, ParseResult)
        for e in res.entities:
            assert e.name and e.type
        for r in res.relations:
            assert r.src and r.tgt and r.predicate
            assert 0.0 <= r.strength <= 10.0
            assert r.src.casefold() != r.tgt.casefold()


def test_chunk_sized_output_parses() -> None:
    rows = []
    for i in range(30):
        rows.append(f"entity{D}Entity number {i}{D}concept{D}" + "A fairly long description sentence. " * 3)
        rows.append(f"relation{D}Entity number {i}{D}Entity number {i + 1}{D}relates to{D}a, b, c{D}Some description.{D}5")
    res = parse_extraction("\n".join(rows) + "\n<|COMPLETE|>")
    assert len(res.entities) == 30 and len(res.relations) == 30 and res.complete and not res.dropped


class _TooSlow(BaseException):   # not an Exception: the parser's own guard must not swallow it
    pass


def _best_time(text: str, reps: int = 3, cut: float = 0.0) -> float:
    """Best of `reps` parse times (CPU seconds); with `cut`, a parse still running after `cut` seconds is stopped (the
    regex engine checks signals) and counts as infinite, so a quadratic regression fails fast instead of
    running for hours."""
    def stop(*_: object) -> None:
        raise _TooSlow

    best = float("inf")
    old = signal.signal(signal.SIGALRM, stop) if cut else None
    try:
        for _ in range(reps):
            if cut:
                signal.setitimer(signal.ITIMER_REAL, cut)
            t0 = time.process_time()   # CPU, not wall: other jobs on a loaded machine do not count
            try:
                parse_extraction(text)
            except _TooSlow:
                return float("inf")
            finally:
                if cut:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            best = min(best, time.process_time() - t0)
    finally:
        if cut:
            signal.signal(signal.SIGALRM, old)
    return best


def test_parse_time_grows_linearly() -> None:
    """Random outputs up to 1 MB (rows, loose delimiter fragments, long runs of blanks, tabs and fragments) and
    a sample of adversarial shapes (one long run after each kind of row prefix): parsing 8x the text must
    take about 8x the time, never the 64x a quadratic step gives. Ratios, not absolute times: the bench
    (bench/parse_speed.py) prints the per-100 KB figures."""
    from tests.parser_inputs import ROWS, adversarial_outputs, random_output

    small = 125_000
    pairs = [(random_output(random.Random(seed), small), random_output(random.Random(seed), small, scale=8))
             for seed in range(2)]
    shapes = dict(adversarial_outputs(small // 4))
    labels = random.Random(15).sample(sorted(shapes), 12)
    big_shapes = dict(adversarial_outputs(2 * small))
    pairs += [(shapes[k], big_shapes[k]) for k in labels]
    issue = [lambda n: f"entity{D}A{D}t{D}d ##" + " " * n + "x",                 # the issue's three shapes
             lambda n: f"entity{D}A{D}t{D}d\n<" + " " * n + "x\n<|COMPLETE|>",
             lambda n: f"relation{D}A{D}B{D}p{D}k{D}d{D}5" + " " * n + "x"]
    pairs += [(make(small // 4), make(2 * small)) for make in issue]
    worst, what = 0.0, ""
    for lo, hi in pairs:
        growth = len(hi) / len(lo)
        # A well-formed output of the same length sets the patience: a parse 50x slower than it is stopped.
        t_ref = _best_time(("".join(ROWS) * (len(lo) // len("".join(ROWS)) + 1))[: len(lo)])
        t_lo = max(_best_time(lo, cut=max(1.0, 50 * t_ref)), 1e-4)
        t_hi = _best_time(hi, cut=max(1.0, 50 * growth * max(t_ref, t_lo)))    # never raises, whatever the run
        if t_hi / t_lo / growth > worst:
            worst, what = t_hi / t_lo / growth, f"{lo[:40]!r}: {t_lo:.4f}s -> {t_hi:.4f}s (ref {t_ref:.4f}s)"
    assert worst < 4.5, f"time grew {worst:.1f}x faster than the text: not linear; {what}"


# --------------------------------------------------------------------------------------------- prompts


def test_prompts_shape() -> None:
    assert PROMPT_VERSION
    msgs = build_extraction_messages("Some chunk text.", ["person", "place"], language="French")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert FIELD_DELIMITER in msgs[0]["content"] and COMPLETION_MARKER in msgs[0]["content"]
    assert "Some chunk text." in msgs[1]["content"] and "French" in msgs[1]["content"]
    assert "person, place" in msgs[1]["content"]
    assert build_gleaning_message()["role"] == "user"
    s = build_summary_messages("entity", "Acme", ["a", "b"], 200, "English")
    assert "Acme" in s[-1]["content"] and "- a" in s[-1]["content"]
    k = build_keywords_messages("Who founded Acme?")
    assert "high_level_keywords" in k[0]["content"] and "Who founded Acme?" in k[-1]["content"]
    a = build_answer_messages("q?", "[1] passage")
    assert "[1] passage" in a[-1]["content"]


# --------------------------------------------------------------------------------------------- structural checks

CHUNK = ("The Harrowgate Institute was founded by its first director, Marisol Venkat, in 1931. "
         "It later opened a station on Kestrel Island with the Brenner Trust.")


def checked(text: str, types: list[str] | None = None) -> ParseResult:
    types = types or DEFAULT_ENTITY_TYPES
    return check_extraction(parse_extraction(text, types), CHUNK, types)


def test_check_shifted_relation_dropped_not_an_edge_to_a_predicate() -> None:
    res = checked(f"entity{D}Harrowgate Institute{D}organization{D}A research institute.\n"
                  f"entity{D}Marisol Venkat{D}person{D}Its first director.\n"
                  f"relation{D}Harrowgate Institute{D}was founded by{D}founding director, Marisol Venkat{D}"
                  f"Marisol Venkat founded it.{D}9\n"
                  f"relation{D}Marisol Venkat{D}located in{D}place{D}She worked there.{D}5\n"
                  f"relation{D}Marisol Venkat{D}Harrowgate Institute{D}founded{D}founding{D}She founded it.{D}9")
    assert [(r.src, r.tgt, r.predicate) for r in res.relations] == [
        ("Marisol Venkat", "Harrowgate Institute", "founded")]
    assert res.dropped == {"shifted_fields": 2}


def test_check_endpoints_must_be_listed_or_in_the_chunk() -> None:
    """Unlisted endpoints stay only when the chunk names them (as whole words); others are dropped."""
    targets = [("Kestrel Island", "has a station on"), ("Brenner", "partner of"), ("Orrin Vale", "funded by"),
               ("Trust", "works with"), ("Brenner Tru", "works with")]
    res = checked(f"entity{D}Harrowgate Institute{D}organization{D}An institute.\n"
                  + "\n".join(f"relation{D}Harrowgate Institute{D}{t}{D}{p}{D}k{D}d{D}6" for t, p in targets))
    assert [(r.tgt, r.predicate) for r in res.relations] == [
        ("Kestrel Island", "has a station on"), ("Brenner", "partner of"), ("Trust", "works with")]
    assert res.dropped == {"unlisted_endpoint": 2}


def test_check_types_outside_the_list_become_other() -> None:
    res = checked(f"entity{D}Harrowgate Institute{D}Research Institute{D}An institute.\n"
                  f"entity{D}Marisol Venkat{D}persons{D}A director.\n"
                  f"entity{D}Brenner Trust{D}organisation{D}A trust.\n"
                  f"entity{D}Kestrel Island{D}location{D}An island.\n"
                  f"entity{D}1931{D}{D}A year.")
    assert [(e.name, e.type) for e in res.entities] == [
        ("Harrowgate Institute", "other"), ("Marisol Venkat", "person"), ("Brenner Trust", "organization"),
        ("Kestrel Island", "location"), ("1931", "unknown")]
    assert res.retyped == 1 and res.dropped == {}
    custom = checked(f"entity{D}Harrowgate Institute{D}institute{D}An institute.", ["institute"])
    assert [(e.name, e.type) for e in custom.entities] == [("Harrowgate Institute", "institute")]


def test_check_prompt_example_copies_dropped() -> None:
    """Names from the prompt's worked example that the chunk does not contain were copied, with their rows."""
    passage, _ = worked_example()
    assert "Marta Vidal" in passage and "Braga" in passage
    res = checked(f"entity{D}Marta Vidal{D}person{D}An engineer.\n"
                  f"entity{D}Braga{D}location{D}A town.\n"
                  f"entity{D}Marisol Venkat{D}person{D}A director.\n"
                  f"entity{D}1931{D}date{D}A year.\n"
                  f"relation{D}Marta Vidal{D}Marisol Venkat{D}met{D}k{D}d{D}3\n"
                  f"relation{D}Marisol Venkat{D}1931{D}founded in{D}k{D}d{D}8")
    assert [e.name for e in res.entities] == ["Marisol Venkat", "1931"]
    assert [(r.src, r.tgt) for r in res.relations] == [("Marisol Venkat", "1931")]
    assert res.dropped == {"prompt_example": 3}
    # a chunk that does mention an example name keeps it
    own = check_extraction(parse_extraction(f"entity{D}Braga{D}location{D}A town."), "We drove to Braga.",
                           DEFAULT_ENTITY_TYPES)
    assert [e.name for e in own.entities] == ["Braga"] and own.dropped == {}


def test_check_keeps_parser_counts_and_inputs() -> None:
    parsed = parse_extraction(f"entity{D}{D}person{D}d\nentity{D}Marisol Venkat{D}person{D}A director.")
    res = check_extraction(parsed, CHUNK, DEFAULT_ENTITY_TYPES)
    assert res.dropped == {"no_name": 1} and parsed.dropped == {"no_name": 1}
    assert res.entities == parsed.entities and res.entities is not parsed.entities
