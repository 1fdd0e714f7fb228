"""Small word lists the rules extractor types names with when the sentence gives no cue.

A lone capitalised word ("Indiana", "Joseph") carries no suffix or title; these lists say what the common
ones are. Kept short: countries, continents, U.S. states and large regions, the most frequent given names,
and the demonyms of the countries. Anything not listed falls back to the sentence's cues.
"""

from __future__ import annotations

PLACES = frozenset("""
afghanistan albania algeria andorra angola argentina armenia australia austria azerbaijan bahamas bahrain
bangladesh barbados belarus belgium belize benin bhutan bolivia bosnia botswana brazil brunei bulgaria burkina
burundi cambodia cameroon canada chad chile china colombia comoros congo croatia cuba cyprus czechia denmark
djibouti dominica ecuador egypt eritrea estonia eswatini ethiopia fiji finland france gabon gambia georgia germany
ghana greece grenada guatemala guinea guyana haiti honduras hungary iceland india indonesia iran iraq ireland
israel italy jamaica japan jordan kazakhstan kenya kiribati korea kosovo kuwait kyrgyzstan laos latvia lebanon
lesotho liberia libya liechtenstein lithuania luxembourg madagascar malawi malaysia maldives mali malta
mauritania mauritius mexico micronesia moldova monaco mongolia montenegro morocco mozambique myanmar namibia
nauru nepal netherlands nicaragua niger nigeria norway oman pakistan palau palestine panama paraguay peru
philippines poland portugal qatar romania russia rwanda samoa senegal serbia seychelles singapore slovakia
slovenia somalia spain sudan suriname sweden switzerland syria taiwan tajikistan tanzania thailand togo tonga
trinidad tunisia turkey turkmenistan tuvalu uganda ukraine uruguay uzbekistan vanuatu vatican venezuela vietnam
yemen zambia zimbabwe england scotland wales britain prussia bavaria bohemia persia burma ceylon rhodesia
yugoslavia czechoslovakia tibet catalonia flanders silesia saxony tuscany sicily sardinia corsica crete
africa asia europe antarctica oceania america americas arctic scandinavia siberia balkans caribbean
alabama alaska arizona arkansas california colorado connecticut delaware florida hawaii idaho illinois indiana
iowa kansas kentucky louisiana maine maryland massachusetts michigan minnesota mississippi missouri montana
nebraska nevada ohio oklahoma oregon pennsylvania tennessee texas utah vermont virginia washington wisconsin
wyoming ontario quebec manitoba alberta saskatchewan bengal punjab kerala bavaria queensland tasmania victoria
london paris berlin rome madrid vienna moscow tokyo beijing shanghai delhi mumbai calcutta kolkata chennai
cairo istanbul athens dublin edinburgh glasgow manchester liverpool birmingham amsterdam brussels lisbon
prague budapest warsaw stockholm oslo copenhagen helsinki munich hamburg milan naples venice florence
barcelona seville toronto montreal vancouver sydney melbourne chicago boston philadelphia detroit houston
dallas atlanta seattle baltimore brooklyn manhattan hollywood jerusalem baghdad tehran karachi lahore dhaka
bangkok manila jakarta seoul osaka kyoto hanoi singapore nairobi lagos johannesburg havana lima bogota
santiago caracas quito honolulu geneva zurich
""".split()) | frozenset((
    "trinidad and tobago", "antigua and barbuda", "bosnia and herzegovina", "saint kitts and nevis",
    "saint vincent and the grenadines", "são tomé and príncipe", "sao tome and principe",
    "saint pierre and miquelon", "turks and caicos islands", "wallis and futuna", "akrotiri and dhekelia",
    "heard island and mcdonald islands", "svalbard and jan mayen", "french southern and antarctic lands",
    "south georgia and the south sandwich islands"))

# Nationalities and other demonyms: "an American actor" is an adjective of nationality, not a place.
DEMONYMS = frozenset("""
american british english scottish welsh irish french german italian spanish portuguese dutch belgian swiss
austrian swedish norwegian danish finnish icelandic polish czech slovak hungarian romanian bulgarian greek
turkish russian ukrainian serbian croatian bosnian slovene albanian estonian latvian lithuanian georgian
armenian persian iranian iraqi syrian lebanese israeli jewish arab arabic egyptian moroccan algerian tunisian
libyan nigerian ghanaian kenyan ethiopian somali sudanese african asian european chinese japanese korean
vietnamese thai indian pakistani bangladeshi afghan nepali indonesian filipino malaysian australian canadian
mexican cuban brazilian argentine argentinian chilean peruvian colombian venezuelan jamaican haitian
prussian bavarian soviet roman byzantine ottoman catholic protestant christian muslim islamic hindu buddhist
anglican orthodox latin celtic norse viking anglo-saxon saxon hispanic native scandinavian
""".split())

GIVEN_NAMES = frozenset("""
aaron adam adrian alan albert alexander alfred alice amanda amy andrew angela ann anna anne anthony antonio
arthur barbara benjamin bernard betty bill bob brian bruce carl carlos carol caroline catherine charles
charlotte chris christian christine christopher claire daniel david deborah dennis diana donald dorothy douglas
edward elizabeth ellen emily emma eric ernest eugene evelyn frank frederick george gerald gordon grace gregory
harold harry helen henry howard hugh ian isabella jack jacob james jane janet jason jean jeffrey jennifer jessica
joan joe john jonathan jose joseph joshua juan julia julie karen katherine kathleen keith kenneth kevin larry
laura lawrence leonard linda lisa louis louise lucy margaret maria marie mark martha martin mary matthew
michael michelle nancy nicholas oliver patricia patrick paul peter philip rachel ralph raymond rebecca richard
robert roger ronald rose ruth samuel sandra sarah scott sharon simon stephen steven susan thomas timothy
victor walter wayne william
""".split())
