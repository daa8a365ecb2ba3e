#!/usr/bin/env python3
"""Assemble the English training corpus for kern's tiny Qwen3 model from text already on this machine.

No network is used. Each *source* is a set of files on disk (Rust books, man pages, Vim help, Perl POD,
Python docstrings, package docs, ...) with an extractor that turns one file into plain paragraphs. Every
paragraph then passes through one prose filter (`is_prose`: drops code, tables, option lists and non-English
text) and one exact de-duplication over the whole corpus. Kept paragraphs of one file form one document;
documents are separated by a line holding only `<|endoftext|>` (DOC_SEPARATOR), which train_tiny.py turns
into the EOS token.

The build is deterministic: files are visited in sorted path order, a per-source byte cap keeps documents in
the order of sha1(path) (an unbiased, reproducible subset), and the gzip header carries no time stamp.
Alongside the corpus a Markdown sources report records, per source and per group, the roots read, file
counts, paragraph counts and bytes kept.

Usage: python3 tools/build_corpus.py --out corpus/tiny-corpus.txt.gz --sources tools/tiny-corpus-SOURCES.md
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import fnmatch
import functools
import gzip
import hashlib
import html
import html.parser
import inspect
import multiprocessing
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

DOC_SEPARATOR = "<|endoftext|>"

# ---------------------------------------------------------------------------------------------------------
# Text normalisation and the prose filter (pure functions; tests/train/test_build_corpus.py pins them).
# ---------------------------------------------------------------------------------------------------------

_TYPOGRAPHY = str.maketrans(
    {
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-",
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"',
        "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u200b": "", "\u00ad": "",
        "\u2026": "...", "\u2022": "*", "\u00b7": "*",
    }
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACES = re.compile(r"\s+")

# Function words that make up a large share of any English prose; used to tell English from identifiers,
# numbers and other languages.
_ENGLISH_FUNCTION_WORDS = frozenset(
    """a about after all also an and any are as at be because been before but by can could do does each
    for from has have how if in into is it its may more most must no not of on one only or other our out
    should so some such than that the their them then there these they this those to under up use used
    was we were what when where which while who will with would you your""".split()
)
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_CODE_SYMBOLS = frozenset("{}[]<>;=_\\|#$@*&^~`")
_CODE_PATTERN = re.compile(
    r"(?:^|\s)(?:def|class|import|return|fn|let|var|const|void|struct|impl|pub|sudo|\$|#include|#define)\s"
    r"|;\s*$|\{\s*$|=>|::|\(\)|==|!=|\+\+|&&|\|\||>>>|\w\(\w*[,)]|\w\.\w+\.\w+|</?\w+>|\w/\w+/"
)


def normalize_text(text: str) -> str:
    """Map typographic characters to ASCII and drop control characters; newlines and tabs are kept."""
    return _CONTROL.sub("", text.translate(_TYPOGRAPHY))


def split_paragraphs(text: str) -> list[str]:
    """Split on blank lines and join each paragraph's wrapped lines into one line of single spaces."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        joined = _SPACES.sub(" ", block).strip()
        if joined:
            paragraphs.append(joined)
    return paragraphs


def is_prose(paragraph: str) -> bool:
    """True when a one-line paragraph reads as English prose rather than code, a table or a list of names.

    Heuristics, each cheap and explainable: at least 8 words and 50 characters; starts with a letter or an
    opening quote/parenthesis (drops `-v, --verbose ...` option lists and `$ cmd` lines); ends like a
    sentence; at most 1% non-ASCII characters (drops other scripts); at least 75% letters and spaces; at most
    4% code symbols ({}[]<>;=_ ...); at most one code-looking token per 12 words; and at least 20% of its
    words are common English function words (drops identifier lists and other Latin-script languages).
    """
    n_chars = len(paragraph)
    if n_chars < 50:
        return False
    if not (paragraph[0].isalpha() or paragraph[0] in "\"'("):
        return False
    if paragraph[-1] not in ".!?:)\"'":
        return False
    if sum(1 for c in paragraph if ord(c) > 127) > 0.01 * n_chars:
        return False
    if sum(1 for c in paragraph if c.isalpha() or c == " ") < 0.75 * n_chars:
        return False
    if sum(1 for c in paragraph if c in _CODE_SYMBOLS) > 0.04 * n_chars:
        return False
    words = _WORD.findall(paragraph)
    if len(words) < 8:
        return False
    if len(_CODE_PATTERN.findall(paragraph)) * 12 > len(words):
        return False
    function_words = sum(1 for w in words if w.lower() in _ENGLISH_FUNCTION_WORDS)
    return function_words >= 0.20 * len(words)


