"""Document readers side by side with one alternative each, and the chunk stage on big inputs.

For each format the reader hrag uses and an alternative read the same files, each in a child process of its
own: CPU seconds, pages (or files) per CPU second, the child's peak RSS, and how much of the text differs
(the share of words one gives that the other does not, after folding case, ligatures and hyphenated line
ends). PDF: pypdfium2 against pypdf; HTML: the stdlib html.parser reader against selectolax (lexbor); DOCX
(made here): the zipfile + ElementTree reader against python-docx. The alternatives are the `bench` extra:
`pip install -e '.[bench]'`.

`--big-mb` and `--pdf-pages` then make a big Markdown file and a long PDF (never committed) and run
`hrag index --stop-after chunk` on each: CPU seconds, peak RSS, and the longest stretch without a progress
line (the progress interval is 10 s off a terminal).

    .venv/bin/python bench/readers.py --docs DOCS_FOLDER [--big-mb 50] [--pdf-pages 500] [--full]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import hrag, peak_rss_mb


# ------------------------------------------------------------------------------------------------ readers
# Each reader runs in a child: `python bench/readers.py --child NAME FILES...` prints one JSON line.


def _hrag_pdf(path: Path) -> tuple[int, str]:
    from hrag_cli.chunk.readers import pdf_pages

    pages = list(pdf_pages(path))
    return len(pages), "\n".join(t for _, t in pages)


def _pypdf(path: Path) -> tuple[int, str]:
    import logging

    import pypdf

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    reader = pypdf.PdfReader(str(path))
    return len(reader.pages), "\n".join(p.extract_text() or "" for p in reader.pages)


def _hrag_html(path: Path) -> tuple[int, str]:
    from hrag_cli.chunk.readers import read_html

    return 1, "\n".join(s.text for s in read_html(path.read_text("utf-8", errors="replace")))


def _selectolax(path: Path) -> tuple[int, str]:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(path.read_text("utf-8", errors="replace"))
    tree.strip_tags(["script", "style", "nav", "noscript", "template", "head", "footer", "aside"])
    body = tree.body
    return 1, body.text(separator="\n") if body is not None else ""


def _hrag_docx(path: Path) -> tuple[int, str]:
    from hrag_cli.chunk.readers import read_docx

    return 1, "\n".join(s.text for s in read_docx(path))


def _python_docx(path: Path) -> tuple[int, str]:
    import docx

    return 1, "\n".join(p.text for p in docx.Document(str(path)).paragraphs)


READERS = {"pypdfium2": _hrag_pdf, "pypdf": _pypdf, "html.parser": _hrag_html, "selectolax": _selectolax,
           "zipfile+ElementTree": _hrag_docx, "python-docx": _python_docx}
PAIRS = [("PDF", "pypdfium2", "pypdf", "*.pdf"), ("HTML", "html.parser", "selectolax", "*.htm*"),
         ("DOCX", "zipfile+ElementTree", "python-docx", "*.docx")]


def child(name: str, files: list[str], out: str) -> None:
    fn = READERS[name]
    t0 = time.process_time()
    units, texts = 0, {}
    for f in files:
        n, text = fn(Path(f))
        units += n
        texts[f] = text
    cpu = time.process_time() - t0
    Path(out).write_text(json.dumps({"cpu": cpu, "units": units, "texts": texts}))
    print(json.dumps({"rss_mb": peak_rss_mb()}))


def run_child(name: str, files: list[Path], work: Path) -> dict:
    out = work / f"{name}.json"
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--out", str(out), *map(str, files)],
                          capture_output=True, text=True)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    res = json.loads(out.read_text())
    res["rss_mb"] = json.loads(proc.stdout.strip().splitlines()[-1])["rss_mb"]
    return res


_FOLD = str.maketrans({"ﬁ": "fi", "ﬂ": "fl", "ﬀ": "ff", "ﬃ": "ffi", "ﬄ": "ffl", "\u00ad": ""})


def words(text: str) -> Counter:
    text = re.sub(r"-\s*\n\s*", "", text.translate(_FOLD))
    return Counter(re.findall(r"\w+", text.lower()))


def differ(a: str, b: str) -> tuple[float, float]:
    """(share of a's words b lacks, share of b's words a lacks), as multisets."""
    wa, wb = words(a), words(b)
    return (sum((wa - wb).values()) / max(1, sum(wa.values())), sum((wb - wa).values()) / max(1, sum(wb.values())))


def compare(docs: Path | None, work: Path) -> None:
    from tests.docmakers import make_docx

    gen = work / "docx"
    gen.mkdir()
    for i in range(40):
        paras = [("Title", f"Handbook {i}")]
        for s in range(12):
            paras.append(("Heading1" if s % 3 == 0 else "Heading2", f"Section {s} of handbook {i}"))
            paras.extend(("", f"Paragraph {p} of section {s}: the harbour commission met to weigh the cost of "
                              f"the sea wall, and Mara Quint argued for stone over timber.") for p in range(6))
        make_docx(gen / f"handbook{i:02d}.docx", paras)
    print(f"{'format':6} {'reader':20} {'files':>5} {'units':>6} {'CPU s':>7} {'units/CPU s':>11} {'peak MB':>8} "
          f"{'words only here':>15}")
    for fmt, mine, other, pattern in PAIRS:
        root = gen if fmt == "DOCX" else docs
        if root is None:
            continue
        files = sorted(root.rglob(pattern))
        if not files:
            continue
        a, b = run_child(mine, files, work), run_child(other, files, work)
        diffs = [differ(a["texts"][str(f)], b["texts"][str(f)]) for f in files] if "texts" in a and "texts" in b \
            else []
        only_a = sum(d[0] for d in diffs) / max(1, len(diffs))
        only_b = sum(d[1] for d in diffs) / max(1, len(diffs))
        unit = "pages" if fmt == "PDF" else "files"
        for name, res, only in ((mine, a, only_a), (other, b, only_b)):
            if "error" in res:
                print(f"{fmt:6} {name:20} {len(files):>5}  not run: {res['error']}")
                continue
            print(f"{fmt:6} {name:20} {len(files):>5} {res['units']:>6} {res['cpu']:>7.2f} "
                  f"{res['units'] / max(res['cpu'], 1e-9):>11.1f} {res['rss_mb']:>8.0f} {only * 100:>14.1f}%")
        if diffs:
            worst = max(range(len(files)), key=lambda i: max(diffs[i]))
            print(f"       most different: {files[worst].relative_to(root)} ({diffs[worst][0] * 100:.0f}% of "
                  f"{mine}'s words not in {other}'s, {diffs[worst][1] * 100:.0f}% the other way) [{unit}]")


# ------------------------------------------------------------------------------------------------ big inputs

PARA = ("The harbour commission of Oldport met on a grey morning to weigh the cost of the new sea wall, and "
        "Mara Quint, who had built the Selby Lighthouse, argued for stone over timber. ")


def index_chunk(docs: Path, proj: Path, full: bool = False) -> tuple[float, float, float, dict]:
    """(CPU seconds, peak RSS MB, longest gap between progress lines in s, chunk counts) of one child run:
    the chunk stage, or with `full` the whole offline index (rules extractor, builtin embedder)."""
    how = ["--extractor", "rules", "--embed-model", "builtin"] if full else ["--stop-after", "chunk"]
    last, gap = time.monotonic(), 0.0

    def line(_: str) -> None:
        nonlocal last, gap
        now = time.monotonic()
        gap, last = max(gap, now - last), now

    run = hrag("index", docs, "-p", proj, *how, "--json", check=False, on_stderr_line=line)
    gap = max(gap, time.monotonic() - last)
    return run.cpu_s, run.peak_rss_mb, gap, json.loads(run.stdout)["chunk"] if run.returncode == 0 else {}


def big_inputs(work: Path, big_mb: int, pdf_pages: int, full: bool) -> None:
    from tests.docmakers import make_pdf

    if big_mb:
        folder = work / "big"
        folder.mkdir()
        with open(folder / "big.md", "w") as fh:
            written, n = 0, 0
            while written < big_mb << 20:
                block = f"## Part {n}\n\n" + (PARA * 4 + "\n\n") * 6
                fh.write(block)
                written += len(block)
                n += 1
        cpu, rss, gap, counts = index_chunk(folder, work / "p_big")
        print(f"one {big_mb} MB Markdown file: {cpu:.1f} CPU s, peak RSS {rss:.0f} MB, longest silence {gap:.1f} s, "
              f"{counts.get('chunks')} chunks")
        if full:
            cpu, rss, gap, _ = index_chunk(folder, work / "p_big_full", full=True)
            print(f"  whole offline index of it: {cpu:.1f} CPU s, peak RSS {rss:.0f} MB, longest silence {gap:.1f} s")
    if pdf_pages:
        folder = work / "pdf"
        folder.mkdir()
        make_pdf(folder / "long.pdf", [[f"Page {p} line {k}: " + PARA[:70] for k in range(45)]
                                       for p in range(pdf_pages)])
        size = (folder / "long.pdf").stat().st_size >> 20
        cpu, rss, gap, counts = index_chunk(folder, work / "p_pdf")
        print(f"one {pdf_pages}-page PDF ({size} MB): {cpu:.1f} CPU s ({pdf_pages / max(cpu, 1e-9):.0f} pages per "
              f"CPU s, whole run), peak RSS {rss:.0f} MB, longest silence {gap:.1f} s, {counts.get('chunks')} chunks "
              f"(peak RSS is the largest child so far)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=Path, help="a folder of PDF and HTML files to read with both readers")
    ap.add_argument("--big-mb", type=int, default=50)
    ap.add_argument("--pdf-pages", type=int, default=500)
    ap.add_argument("--full", action="store_true", help="also the whole offline index of the big text file")
    ap.add_argument("--child")
    ap.add_argument("--out")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.files, args.out)
        return
    with tempfile.TemporaryDirectory(prefix="hrag-readers-") as tmp:
        work = Path(tmp)
        compare(args.docs, work)
        big_inputs(work, args.big_mb, args.pdf_pages, args.full)


if __name__ == "__main__":
    main()
