"""tools/build_corpus.py: the prose filter, the markup strippers, de-duplication and a deterministic build."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from train_testkit import load_tool

bc = load_tool("build_corpus")

PROSE = (
    "A process can change the disposition of a signal using sigaction or signal, and the new disposition "
    "applies to every thread in the process.",
    "The String class represents character strings. All string literals in Java programs are implemented "
    "as instances of this class.",
    "If the file does not exist, it is created; otherwise its contents are replaced by the new data.",
)
NOT_PROSE = (
    "for (int i = 0; i < count; i++) { total += values[i]; }",
    "def read_config(path): return json.loads(open(path).read()) if path else {}",
    "-v, --verbose print the name of each file as it is processed, one per line.",
    "$ cargo build --release && ./target/release/app --port 8080 --verbose --config x.toml.",
    "Der Prozess kann die Behandlung eines Signals mit Hilfe von sigaction ändern, und das gilt für alle.",
    "Le processus peut modifier la disposition d'un signal avec sigaction, et elle est partagée par tous.",
    "SIGHUP 1 Term SIGINT 2 Term SIGQUIT 3 Core SIGILL 4 Core SIGABRT 6 Core SIGFPE 8 Core.",
    "Short line.",
    "let v: Vec<u32> = Vec::new(); v.push(1); println!(\"{:?}\", v); assert_eq!(v.len(), 1);",
)


@pytest.mark.parametrize("paragraph", PROSE)
def test_prose_is_kept(paragraph: str) -> None:
    assert bc.is_prose(paragraph)


@pytest.mark.parametrize("paragraph", NOT_PROSE)
def test_code_lists_and_other_languages_are_dropped(paragraph: str) -> None:
    assert not bc.is_prose(bc.normalize_text(paragraph))


def test_normalize_maps_typography_to_ascii_and_drops_control_characters() -> None:
    assert bc.normalize_text("\u201cquoted\u201d \u2014 it\u2019s\u2026\x07ok\u00a0now") == '"quoted" - it\'s...ok now'


def test_split_paragraphs_joins_wrapped_lines() -> None:
    text = "First line\n  wraps here.\n\n\n  Second\tparagraph.  \n \nThird."
    assert bc.split_paragraphs(text) == ["First line wraps here.", "Second paragraph.", "Third."]


def test_strip_markup_drops_code_blocks_and_keeps_link_text() -> None:
    md = "# Title\n\nSee [the guide](https://x.org/g) for **more** `detail`.\n\n```python\nimport os\n```\n\n    indented code\n"
    assert bc.split_paragraphs(bc.strip_markup(md)) == ["Title", "See the guide for more detail."]
    rst = "Use :func:`open` here::\n\n    open('x')\n\nAfter the block.\n\n.. note::\n\n   hidden\n"
    assert bc.split_paragraphs(bc.strip_markup(rst)) == ["Use open here:", "After the block."]


def test_pod_keeps_ordinary_paragraphs_only() -> None:
    pod = "sub f { 1 }\n\n=head1 NAME\n\nThe B<fast> module uses C<< $x->y >> and L<perlfunc|perlfunc/open>.\n\n" \
          "    my $x = 1;\n\n=cut\n\nsub g { 2 }\n"
    assert bc.split_paragraphs(bc.pod_to_text(pod)) == ["The fast module uses $x->y and perlfunc."]


def test_javadoc_keeps_description_without_tags_or_html() -> None:
    java = ("/**\n * Returns the {@code length} of this {@link java.lang.String#length() string}.\n * <p>\n"
            " * Second paragraph.\n * <pre>{@code\n *   s.length();\n * }</pre>\n * @param x ignored\n */\n"
            "int length();\n")
    assert bc.split_paragraphs(bc.javadoc_to_text(java)) == ["Returns the length of this length.", "Second paragraph."]


def test_html_text_skips_pre_and_navigation() -> None:
    page = ("<html><head><title>T</title></head><body><nav>Menu</nav><main><h1>Vectors</h1>"
            "<p>A <code>Vec</code> grows.</p><pre>let v = vec![];</pre><p>Second &amp; last.</p></main></body></html>")
    assert bc.split_paragraphs(bc.html_to_text(page)) == ["Vectors", "A Vec grows.", "Second & last."]


def test_vim_help_drops_tags_and_headings() -> None:
    vim = "INTRODUCTION ~\n\nThe |:edit| command opens a file.\t*:e*\n\n\t:e foo.txt\n"
    assert bc.split_paragraphs(bc.vim_help_to_text(vim)) == ["The :edit command opens a file."]


def _write_source_tree(root: Path) -> None:
    (root / "a").mkdir(parents=True)
    (root / "a" / "one.txt").write_text(f"{PROSE[0]}\n\n{NOT_PROSE[0]}\n\n{PROSE[1]}\n")
    (root / "b.txt").write_text(f"{PROSE[0].upper()}\n\n{PROSE[2]}\n")  # first paragraph: a duplicate
    with gzip.open(root / "c.txt.gz", "wt") as f:
        f.write(NOT_PROSE[1] + "\n")


def test_build_dedupes_across_files_and_is_deterministic(tmp_path: Path) -> None:
    _write_source_tree(tmp_path / "src")
    source = bc.Source("test", "test files", (tmp_path / "src",), ("*.txt", "*.txt.gz"), bc._text(bc.strip_markup))
    documents, stats = bc.build([source], workers=2)
    # Path order: a/one.txt, b.txt (c.txt.gz keeps nothing); b.txt's upper-case copy of PROSE[0] is a duplicate.
    assert documents == [f"{PROSE[0]}\n\n{PROSE[1]}", PROSE[2]]
    st = stats["test"]
    assert (st.files_read, st.files_kept, st.paragraphs_seen, st.paragraphs_kept, st.duplicates) == (3, 2, 6, 3, 1)
    assert st.groups == {"a": [1, 2, len(documents[0])], ".": [1, 1, len(documents[1])]}

    out1, out2 = tmp_path / "c1.txt.gz", tmp_path / "c2.txt.gz"
    text = bc.write_corpus(documents, out1)
    bc.write_corpus(bc.build([source], workers=1)[0], out2)
    assert hashlib.sha256(out1.read_bytes()).digest() == hashlib.sha256(out2.read_bytes()).digest()
    assert gzip.decompress(out1.read_bytes()) == text
    assert text == f"{documents[0]}\n<|endoftext|>\n{documents[1]}\n".encode()


def test_per_source_cap_keeps_a_reproducible_subset(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    for i in range(10):
        (root / f"{i}.txt").write_text(f"Document number {i} is one of the files that the cap can keep or drop here.\n")
    source = bc.Source("capped", "capped", (root,), ("*.txt",), bc._text(bc.strip_markup), cap_bytes=300)
    first = bc.build([source], workers=1)[0]
    assert 1 <= len(first) < 10 and sum(len(d) + 1 for d in first) <= 300
    assert bc.build([source], workers=2)[0] == first
