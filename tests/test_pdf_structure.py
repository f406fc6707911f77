from __future__ import annotations

from ragpipe.ingest.pdf_structure import Line, lines_to_markdown

W, H = 600.0, 800.0


def _line(page: int, top: float, text: str, font: str = "/AB+Times-Roman", size: float = 10.0,
          x0: float = 72.0, x1: float = 520.0) -> Line:  # fmt: skip
    return Line(page, x0, x1, top, top + size, font, text, W, H)


def test_headings_paragraphs_hyphens_and_running_lines() -> None:
    lines = []
    for page in (1, 2, 3):
        lines.append(_line(page, 20, "ACME Handbook", x1=200))  # running header
        lines.append(_line(page, 770, str(page), x0=300, x1=310))  # page number
    body = [
        _line(1, 100, "1 Introduction", font="/AB+Times-Bold", size=14, x1=220),
        _line(1, 130, "This handbook explains the infor-"),
        _line(1, 144, "mation you need to keep going."),
        _line(1, 158, "Short last line.", x1=200),
        _line(1, 172, "A second paragraph starts here and runs"),
        _line(1, 186, "to the next line."),
        _line(2, 100, "1.1 Scope", font="/AB+Times-Bold", size=12, x1=160),
        _line(2, 130, "• First point of the list"),
        _line(2, 144, "• Second point"),
    ]
    ordered = [ln for ln in lines if ln.page == 1][:1] + body[:6] + lines[2:3] + body[6:]
    ordered += lines[1:2] + lines[3:]
    markdown, stats = lines_to_markdown(ordered)
    assert markdown == (
        "<!-- ragpipe:page 1 -->\n\n"
        "# 1 Introduction\n\n"
        "This handbook explains the information you need to keep going. Short last line.\n\n"
        "A second paragraph starts here and runs to the next line.\n\n"
        "<!-- ragpipe:page 2 -->\n\n"
        "## 1.1 Scope\n\n"
        "- First point of the list\n\n"
        "- Second point\n"
    )  # page 3 held only running lines: nothing, not even a marker
    assert stats["running_lines_dropped"] == 6
    assert stats["headings"] == 2


def test_a_line_broken_at_a_words_own_hyphen_keeps_it() -> None:
    """TeX breaks a word holding a hyphen only there: "--no-" "restore" was joined as
    "--norestore", "R-windows@R-" "project.org" as "R-windows@Rproject.org" (in R-intro and
    R-FAQ, about 15 of 150 joins)."""
    from ragpipe.ingest.pdf_structure import _join

    for prev, nxt, joined in [
        ("use --no-", "restore.", "use --no-restore."),
        ("sent to R-windows@R-", "project.org.", "sent to R-windows@R-project.org."),
        ("a cut-and-", "paste approach", "a cut-and-paste approach"),
        ("is DBMS-", "specific,", "is DBMS-specific,"),
        ("on the R-", "help list", "on the R-help list"),
        ("the infor-", "mation", "the information"),  # a word TeX broke: joined
        ("experi-", "ment", "experiment"),
        ("see page 3-", "and more", "see page 3- and more"),  # not a word's break
    ]:
        assert _join(prev, nxt) == joined


def test_code_holding_a_fence_gets_a_longer_one() -> None:
    """An R Markdown chunk in a PDF's code: its "```{r}" and "```" lines closed the fast
    converter's three-backtick fence, and the real closer opened one to the document's end
    (every later heading lost)."""
    from ragpipe.ingest.chunk import split_sections

    code = ["---", "title: Report", "---", "```{r}", "summary(cars)", "```"]
    lines = [_line(1, 100, "1 Using R Markdown", font="/AB+Times-Bold", size=14, x1=220),
             _line(1, 130, "A chunk:")]  # fmt: skip
    lines += [_line(1, 160 + 14 * i, t, font="/AB+CMTT10", x0=90) for i, t in enumerate(code)]
    lines += [_line(1, 280, "2 Rendering", font="/AB+Times-Bold", size=14, x1=220)]
    lines += [_line(1, 310 + 14 * i, f"Call render with the file as its first argument {i}")
              for i in range(8)]  # body text outnumbers code: its font is the body's  # fmt: skip
    markdown, _ = lines_to_markdown(lines)
    assert "````\n---\ntitle: Report\n---\n```{r}\nsummary(cars)\n```\n````" in markdown
    titles = [s.heading_path for s in split_sections(markdown)]
    assert titles[-1] == ["2 Rendering"]


def test_monospace_block_becomes_code() -> None:
    lines = [
        _line(1, 100, "Run the following:"),
        _line(1, 130, "x <- c(1, 2)", font="/AB+CMTT10", x0=90),
        _line(1, 144, "mean(x)", font="/AB+CMTT10", x0=90),
        _line(1, 174, "and read the result."),
    ]
    markdown, stats = lines_to_markdown(lines)
    assert markdown == (
        "<!-- ragpipe:page 1 -->\n\nRun the following:\n\n"
        "```\nx <- c(1, 2)\nmean(x)\n```\n\nand read the result.\n"
    )
    assert stats["code_blocks"] == 1


