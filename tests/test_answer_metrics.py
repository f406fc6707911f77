"""Judge-free answer metrics against hand-computed values (token counts in comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragpipe.evaluation.answers import (
    DEGENERATE_MIN_NGRAMS,
    DEGENERATE_SHARE,
    citation_scores,
    cosine,
    is_degenerate,
    normalize_answer,
    repetition_share,
    rouge_l,
    token_f1,
)

# --- normalize_answer ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # lower -> "the cat, sat!  on   a mat." -> no punct -> "the cat sat  on   a mat"
        # -> no articles -> " cat sat  on    mat" -> collapse
        ("The Cat, sat!  on   a MAT.", "cat sat on mat"),
        # punctuation is deleted, not replaced by a space: "don't" -> "dont", "U.S.A." -> "usa"
        ("Don't visit the U.S.A.", "dont visit usa"),
        # articles only as whole words: "theater", "another", "anna" stay
        ("An apple in another theater with Anna", "apple in another theater with anna"),
        # punctuation goes before articles: "the-end" -> "theend", which is no article
        ("the-end", "theend"),
        # tabs and newlines are whitespace too
        ("\tThe\n answer \r\n is  42 ", "answer is 42"),
        ("", ""),
        ("A an THE ... !", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


# --- token_f1 -----------------------------------------------------------------


def test_token_f1_partial_overlap_counts_duplicates_once_per_match() -> None:
    # pred "The cat cat sat." -> [cat, cat, sat] (3)
    # ref "a cat sat on mat" -> [cat, sat, on, mat] (4)
    # Counter intersection: cat min(2, 1) = 1, sat 1 -> common 2; P = 2/3, R = 2/4
    p, r = 2 / 3, 2 / 4
    assert token_f1("The cat cat sat.", "a cat sat on mat") == pytest.approx(2 * p * r / (p + r))
    assert token_f1("The cat cat sat.", "a cat sat on mat") == pytest.approx(4 / 7)


def test_token_f1_duplicates_on_both_sides() -> None:
    # pred [x, x, x, y] (4); ref [x, x, z] (3); common: x min(3, 2) = 2 -> P = 2/4, R = 2/3
    p, r = 2 / 4, 2 / 3
    assert token_f1("x x x y", "x x z") == pytest.approx(2 * p * r / (p + r))


def test_token_f1_exact_match_after_normalisation() -> None:
    assert token_f1("The Eiffel Tower!", "eiffel   tower") == 1.0


def test_token_f1_disjoint() -> None:
    assert token_f1("Paris", "London") == 0.0


def test_token_f1_both_empty_is_one() -> None:
    # both normalise to no tokens (articles and punctuation only)
    assert token_f1("", "the .") == 1.0


def test_token_f1_one_empty_is_zero() -> None:
    assert token_f1("a", "cat") == 0.0
    assert token_f1("cat", "") == 0.0


def test_token_f1_ignores_word_order() -> None:
    # normalised: [cat, sat, on, mat] vs [on, mat, cat, sat]: same bag
    assert token_f1("the cat sat on the mat", "on the mat the cat sat") == 1.0


# --- rouge_l ------------------------------------------------------------------


def test_rouge_l_word_order_matters() -> None:
    # pred [the, cat, sat, on, the, mat] (6); ref [on, the, mat, the, cat, sat] (6)
    # bag overlap is all 6 tokens, but the LCS is 3 ("the cat sat" or "on the mat")
    # P = 3/6, R = 3/6 -> F1 = 1/2
    p, r = 3 / 6, 3 / 6
    assert rouge_l("the cat sat on the mat", "on the mat the cat sat") == pytest.approx(
        2 * p * r / (p + r)
    )


def test_rouge_l_subsequence() -> None:
    # pred [the, cat, on, mat] (4); ref [the, cat, sat, on, the, mat] (6); LCS 4
    # P = 4/4, R = 4/6 -> F1 = 2 * 1 * (2/3) / (1 + 2/3) = 4/5
    p, r = 4 / 4, 4 / 6
    assert rouge_l("The cat on mat", "The cat sat on the mat.") == pytest.approx(
        2 * p * r / (p + r)
    )


def test_rouge_l_tokenises_non_alphanumerics_as_spaces() -> None:
    # "Don't STOP!" -> [don, t, stop]; articles are kept (no SQuAD normalisation)
    assert rouge_l("Don't STOP!", "don t stop") == 1.0
    # pred [a, cat] (2) vs ref [cat] (1): LCS 1, P = 1/2, R = 1/1
    p, r = 1 / 2, 1 / 1
    assert rouge_l("a cat", "cat") == pytest.approx(2 * p * r / (p + r))


def test_rouge_l_exact_match() -> None:
    assert rouge_l("The cat sat on the mat.", "the cat sat on the mat") == 1.0


def test_rouge_l_empty_and_disjoint() -> None:
    assert rouge_l("", "the cat") == 0.0
    assert rouge_l("the cat", "") == 0.0
    assert rouge_l("!!!", "???") == 0.0
    assert rouge_l("paris", "london") == 0.0


# --- cosine -------------------------------------------------------------------


def test_cosine_simple_vectors() -> None:
    assert cosine([1.0, 0.0], [0.0, 1.0]) == 0.0
    assert cosine([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert cosine([1.0, 2.0], [-1.0, -2.0]) == pytest.approx(-1.0)
    # [1, 0] . [1, 1] = 1; norms 1 and sqrt(2)
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(1 / math.sqrt(2))
    # scale does not matter: [3, 4] . [4, 3] = 24; norms 5 and 5
    assert cosine(np.array([3.0, 4.0]), np.array([8.0, 6.0])) == pytest.approx(24 / 25)


def test_cosine_zero_vector_is_zero() -> None:
    assert cosine([0.0, 0.0], [1.0, 2.0]) == 0.0
    assert cosine(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float32)) == 0.0


def test_cosine_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="equal length"):
        cosine([1.0, 2.0], [1.0, 2.0, 3.0])


# --- repetition_share / is_degenerate -------------------------------------------


def test_repetition_share_periodic_text() -> None:
    # 9 tokens -> 7 trigrams: abc bca cab | abc bca cab abc -> 4 repeats
    assert repetition_share("a b c a b c a b c") == pytest.approx(4 / 7)


def test_repetition_share_no_repeats() -> None:
    assert repetition_share("one two three four five") == 0.0


def test_repetition_share_lower_cases_and_other_n() -> None:
    # [a, b, c, a, b, c] -> trigrams abc bca cab abc -> 1 repeat of 4
    assert repetition_share("A b c a B c") == pytest.approx(1 / 4)
    # unigrams [yes, yes, no]: the second "yes" repeats -> 1/3
    assert repetition_share("yes yes no", n=1) == pytest.approx(1 / 3)


def test_repetition_share_no_ngrams() -> None:
    assert repetition_share("") == 0.0
    assert repetition_share("a b") == 0.0


def test_repetition_share_rejects_bad_n() -> None:
    with pytest.raises(ValueError, match="n=0"):
        repetition_share("a b c", n=0)


def test_is_degenerate_looping_answer() -> None:
    text = "The answer to this question is: " * 10
    # [the, answer, to, this, question, is:] x 10 = 60 tokens -> 58 trigrams,
    # 6 distinct (one per start word) -> 52 repeats
    assert repetition_share(text) == pytest.approx(52 / 58)
    assert is_degenerate(text)


def test_is_degenerate_normal_sentence() -> None:
    text = (
        "Retrieval augmented generation combines a search over indexed documents "
        "with a language model that writes an answer citing the sources."
    )
    assert len(text.split()) == 20
    assert repetition_share(text) == 0.0
    assert not is_degenerate(text)


def test_is_degenerate_short_answers_never_flagged() -> None:
    # 4 tokens -> 2 trigrams, 1 repeat: share 1/2 but fewer than DEGENERATE_MIN_NGRAMS
    assert repetition_share("yes yes yes yes") == pytest.approx(1 / 2)
    assert not is_degenerate("yes yes yes yes")


def test_is_degenerate_min_ngrams_boundary() -> None:
    assert DEGENERATE_MIN_NGRAMS == 8
    assert DEGENERATE_SHARE == 0.3
    # 9 tokens -> 7 trigrams: not flagged; 10 tokens -> 8 trigrams (7 repeats): flagged
    assert not is_degenerate("yes " * 9)
    assert is_degenerate("yes " * 10)


def test_is_degenerate_share_threshold_inclusive() -> None:
    # 20 tokens -> 18 trigrams; the tail "a b c d e a b c d e" repeats abc, bcd, cde:
    # 3 repeats of 18 -> 1/6 (and a run of 5 follows itself: 10 tokens, 8 trigrams)
    text = "p q r s t u v w x y a b c d e a b c d e"
    assert repetition_share(text) == pytest.approx(1 / 6)
    assert not is_degenerate(text)
    assert is_degenerate(text, share=1 / 6)
    # The same share without a run that repeats itself verbatim over 10 tokens: no loop.
    short = "p q r s t a b c a b c"  # 11 tokens, 1 repeat of 9 trigrams; "a b c a b c" is 6
    assert repetition_share(short) == pytest.approx(1 / 9)
    assert not is_degenerate(short, share=1 / 9)


def test_lists_and_tables_of_one_shape_are_no_loops_and_loops_without_spaces_are() -> None:
    """A 10-row table of yes/no cells (its pipes and cells repeat) was cut as a loop after
    7 rows, a 6-step Chinese list after 240 of 322 characters; "[1]" written 300 times,
    one whitespace "word", was never a loop and ran to max_tokens."""
    rows = [("Windows", "yes", "yes", 1), ("macOS", "no", "yes", 1), ("Linux", "yes", "yes", 2),
            ("FreeBSD", "no", "yes", 2), ("Solaris", "no", "no", 3), ("AIX", "no", "no", 3),
            ("HP-UX", "no", "no", 3), ("OpenBSD", "no", "yes", 2), ("NetBSD", "no", "yes", 2),
            ("Haiku", "no", "no", 3)]  # fmt: skip
    table = "| Platform | 32-bit | 64-bit |\n|---|---|---|\n" + "\n".join(
        f"| {p} | {a} | {b} [{n}] |" for p, a, b, n in rows
    )
    assert repetition_share(table) >= DEGENERATE_SHARE and not is_degenerate(table)
    steps = "安装步骤如下[1]：\n" + "\n".join(
        f"{i}. 打开终端，然后运行命令 apt-get install {p} 来安装软件包 {p} [{1 + i % 3}]。"
        for i, p in enumerate(["vim", "git", "curl", "wget", "make", "gcc"], 1)
    )
    assert repetition_share(steps) >= DEGENERATE_SHARE and not is_degenerate(steps)
    english = "\n".join(
        f"{i}. Open a terminal and run apt-get install {p} to get {p} [2]."
        for i, p in enumerate(["vim", "git", "curl", "wget", "make"], 1)
    )
    assert repetition_share(english) >= DEGENERATE_SHARE and not is_degenerate(english)
    # Numbered, the loop is still a loop: list numbers are no words.
    numbered = " ".join(f"{i}. The answer is in the manual [1]." for i in range(1, 8))
    assert is_degenerate(numbered)
    assert is_degenerate("Bread is baked at 230 °C [1]" + "[1]" * 300)
    assert is_degenerate("Bread is baked at 230 °C [1].\n" + "|---" * 300)
    assert not is_degenerate("Bread is baked at 230 °C [1][2][3].")
    # A loop that counts is a loop: SmolLM2 wrote "The answer is:" with [7], [8], [9], ...
    # (every number reads as one), and a table of numbers alone is no loop.
    counting = "".join(f"The answer is:\n\n[{i}] [1] [2] [3] [4] [5]\n\n" for i in range(6, 20))
    assert is_degenerate(counting)
    numbers = "| 4.1 | 2021 |\n| 4.2 | 2022 |\n| 4.3 | 2023 |\n| 4.4 | 2024 |\n| 4.5 | 2025 |\n"
    assert not is_degenerate(numbers * 2)
    # A number that counts on is a loop's counter; figures of their own are an answer (the
    # review: revenue year by year was cut as a loop once every number read as one).
    years = [(2017, 2.1), (2018, 2.4), (2019, 3.0), (2020, 2.2), (2021, 3.8), (2022, 4.5),
             (2023, 5.1), (2024, 6.3)]  # fmt: skip
    revenue = "\n".join(f"- In {y}, revenue was {r} million euros [1]." for y, r in years)
    assert not is_degenerate(revenue)
    ports = "\n".join(f"- Port {p}: open [{i % 3 + 1}]" for i, p in enumerate([22, 80, 443, 8080,
                      5432, 6379, 27017]))  # fmt: skip
    assert not is_degenerate(ports)
    assert is_degenerate(" ".join(f"The bread bakes for {30 + i} minutes." for i in range(14)))
    # A loop of any length: a paragraph of 141 words said three times.
    paragraph = " ".join(f"word{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(141))
    assert is_degenerate(f"{paragraph}. " * 3)
    # The review: one character 70 times, or a run in code, is no loop (a test runner's
    # rule, a hash of zeros, dot leaders); "=" 300 times in prose is.
    rule = "=" * 70
    assert not is_degenerate(f"Run the tests:\n```\n{rule} test session starts {rule}\n```\n")
    assert not is_degenerate("The genesis block's previous hash is " + "0" * 64 + " [1].")
    assert not is_degenerate("The contents list: Introduction " + "." * 70 + " 1 [1].")
    assert not is_degenerate("Use `" + "[1]" * 70 + "` as the pattern [1].")
    assert is_degenerate("The answer is " + "=" * 300)


PLAN = "Beginner 10 km plan.\n" + "\n".join(
    f"- Week {i}: run {i + 2} km three times." for i in range(1, 11)
)


def test_the_eval_scores_a_list_copied_from_its_source_as_no_loop() -> None:
    """``eval rag``'s degenerate metric reads the sources the answer had, as the answer's
    own check does: the 10-week plan copied from its source scored degenerate 1.0 in the
    eval (``is_degenerate`` without sources) though the answer carried no flag."""
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import Answer, Source
    from ragpipe.query.results import Retrieved

    hit = Retrieved("p1", 1.0, {"file_path": "plan.md", "heading_path": "Plan", "text": PLAN})
    source = Source(1, "p1", "plan.md", None, "Plan", PLAN)
    item = GoldenItem("plan", "The plan?", {"plan.md": 1}, (ChunkTarget("plan.md"),))
    copy = "\n".join(f"Week {i}: run {i + 2} km three times [1]." for i in range(1, 11))
    scores, _, _, _ = score_answer(item, Answer(item.query, copy, [source], [source]), [hit], None)
    assert scores["degenerate"].value == 0.0
    # The same answer over a source that does not hold the list is still a loop.
    other = Source(1, "p1", "plan.md", None, "Plan", "Run three times a week.")
    reply = Answer(item.query, copy, [other], [other])
    assert score_answer(item, reply, [hit], None)[0]["degenerate"].value == 1.0
    # The plan in two chunks, cut before week 10 (no overlap: a line's end between them):
    # weeks 9 and 10 are in no one chunk, so they are compared joined, as generate.answer
    # joins them (the attack review: scored 1.0).
    cut = PLAN.index("- Week 10")
    first = Source(1, "p1", "plan.md", None, "Plan", PLAN[: cut - 1], 0, 0, cut - 1)
    second = Source(2, "p2", "plan.md", None, "Plan", PLAN[cut:], 1, cut, len(PLAN))
    reply = Answer(item.query, copy, [second, first], [second, first])
    hits = [Retrieved(s.point_id, 1.0, {"file_path": "plan.md", "heading_path": "Plan",
                                         "text": s.text}) for s in (first, second)]  # fmt: skip
    assert score_answer(item, reply, hits, None)[0]["degenerate"].value == 0.0


def test_a_counting_list_copied_from_a_source_is_no_loop_and_a_loop_still_is() -> None:
    """The review: the real model's copy of a 10-week plan was cut at week 8 as a loop
    (its numbers count on, as a loop's counter does). Copied word for word from a source,
    its last two periods and the seam between them included, it is that source's list."""
    copy = "\n".join(f"Week {i}: run {i + 2} km three times [1]." for i in range(1, 11))
    assert is_degenerate(copy)  # no source to compare with: the rule as before
    assert not is_degenerate(copy, sources=["Unrelated text.", PLAN])
    # Numbers as written: a week's distance off by one is not the source's list.
    off = "\n".join(f"Week {i}: run {i + 3} km three times [1]." for i in range(1, 11))
    assert is_degenerate(off, sources=[PLAN])
    # Counting on past the source's last week, or the whole list said again (its seam,
    # week 10 then week 1, is in no source): loops.
    on = "\n".join(f"Week {i}: run {i + 2} km three times [1]." for i in range(1, 25))
    assert is_degenerate(on, sources=[PLAN])
    assert is_degenerate(f"{copy}\n{copy}\n{copy}", sources=[PLAN])
    # A loop's seam is in no source, whatever the sources say.
    loop = " ".join(f"Step {i} adds flour number {i} [1]." for i in range(30))
    assert is_degenerate(loop, sources=[PLAN, "Step 3 adds flour."])
    # Versions and numbered settings, copied (probe6 of the review: cut at v1.13, step 6).
    versions = "The 1.x line had these releases: " + ", ".join(f"v1.{i}.0" for i in range(25))
    assert is_degenerate(versions + " [1].")
    assert not is_degenerate(versions + " [1].", sources=[versions + "."])
    steps = "\n".join(f"{i}. Set `opt{i}` to {i * 10} in the config." for i in range(1, 16))
    said = "\n".join(f"{i}. Set `opt{i}` to {i * 10} in the config [2]." for i in range(1, 16))
    assert is_degenerate(said) and not is_degenerate(said, sources=[steps])


def test_rouge_l_and_token_f1_score_answers_in_any_script() -> None:
    """rouge-score's tokens are [a-z0-9]+: an exact answer in Chinese or Russian was no
    token and scored ROUGE-L 0 (a silent 0 in the headline); Chinese was one F1 token."""
    assert rouge_l("北京是中国的首都", "北京是中国的首都") == 1.0
    assert rouge_l("Москва — столица России", "Москва — столица России") == 1.0
    # 5 of 8 characters, in order: P 5/5, R 5/8 -> F1 2 * 5/8 / (1 + 5/8) = 10/13
    assert rouge_l("北京是首都", "北京是中国的首都") == pytest.approx(10 / 13)
    assert token_f1("北京是首都", "北京是中国的首都") == pytest.approx(10 / 13)
    # "—" is punctuation (SQuAD's script kept it as a token): P 2/2, R 2/3 -> 0.8
    assert token_f1("Москва столица", "Москва — столица России") == pytest.approx(0.8)
    from ragpipe.evaluation.answers import _rouge_tokens

    # Any script's punctuation is punctuation: "北京。" scored F1 0.8, «Москва» 0.
    assert token_f1("北京。", "北京") == token_f1("«Москва»", "Москва") == 1.0
    # A Devanagari word keeps its vowel signs (combining marks): 2 tokens, not 5; LCS 1,
    # P 1/2, R 1/1 -> 2/3.
    assert _rouge_tokens("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]
    assert rouge_l("नमस्ते दुनिया", "नमस्ते") == pytest.approx(2 / 3)
    # The second review: "・" is punctuation inside a katakana name, and a decomposed
    # (NFD) answer is the composed one.
    assert (
        rouge_l("ジョン・スミス", "ジョンスミス")
        == token_f1("ジョン・スミス", "ジョンスミス")
        == 1.0
    )
    import unicodedata

    decomposed = unicodedata.normalize("NFD", "がっこう")
    assert rouge_l(decomposed, "がっこう") == token_f1(decomposed, "がっこう") == 1.0
    assert normalize_answer(unicodedata.normalize("NFD", "thé")) == "thé"  # not "the" + mark
    # ASCII text is tokenised as rouge-score tokenises it.
    assert _rouge_tokens("Hello, wor_ld! 3.5 R-FAQ") == ["hello", "wor", "ld", "3", "5", "r", "faq"]


def test_chinese_and_japanese_are_counted_in_characters() -> None:
    """Written without spaces, a Chinese answer was one "word" per sentence: one that looped
    ran to max_tokens, never flagged."""
    from ragpipe.evaluation.answers import answer_tokens

    loop = "软件包可以安装。" * 3  # 8 characters a sentence, "。" a token too
    assert answer_tokens(loop) == (list(loop), 6)  # mostly characters: 6-grams
    # 24 tokens -> 19 6-grams; the first 8 are new, every later one repeats one 8 back: 11
    assert repetition_share(loop) == pytest.approx(11 / 19) and is_degenerate(loop)
    from ragpipe.evaluation.answers import answer_tokens as tokens

    assert tokens("가 나 다 라 마 바")[1] == 3  # Hangul is written with spaces: words
    mixed = ["北", "京", "is", "the", "capital", "[1]"]
    assert answer_tokens("北京 is the capital [1]") == (mixed, 3)  # mostly words: trigrams
    # Japanese prose repeats a fifth of its character trigrams, 3 % of these 6-grams.
    prose = (
        "Rのパッケージをインストールするには、Rコンソールでinstall.packages関数を使用します。"
        "この関数はCRANミラーからパッケージをダウンロードし、依存関係も自動的にインストールします。"
    )
    assert repetition_share(prose) == pytest.approx(2 / 74) and not is_degenerate(prose)
    assert len(prose.split()) == 1  # one whitespace word


# --- citation_scores ------------------------------------------------------------


def test_citation_scores_invalid_citation_counts_as_wrong() -> None:
    # cited {1, 7}; 7 was never given; supporting & given = {1, 2}; correct = {1}
    precision, recall = citation_scores([1, 7], supporting={1, 2}, given={1, 2, 3})
    assert precision == pytest.approx(1 / 2)
    assert recall == pytest.approx(1 / 2)


def test_citation_scores_all_cited_partly_supporting() -> None:
    # cited {1, 2, 3}; supporting {1, 3} -> P = 2/3, R = 2/2
    precision, recall = citation_scores([1, 2, 3], supporting={1, 3}, given={1, 2, 3, 4})
    assert precision == pytest.approx(2 / 3)
    assert recall == 1.0


def test_citation_scores_no_citations() -> None:
    precision, recall = citation_scores([], supporting={2}, given={1, 2, 3})
    assert precision is None
    assert recall == 0.0


def test_citation_scores_no_supporting_sources() -> None:
    precision, recall = citation_scores([1], supporting=set(), given={1, 2})
    assert precision == 0.0
    assert recall is None


def test_citation_scores_supporting_source_not_given() -> None:
    # 4 supports but was not given: recall has nothing to find; citing 4 is invalid
    precision, recall = citation_scores([4], supporting={4}, given={1, 2, 3})
    assert precision == 0.0
    assert recall is None


def test_citation_scores_duplicates_count_once() -> None:
    cited = [2, 2, 3, 2]
    # distinct {2, 3}; supporting {2} -> P = 1/2, R = 1/1
    precision, recall = citation_scores(cited, supporting={2}, given={1, 2, 3})
    assert precision == pytest.approx(1 / 2)
    assert recall == 1.0
    assert cited == [2, 2, 3, 2]


def test_an_answers_citations_are_no_words_of_it() -> None:
    # "The cat sat on the mat [1]." against "A cat sat on a red mat": the answer's tokens
    # are cat, sat, on, mat (articles dropped), the expected cat, sat, on, red, mat: F1 =
    # 2 * 4/4 * 4/5 / (4/4 + 4/5) = 8/9. Scored with the marker as a token ("1"), it was 0.8.
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import Answer, Source
    from ragpipe.query.results import Retrieved

    payload = {"file_path": "pets.md", "heading_path": "Cats", "text": "The cat sat."}
    hit = Retrieved("p1", 1.0, payload)
    source = Source(1, "p1", "pets.md", None, "Cats", "The cat sat.")
    target = ChunkTarget("pets.md", heading="Cats")
    item = GoldenItem("cat", "Where?", {"pets.md": 1}, (target,), "A cat sat on a red mat")
    reply = Answer(item.query, "The cat sat on the mat [1].", [source], [source])
    scores, _, cited, _ = score_answer(item, reply, [hit], None)
    assert token_f1(reply.text, item.expected_answer or "") == pytest.approx(0.8)
    assert scores["answer_f1"].value == pytest.approx(8 / 9)
    # ROUGE-L: the longest common subsequence (cat, sat, on, mat) is 4 of the answer's 6
    # tokens (the, cat, sat, on, the, mat) and of the expected's 7: F1 = 2*4/6*4/7/(4/6+4/7)
    # = 8/13. With the marker a 7th token of the answer, it was 4/7.
    assert scores["answer_rouge_l"].value == pytest.approx(8 / 13)
    assert rouge_l(reply.text, item.expected_answer or "") == pytest.approx(4 / 7)
    assert cited == [1] and scores["citation_precision"].value == 1.0
    # Code is not a citation: "x[1]" stays, as in the expected answer (F1 1, not lower).
    code = GoldenItem("x", "First element?", {"pets.md": 1}, (target,), "Use x[1] in R.")
    reply = Answer(code.query, "Use x[1] in R [1].", [source], [source])
    assert score_answer(code, reply, [hit], None)[0]["answer_f1"].value == 1.0
    # Nor when the answer's citations are read: with "x[2]" in it and [1] its only citation,
    # source 2 (the target) is not cited: precision and recall 0 (they were 0.5 and 1).
    from ragpipe.query.generate import check_citations

    dogs = Retrieved("p2", 0.9, {"file_path": "pets.md", "heading_path": "Dogs", "text": "d"})
    two = [Source(1, "p2", "pets.md", None, "Dogs", "d"), source]
    two[1] = Source(2, "p1", "pets.md", None, "Cats", "The cat sat.")
    text = "Use x[2] for the second element [1]."
    cited_sources, invalid = check_citations(text, two)
    reply = Answer(item.query, text, two, cited_sources, invalid)
    scores, _, cited, _ = score_answer(item, reply, [dogs, hit], None)
    assert cited == [1] and invalid == []
    assert scores["citation_precision"].value == scores["citation_recall"].value == 0.0


def test_a_grade_0_chunk_target_is_no_support_for_a_citation() -> None:
    # Two sources: [1] the graded target (Cats), [2] a distractor graded 0 (Dogs). The
    # answer cites [2] alone: precision 0/1 (the cited source holds no target), recall 0/1
    # (the one supporting source is not cited). Counting the grade-0 target as support,
    # both were 1/1 and 1/2.
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import Answer, Source
    from ragpipe.query.results import Retrieved

    cats = {"file_path": "pets.md", "heading_path": ["Cats"], "text": "Cats purr."}
    dogs = {"file_path": "pets.md", "heading_path": ["Dogs"], "text": "Dogs bark."}
    hits = [Retrieved("p1", 1.0, cats), Retrieved("p2", 0.9, dogs)]
    one = Source(1, "p1", "pets.md", None, "Cats", "Cats purr.")
    two = Source(2, "p2", "pets.md", None, "Dogs", "Dogs bark.")
    targets = (ChunkTarget("pets.md", heading="Cats"), ChunkTarget("pets.md", heading="Dogs",
                                                                    grade=0))  # fmt: skip
    item = GoldenItem("purr", "What purrs?", {"pets.md": 1}, targets, "Cats purr.")
    reply = Answer(item.query, "Dogs bark [2].", [one, two], [two])
    scores, sources, cited, _ = score_answer(item, reply, hits, None)
    assert cited == [2]
    assert [s["holds_target"] for s in sources] == [True, False]
    assert scores["citation_precision"].value == 0.0
    assert scores["citation_recall"].value == 0.0


def test_the_calibration_probe_never_takes_a_distractor_for_an_answer() -> None:
    # The probe's "matching answer" pairs come from an item's target chunks; a grade-0
    # target (Dogs) was taken too, so a judge saying "no" to "What purrs? Dogs bark." was
    # scored wrong.
    from ragpipe.evaluation.calibration import _target_chunks
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem

    cats = {"file_path": "pets.md", "heading_path": ["Cats"], "text": "Cats purr."}
    dogs = {"file_path": "pets.md", "heading_path": ["Dogs"], "text": "Dogs bark."}

    class View:
        def matching(self, suffix: str) -> list[str]:
            return ["pets.md"]

        def payloads(self, path: str) -> list[dict[str, object]]:
            return [cats, dogs]

    graded = (ChunkTarget("pets.md", heading="Cats"), ChunkTarget("pets.md", heading="Dogs",
                                                                   grade=0))  # fmt: skip
    item = GoldenItem("purr", "What purrs?", {"pets.md": 1}, graded)
    assert _target_chunks(item, View()) == [cats]  # type: ignore[arg-type]
    only_0 = GoldenItem("purr", "What purrs?", {"pets.md": 1}, graded[1:])
    assert _target_chunks(only_0, View()) == []  # type: ignore[arg-type]  # not the file's


# --- how an answer is scored: refusals, the floor, cut sources, loops, file targets ---------


def _bread() -> tuple[object, list[object]]:
    from ragpipe.evaluation.golden import ChunkTarget, GoldenItem
    from ragpipe.query.results import Retrieved

    oven = {"file_path": "kitchen/bread.md", "heading_path": ["Oven"],
            "text": "Bake the loaf at 230 degrees Celsius for thirty-five minutes."}  # fmt: skip
    soup = {"file_path": "kitchen/soup.md", "heading_path": ["Soup"], "text": "Soup simmers."}
    hits = [Retrieved("p1", 1.0, oven, {"chunk_cosine": 0.22}),
            Retrieved("p2", 0.9, soup, {"chunk_cosine": 0.2})]  # fmt: skip
    item = GoldenItem("oven", "How long should bread bake?", {"kitchen/bread.md": 3},
                      (ChunkTarget("kitchen/bread.md", heading="Oven"),),
                      "Bake the loaf at 230 degrees Celsius for thirty-five minutes.")  # fmt: skip
    return item, hits


class _Scripted:
    """A model that writes the given pieces (no model file)."""

    name, takes_grammar = "scripted", False

    def __init__(self, *pieces: str) -> None:
        self.pieces, self.asked = pieces, 0

    def chat(self, messages: object, on_token: object = None, **options: object) -> object:
        from ragpipe.models.llm import Completion

        self.asked += 1
        for piece in self.pieces:
            if callable(on_token):
                on_token(piece)
        return Completion("".join(self.pieces), 50, len(self.pieces), self.name, 0.01, "stop")

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


@pytest.mark.parametrize(
    "text",
    [
        "The provided documents do not contain this information [1].",
        "Not found in the sources.",
        "The answer is not in the provided documents [2].",
    ],
)
def test_a_refusal_in_other_words_is_no_answer_and_no_refusal_score(text: str) -> None:
    # With the target given as [1], "The provided documents do not contain this information
    # [1]." scored false_refusal 0 and citation precision 1 (a trusted answer), and 0 as a
    # correct refusal of an unanswerable item. It is neither: the refusal metrics fail
    # (null, counted), and its citation backs no claim.
    from dataclasses import replace

    from ragpipe.evaluation.rag import FAILED, NOT_APPLICABLE, score_answer
    from ragpipe.query.generate import answer

    item, hits = _bread()
    reply = answer(item.query, hits, _Scripted(text))  # type: ignore[arg-type]
    scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
    assert scores["false_refusal"].status == FAILED and scores["false_refusal"].value is None
    assert "not with the not-found sentence" in str(scores["false_refusal"].reason)
    assert scores["citation_precision"].status == NOT_APPLICABLE
    unanswerable = replace(item, answerable=False, relevance={}, chunks=(), expected_answer=None)
    scores = score_answer(unanswerable, reply, hits, None)[0]  # type: ignore[arg-type]
    assert scores["correct_refusal"].status == FAILED


@pytest.mark.parametrize(
    "text",
    [
        "Bake it at 230 C [1]. The documents do not say how long.",  # answers in part
        "R does not contain a GUI; use RStudio [1].",
        "Not found in the provided documents.",  # the sentence itself: a refusal proper
        # Answers about files not found, code built from source, or what a package
        # provides (read as refusals by the first rule, which matched the bare words).
        "The function is not in base R; it is provided by the MASS package [1].",
        "If the file is not found, source() signals an error [1].",
        "Packages not found on CRAN can be installed from source [1].",
        "If the key is not found, the function returns the context default [1].",
        "The API returns 404 when the document is not found [2].",
        "Open source licenses do not cover trademarks [1].",
        "No information is sent to external sources [1].",
        # Things named after sources, and what a program cannot find (a review's finds).
        "If apt cannot find a package in the sources, run apt-get update first [1].",
        "A mirror is not found in the sources list until apt-get update runs [2].",
        # A claim beside a clause saying the sources lack something (an attack review's:
        # each read as a refusal, one sentence with a "lacks" phrase in it).
        "Bake the loaf at 230 degrees Celsius for thirty-five minutes; the sources do not "
        "say whether to preheat [1].",
        "The provided documents do not mention France, but the capital of France is Paris.",
        "Although the documents don't say why, Ada Lovelace wrote the first published "
        "program for the Analytical Engine [1].",
        "Knead the dough for ten minutes [1], although the sources do not mention kneading "
        "by machine.",
        "The provided documents do not mention France \u2014 its capital is Paris.",
        "The provided documents do not say how long to bake. They only describe kneading [2].",
    ],
)
def test_answers_that_mention_sources_or_absence_are_answers(text: str) -> None:
    from ragpipe.evaluation.rag import reads_as_refusal

    assert not reads_as_refusal(text)


@pytest.mark.parametrize(
    "text",
    [
        "The sources don't mention a baking time [1].",
        "The context does not specify the version [3].",
        "I could not find this in the documents.",
        "None of the sources mention this.",
        "I cannot answer this from the given sources.",
        "There is no information about this in the provided documents.",
        "I don't know.",
        "No relevant information was found.",
        # More than one sentence or clause, each saying the sources lack the answer (read
        # as an answer: more than one sentence), and words that state nothing.
        "The provided documents do not mention France. I cannot answer this question.",
        "The provided documents do not mention France.\n\nI cannot answer this question.",
        "I'm sorry, but the documents do not mention France.",
        "Unfortunately, the provided documents do not mention France [1].",
        "Sorry. I cannot answer this question.",
        "The sources do not say how long; I cannot determine it [1].",
        "The documents do not say, however, how long to bake.",
        "The documents do not mention the oven temperature, baking time, or preheating.",
    ],
)
def test_refusals_in_other_words_are_recognised(text: str) -> None:
    from ragpipe.evaluation.rag import reads_as_refusal

    assert reads_as_refusal(text)


def test_a_reply_is_a_refusal_in_other_words_only_when_it_claims_nothing_else() -> None:
    """An attack review: a right answer with a clause saying the sources lack a detail
    scored answer_f1 0 and failed false_refusal (one sentence, a "lacks" phrase in it); an
    answer from outside the sources to an unanswerable item failed correct_refusal, where it
    is a missed refusal (0); and two sentences saying the sources lack the answer scored 0
    as an answer, where they are a refusal not in the required form (failed)."""
    from dataclasses import replace

    from ragpipe.evaluation.rag import FAILED, NOT_APPLICABLE, OK, score_answer
    from ragpipe.query.generate import answer

    def scored(item: object, text: str) -> dict[str, tuple[float | None, str]]:
        reply = answer(item.query, hits, _Scripted(text))  # type: ignore[attr-defined,arg-type]
        scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
        return {m: (j.value, j.status) for m, j in scores.items() if j.status != NOT_APPLICABLE}

    item, hits = _bread()
    # By hand: the expected answer's 9 tokens (bake loaf at 230 degrees celsius for
    # thirtyfive minutes) all in the reply's 16 (+ sources do not say whether to preheat):
    # F1 2 * 9/16 * 1 / (9/16 + 1) = 18/25; ROUGE-L 11 of 11 tokens in order among 19
    # ("thirty five" two, "the" kept): 2 * 11 / (11 + 19) = 11/15. [1] holds the target.
    hedged = ("Bake the loaf at 230 degrees Celsius for thirty-five minutes; the sources do "
              "not say whether to preheat [1].")  # fmt: skip
    assert scored(item, hedged) == {
        "answer_f1": (pytest.approx(18 / 25), OK),
        "answer_rouge_l": (pytest.approx(11 / 15), OK),
        "citation_precision": (1.0, OK),
        "citation_recall": (1.0, OK),
        "false_refusal": (0.0, OK),
        "degenerate": (0.0, OK),
    }
    unanswerable = replace(item, query="What is the capital of France?", answerable=False,
                           relevance={}, chunks=(), expected_answer=None)  # fmt: skip
    outside = "The provided documents do not mention France, but the capital of France is Paris."
    assert scored(unanswerable, outside) == {"correct_refusal": (0.0, OK), "degenerate": (0.0, OK)}
    twice = "The provided documents do not mention France. I cannot answer this question."
    assert scored(unanswerable, twice) == {
        "correct_refusal": (None, FAILED),
        "degenerate": (0.0, OK),
    }
    # The same two sentences to the answerable item, its target given as [1]: a refusal in
    # other words, no answer (0, SQuAD v2's rule) and no refusal (failed).
    assert scored(item, twice) == {
        "answer_f1": (0.0, OK),
        "answer_rouge_l": (0.0, OK),
        "answer_cosine": (0.0, OK),
        "false_refusal": (None, FAILED),
        "degenerate": (0.0, OK),
    }


@pytest.mark.parametrize("text", ["[1].", "[1][2].", "\u2014 [1]", "**[1]**", " [1] "])
def test_citations_with_marks_around_them_are_an_empty_answer(text: str) -> None:
    """An attack review: generate flagged "[1]." no_answer_text (no word character once
    the citations are set aside) while eval rag's own test (nothing but spaces left) read it
    as an answer: citation precision and recall 1.0, false_refusal 0. Both read it with one
    predicate now, and a reply flagged no_answer_text is empty to eval rag in any case."""
    from dataclasses import replace

    from ragpipe.evaluation.rag import EMPTY_ANSWER, FAILED, NOT_APPLICABLE, OK, score_answer
    from ragpipe.query.generate import NO_TEXT, answer

    item, hits = _bread()
    reply = answer(item.query, hits, _Scripted(text))  # type: ignore[arg-type]
    assert reply.flags == [NO_TEXT] and reply.cited
    back = f"{EMPTY_ANSWER}: its citations back no claim"
    expected = {
        "answer_f1": (0.0, OK, EMPTY_ANSWER),
        "answer_rouge_l": (0.0, OK, EMPTY_ANSWER),
        "answer_cosine": (0.0, OK, EMPTY_ANSWER),
        "citation_precision": (None, NOT_APPLICABLE, back),
        "citation_recall": (None, NOT_APPLICABLE, back),
        "correct_refusal": (None, NOT_APPLICABLE, "answerable item"),
        "false_refusal": (None, FAILED, EMPTY_ANSWER),
        "degenerate": (0.0, OK, None),
    }
    for scored in (reply, replace(reply, flags=[])):  # flagged, and read from its text alone
        scores = score_answer(item, scored, hits, None)[0]  # type: ignore[arg-type]
        assert {m: (j.value, j.status, j.reason) for m, j in scores.items()} == expected


def test_a_citation_past_99_is_an_empty_answer_among_as_many_sources() -> None:
    # "[150]" of 150 sources is a citation (of 5 sources, a number: text), as generate reads
    # it; eval rag read every bracket past 99 as text, so "[150]" was an answer to score.
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import EMPTY_ANSWER, FAILED, score_answer
    from ragpipe.query.generate import Answer, Source, no_answer_text
    from ragpipe.query.results import Retrieved

    hits = [Retrieved(f"p{n}", 1.0, {"file_path": f"d{n}.md", "text": f"Fact {n}."})
            for n in range(1, 151)]  # fmt: skip
    sources = [Source(n, f"p{n}", f"d{n}.md", None, "", f"Fact {n}.") for n in range(1, 151)]
    item = GoldenItem("fact", "What is fact 150?", {"d150.md": 1}, (), "Fact 150.")
    reply = Answer(item.query, "[150]", sources, [sources[149]])
    assert no_answer_text("[150]", 150) and not no_answer_text("[150]", 5)
    scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
    assert (scores["false_refusal"].status, scores["false_refusal"].reason) == (
        FAILED, EMPTY_ANSWER)  # fmt: skip
    assert scores["citation_precision"].value is None


def test_a_zero_cited_counts_as_a_wrong_citation_as_one_past_the_sources_does() -> None:
    # "X [0]." was uncited text: citation precision not applicable ("nothing cited") where
    # "X [7]." of 2 sources scored 0 (a citation of a source never given). By hand, for
    # both: one distinct number cited, not the target's source [1]: precision 0/1; the one
    # target held by [1] not cited: recall 0/1; the answer's words are the expected ones.
    from ragpipe.evaluation.rag import OK, score_answer
    from ragpipe.query.generate import answer

    item, hits = _bread()
    said = "Bake the loaf at 230 degrees Celsius for thirty-five minutes"
    for number in (0, 7):
        reply = answer(item.query, hits, _Scripted(f"{said} [{number}]."))  # type: ignore[arg-type]
        assert reply.invalid_citations == [number] and reply.text == f"{said}."
        scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
        got = {m: (scores[m].value, scores[m].status) for m in
               ("answer_f1", "citation_precision", "citation_recall", "false_refusal")}  # fmt: skip
        assert got == {
            "answer_f1": (1.0, OK),
            "citation_precision": (0.0, OK),
            "citation_recall": (0.0, OK),
            "false_refusal": (0.0, OK),
        }, number


def test_a_refusal_by_the_relevance_floor_with_the_target_retrieved_is_a_false_one() -> None:
    # Best cosine 0.22 under a floor of 0.25: "not found" without asking the model, though
    # the target chunk was hit 1. false_refusal was n/a ("no given source holds a golden
    # target": none was given), so 5 such refusals of 10 read 0.000 (n=5); by hand 1 each.
    from ragpipe.evaluation.rag import OK, score_answer
    from ragpipe.query.generate import BELOW_FLOOR, answer

    item, hits = _bread()
    model = _Scripted("unused [1].")
    reply = answer(item.query, hits, model, min_relevance=0.25)  # type: ignore[arg-type]
    assert model.asked == 0 and BELOW_FLOOR in reply.flags
    scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
    assert (scores["false_refusal"].value, scores["false_refusal"].status) == (1.0, OK)
    below = [hits[1]]  # only the soup retrieved: the refusal is right, not applicable
    reply = answer(item.query, below, model, min_relevance=0.25)  # type: ignore[arg-type]
    scores = score_answer(item, reply, below, None)[0]  # type: ignore[arg-type]
    assert scores["false_refusal"].reason == "no retrieved hit holds a golden target"


def test_a_target_cut_from_its_source_by_the_budget_is_not_given() -> None:
    # The source the model read holds the chunk's first sentence only; the target's text
    # ("thirty-five minutes") was cut. A refusal scored false_refusal 1 from the whole
    # chunk's text; the model never saw the answer: not applicable.
    from ragpipe.evaluation.golden import ChunkTarget
    from ragpipe.evaluation.rag import NOT_APPLICABLE, score_answer
    from ragpipe.query.generate import NOT_FOUND, Answer, Source

    item, hits = _bread()
    item = type(item)(item.id, item.query, item.relevance,
                      (ChunkTarget("kitchen/bread.md", contains="thirty-five minutes"),),
                      item.expected_answer)  # fmt: skip
    cut = Source(1, "p1", "kitchen/bread.md", None, "Oven", "Bake the loaf at 230 degrees")
    reply = Answer(item.query, NOT_FOUND, [cut], [], not_found=True)
    scores, sources, _, _ = score_answer(item, reply, hits, None)  # type: ignore[arg-type]
    assert sources[0]["holds_target"] is False
    assert scores["false_refusal"].status == NOT_APPLICABLE


def test_a_loop_withdrawn_as_not_found_is_still_degenerate() -> None:
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import DEGENERATE, WITHDRAWN, answer

    item, hits = _bread()
    looping = _Scripted(*["Not found in the provided documents. "] * 200)
    reply = answer(item.query, hits, looping)  # type: ignore[arg-type]
    assert {DEGENERATE, WITHDRAWN} <= set(reply.flags)
    scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
    assert scores["degenerate"].value == 1.0  # it read 0.0: the shown text is one sentence


def test_citation_recall_with_file_targets_counts_files_not_chunks() -> None:
    # Three chunks of ops/backups.md given; the answer cites the one that answers. Recall
    # was 1/3 (every chunk of the file counted as needed); by hand 1/1, one file cited.
    from ragpipe.evaluation.golden import GoldenItem
    from ragpipe.evaluation.rag import score_answer
    from ragpipe.query.generate import Answer, Source
    from ragpipe.query.results import Retrieved

    heads = ["Schedule", "Retention", "Restore"]
    hits = [Retrieved(f"p{i}", 1.0 - i / 10, {"file_path": "ops/backups.md",
                                              "heading_path": [h], "text": h})
            for i, h in enumerate(heads)]  # fmt: skip
    sources = [Source(i + 1, f"p{i}", "ops/backups.md", None, h, h) for i, h in enumerate(heads)]
    item = GoldenItem("when", "When do backups run?", {"backups.md": 1}, (), "Nightly.")
    reply = Answer(item.query, "Every night at 02:00 [1].", sources, [sources[0]])
    scores = score_answer(item, reply, hits, None)[0]  # type: ignore[arg-type]
    assert scores["citation_precision"].value == 1.0
    assert scores["citation_recall"].value == 1.0
