"""Format readers: a file's bytes to sections of text, each with its heading trail and, for PDFs, its pages.

A reader keeps the structure that is cheap to find (headings of Markdown, reStructuredText, AsciiDoc, Org,
LaTeX, HTML and DOCX; PDF pages) and nothing heavier: no OCR, no layout model. A file a reader cannot use
raises `Skip` with the reason the run lists it under.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

TRAIL_SEP = " › "


class Skip(Exception):
    """The file is not indexed; the message is the reason shown beside its name."""


@dataclass
class Section:
    """Text under one heading trail. `pages`: (character offset, page number) where each page starts."""

    text: str
    trail: tuple[str, ...] = ()
    pages: list[tuple[int, int]] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ kinds

MARKDOWN = {".md", ".markdown", ".mdown", ".mkd"}
PLAIN = {".txt", ".text", ".csv", ".tsv", ".log"}
CODE = {".py", ".pyi", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".java", ".kt", ".scala", ".c", ".h", ".cc",
        ".cpp", ".hpp", ".cxx", ".cs", ".go", ".rs", ".rb", ".php", ".pl", ".lua", ".r", ".jl", ".swift", ".m",
        ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".cmd", ".sql", ".toml", ".yaml", ".yml", ".ini", ".cfg",
        ".conf", ".json", ".xml", ".css", ".scss", ".proto", ".graphql", ".dockerfile", ".mk", ".cmake", ".gradle"}
CODE_NAMES = {"makefile", "dockerfile", "gnumakefile", "cmakelists.txt", "jenkinsfile", "vagrantfile", "gemfile",
              "rakefile", "procfile"}
PLAIN_NAMES = {"readme", "license", "licence", "copying", "authors", "changes", "changelog", "news", "install",
               "notice", "contributing", "todo", "history"}
MARKUP = {".rst": "rst", ".rest": "rst", ".adoc": "adoc", ".asciidoc": "adoc", ".asc": "adoc", ".org": "org",
          ".tex": "tex", ".latex": "tex", **{s: "markdown" for s in MARKDOWN}}
HTML = {".html", ".htm", ".xhtml"}
PDF = {".pdf"}
DOCX = {".docx"}


def kind_of(name: str) -> str:
    """The reader a file name asks for: markdown, rst, adoc, org, tex, plain, code, html, pdf, docx, or ""."""
    lower = name.lower()
    suffix = Path(lower).suffix
    if suffix in MARKUP:
        return MARKUP[suffix]
    if suffix in PLAIN:
        return "plain"
    if suffix in HTML:
        return "html"
    if suffix in PDF:
        return "pdf"
    if suffix in DOCX:
        return "docx"
    if suffix in CODE or lower in CODE_NAMES:
        return "code"
    if lower in PLAIN_NAMES:
        return "plain"
    return ""


TEXT_KINDS = {"markdown", "rst", "adoc", "org", "tex", "plain", "code"}
FORMATS = ("text, Markdown, reStructuredText, AsciiDoc, Org, LaTeX, CSV, source code, HTML, PDF, DOCX and "
           "JSONL files")

_HTML_START = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*"
                         rb"<(?:!doctype\s+html|html[\s>]|head[\s>])",
                         re.I | re.S)


def sniff(head: bytes, kind: str) -> str:
    """The kind the content shows, when a text name hides it: an HTML page or a PDF saved as .txt."""
    if kind in TEXT_KINDS:
        if head.startswith(b"%PDF-"):
            return "pdf"
        if _HTML_START.match(head):
            return "html"
    return kind


# ------------------------------------------------------------------------------------------------ headings

_ATX = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_RST_ADORN = re.compile(r"^([=\-~^\"'`#*+:._!$%&,;<>?@\\/|])\1{2,}\s*$")
_ADOC = re.compile(r"^(={1,6})[ \t]+(\S.*?)\s*$")
_ORG = re.compile(r"^(\*{1,8})[ \t]+(\S.*?)\s*$")
_MARKER_HEADINGS = {"adoc": _ADOC, "org": _ORG}
_TEX = re.compile(r"\\(part|chapter|section|subsection|subsubsection|paragraph)\*?\s*(?:\[[^\]]*\])?\{([^{}]*)\}")
_TEX_LEVEL = {"part": 0, "chapter": 1, "section": 2, "subsection": 3, "subsubsection": 4, "paragraph": 5}


class Headings:
    """Finds headings line by line for one markup, keeping the state a long file read in pieces needs
    (the open trail, a code fence, reStructuredText's order of underline styles)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.stack: list[tuple[int, str]] = []     # (level, title)
        self.fence = False
        self.rst_styles: list[str] = []

    @property
    def trail(self) -> tuple[str, ...]:
        return tuple(t for _, t in self.stack)

    def _push(self, level: int, title: str) -> None:
        title = " ".join(title.split())
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        self.stack.append((level, title))

    def heading_at(self, lines: list[str], i: int) -> tuple[int, int, str] | None:
        """(first line, lines it spans, title) when a heading starts at or just before line i."""
        line = lines[i]
        if self.kind == "markdown":
            if _FENCE.match(line):
                self.fence = not self.fence
                return None
            if self.fence:
                return None
            m = _ATX.match(line)
            if m:
                self._push(len(m.group(1)), m.group(2))
                return i, 1, m.group(2)
            if i + 1 < len(lines) and line.strip() and re.fullmatch(r"(=+|-+)\s*", lines[i + 1]) \
                    and not line.startswith(("    ", "\t", "- ", "* ")):
                self._push(1 if lines[i + 1].startswith("=") else 2, line.strip())
                return i, 2, line.strip()
            return None
        if self.kind == "rst":
            return self._rst(lines, i)
        if self.kind in _MARKER_HEADINGS:       # the level is the number of marker characters
            m = _MARKER_HEADINGS[self.kind].match(line)
            if m:
                self._push(len(m.group(1)), m.group(2))
                return i, 1, m.group(2)
            return None
        if self.kind == "tex":
            m = _TEX.search(line)
            if m and not line.lstrip().startswith("%"):
                self._push(_TEX_LEVEL[m.group(1)], m.group(2))
                return i, 1, m.group(2)
        return None

    def _rst(self, lines: list[str], i: int) -> tuple[int, int, str] | None:
        """A title line underlined (and perhaps overlined) by a row of one punctuation character at least as
        long; levels follow the order in which underline styles first appear, as docutils does."""
        title = lines[i].rstrip()
        if not title.strip() or _RST_ADORN.match(title) or i + 1 >= len(lines):
            return None
        under = lines[i + 1].rstrip()
        m = _RST_ADORN.match(under)
        if not m or len(under) < len(title.strip()):
            return None
        over = i > 0 and lines[i - 1].rstrip() == under
        style = ("o" if over else "u") + m.group(1)
        if style not in self.rst_styles:
            self.rst_styles.append(style)
        self._push(self.rst_styles.index(style) + 1, title.strip())
        return (i - 1, 3, title.strip()) if over else (i, 2, title.strip())


def structured(pieces: Iterable[str], kind: str) -> Iterator[Section]:
    """Sections of a text read in pieces (each ending at a line break, or the end): a new section starts at
    every heading, and holds the heading line itself, so a chunk's text still names its topic."""
    finder = Headings(kind) if kind in ("markdown", "rst", "adoc", "org", "tex") else None
    for piece in pieces:
        if finder is None:
            yield Section(piece)
            continue
        lines = piece.split("\n")
        start, trail, i = 0, finder.trail, 0
        while i < len(lines):
            found = finder.heading_at(lines, i)
            if found is None:
                i += 1
                continue
            first, span, _ = found
            if first > start:
                yield Section("\n".join(lines[start:first]), trail)
            start, trail = first, finder.trail
            i = first + span
        if start < len(lines):
            yield Section("\n".join(lines[start:]), trail)


# ------------------------------------------------------------------------------------------------ HTML

_SKIP_TAGS = {"script", "style", "nav", "noscript", "template", "svg", "head", "footer", "aside", "form", "button",
              "select", "iframe", "object", "canvas"}
_BLOCK_TAGS = {"p", "div", "section", "article", "main", "ul", "ol", "li", "dl", "dt", "dd", "table", "tr",
               "blockquote", "pre", "hr", "br", "figure", "figcaption", "header", "address", "details", "summary",
               "h1", "h2", "h3", "h4", "h5", "h6", "td", "th", "tbody", "thead"}
_PARA_TAGS = {"p", "pre", "table", "ul", "ol", "dl", "blockquote", "hr", "section", "article", "figure"}
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "track", "wbr"}
_NAV_ROLES = {"navigation", "banner", "contentinfo", "search", "complementary"}


