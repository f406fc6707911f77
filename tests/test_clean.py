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


def test_lists_and_settings_that_end_in_a_number_are_not_a_table_of_contents() -> None:
    """A contents entry ended in its number after one space, or in a word of i, v, x, l, c,
    d, m: lists of years, requirements and formats, and code constants, were dropped."""
    for text in [
        "Company history:\n\n- Founded in 1998\n- IPO in 2004\n- Acquired in 2012\n",
        "Requirements:\n\n- Python 3\n- 8 GB RAM\n- Ubuntu 22\n",
        "Formats:\n\n- Blu-ray\n- DVD\n- CD\n",
        "MAX_RETRIES = 5\nTIMEOUT = 30\nPORT = 8080\n",
        "1. Preheat to 180\n2. Knead for 10\n3. Bake for 35\n",  # a Markdown list
        "Loading.... one\nLoading.... two\nLoading.... three\n",  # no page after the dots
    ]:
        result = clean_markdown(text, CleanConfig(), "markdown")
        assert result.markdown == text and result.dropped == {}, text
    # Numbered sections whose pages go down are not contents either.
    down = "1 Setup 12\n2 Usage 4\n3 Errors 9\n"
    assert clean_markdown(down, CleanConfig(), "pdf").dropped == {}
    gap = "Introduction  1\nScope\tiv\nMethods  12\n"  # a gap before the page: contents
    assert clean_markdown(gap, CleanConfig(), "docx").dropped == {"toc": 1}


def test_a_text_file_keeps_its_lines_and_indentation() -> None:
    """Code and config read as text: the constants block went as a contents page, every
    indentation became one space, and a line of one number went as a page number."""
    code = (
        "import os\n\nMAX_RETRIES = 5\nTIMEOUT = 30\n\n\ndef connect(host):\n"
        "    for attempt in range(MAX_RETRIES):\n        if attempt > 2:\n"
        "            return None\n    return host\n\n# (c) by the authors\n42\n"
    )
    kept = clean_markdown(code, CleanConfig(), "text")
    assert kept.markdown == code and kept.dropped == {}
    # Invisible characters are still fixed, and the user's own patterns still apply.
    odd = clean_markdown("a\u200bb\nSECRET x\nc\n", CleanConfig(extra_patterns=["^SECRET"]),
                         "text")  # fmt: skip
    assert odd.markdown == "ab\nc\n" and odd.dropped == {"ocr_fix": 1, "custom": 1}
    # Nested lists in Markdown keep their nesting too.
    nested = "- a\n    - b\n- c  d\n"
    assert clean_markdown(nested, CleanConfig(), "markdown").markdown == "- a\n    - b\n- c d\n"


def test_comments_are_removed_within_a_block_never_across_a_section() -> None:
    """A literal <!-- in the text ran to the next --> sections later: two headings and
    three paragraphs went as one comment. Fenced code keeps its comments."""
    text = (
        "# HTML basics\n\nA comment starts with <!-- on the same or a later line.\n\n"
        "## Attributes\n\nAttributes go in the tag.\n\n## Ending comments\n\n"
        "A comment ends with --> after its text.\n\n<!-- image -->\n\n"
        "```html\n<!-- a comment -->\n<div>x</div>\n```\n"
    )
    result = clean_markdown(text, CleanConfig(), "html")
    assert result.markdown == text.replace("<!-- image -->\n\n", "")
    assert result.dropped == {"html_comment": 1}
    # Linear: 20,000 unterminated openers took 36 s.
    import time

    started = time.perf_counter()
    clean_markdown("text <!-- " * 20_000, CleanConfig(), "html")
    assert time.perf_counter() - started < 5


def test_a_fence_that_text_runs_into_is_still_code() -> None:
    text = "Example:\n```python\ndef f():\n\n    return 1\n1\n```\nAfter.\n"
    result = clean_markdown(text, CleanConfig(), "markdown")
    assert result.markdown == (
        "Example:\n\n```python\ndef f():\n\n    return 1\n1\n```\n\nAfter.\n"
    )
    assert result.dropped == {}