def dedupe_key(paragraph: str) -> bytes:
    """Key under which two paragraphs count as the same: case and spacing ignored."""
    return hashlib.sha1(_SPACES.sub(" ", paragraph.lower()).encode()).digest()


# ---------------------------------------------------------------------------------------------------------
# Markup strippers: one per file format; each returns plain text with paragraphs separated by blank lines.
# ---------------------------------------------------------------------------------------------------------

_MD_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_INLINE = re.compile(r"(\*\*|__|`+)(.+?)\1")
_RST_ROLE = re.compile(r":[\w:-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_REF = re.compile(r"`([^`<]+?)(?:\s*<[^>]*>)?`_{1,2}")
_URL = re.compile(r"<?https?://\S+>?")
_HEADING_RULE = re.compile(r"^\s*([=\-~^\"'`#*+.:_])\1{2,}\s*$", re.M)


def strip_markup(text: str) -> str:
    """Plain text from Markdown or reStructuredText: fenced, indented and directive blocks become blank."""
    text = _MD_FENCE.sub("\n", text)
    out: list[str] = []
    in_literal = False  # inside an indented block after `::` or an rst directive
    for line in text.split("\n"):
        stripped = line.strip()
        indented = line.startswith(("    ", "\t"))
        if in_literal and (line[:1] in (" ", "\t") or not stripped):  # any indent continues the block
            out.append("")
            continue
        in_literal = False
        if stripped.startswith(".. ") or stripped.startswith("|") or stripped.startswith(">>>"):
            in_literal = True
            out.append("")
            continue
        if indented:  # Markdown code block or rst block quote of code
            out.append("")
            continue
        if stripped.endswith("::"):
            in_literal = True
            line = line.rstrip()[:-1]
        out.append(line)
    text = "\n".join(out)
    text = _HEADING_RULE.sub("", text)
    text = _RST_ROLE.sub(r"\1", text)
    text = _RST_REF.sub(r"\1", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_INLINE.sub(r"\2", text)
    text = _URL.sub("", text)
    return re.sub(r"^\s*(#+|[*+-]|\d+\.)\s+", "", text, flags=re.M)


class _HtmlText(html.parser.HTMLParser):
    """Text of an HTML page's <main> (or whole body), without <pre>, scripts, navigation or tables."""

    _SKIP = {"script", "style", "pre", "nav", "head", "table", "svg", "button", "select"}
    _BLOCK = {"p", "div", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "br", "dt", "dd", "blockquote",
              "section", "article", "main", "tr", "hr", "details", "summary", "figure"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skip_depth = 0
        self.chunks: list[str] = []
        self.main_chunks: list[str] | None = None  # collected only inside <main>
        self.in_main = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skip_depth += 1
        if tag == "main":
            self.in_main = True
            self.main_chunks = self.main_chunks or []
        if tag in self._BLOCK:
            self._emit("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self.skip_depth:
            self.skip_depth -= 1
        if tag == "main":
            self.in_main = False
        if tag in self._BLOCK:
            self._emit("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skip_depth:
            self._emit(data.replace("\n", " "))

    def _emit(self, text: str) -> None:
        self.chunks.append(text)
        if self.in_main and self.main_chunks is not None:
            self.main_chunks.append(text)

    def text(self) -> str:
        return "".join(self.main_chunks if self.main_chunks else self.chunks)


def html_to_text(source: str) -> str:
    parser = _HtmlText()
    parser.feed(source)
    parser.close()
    return parser.text()


_POD_CODE = re.compile(r"[A-Z]<<+\s+(.*?)\s+>>+|[A-Z]<([^<>]*)>", re.S)


def pod_to_text(source: str) -> str:
    """Ordinary paragraphs of the POD in a Perl file; code, commands and verbatim blocks are dropped."""
    out: list[str] = []
    in_pod = False
    for block in re.split(r"\n\s*\n", source):
        first = block.lstrip("\n")
        if first.startswith("=cut"):
            in_pod = False
            continue
        if first.startswith("="):
            in_pod = True
            continue
        if not in_pod or first.startswith((" ", "\t")):
            continue
        for _ in range(3):  # formatting codes nest: B<C<x>> needs more than one pass
            first = _POD_CODE.sub(lambda m: (m.group(1) or m.group(2) or "").split("|")[0], first)
        out.append(first)
    return "\n\n".join(out)


def vim_help_to_text(source: str) -> str:
    """Vim help text without *tags*, |link| bars, heading markers and right-aligned tag columns."""
    lines = []
    for line in source.split("\n"):
        if line.rstrip().endswith("~") or line.startswith((" " * 8, "\t")) or "\t\t" in line:
            lines.append("")  # headings (`Title ~`), examples (indented) and column tables
            continue
        line = re.sub(r"\*[^*\s]+\*", "", line)
        line = re.sub(r"\|([^|\s]+)\|", r"\1", line)
        lines.append(line)
    return "\n".join(lines)


def python_docstrings(source: str) -> str:
    """Module, class and function docstrings of a Python file, as reStructuredText-stripped text."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                docs.append(strip_markup(inspect.cleandoc(doc)))
    return "\n\n".join(docs)


def package_metadata_description(source: str) -> str:
    """Long description (the project's README) from a wheel's METADATA / PKG-INFO file."""
    message = email.parser.Parser().parsestr(source)
    body = message.get_payload()
    if not isinstance(body, str) or not body.strip():
        body = message.get("Description", "") or ""
    return strip_markup(body)


_JAVADOC = re.compile(r"/\*\*(.*?)\*/", re.S)
_JAVADOC_INLINE = re.compile(r"\{@(?:code|link|linkplain|literal|value|systemProperty|index)\s+([^{}]*?)\}")


def javadoc_to_text(source: str) -> str:
    """Prose of the /** ... */ comments in a Java file: no block tags (@param ...), HTML or <pre> code."""
    docs = []
    for body in _JAVADOC.findall(source):
        lines = [re.sub(r"^\s*\*( |$)", "", line) for line in body.split("\n")]
        text = "\n".join(lines)
        text = re.split(r"^\s*@\w+", text, maxsplit=1, flags=re.M)[0]  # block tags end the description
        text = re.sub(r"<pre>.*?</pre>", "\n\n", text, flags=re.S | re.I)
        text = re.sub(r"<(p|/p|ul|/ul|ol|/ol|li|h\d|/h\d|table|/table|dl|/dl|dt|dd|br|hr|blockquote)\b[^>]*>",
                      "\n\n", text, flags=re.I)
        for _ in range(2):
            text = _JAVADOC_INLINE.sub(lambda m: m.group(1).split("#")[-1].split("(")[0].strip(), text)
        text = re.sub(r"<[^>]+>", "", text)
        docs.append(html.unescape(text))
    return "\n\n".join(docs)


def info_to_text(source: str) -> str:
    """GNU info text without node headers, menus and index entries."""
    source = re.sub(r"\x1f\n?File: [^\n]*\n", "\n\n", source)
    source = re.sub(r"^\* [^\n]*$", "", source, flags=re.M)
    return source


_GROFF = ["groff", "-mandoc", "-Tutf8", "-P-cbou", "-rLL=2000n", "-rHY=0"]


def man_to_text(path: Path) -> str:
    """A man page rendered by groff with very long lines, so that each paragraph is one output line."""
    raw = _read_bytes(path)
    if raw.lstrip().startswith(b".so "):  # an alias page that includes another page
        return ""
    try:
        done = subprocess.run(_GROFF, input=raw, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = []
    for line in done.stdout.decode("utf-8", "replace").split("\n"):
        if " " * 20 in line.strip():  # header and footer lines are padded to the full line length
            continue
        lines.append(line.strip() if not line.startswith(" " * 14) else "")  # deep indent: examples
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------------------


ARCHIVE_SEP = "!/"  # "archive.zip!/member" names a member of a zip file, as in jar: URLs


@functools.lru_cache(maxsize=4)
def _open_zip(path: str) -> zipfile.ZipFile:
    return zipfile.ZipFile(path)


def _read_bytes(path: Path) -> bytes:
    if ARCHIVE_SEP in str(path):
        archive, member = str(path).split(ARCHIVE_SEP, 1)
        return _open_zip(archive).read(member)
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def _read_text(path: Path) -> str:
    return _read_bytes(path).decode("utf-8", "replace")


@dataclass(frozen=True)
class Source:
    """One kind of text on disk: where it lives, how its files are found, and how one file becomes text."""

    name: str
    description: str
    roots: tuple[Path, ...]
    patterns: tuple[str, ...]  # rglob patterns under each root
    extract: Callable[[Path], str]
    exclude: Callable[[Path], bool] = lambda path: False
    group_depth: int = 1  # path components under the root that name a group in the sources report
    cap_bytes: int = 12_000_000  # most bytes of kept text this source may contribute

    def files(self) -> list[Path]:
        found: set[Path] = set()
        for root in self.roots:
            if root.is_file() and zipfile.is_zipfile(root):
                for name in _open_zip(str(root)).namelist():
                    member = Path(f"{root}{ARCHIVE_SEP}{name}")
                    if any(fnmatch.fnmatch(name, p) for p in self.patterns) and not self.exclude(member):
                        found.add(member)
                continue
            if not root.is_dir():
                continue
            for pattern in self.patterns:
                for path in root.rglob(pattern):
                    if path.is_file() and not path.is_symlink() and not self.exclude(path):
                        found.add(path)
        return sorted(found)

    def group_of(self, path: Path) -> str:
        for root in self.roots:
            if str(path).startswith(f"{root}{ARCHIVE_SEP}"):
                return str(path)[len(f"{root}{ARCHIVE_SEP}"):].split("/")[0]
            if path.is_relative_to(root):
                rel = path.relative_to(root).parts
                return "/".join(rel[: self.group_depth]) if len(rel) > self.group_depth else "."
        return "?"


def _text(transform: Callable[[str], str]) -> Callable[[Path], str]:
    return lambda path: transform(_read_text(path))


def default_sources() -> list[Source]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site_packages = (stdlib / "site-packages", Path("/usr/lib/python3/dist-packages"))
    rust_html = tuple(sorted(Path.home().glob(".rustup/toolchains/stable-*/share/doc/rust/html")))[:1]
    jdk_src = tuple(sorted(Path("/usr/lib/jvm").glob("*/lib/src.zip"), reverse=True))[:1]  # newest JDK
    doc_names = ("README*", "*.txt", "*.txt.gz", "*.md", "*.md.gz", "*.rst", "copyright")
    return [
        Source("rust-books", "The Rust Programming Language, Rustonomicon, Reference, Cargo/rustc/rustdoc books, "
               "edition guide, embedded book, Rust by Example (rustup's offline docs, print.html pages)",
               rust_html, ("*/print.html",), _text(html_to_text),
               exclude=lambda p: p.parent.name in {"unstable-book", "clippy"}),
        Source("rust-std-docs", "Rust standard library API documentation (rustup's offline rustdoc pages for std)",
               tuple(r / "std" for r in rust_html), ("*.html",), _text(html_to_text)),
        Source("javadoc", "Javadoc comments of the JDK's own sources (lib/src.zip of the newest JDK)", jdk_src,
               ("java.*/*.java",), _text(javadoc_to_text), exclude=lambda p: "/internal/" in str(p),
               cap_bytes=18_000_000),
        Source("man-pages", "English man pages, sections 1-8, rendered with groff (gcloud's 16k generated pages "
               "excluded)", tuple(Path("/usr/share/man") / f"man{i}" for i in range(1, 9)), ("*",), man_to_text,
               exclude=lambda p: p.name.startswith("gcloud") or p.name.startswith("aws"), group_depth=0),
        Source("vim-help", "Vim's help files", (Path("/usr/share/vim"),), ("doc/*.txt",),
               _text(vim_help_to_text), group_depth=0),
        Source("gnu-info", "GNU info manuals", (Path("/usr/share/info"),), ("*.info*",), _text(info_to_text),
               group_depth=0),
        Source("perl-pod", "POD documentation in Perl's core library", (Path("/usr/share/perl"),),
               ("*.pm", "*.pod"), _text(pod_to_text), group_depth=2),
        Source("python-docstrings", "Docstrings of the Python standard library", (stdlib,), ("*.py",),
               _text(python_docstrings),
               exclude=lambda p: "site-packages" in p.parts or "test" in p.parts or "tests" in p.parts
               or "idlelib" in p.parts),
        Source("python-package-readmes", "Long descriptions (READMEs) of installed Python packages",
               site_packages, ("*.dist-info/METADATA", "*.egg-info/PKG-INFO"), _text(package_metadata_description),
               group_depth=0),
        Source("python-package-docs", "reST/Markdown/text documentation inside installed Python packages",
               site_packages, ("*.rst", "*.md", "*.txt"), _text(strip_markup),
               exclude=lambda p: "dist-info" in str(p) or "egg-info" in str(p), cap_bytes=4_000_000),
        Source("cmake-help", "CMake's reStructuredText help", tuple(sorted(Path("/usr/share").glob("cmake-*/Help"))),
               ("*.rst",), _text(strip_markup)),
        Source("node-docs", "Node.js API docs and npm docs (Markdown)",
               (Path("/usr/share/doc/nodejs"), Path("/usr/lib/node_modules/npm/docs")), ("*.md",),
               _text(strip_markup)),
        Source("debian-docs", "READMEs, text docs and copyright/licence files under /usr/share/doc, and "
               "/usr/share/common-licenses", (Path("/usr/share/doc"), Path("/usr/share/common-licenses")),
               doc_names + ("*",), _text(strip_markup),
               exclude=lambda p: "nodejs" in p.parts or "/common-licenses/" not in str(p)
               and not any(p.match(n) for n in doc_names)),
    ]


# ---------------------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------------------


def _extract_job(job: tuple[int, Path]) -> tuple[int, Path, list[str]]:
    source_index, path = job
    try:
        text = _SOURCES[source_index].extract(path)
    except (OSError, UnicodeError, ValueError, EOFError, gzip.BadGzipFile):
        text = ""
    return source_index, path, split_paragraphs(normalize_text(text))


_SOURCES: list[Source] = []  # set before the worker pool forks; read-only afterwards


@dataclass
class SourceStats:
    files_read: int = 0
    files_kept: int = 0
    paragraphs_seen: int = 0
    paragraphs_kept: int = 0
    duplicates: int = 0
    bytes_kept: int = 0
    groups: dict[str, list[int]] = field(default_factory=dict)  # group -> [files, paragraphs, bytes]


def build(sources: list[Source], workers: int) -> tuple[list[str], dict[str, SourceStats]]:
    """Documents (joined kept paragraphs, one per file) in source then path order, and per-source stats."""
    global _SOURCES
    _SOURCES = sources
    jobs = [(i, path) for i, source in enumerate(sources) for path in source.files()]
    seen: set[bytes] = set()
    per_source: list[list[tuple[Path, str, int]]] = [[] for _ in sources]
    stats = {s.name: SourceStats() for s in sources}
    # Each worker re-opens zip archives: a ZipFile inherited through fork shares its file offset.
    with multiprocessing.get_context("fork").Pool(workers, initializer=_open_zip.cache_clear) as pool:
        for i, path, paragraphs in pool.imap(_extract_job, jobs, chunksize=16):
            st = stats[sources[i].name]
            st.files_read += 1
            st.paragraphs_seen += len(paragraphs)
            kept = []
            for paragraph in paragraphs:
                if not is_prose(paragraph):
                    continue
                key = dedupe_key(paragraph)
                if key in seen:
                    st.duplicates += 1
                    continue
                seen.add(key)
                kept.append(paragraph)
            if kept:
                per_source[i].append((path, "\n\n".join(kept), len(kept)))
    documents: list[str] = []
    for i, source in enumerate(sources):
        st = stats[source.name]
        chosen: set[Path] = set()
        total = 0
        for path, doc, _ in sorted(per_source[i], key=lambda item: hashlib.sha1(str(item[0]).encode()).digest()):
            if total + len(doc) > source.cap_bytes:
                continue
            chosen.add(path)
            total += len(doc) + 1
        for path, doc, n_paragraphs in per_source[i]:  # path order
            if path not in chosen:
                continue
            documents.append(doc)
            st.files_kept += 1
            st.paragraphs_kept += n_paragraphs
            st.bytes_kept += len(doc.encode())
            group = st.groups.setdefault(source.group_of(path), [0, 0, 0])
            group[0] += 1
            group[1] += n_paragraphs
            group[2] += len(doc.encode())
    return documents, stats


def write_corpus(documents: Iterable[str], out: Path) -> bytes:
    """Write documents separated by DOC_SEPARATOR lines, gzip without time stamp; returns the raw text."""
    text = ("\n" + DOC_SEPARATOR + "\n").join(documents).encode() + b"\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(text)
    return text


def sources_report(sources: list[Source], stats: dict[str, SourceStats], text: bytes, out: Path) -> str:
    n_docs = text.count(("\n" + DOC_SEPARATOR + "\n").encode()) + 1
    lines = [
        "# tiny-corpus sources",
        "",
        "Generated by `tools/build_corpus.py`; do not edit by hand. The corpus itself is not committed (it is",
        "rebuilt from files on the build machine, and git-ignored under `/corpus/`).",
        "",
        f"- output: `{out.as_posix()}`",
        f"- uncompressed: {len(text):,} bytes in {n_docs:,} documents; gzip: {out.stat().st_size:,} bytes",
        f"- sha256 of uncompressed text: `{hashlib.sha256(text).hexdigest()}`",
        f"- built with Python {sys.version.split()[0]}; filter: `is_prose`, exact de-duplication (case/space-"
        "insensitive) across all sources, per-source cap by sha1(path) order",
        "",
        "| source | files read | files kept | paragraphs seen | kept | duplicates | bytes kept | cap |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in sources:
        st = stats[s.name]
        lines.append(f"| {s.name} | {st.files_read:,} | {st.files_kept:,} | {st.paragraphs_seen:,} | "
                     f"{st.paragraphs_kept:,} | {st.duplicates:,} | {st.bytes_kept:,} | {s.cap_bytes:,} |")
    for s in sources:
        st = stats[s.name]
        lines += ["", f"## {s.name}", "", s.description + ".", "",
                  "Roots: " + (", ".join(f"`{r}`" for r in s.roots) or "(none found)") +
                  "; patterns: " + ", ".join(f"`{p}`" for p in s.patterns), ""]
        if not st.groups:
            lines.append("(nothing kept)")
            continue
        lines += ["| group | files | paragraphs | bytes |", "| --- | ---: | ---: | ---: |"]
        groups = sorted(st.groups.items())
        if len(groups) > 40:  # keep the report readable: largest 40 groups, the rest summed
            groups.sort(key=lambda item: -item[1][2])
            rest = groups[40:]
            groups = sorted(groups[:40]) + [(f"({len(rest)} smaller groups)", [sum(g[1][k] for g in rest)
                                                                                for k in range(3)])]
        for name, (files, paragraphs, n_bytes) in groups:
            lines.append(f"| `{name}` | {files:,} | {paragraphs:,} | {n_bytes:,} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("corpus/tiny-corpus.txt.gz"))
    parser.add_argument("--sources", type=Path, default=Path("tools/tiny-corpus-SOURCES.md"),
                        help="Markdown report of where each part came from")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", nargs="*", help="build only these source names (for trying filters)")
    args = parser.parse_args(argv)
    sources = [s for s in default_sources() if not args.only or s.name in args.only]
    documents, stats = build(sources, args.workers)
    text = write_corpus(documents, args.out)
    args.sources.write_text(sources_report(sources, stats, text, args.out))
    for s in sources:
        st = stats[s.name]
        print(f"{s.name:24s} files {st.files_kept:6d}/{st.files_read:<6d} paragraphs {st.paragraphs_kept:8d}"
              f" bytes {st.bytes_kept:12,d}", flush=True)
    print(f"corpus: {len(text):,} bytes, gzip {args.out.stat().st_size:,} bytes -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