class _HtmlText(HTMLParser):
    """Text of an HTML page as sections: headings h1-h6 start sections; script, style, navigation, header
    and footer matter are left out; `<main>` (or role=main), when the page has one, is all that is kept."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skip = 0                    # depth inside left-out elements
        self.skip_stack: list[str] = []
        self.pre = 0
        self.main = 0
        self.main_seen = False
        self.heading: list[str] | None = None
        self.heading_level = 0
        self.stack: list[tuple[int, str]] = []
        # (in_main, trail, parts) of each section
        self.sections: list[tuple[bool, tuple[str, ...], list[str]]] = [(False, (), [])]
        self.main_stack: list[str] = []

    def _parts(self) -> list[str]:
        in_main = self.main > 0
        if self.sections[-1][0] != in_main:
            self.sections.append((in_main, tuple(t for _, t in self.stack), []))
        return self.sections[-1][2]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            if tag == "br" and not self.skip:
                self._parts().append("\n")
            return
        a = dict(attrs)
        role = (a.get("role") or "").lower()
        if self.skip or tag in _SKIP_TAGS or role in _NAV_ROLES or a.get("hidden") is not None \
                or a.get("aria-hidden") == "true":
            self.skip += 1
            self.skip_stack.append(tag)
            return
        if tag == "main" or role == "main":
            self.main += 1
            self.main_seen = True
            self.main_stack.append(tag)
        if tag == "pre":
            self.pre += 1
        if len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            self.heading, self.heading_level = [], int(tag[1])
            return
        if tag in _BLOCK_TAGS:
            self._parts().append("\n\n" if tag in _PARA_TAGS else "\n")
        elif tag in ("td", "th"):
            self._parts().append("\t")

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self.skip:
            if tag in self.skip_stack:      # close up to the matching tag (HTML lets some end tags go)
                while self.skip_stack:
                    self.skip -= 1
                    if self.skip_stack.pop() == tag:
                        break
            return
        if self.main_stack and tag == self.main_stack[-1]:
            self.main_stack.pop()
            self.main -= 1
        if tag == "pre" and self.pre:
            self.pre -= 1
        if self.heading is not None and len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            title = " ".join("".join(self.heading).split()).rstrip("¶#").strip()
            self.heading = None
            if title:
                while self.stack and self.stack[-1][0] >= self.heading_level:
                    self.stack.pop()
                self.stack.append((self.heading_level, title))
                self.sections.append((self.main > 0, tuple(t for _, t in self.stack), [title, "\n\n"]))
            return
        if tag in _BLOCK_TAGS:
            self._parts().append("\n\n" if tag in _PARA_TAGS else "\n")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.heading is not None:
            self.heading.append(data)
            return
        self._parts().append(data if self.pre else re.sub(r"\s+", " ", data))


_BLANKS = re.compile(r"[ \t]*\n[ \t\n]*\n[ \t]*")


def _tidy(text: str) -> str:
    """Lines stripped of trailing blanks, runs of blank lines made one."""
    text = re.sub(r"[ \t]+\n", "\n", text)
    return _BLANKS.sub("\n\n", text).strip()


def read_html(text: str) -> list[Section]:
    parser = _HtmlText()
    try:
        parser.feed(text)
        parser.close()
    except (AssertionError, ValueError) as exc:   # html.parser's rare hard failures
        raise Skip(f"unreadable HTML ({exc})") from None
    keep = [s for s in parser.sections if s[0]] if parser.main_seen else parser.sections
    out = []
    for _, trail, parts in keep:
        body = _tidy("".join(parts))
        if body:
            out.append(Section(body, trail))
    return _merge_same_trail(out)


def _merge_same_trail(sections: list[Section]) -> list[Section]:
    out: list[Section] = []
    for s in sections:
        if out and out[-1].trail == s.trail and not s.pages:
            out[-1].text += "\n\n" + s.text
        else:
            out.append(s)
    return out


# ------------------------------------------------------------------------------------------------ PDF

_LIGATURES = str.maketrans({"ﬀ": "ff", "ﬁ": "fi", "ﬂ": "fl", "ﬃ": "ffi", "ﬄ": "ffl", "ﬅ": "st", "ﬆ": "st",
                            "\u00ad": "", "\x02": "", "\ufffe": ""})
_HYPHEN_BREAK = re.compile(r"(\w)-[ \t]*\n[ \t]*(?=[a-z])")
_LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*")


def pdf_page_text(raw: str) -> str:
    """One page's text layer as running text: lines joined, a word hyphenated across a line made whole (pdfium
    marks such a hyphen U+FFFE), ligatures spelled out (the text layer breaks lines where the page does, not
    where sentences end)."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n").translate(_LIGATURES)
    text = _HYPHEN_BREAK.sub(r"\1", text)
    return _LINE_BREAK.sub(" ", text).strip()