def test_line_rules_spare_table_rows_clauses_list_items_and_times() -> None:
    licences = (
        "| package | licence | notice |\n|---|---|---|\n"
        "| numpy | BSD-3 | Copyright 2005 NumPy Developers |\n"
        "| requests | Apache-2.0 | Copyright 2019 Kenneth Reitz |\n"
    )
    assert clean_markdown(licences, CleanConfig(), "pdf").markdown == licences
    for line in [
        "(c) by the agent, acting for both parties in good faith.",
        "Copyright by default belongs to the creator of the work.",
        "- 22",
        "12:30:45",
    ]:
        assert clean_markdown(line + "\n", CleanConfig(), "pdf").markdown == line + "\n", line
    # What they are there for still goes.
    furniture = "Copyright (C) 2005 Free Software Foundation\n- 12 -\n2001:db8::1\nText.\n"
    assert clean_markdown(furniture, CleanConfig(), "pdf").markdown == "Text.\n"


def test_page_furniture_is_a_pdfs_and_a_lone_number_elsewhere_is_text() -> None:
    """A record {"text": "42"} cleaned to its title alone; "well-\\nknown" in a Markdown
    source became "wellknown"."""
    record = "# Answer\n\n42\n"
    assert clean_markdown(record, CleanConfig(), "record").markdown == record
    wrapped = "A well-\nknown case.\n"
    assert clean_markdown(wrapped, CleanConfig(), "markdown").markdown == wrapped
    assert clean_markdown(wrapped, CleanConfig(), "pdf").markdown == "A wellknown case.\n"
    stamped = "Body.\n© 2021 Example Corp. All rights reserved.\nPage 3 of 7\n"
    assert clean_markdown(stamped, CleanConfig(), "html").markdown == "Body.\n"
    changelog = "## Releases\n\n2024-01-05\n\n10.0.0.1\n"  # a date, an address: text
    assert clean_markdown(changelog, CleanConfig(), "markdown").markdown == changelog


def test_prose_tables_of_years_and_notices_in_sentences_are_kept() -> None:
    """The review of the kind rules: ellipses before a number or "I", rows of years with
    rising numbers, and sentences that mention access, ©, copyright or rights went."""
    kept = [
        "Well.... I do not know.... I mean.... I guess we could try it.",
        "Checking dependencies.... 3 found\nResolving.... 12 packages\n"
        "Downloading.... 100% done\nInstalling.... 12 packages installed",
        "Revenue by year (EUR million):\n2019 Europe and Asia 120\n2020 Europe and Asia 135\n"
        "2021 Europe and Asia 160\n2022 Europe and Asia 210",
        "1 Sign the contract within 30\n2 Pay the deposit within 60\n3 Move in after 90",
        "Accessed from the main menu, the Settings page lets you change the port.",
        "Retrieved from the cache, a page is served without calling the origin server.",
        "Press Option-G to type the © sign on a Mac keyboard.",
        "Works published after 1978 are protected: copyright 1978 and later lasts longer.",
        "The licensor keeps all rights reserved under section 4 unless the licence says so.",
        "3/4",
        "1 of 3",
        # The second review: a year soon after "(c)" or "Copyright" is not a notice.
        "(c) any work published before 1923 is in the public domain in the United States.",
        "Copyright Act of 1976 extended the term of protection for works created after 1978.",
        "Copyright law changed in 1998 when the Sonny Bono act passed.",
        "(c) In 2019 the committee approved the budget for the next three years.",
    ]
    for text in kept:
        result = clean_markdown(f"Intro.\n\n{text}\n", CleanConfig(), "markdown")
        assert result.markdown == f"Intro.\n\n{text}\n" and result.dropped == {}, text
    # PDF page furniture and a contents page with sections still go.
    pdf = ("Body.\n3/4\nAccessed on 2024-01-05 from https://example.org\n© Copyright 2014 IBM\n"
           "Copyright c© 1998-2020 Kurt Hornik\n")  # fmt: skip
    assert clean_markdown(pdf, CleanConfig(), "pdf").markdown == "Body.\n"
    toc = "1 Introduction 1\n1.1 Scope 2\n2 Methods 5\n"
    assert clean_markdown(toc, CleanConfig(), "pdf").dropped == {"toc": 1}
    index = "assignment . . . . . . . . . . 5, 11 atomic . . . . . . . . . . 7 call . . . . . . 9"
    assert clean_markdown(index, CleanConfig(), "pdf").dropped == {"toc": 1}  # a book index


