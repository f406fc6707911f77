from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path

import pytest

from ragpipe.config import ChunkConfig, ChunkerKind
from ragpipe.errors import ConfigError
from ragpipe.ingest.chunk import TokenCounter, chunk_document, strip_page_markers
from ragpipe.schemas import Chunk, CleanedDocument

COUNTER = TokenCounter("all-MiniLM-L6-v2")

PARA = (
    "Retrieval quality depends on chunking. Chunks that are too long dilute the signal, "
    "and chunks that are too short lose context. "
)


def _doc(markdown: str) -> CleanedDocument:
    return CleanedDocument("d1", "docs/x.md", "sha", "markdown", "docling", markdown, {}, "fp")


def _chunks(markdown: str, kind: str = "markdown", **cfg: object) -> tuple[str, list[Chunk]]:
    config = ChunkConfig(**cfg)  # type: ignore[arg-type]  # test helper: keyword overrides
    text, _ = strip_page_markers(markdown)
    return text, chunk_document(_doc(markdown), kind, config, "fp", COUNTER)


def test_spans_sizes_overlap_and_word_alignment() -> None:
    markdown = "# Title\n\n" + "\n\n".join(PARA * 3 for _ in range(6))
    # Paragraphs of ~390 chars: the overlap must shrink to keep chunks <= 400.
    text, chunks = _chunks(markdown, size=400, overlap=80)
    assert len(chunks) > 4
    for i, c in enumerate(chunks):
        assert c.chunk_index == i
        assert c.text == text[c.char_start : c.char_end]
        assert len(c.text) <= 400
        assert c.text == c.text.strip()
        assert c.text_sha256 == hashlib.sha256(c.text.encode()).hexdigest()
        assert c.token_count == COUNTER.count(c.text) <= 256
    shared = [prev.char_end - nxt.char_start for prev, nxt in itertools.pairwise(chunks)]
    assert all(0 <= s <= 80 for s in shared), shared
    assert sum(s > 0 for s in shared) >= len(shared) // 2, shared
    for c in chunks[1:]:
        assert text[c.char_start - 1].isspace(), "chunks start at a word boundary"
    covered = set()
    for c in chunks:
        covered.update(range(c.char_start, c.char_end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())


def test_heading_paths_and_sections_do_not_mix() -> None:
    markdown = (
        "# Guide\n\nIntro.\n\n## Install\n\nRun it.\n\n"
        "### Linux\n\nUse apt.\n\n## Usage\n\nCall it.\n"
    )
    _, chunks = _chunks(markdown)
    assert [(c.heading_path, c.text) for c in chunks] == [
        (["Guide"], "# Guide\n\nIntro."),
        (["Guide", "Install"], "## Install\n\nRun it."),
        (["Guide", "Install", "Linux"], "### Linux\n\nUse apt."),
        (["Guide", "Usage"], "## Usage\n\nCall it."),
    ]


def test_a_heading_with_nothing_under_it_opens_the_next_sections_chunk() -> None:
    """'# Install' followed by '## 2.5 How can R be installed?' was a chunk of its own, as
    was the question (45 such chunks in the R manuals; for R-FAQ, a question alone matched
    its question with no answer). The headings now open the chunk of the text under them,
    which has that text's heading path; a heading at the very end has nothing to open."""
    question = "## 2.5 How can R be installed?"
    markdown = (
        f"# Install\n\n{question}\n\n### 2.5.1 Unix-like\n\nBuild it from source.\n\n"
        "## 2.6 Binaries\n\n## 2.7 Docs\n\nRead the manuals.\n\n"
        "## Code\n\n```\n# not a heading\n```\n\n## Empty\n"
    )
    for config in ({}, {"whole_sections": True}):
        _, chunks = _chunks(markdown, **config)
        assert [(c.heading_path, c.text, c.line_start) for c in chunks] == [
            (["Install", "2.5 How can R be installed?", "2.5.1 Unix-like"],
             f"# Install\n\n{question}\n\n### 2.5.1 Unix-like\n\nBuild it from source.", 1),
            (["Install", "2.7 Docs"], "## 2.6 Binaries\n\n## 2.7 Docs\n\nRead the manuals.", 9),
            (["Install", "Code"], "## Code\n\n```\n# not a heading\n```", 15),
            (["Install", "Empty"], "## Empty", 21),
        ], config  # fmt: skip
    # A long section after it: the headings lead its first chunk, every chunk has its path.
    text, chunks = _chunks(f"# Install\n\n{question}\n\n" + PARA * 8, size=300, overlap=50)
    assert chunks[0].text.startswith(f"# Install\n\n{question}\n\nRetrieval quality")
    assert {tuple(c.heading_path) for c in chunks} == {("Install", question[3:])}
    assert len(chunks) > 3 and all(c.text == text[c.char_start : c.char_end] for c in chunks)


def test_code_fence_hash_lines_are_not_headings_and_text_kind_has_none() -> None:
    markdown = "# Real\n\n```\n# a comment\nx = 1\n```\n"
    _, chunks = _chunks(markdown)
    assert {tuple(c.heading_path) for c in chunks} == {("Real",)}
    _, plain = _chunks("# not a heading in a .py file\nx = 1\n", kind="text")
    assert [c.heading_path for c in plain] == [[]]


def test_pages_and_line_numbers() -> None:
    markdown = (
        "<!-- ragpipe:page 1 -->\n\n# A\n\nFirst page.\n\n"
        "<!-- ragpipe:page 2 -->\n\n# B\n\nSecond page.\n"
    )
    text, chunks = _chunks(markdown)
    assert [(c.page, c.line_start, c.text) for c in chunks] == [
        (1, 1, "# A\n\nFirst page."),
        (2, 5, "# B\n\nSecond page."),
    ]
    assert "ragpipe:page" not in text


def test_token_cap_splits_dense_text_below_char_size() -> None:
    # Digits and symbols cost about one word-piece per character: 900 chars
    # fit the character budget but not 256 word-pieces.
    dense = " ".join(f"x{i}:{i * 7}/{i % 13}" for i in range(120))
    _, chunks = _chunks(dense, size=1000, overlap=100)
    assert COUNTER.count(dense) > 256
    assert len(chunks) >= 2
    assert max(c.token_count for c in chunks) <= 256


def test_unbreakable_token_is_hard_cut_within_cap() -> None:
    blob = "a" * 1500 + "ü" * 300
    text, chunks = _chunks(blob, size=1000, overlap=100, max_tokens=64)
    assert "".join(c.text for c in chunks) == text
    assert all(c.token_count <= 64 for c in chunks)


def test_unicode_text_is_kept_exactly() -> None:
    markdown = "# 日本語\n\n" + "これは文です。" * 200 + "\n\nEmoji 🎉 and Ωmega ünïcode.\n"
    text, chunks = _chunks(markdown, size=300, overlap=50)
    for c in chunks:
        assert c.text == text[c.char_start : c.char_end]
        c.text.encode("utf-8")
        assert len(c.text) <= 300 and c.token_count <= 256
    assert chunks[-1].text.endswith("Ωmega ünïcode.")


def test_sentence_window() -> None:
    sentences = [f"Sentence number {i} talks about topic {i}." for i in range(8)]
    markdown = "# Topic\n\n" + " ".join(sentences) + "\n"
    _, chunks = _chunks(markdown, chunker=ChunkerKind.SENTENCE_WINDOW, window=2)
    assert [c.text for c in chunks] == ["# Topic", *sentences]
    assert chunks[3].context == " ".join(sentences[0:5])
    assert chunks[1].context == "# Topic\n\n" + " ".join(sentences[0:3])
    assert all(c.heading_path == ["Topic"] for c in chunks)


def test_sentence_window_context_exact() -> None:
    sentences = [f"Fact {i} is stated here." for i in range(6)]
    _, chunks = _chunks(" ".join(sentences), kind="text", chunker="sentence-window", window=1)
    assert [c.text for c in chunks] == sentences
    assert chunks[0].context == " ".join(sentences[0:2])
    assert chunks[3].context == " ".join(sentences[2:5])
    assert chunks[5].context == " ".join(sentences[4:6])


def test_ids_are_deterministic_and_config_sensitive() -> None:
    markdown = "# T\n\n" + PARA * 20
    _, a = _chunks(markdown, size=300, overlap=30)
    _, b = _chunks(markdown, size=300, overlap=30)
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    other = chunk_document(
        _doc(markdown), "markdown", ChunkConfig(size=300, overlap=30), "fp2", COUNTER
    )
    assert {c.chunk_id for c in a}.isdisjoint(c.chunk_id for c in other)


def test_overlap_validation() -> None:
    with pytest.raises(ValueError, match="overlap"):
        ChunkConfig(size=100, overlap=100)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        ChunkConfig(overlap=-1)


def test_overlap_zero_tiles_the_text() -> None:
    markdown = "# Title\n\n" + "\n\n".join(PARA * 3 for _ in range(6))
    text, chunks = _chunks(markdown, size=400, overlap=0)
    assert len(chunks) > 4
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.char_end <= nxt.char_start, "no chunk shares text with the one before"
    covered = set()
    for c in chunks:
        covered.update(range(c.char_start, c.char_end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())


def test_unknown_tokenizer_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"chunk.tokenizer"):
        TokenCounter("/no/such/tokenizer.json").count("x")
    # Refused at load, naming the fix: it was a failure row for every document, after
    # convert and clean had run.
    from ragpipe.config import load_config

    path = tmp_path / "r.yaml"
    path.write_text("chunk: {tokenizer: all-minilm-l6-v2}\n")
    with pytest.raises(ConfigError, match=r"chunk.tokenizer: .*did you mean 'all-MiniLM-L6-v2'"):
        load_config(path)
    path.write_text(f"chunk: {{tokenizer: {tmp_path}}}\n")  # a folder without tokenizer.json
    with pytest.raises(ConfigError, match=r"nor an existing tokenizer.json"):
        load_config(path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert load_config(path).chunk.tokenizer == str(tmp_path)


# -- tables ----------------------------------------------------------------------------

CAPTION = "Table 3: Ports by host"
HEADER = "| host | port |\n|---|---|"
ROWS = [f"| server-{i:02d}.example.org | {8000 + i} |" for i in range(8)]
TABLE = f"{CAPTION}\n\n{HEADER}\n" + "\n".join(ROWS)


def test_a_long_table_is_split_between_rows_with_caption_and_header_in_every_part() -> None:
    # Room for the caption, header and exactly three rows (each row is 33 characters).
    size = len(f"{CAPTION}\n\n{HEADER}\n") + 3 * len(ROWS[0]) + 2
    markdown = f"# Network\n\nThe hosts below serve the API.\n\n{TABLE}\n\nEnd of the list."
    text, chunks = _chunks(markdown, size=size, overlap=20)
    head = f"{CAPTION}\n\n{HEADER}\n"
    assert [c.text for c in chunks] == [
        "# Network\n\nThe hosts below serve the API.",
        head + "\n".join(ROWS[0:3]),
        head + "\n".join(ROWS[3:6]),
        head + "\n".join(ROWS[6:8]),
        "End of the list.",
    ]
    # The first part is the table's own text; later parts span their rows only.
    first, second, third = chunks[1:4]
    assert text[first.char_start : first.char_end] == first.text
    assert text[second.char_start : second.char_end] == "\n".join(ROWS[3:6])
    assert text[third.char_start : third.char_end] == "\n".join(ROWS[6:8])
    assert all(c.heading_path == ["Network"] for c in chunks)
    assert all(len(c.text) <= size for c in chunks)
    assert all(c.token_count == COUNTER.count(c.text) for c in chunks)


def test_a_table_that_fits_is_never_cut_and_others_are_chunked_as_before() -> None:
    prose = PARA * 3
    markdown = f"# Hosts\n\n{prose}\n\n{TABLE}\n\n{prose}"
    text, chunks = _chunks(markdown, size=400, overlap=1)
    holding = [c for c in chunks if any(row in c.text for row in ROWS)]
    assert len(holding) == 1 and TABLE in holding[0].text  # whole, in one chunk
    assert all(c.text == text[c.char_start : c.char_end] for c in chunks)
    # The next chunk's overlap does not start with the tail of the last row.
    after = chunks[chunks.index(holding[0]) + 1]
    assert "|" not in after.text and after.text.startswith("Retrieval quality")


def test_sentence_windows_keep_a_table_whole_as_its_own_context() -> None:
    markdown = f"# Hosts\n\nFirst sentence. Second sentence.\n\n{TABLE}\n\nLast sentence."
    _, chunks = _chunks(markdown, chunker=ChunkerKind.SENTENCE_WINDOW, window=1)
    (table,) = [c for c in chunks if ROWS[0] in c.text]
    assert table.text == TABLE and table.context == TABLE
    assert [c.text for c in chunks if c is not table] == [
        "# Hosts",
        "First sentence.",
        "Second sentence.",
        "Last sentence.",
    ]


def test_only_a_row_longer_than_a_chunk_is_cut_and_pipes_in_code_are_no_table() -> None:
    long_row = "| wide | " + " ".join(f"word{i}" for i in range(120)) + " |"
    markdown = f"{HEADER}\n{ROWS[0]}\n{long_row}\n{ROWS[1]}"
    _, chunks = _chunks(markdown, size=300, overlap=1)
    assert chunks[0].text == f"{HEADER}\n{ROWS[0]}"
    cut = [c for c in chunks if "word" in c.text]
    assert len(cut) > 1 and all(c.text.startswith(HEADER + "\n") for c in cut)
    assert all(len(c.text) <= 300 for c in chunks)
    # The pieces (without the repeated header) are the row, cut between words.
    pieces = [c.text.removeprefix(HEADER + "\n") for c in cut]
    assert " ".join(pieces) == long_row
    assert chunks[-1].text == f"{HEADER}\n{ROWS[1]}"
    code = "```\n" + f"{HEADER}\n" + "\n".join(ROWS * 3) + "\n```"
    _, chunks = _chunks(code, size=300, overlap=1)
    assert sum(HEADER in c.text for c in chunks) == 1  # cut like any code, header once


def test_an_overlap_never_starts_inside_a_table() -> None:
    rows = "\n".join(f"| r{i} | value number {i} |" for i in range(6))
    markdown = (
        "# S\n\n" + "Intro words here. " * 10 + "\n\n| Name | Value |\n|---|---|\n" + rows
        + "\n\n" + "After the table there is prose. " * 4 + "\n\n" + "More. " * 40
    )  # fmt: skip
    _, chunks = _chunks(markdown, size=400, overlap=120)
    for c in chunks:
        if "| r" in c.text:
            assert "| Name | Value |\n|---|---|" in c.text, c.text


def test_a_table_glued_to_prose_is_not_cut_with_it() -> None:
    table = "| Key | Value |\n|---|---|\n" + "\n".join(f"| k{i} | v{i} |" for i in range(8))
    markdown = "# S\n\n" + "Lead in prose sentence number one goes here. " * 5 + "\n" + table
    _, chunks = _chunks(markdown, size=300, overlap=50)
    assert [c.text for c in chunks if "| k" in c.text] == [table]


def test_a_row_too_wide_for_caption_and_header_is_whole_after_the_header_alone() -> None:
    header = "| host | port |\n|---|---|"
    wide = "| " + " ".join(f"w{i}" for i in range(50)) + " | 1 |"  # 207 characters
    caption = "Table 9: " + "a caption of many words " * 4  # 105 characters
    markdown = f"{caption}\n\n{header}\n{ROWS[0]}\n{wide}\n{ROWS[1]}"
    size = len(f"{header}\n{wide}")  # room for the header and the wide row, not the caption
    _, chunks = _chunks(markdown, size=size, overlap=20)
    assert f"{header}\n{wide}" in [c.text for c in chunks]  # whole, not cut
    assert f"{caption.strip()}\n\n{header}\n{ROWS[1]}" in [c.text for c in chunks]


def test_a_header_wider_than_half_a_chunk_is_not_repeated_and_rows_stay_grouped() -> None:
    header = "| " + " | ".join(f"column {i}" for i in range(40)) + " |\n|" + "---|" * 40
    rows = [f"| r{i} |" + " |" * 39 for i in range(30)]
    markdown = header + "\n" + "\n".join(rows)
    _, chunks = _chunks(markdown, size=600, overlap=20)
    assert len(chunks) < 12  # 30 rows of 84 characters, several to a chunk
    assert sum(r in c.text.split("\n") for c in chunks for r in rows) == 30


def test_a_heading_before_a_long_table_opens_its_first_part() -> None:
    table = "| Key | Value |\n|---|---|\n" + "\n".join(
        f"| k{i} | value number {i} with more words |" for i in range(60)
    )
    _, chunks = _chunks(f"## Limits\n\n{table}")
    assert chunks[0].text.startswith("## Limits\n\n| Key | Value |\n|---|---|\n| k0 |")
    assert all(c.text.startswith("| Key | Value |") for c in chunks[1:])


def test_captions_are_captions_and_back_to_back_tables_are_two() -> None:
    small = "| Table version | Date |\n|---|---|\n| 1 | 2020 |"
    big = "| Key | Value |\n|---|---|\n" + "\n".join(f"| k{i} | value {i} |" for i in range(20))
    _, chunks = _chunks(f"{small}\n\n{big}", size=150, overlap=20)
    assert sum(small in c.text for c in chunks) == 1  # not repeated as the big one's caption
    _, chunks = _chunks(f"Table is where the values go.\n\n{big}", size=150, overlap=20)
    assert sum("Table is" in c.text for c in chunks) == 1
    glued = "| A | B |\n|---|---|\n| a1 | b1 |\n| C | D |\n|---|---|\n| c1 | d1 |"
    _, chunks = _chunks(glued, chunker=ChunkerKind.SENTENCE_WINDOW)
    assert [c.text for c in chunks] == [
        "| A | B |\n|---|---|\n| a1 | b1 |",
        "| C | D |\n|---|---|\n| c1 | d1 |",
    ]


_WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma",
    "omega", "42", "3.14", "foo_bar", "x=1", "naïve", "東京",
]  # fmt: skip


def _random_tables(seed: int) -> tuple[str, list[tuple[str, list[str], str]]]:
    """A document of prose, captions and 1-3 tables of random shapes (cells up to 80 words)."""
    r = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(r.choice(_WORDS) for _ in range(n))

    parts, tables = [f"# Title {words(2)}"], []
    for t in range(r.randint(1, 3)):
        if r.random() < 0.7:
            parts.append(words(r.randint(1, 60)) + ".")
        caption = f"Table {t + 1}: {words(r.randint(1, 15))}" if r.random() < 0.5 else ""
        if caption:
            parts.append(caption)
        ncol = r.randint(1, 6)
        head = "| " + " | ".join(f"H{t}c{c} {words(r.randint(0, 3))}" for c in range(ncol)) + " |"
        rows = [
            "| " + " | ".join([f"R{t}x{i}"] + [words(r.choice([0, 1, 3, 10, 40, 80]))
                                               for _ in range(ncol - 1)]) + " |"
            for i in range(r.randint(1, 30))
        ]  # fmt: skip
        tables.append((head, rows, caption))
        parts.append("\n".join([head, "|" + "---|" * ncol, *rows]))
    parts.append(words(r.randint(1, 80)) + ".")
    return "\n\n".join(parts), tables


@pytest.mark.parametrize("chunker", [ChunkerKind.RECURSIVE, ChunkerKind.SENTENCE_WINDOW])
def test_random_tables_keep_every_budget_every_row_and_every_header(chunker: ChunkerKind) -> None:
    for seed in range(40):
        markdown, tables = _random_tables(seed)
        r = random.Random(seed)
        size, max_tokens = r.choice([120, 300, 500, 1000]), r.choice([16, 64, 128, 256])
        config = {
            "size": size,
            "max_tokens": max_tokens,
            "overlap": r.randint(1, min(size - 1, 200)),
        }
        _, chunks = _chunks(markdown, chunker=chunker, **config)
        for c in chunks:
            assert COUNTER.count(c.text) == c.token_count <= max_tokens, (seed, c.chunk_index)
            assert chunker == ChunkerKind.SENTENCE_WINDOW or len(c.text) <= size, seed
        for head, rows, caption in tables:
            delimiter = "|" + "---|" * head.count(" | ") + "---|"
            full_head = (f"{caption}\n\n" if caption else "") + f"{head}\n{delimiter}"
            for row in rows:
                holding = [c for c in chunks if row in c.text.split("\n")]
                fits = len(row) <= size and COUNTER.count(row) <= max_tokens
                assert holding or not fits, (seed, row[:20])  # a row that fits is never cut
                with_head = f"{full_head}\n{row}"
                if len(with_head) <= size and COUNTER.count(with_head) <= max_tokens:
                    assert all(head in c.text for c in holding), (seed, row[:20])


def test_whole_sections_keep_a_section_that_fits_the_window_as_one_chunk() -> None:
    short = PARA * 4  # ~600 characters, ~110 word-pieces: past size, within the window
    markdown = f"# Short\n\n{short}\n\n# Long\n\n" + "\n\n".join([PARA * 3] * 4)
    text, split = _chunks(markdown, size=300, overlap=30)
    assert sum(c.heading_path == ["Short"] for c in split) > 1  # cut at size by default
    text, whole = _chunks(markdown, size=300, overlap=30, whole_sections=True)
    first = [c for c in whole if c.heading_path == ["Short"]]
    assert len(first) == 1
    assert first[0].text == text[first[0].char_start : first[0].char_end]
    assert first[0].text.endswith(short.strip()) and first[0].text.startswith("# Short")
    assert len(first[0].text) > 300 and first[0].token_count == COUNTER.count(first[0].text)
    # A section past the window is split by size as before.
    long = [c for c in whole if c.heading_path == ["Long"]]
    assert [(c.char_start, c.char_end) for c in long] == [
        (c.char_start, c.char_end) for c in split if c.heading_path == ["Long"]
    ]
    assert len(long) > 1 and all(len(c.text) <= 300 for c in long)


def test_whole_sections_count_the_heading_prefix_keep_tables_and_cap_characters() -> None:
    table = "| name | value |\n|---|---|\n" + "\n".join(f"| row{i} | {i * 7} |" for i in range(20))
    markdown = f"# T\n\nIntro line.\n\n{table}\n"
    text, whole = _chunks(markdown, size=300, overlap=30, whole_sections=True)
    assert len(whole) == 1 and whole[0].text == text.strip()  # the table's section, whole
    assert len(_chunks(markdown, size=300, overlap=30)[1]) > 1
    # A section that fits only without its heading path is split: the embedder reads both.
    body = " ".join(f"word{i}" for i in range(60))
    heading = "A rather long heading about package pinning and release preferences"
    markdown = f"# {heading}\n\n{body}\n"
    alone = COUNTER.count(markdown.strip())
    read = COUNTER.count(f"{heading}\n{markdown.strip()}")  # contextual_text's view
    assert alone < read
    _, cut = _chunks(markdown, size=250, overlap=20, max_tokens=alone, whole_sections=True)
    assert len(cut) > 1
    _, kept = _chunks(markdown, size=250, overlap=20, max_tokens=read, whole_sections=True)
    assert len(kept) == 1 and len(kept[0].text) > 250
    # Few tokens, many characters (padding): not past twice size.
    padded = "\n".join("x" + " " * 200 for _ in range(10)) + "x"
    _, capped = _chunks(f"# P\n\n{padded}\n", size=300, overlap=30, whole_sections=True)
    assert len(capped) > 1 and all(len(c.text) <= 300 for c in capped)


def test_whole_sections_are_refused_for_sentence_windows() -> None:
    with pytest.raises(ValueError, match=r"set chunk\.chunker: recursive"):
        ChunkConfig(chunker=ChunkerKind.SENTENCE_WINDOW, whole_sections=True)


def test_whole_sections_off_keeps_the_fingerprint_of_indexes_built_before_it() -> None:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.chunk import chunk_fingerprint

    # The default's fingerprint as it would be without the setting: it is not part of it
    # while off (a changed fingerprint re-indexes every file). The value moves with the
    # converter's, cleaner's and chunker's versions (CONVERT 3, CLEAN 4, CHUNK 3:
    # 7023a98a -> 9fa22c80; CONVERT 4: 47b3b93a; CLEAN 5, CHUNK 4: f343931d; CONVERT 5:
    # 32f9dc69; CLEAN 6: f0c33110; CLEAN 7: 8c28e6b0; CONVERT 6: cb8010f4; CHUNK 5: 82701cf9;
    # CHUNK 6: 2e74710a; CHUNK 7: 04f13162).
    assert chunk_fingerprint(RagpipeConfig()) == "04f131628ffd0c20"
    on = RagpipeConfig.model_validate({"chunk": {"whole_sections": True}})
    assert chunk_fingerprint(on) != chunk_fingerprint(RagpipeConfig())
    # What whole_sections means is versioned: an index built under another meaning re-chunks.
    from ragpipe.ingest import chunk

    before = chunk_fingerprint(on)
    chunk.WHOLE_SECTIONS_VERSION = "0"
    try:
        assert chunk_fingerprint(on) != before
        assert chunk_fingerprint(RagpipeConfig()) == "04f131628ffd0c20"
    finally:
        chunk.WHOLE_SECTIONS_VERSION = "2"


def test_a_heading_may_end_in_a_hash() -> None:
    """'# C#' was titled 'C': a closing run of # needs a space before it."""
    _, chunks = _chunks("# C#\n\nC# is a language.\n\n## F# ##\n\nF# too.\n", size=30, overlap=5)
    assert [c.heading_path for c in chunks] == [["C#"], ["C#", "F#"]]


def test_a_fence_that_fits_a_chunk_is_never_cut_at_its_blank_line() -> None:
    """Cut at its blank line, chunk 0 ended inside the function with an open fence and
    chunk 1 began without one (the attack review's case, at the default settings)."""
    prose = ("word " * 140).strip() + "."
    first = "\n".join(f"    x{i} = {i}" for i in range(12))
    second = "\n".join(f"    y{i} = {i}" for i in range(12))
    code = f"```python\ndef setup():\n{first}\n\n    # second half\n{second}\n    return x0\n```"
    _, chunks = _chunks(f"# T\n\n{prose}\n\n{code}\n\nAfter.\n")
    assert any(code in c.text for c in chunks)
    for c in chunks:
        assert c.text.count("```") % 2 == 0, c.text


def test_no_overlap_starts_inside_a_fence_that_ends_before_the_next_chunk() -> None:
    """The overlap was moved out of tables, not out of code: the chunk after this code
    block began 'package\npip install ragpipe\n# check it …' with its closing fence and no
    opening one (the attack review's case, at the default settings). A fence longer than
    a chunk is cut anyway: there the overlap stays, the code's lines before the cut."""
    code = (
        "```bash\n# create the environment\npython -m venv .venv\n# install the package\n"
        "pip install ragpipe\n# check it\nragpipe --version\n# build the first index\n"
        "ragpipe ingest docs\n# ask it something\nragpipe ask 'what is this'\n```"
    )
    lead = ("Run the installer from the project folder first. " * 9).strip()
    after = ("After that the command line tool is ready and the tutorial continues with the "
             "first index. " * 7).strip()  # fmt: skip
    _, chunks = _chunks(f"# Install\n\n{lead}\n\n{code}\n\n{after}\n")
    assert [c.text for c in chunks] == [f"# Install\n\n{lead}\n\n{code}", after]
    long = "```python\n" + "\n".join(f"value_{i} = compute_the_value({i})" for i in range(60))
    text, chunks = _chunks(f"# T\n\n{long}\n```\n\nAfter the code.\n")
    assert len(chunks) == 4
    for before, nxt in itertools.pairwise(chunks):
        assert text[nxt.char_start : nxt.char_start + 6] == "value_"
        assert 0 < before.char_end - nxt.char_start <= 150


def test_a_fence_of_exactly_a_chunks_size_is_not_cut_at_its_sentences() -> None:
    """With the blank line after it, a 300-character fence was 302 characters that did
    not fit a 300-character chunk, and was cut at its sentences (the fuzz after the overlap
    fix): pieces are measured without the blank space they lose."""
    body = "# Build the index first. Then ask it.\nragpipe ingest docs\n\n# Ask it. It answers.\n"
    code = "```bash\n" + body + "x" * (300 - len(body) - 12) + "\n```"
    assert len(code) == 300
    lead, after = "Some words before the code. " * 3, "After the code there is prose. " * 4
    _, chunks = _chunks(f"# T\n\n{lead}\n\n{code}\n\n{after}\n", size=300, overlap=50)
    assert [c.text for c in chunks] == [f"# T\n\n{lead.strip()}", code, after.strip()]


def test_a_large_tables_caption_and_header_are_in_a_chunk() -> None:
    """When the caption, header and first row did not fit together, the later parts began
    with the header alone (or nothing): no chunk held the caption, or the column names."""
    caption = "Table 4: Energy use of the pump models tested at the Oslo site in winter 2023."
    head = "| Model | Notes |\n|---|---|"
    for words in (55, 60, 120):
        rows = [f"| M{i} | " + " ".join(f"w{i}x{j}" for j in range(words)) + " |"
                for i in range(3)]  # fmt: skip
        markdown = f"# Results\n\n{caption}\n\n{head}\n" + "\n".join(rows) + "\n"
        _, chunks = _chunks(markdown)
        assert any(caption in c.text and "| Model | Notes |" in c.text for c in chunks), words
        assert any("# Results" in c.text for c in chunks), words
        for row in rows:  # every row still in some chunk
            assert any(row[:40] in c.text for c in chunks)


def test_a_fence_closes_only_on_its_own_kind_and_length() -> None:
    """Docling writes a four-backtick fence around code that holds a three-backtick one:
    the inner fence "closed" it, clean put blank lines inside the code, and its "# Setup"
    comment became a heading with every later section under it."""
    from ragpipe.config import CleanConfig
    from ragpipe.ingest.clean import clean_markdown

    code = "````\n```python\n# Setup\nx = 1\n```\n````"
    tilde = "~~~ Part two ~~~"  # a paragraph (Docling writes backtick fences only)
    markdown = (f"# Guide\n\nHow to write a code block:\n\n{code}\n\n## Install\n\n"
                f"Run the installer.\n\n{tilde}\n\n## Use\n\nRun it.\n")  # fmt: skip
    cleaned = clean_markdown(markdown, CleanConfig(), "markdown").markdown
    assert code in cleaned and tilde in cleaned  # byte for byte
    _, chunks = _chunks(cleaned, size=60, overlap=10)
    paths = [c.heading_path for c in chunks]
    assert ["Setup"] not in paths
    assert paths[-1] == ["Guide", "Use"] and ["Guide", "Install"] in paths
    # Inline code with three backticks opens no fence: the heading after it is one.
    _, inline = _chunks("# A\n\n```x``` is code.\n\n## B\n\nText.\n", size=60, overlap=10)
    assert [c.heading_path for c in inline] == [["A"], ["A", "B"]]


def test_korean_text_is_neither_over_the_window_nor_mostly_overlap() -> None:
    """Hangul is two or three word-pieces a syllable. Cut at max_tokens - 2 characters, a
    run without spaces made chunks of 575 pieces for a window of 256 (the embedder cut
    them); an overlap of 150 characters left a few new characters a chunk (a 304-character
    paragraph became 8 chunks, 1,347 characters embedded)."""
    _, unspaced = _chunks("# T\n\n" + "한국어." * 200, size=1000, overlap=150)
    assert all(c.token_count <= 256 for c in unspaced) and len(unspaced) < 12
    sentence = "3) 개정 이유는 다음과 같습니다. 우리 회사의 제품과 서비스를 보다 명확하게 설명하고 "
    paragraph = (sentence * 6)[:304]
    text, chunks = _chunks(f"# T\n\n{paragraph}\n", size=1000, overlap=150)
    assert all(c.token_count <= 256 for c in chunks)
    assert len(chunks) <= 3 and sum(len(c.text) for c in chunks) < 1.5 * len(text)
    for before, after in itertools.pairwise(chunks):  # each adds more than its overlap
        assert after.char_end - before.char_end > before.char_end - after.char_start