def pdf_pages(path: Path) -> Iterator[tuple[int, str]]:
    """(page number from 1, running text) of each page, one page in memory at a time."""
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        message = str(exc).lower()
        if "password" in message or "security" in message:
            raise Skip("encrypted PDF (a password is needed)") from None
        raise Skip(f"unreadable PDF ({exc})") from None
    try:
        for i in range(len(pdf)):
            page = pdf[i]
            textpage = page.get_textpage()
            try:
                yield i + 1, pdf_page_text(textpage.get_text_range())
            finally:
                textpage.close()
                page.close()
    finally:
        pdf.close()


PDF_SECTION_PAGES = 25   # pages per section, so a 500-page PDF is never one string in memory


def read_pdf(path: Path, blank_pages: list[int]) -> Iterator[Section]:
    """The text layer in sections of up to PDF_SECTION_PAGES pages, each page's start marked; pages without
    text are appended to `blank_pages` (scans: OCR is not done). Skip when no page has text."""
    parts: list[str] = []
    pages: list[tuple[int, int]] = []
    size = 0
    any_text = False
    for number, text in pdf_pages(path):
        if not text:
            blank_pages.append(number)
            continue
        any_text = True
        pages.append((size, number))
        parts.append(text)
        size += len(text) + 2
        if len(pages) >= PDF_SECTION_PAGES:
            yield Section("\n\n".join(parts), (), pages)
            parts, pages, size = [], [], 0
    if parts:
        yield Section("\n\n".join(parts), (), pages)
    if not any_text:
        raise Skip("no text layer (a scan? OCR is not done)" if blank_pages else "empty")