def test_prose_and_listings_with_leaders_are_no_contents_page() -> None:
    """Three runs of "........ N" anywhere in a paragraph deleted it whole, prose and all,
    as a contents page: long leaders needed no next entry after their number."""
    kept = [
        "Results: Group A ........ 12 patients, Group B ........ 15 patients, Group C "
        "........ 9 patients.",
        "The install log shows: Downloading.......... 100% done Unpacking.......... 100% "
        "done Configuring.......... 100% done, and then it exits.",
        "lint ........ 0 errors\ntest ........ 0 failures\nbuild ........ 0 warnings",
        # A capitalised unit after the number is no next entry (the second review).
        "lint ........ 0 Errors\ntest ........ 0 Failures\nbuild ........ 0 Warnings",
        "Subtotal ........ 120 EUR\nShipping ........ 5 EUR\nTax ........ 24 EUR",
    ]
    for text in kept:
        for kind in ("markdown", "html", "pdf"):
            result = clean_markdown(f"# Trial\n\nIntro.\n\n{text}\n", CleanConfig(), kind)
            assert text in result.markdown and "toc" not in result.dropped, (kind, text)
    joined = ("1 Introduction . . . . . . . . . . 1 1.1 What is R? . . . . . . . . . 2 "
              "1.2 Obtaining R . . . . . . . . . . 3")  # fmt: skip
    assert clean_markdown(joined, CleanConfig(), "pdf").dropped == {"toc": 1}
    # A book index's terms hold commas and dots (R-ints, R-lang): still an index page.
    index = ("generic, generic . . . . . . . . . . . . . . . . . . . . 12 generic, internal . . "
             ". . . . . . . . . . . . . . . . 12 global environment. . . . . . . . . . . . . . . "
             ". . . . . 23 read.table . . . . . . . . . . . . . 5, 11")  # fmt: skip
    assert clean_markdown(index, CleanConfig(), "pdf").dropped == {"toc": 1}
    # A record's field is no contents page, however it aligns its numbers.
    record = "# Inventory for March\n\nStock on hand:\nApples   12\nPears    7\nPlums    30\n"
    assert clean_markdown(record, CleanConfig(), "record").dropped == {}


def test_a_text_files_comment_lines_meet_the_users_patterns() -> None:
    licence = "# SPDX-License-Identifier: MIT\n# Copyright 2024 ACME\n// Copyright 2024 ACME\nx\n"
    patterns = ["SPDX-License-Identifier", "Copyright"]
    result = clean_markdown(licence, CleanConfig(extra_patterns=patterns), "text")
    assert result.markdown == "x\n" and result.dropped == {"custom": 3}


def test_a_contents_page_of_one_entry_per_paragraph_is_judged_as_one() -> None:
    """A PDF's contents page sets each chapter's entry apart, one paragraph each, and the
    TOC rule judged block by block, needing three lines: 197 of the R manuals' 1959
    chunks were mostly dot leaders. A run of adjacent entries is now one candidate, over a
    page break, up to the next heading or text."""
    toc = (
        "## Table of Contents\n\n1 Introduction . . . . . . . . . . 1\n\n"
        "2 R Basics. . . . . . . . . . 3\n\n3 R and S . . . . . . . . 12\n"
    )
    result = clean_markdown(toc, CleanConfig(), "pdf")
    assert result.markdown == "## Table of Contents\n"
    assert result.dropped == {"toc": 3}
    # Entries joined on a line and index entries with pages after a comma are entries; a
    # contents page goes on over the page (its marker kept), and the text after it stays.
    pages = (
        "## Contents\n\nAcknowledgements . . . . . . . . . . . 1\n\n"
        "3.1 EpiInfo, Minitab . . . . . . . 15 3.2 Octave . . . . . . . . 16\n\n"
        "<!-- ragpipe:page 4 -->\n\nConcept index. . . . . . . . . . . . 36, 37\n\n"
        "## Acknowledgements\n\nThe manual owes much to its readers.\n"
    )
    result = clean_markdown(pages, CleanConfig(), "pdf")
    assert result.markdown == (
        "## Contents\n\n<!-- ragpipe:page 4 -->\n\n"
        "## Acknowledgements\n\nThe manual owes much to its readers.\n"
    )
    assert result.dropped == {"toc": 3}
    # Markdown gets the rule too; numbered sections with rising pages are entries.
    numbered = "# Contents\n\n1 Introduction 1\n\n1.1 Scope 2\n\n2 Methods 5\n\nBody.\n"
    result = clean_markdown(numbered, CleanConfig(), "markdown")
    assert result.markdown == "# Contents\n\nBody.\n" and result.dropped == {"toc": 3}