def test_a_line_that_starts_with_a_minus_or_an_option_is_no_list_item() -> None:
    """A dash took no space after it to be a bullet: "-40 degrees" became the item
    "- 40 degrees" (the sign lost, the paragraph cut), "--vanilla" became "- -vanilla"."""
    lines = [
        _line(1, 100, "Freezing points differ. At sea level the temperature where both agree is"),
        _line(1, 114, "-40 degrees, which surprises many readers when they first convert them."),
        _line(1, 128, "Run R with the option that skips all startup files, which is named"),
        _line(1, 142, "--vanilla and is equivalent to --no-environ --no-site-file together."),
        _line(1, 156, "- a dash and a space is still a bullet", x1=300),
    ]
    markdown, _ = lines_to_markdown(lines)
    assert markdown == (
        "<!-- ragpipe:page 1 -->\n\n"
        "Freezing points differ. At sea level the temperature where both agree is -40 degrees, "
        "which surprises many readers when they first convert them. Run R with the option that "
        "skips all startup files, which is named --vanilla and is equivalent to --no-environ "
        "--no-site-file together.\n\n"
        "- a dash and a space is still a bullet\n"
    )


def test_a_numbered_list_item_keeps_its_number() -> None:
    """Every list item became "- text": "1. Install R" and "(b) Restart" lost the numbers
    that the steps' text refers to ("repeat step 2")."""
    lines = [
        _line(1, 100, "To install, follow these steps:"),
        _line(1, 114, "1. Download the installer from a mirror.", x1=300),
        _line(1, 128, "2) Run it and accept the defaults.", x1=300),
        _line(1, 142, "(b) Restart, then repeat step 2.", x1=300),
        _line(1, 156, "c. Check the version.", x1=300),
        _line(1, 170, "• A symbol bullet is a plain item.", x1=300),
    ]
    markdown, _ = lines_to_markdown(lines)
    assert markdown == (
        "<!-- ragpipe:page 1 -->\n\n"
        "To install, follow these steps:\n\n"
        "1. Download the installer from a mirror.\n\n"
        "2) Run it and accept the defaults.\n\n"
        "- (b) Restart, then repeat step 2.\n\n"
        "- c. Check the version.\n\n"
        "- A symbol bullet is a plain item.\n"
    )


def test_a_short_chapters_running_head_goes_where_the_others_stand() -> None:
    """A running head is dropped when it repeats on three pages: a chapter of one or two
    pages printed its head too few times ("Chapter 14: OS facilities  87" stayed between
    paragraphs: 45 heads in the six R manuals). A margin line in the heads' font and place
    that prints its own page's number as they do is a head too; other margin text stays."""
    head = "/AB+CMR10"
    lines = []
    for page in range(1, 8):
        if page == 1:  # margin text in the heads' place and font, not its page's number
            lines.append(_line(page, 40, "Set the limit to 3", font=head))
        if page == 5:  # its page's number in the heads' place, not in their font
            lines.append(_line(page, 40, "See page 4", font="/AB+Times-Italic"))
        if page in (1, 5):  # a chapter opens without a head
            title = "1 Basics" if page == 1 else "2 Short"
            lines.append(_line(page, 100, title, font="/AB+Times-Bold", size=14, x1=200))
        else:  # the printed page numbers run one behind the PDF's
            chapter = "Chapter 1: Basics" if page < 5 else "Chapter 2: Short"
            lines.append(_line(page, 40, f"{chapter}  {page - 1}", font=head))
        lines.append(_line(page, 130, f"Body text of page {page} goes on for a line."))
        if page == 5:  # its page's number in the heads' font, not in their place
            lines.append(_line(page, 760, "Printed on page 4", font=head))
    markdown, stats = lines_to_markdown(lines)
    body = "Body text of page {} goes on for a line."
    assert markdown == (
        f"<!-- ragpipe:page 1 -->\n\nSet the limit to 3\n\n# 1 Basics\n\n{body.format(1)}\n\n"
        f"<!-- ragpipe:page 2 -->\n\n{body.format(2)}\n\n"
        f"<!-- ragpipe:page 3 -->\n\n{body.format(3)}\n\n"
        f"<!-- ragpipe:page 4 -->\n\n{body.format(4)}\n\n"
        f"<!-- ragpipe:page 5 -->\n\nSee page 4\n\n# 2 Short\n\n{body.format(5)}\n\n"
        "Printed on page 4\n\n"
        f"<!-- ragpipe:page 6 -->\n\n{body.format(6)}\n\n"
        f"<!-- ragpipe:page 7 -->\n\n{body.format(7)}\n"
    )
    assert stats["running_lines_dropped"] == 5  # three heads of chapter 1, two of chapter 2