# ------------------------------------------------------------------------------------------------ DOCX

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _docx_heading_styles(z: zipfile.ZipFile) -> dict[str, int]:
    """styleId -> heading level, from the style names ("heading 2", "Title"), which do not change with the
    language the document was written in, unlike the ids."""
    levels: dict[str, int] = {}
    try:
        root = ElementTree.fromstring(z.read("word/styles.xml"))
    except (KeyError, ElementTree.ParseError):
        return levels
    for style in root.iter(f"{_W}style"):
        sid = style.get(f"{_W}styleId") or ""
        name_el = style.find(f"{_W}name")
        name = (name_el.get(f"{_W}val") if name_el is not None else "") or ""
        m = re.fullmatch(r"heading (\d)", name.strip().lower())
        if m:
            levels[sid] = int(m.group(1))
        elif name.strip().lower() == "title":
            levels[sid] = 0
    return levels


def read_docx(path: Path) -> list[Section]:
    """Paragraphs of word/document.xml (tables cell by cell), sections at the paragraphs whose style is a
    heading."""
    try:
        with zipfile.ZipFile(path) as z:
            styles = _docx_heading_styles(z)
            with z.open("word/document.xml") as fh:
                events = ElementTree.iterparse(fh, events=("end",))
                return _docx_sections(events, styles)
    except KeyError:
        raise Skip("not a DOCX file (no word/document.xml)") from None
    except zipfile.BadZipFile:
        raise Skip("encrypted or damaged DOCX (not a zip file)") from None
    except ElementTree.ParseError as exc:
        raise Skip(f"damaged DOCX ({exc})") from None


def _docx_sections(events: Iterable[tuple[str, ElementTree.Element]], styles: dict[str, int]) -> list[Section]:
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []
    parts: list[str] = []

    def flush() -> None:
        body = _tidy("\n\n".join(parts))
        if body:
            sections.append(Section(body, tuple(t for _, t in stack)))
        parts.clear()

    for _, el in events:
        if el.tag != f"{_W}p":
            if el.tag == f"{_W}body":
                break
            continue
        text = "".join(_docx_run_text(el)).strip()
        style = el.find(f"{_W}pPr/{_W}pStyle")
        sid = style.get(f"{_W}val") if style is not None else None
        level = styles.get(sid or "", _builtin_heading(sid))
        el.clear()
        if not text:
            continue
        if level is not None:
            flush()
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, " ".join(text.split())))
        parts.append(text)
    flush()
    return sections


def _builtin_heading(sid: str | None) -> int | None:
    m = re.fullmatch(r"Heading(\d)", sid or "")
    return int(m.group(1)) if m else (0 if sid == "Title" else None)


def _docx_run_text(p: ElementTree.Element) -> Iterator[str]:
    for el in p.iter():
        if el.tag == f"{_W}t" and el.text:
            yield el.text
        elif el.tag == f"{_W}tab":
            yield "\t"
        elif el.tag in (f"{_W}br", f"{_W}cr"):
            yield "\n"


def where(path: str, trail: Iterable[str] = (), page: int = 0, page_end: int = 0) -> str:
    """How a chunk's origin is shown: `guide/deps.md › Dependencies › With yield`, `manual.pdf p. 12`,
    `manual.pdf pp. 12-13`."""
    out = TRAIL_SEP.join([path, *trail])
    if page and page_end > page:
        return f"{out} pp. {page}-{page_end}"
    return f"{out} p. {page}" if page else out