def test_short_lists_and_entries_apart_from_each_other_are_kept() -> None:
    """What a run of one-paragraph entries must not take: real short lists, lines that end
    in a number after a gap or one space, two entries (under toc_min_lines), and entries
    with text between them (not adjacent)."""
    kept = [
        "- Install R\n\n- Run the tests\n\n- Read chapter 2",
        "1. Preheat to 180\n\n2. Knead for 10\n\n3. Bake for 35",
        "1 Sign the contract within 30\n\n2 Pay the deposit within 60\n\n3 Move in after 90",
        "Flour\t200\n\nSugar\t100\n\nEggs\t2",  # a gap is no entry across paragraphs
        "Results: Group A ........ 12 patients\n\nGroup B ........ 15 patients\n\n"
        "Group C ........ 9 patients",
        "Introduction . . . . . . . . 1\n\nUsage . . . . . . . . 3",  # two: not enough
        "Introduction . . . . . . . . 1\n\nThe chapters follow.\n\nUsage . . . . . . . . 3\n\n"
        "More text.\n\nErrors . . . . . . . . 7",
    ]
    for text in kept:
        for kind in ("markdown", "pdf"):
            result = clean_markdown(f"# Notes\n\n{text}\n", CleanConfig(), kind)
            assert result.markdown == f"# Notes\n\n{text}\n", (kind, text)
            assert result.dropped == {}, (kind, text)
    # A heading ends the run: two entries on each side of one are two short lists.
    split = (
        "Intro . . . . . . . 1\n\nUsage . . . . . . . 3\n\n## Part two\n\nErrors . . . . . . 7\n"
    )
    assert clean_markdown(split, CleanConfig(), "pdf").markdown == split


def test_a_pdfs_book_index_set_as_code_is_judged_and_real_code_kept() -> None:
    """The fast converter fences lines set in a monospace font, and R's manuals set their
    function index so (14.6 KB of R-intro's index, 14.3 KB of R-ints'); cleaning never
    looked inside a fence. In a PDF a fence whose every line ends in leaders to its pages
    (or is a term wrapped onto an indented line that does) is judged as entries."""
    index = "```\ncbind. . . . . . . 26\ncoef . . . . . . 58\nc . . . . . . . . 7, 9\n```\n"
    result = clean_markdown(f"## Index\n\n{index}", CleanConfig(), "pdf")
    assert result.markdown == "## Index\n" and result.dropped == {"toc": 1}
    # Two fenced lines are short alone, but part of the index's run of entries.
    run = (
        "## Function and variable index\n\n..dbf . . . . . . . . . . 21\n\n"
        "```\n.xls . . . . . . . . . . 23, 32\n.xlsx. . . . . . . . . . 32\n```\n\n"
        "Bbzfile. . . . . . . . . . 26\n\n"
        "```\n_R_CHECK_BUILD_VIGNETTES_\n  ELAPSED_TIMEOUT_ . . . . . . 65\n```\n"
    )
    result = clean_markdown(run, CleanConfig(), "pdf")
    assert result.markdown == "## Function and variable index\n"
    assert result.dropped == {"toc": 4}
    # A Markdown author's code block is never judged, whatever it holds.
    assert clean_markdown(index, CleanConfig(), "markdown").markdown == index
    # Real code with dots, and output whose leaders end in no page, stay in a PDF too; so
    # do a line of code before leaders (no wrapped term: not indented under it) and a
    # fence left open.
    for code in [
        '```\nf <- function(x, ...) UseMethod("f")\nx[1:3]\nfor (i in 1:10) cat(i, "....")\n```',
        "```\nChecking files . . . . . . done\nChecking links . . . . . . done\n"
        "Checking style . . . . . . done\n```",
        "```\nsummary(fit)\nResiduals . . . . . . 12\nCoefficients . . . . . 3\n"
        "Sigma . . . . . . 5\n```",
        "```\ncbind. . . . . . . 26\ncoef . . . . . . 58\nc . . . . . . . . 7, 9\n",
        "```\ncbind. . . . . 26\ncoef . . . . 58\n```",  # two entries alone: too few
    ]:
        text = f"Run this:\n\n{code}\n\nThen read the output.\n"
        result = clean_markdown(text, CleanConfig(), "pdf")
        assert result.markdown == text and result.dropped == {}, code
