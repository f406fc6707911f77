from __future__ import annotations

from ragpipe.config import CleanConfig
from ragpipe.ingest.clean import clean_markdown


def test_boilerplate_lines_dropped_and_counted() -> None:
    text = (
        "Real text stays.\n"
        "Page 3 of 10\n"
        "© 2021 Example Corp. All rights reserved.\n"
        "This content downloaded from 128.32.10.1 on Mon, 01 Jan 2024 10:00:00 UTC\n"
        "12/01/2023 10:45\n"
        "192.168.0.1\n"
        "42\n"
        "More real text.\n"
    )
    result = clean_markdown(text, CleanConfig())
    assert result.markdown == "Real text stays.\nMore real text.\n"
    assert result.dropped == {
        "page_number": 2,
        "copyright": 1,
        "download_notice": 1,
        "timestamp": 1,
        "ip_address": 1,
    }


def test_rules_can_be_switched_off() -> None:
    text = "Page 3 of 10\nBody ﬁne.\n<!-- image -->\n"
    off = CleanConfig(boilerplate=False, ligatures=False, html_comments=False)
    result = clean_markdown(text, off)
    assert result.markdown == text
    assert result.dropped == {}


def test_html_comments_ligatures_ocr_and_hyphenation() -> None:
    text = (
        "<!-- image -->\n\nThe ﬁrst ﬂoor\u00ad plan is in-\nformation rich, a well-\nKnown case.\n"
    )
    result = clean_markdown(text, CleanConfig())
    assert result.markdown == "The first floor plan is information rich, a well-\nKnown case.\n"
    assert result.dropped == {"html_comment": 1, "ligature": 2, "ocr_fix": 1, "hyphenation": 1}


def test_page_markers_and_code_blocks_untouched() -> None:
    text = "<!-- ragpipe:page 2 -->\n\n```\n42\nPage 1 of 2\n\n  x  =  1\n```\n\nAfter.\n"
    result = clean_markdown(text, CleanConfig())
    assert result.markdown == text
    assert result.dropped == {}


def test_toc_blocks_dropped_headings_kept() -> None:
    toc = "\n".join(
        ["1 Introduction 1", "1.1 Scope 2", "2 Methods 5", "2.1 Data 7", "3 Results 11"]
    )
    leaders = "Notices . . . . . . vii Trademarks . . . . . . viii Preface . . . . . . xi"
    text = f"# Contents\n\n{toc}\n\n{leaders}\n\nThe study has 3 parts.\n"
    result = clean_markdown(text, CleanConfig())
    assert result.markdown == "# Contents\n\nThe study has 3 parts.\n"
    assert result.dropped == {"toc": 2}


def test_custom_patterns_and_whitespace() -> None:
    text = "CONFIDENTIAL - internal\nKeep   this\t\tline.   \n\n\n\nNext.\n"
    result = clean_markdown(text, CleanConfig(extra_patterns=[r"^CONFIDENTIAL\b"]))
    assert result.markdown == "Keep this line.\n\nNext.\n"
    assert result.dropped == {"custom": 1}


def test_everything_dropped_gives_empty_text() -> None:
    result = clean_markdown("Page 1 of 2\n\n7\n", CleanConfig())
    assert result.markdown == ""
    assert result.dropped == {"page_number": 2}


def test_a_data_table_ending_in_numbers_is_not_a_table_of_contents() -> None:
    prices = "| item | price |\n|---|---|\n" + "\n".join(
        f"| item {name} | {price} |"
        for name, price in zip("abcdefgh", [3, 1, 7, 2, 9, 4, 4, 1], strict=True)
    )
    years = "| Event | Year |\n|---|---|\n| Founded | 1990 |\n| IPO | 2001 |\n| Merger | 2010 |"
    # Docling renders a PDF's contents page as a table that keeps the dot leaders.
    contents = "| Notices . . . . . . . . | vii |\n|---|---|\n" + "\n".join(
        f"| Chapter {i} . . . . . . . . | {i * 12} |" for i in range(1, 8)
    )
    text = f"{prices}\n\n{years}\n\n{contents}\n\nBody.\n"
    result = clean_markdown(text, CleanConfig())
    assert result.markdown == f"{prices}\n\n{years}\n\nBody.\n"
    assert result.dropped == {"toc": 1}  # the data tables had no padding to remove


def test_table_padding_is_removed_and_alignment_kept() -> None:
    docling = (
        "| name          |   default | meaning              |\n"
        "|:--------------|----------:|----------------------|\n"
        "| chunk.size    |      1000 | characters per chunk |\n"
        "| a \\| b        |         1 | an escaped pipe      |"
    )
    result = clean_markdown(docling + "\n", CleanConfig())
    assert result.markdown == (
        "| name | default | meaning |\n|:---|---:|---|\n"
        "| chunk.size | 1000 | characters per chunk |\n"
        "| a \\| b | 1 | an escaped pipe |\n"
    )
    assert result.dropped == {"table_padding": 1}
    kept = clean_markdown(docling + "\n", CleanConfig(compact_tables=False))
    assert kept.markdown == docling + "\n"
