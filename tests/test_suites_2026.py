"""The suites 2026 papers cite: DPG-Bench's question graph, T2I-CompBench++'s per-category metrics (UniDet's part
substituted and marked), UniGenBench++'s testpoint judge; their converters on small files written here and tiny
judges (module:function), never a download."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT

import flowrl
from flowrl.cli.main import main
from flowrl.core.registry import available
from flowrl.suites import converters
from flowrl.suites.data import SOURCES, FetchError, fetch

EGRPO = str(ROOT / "recipes" / "egrpo.toml")
CLIP = {"type": "clipscore", "model": str(ROOT / "tests" / "data" / "rewards" / "clip"), "device": "cpu"}


def cat_judge(image: torch.Tensor, question: str, forms: list[str]) -> float:
    """Says yes (0.9) to questions about a cat, no (0.9) to the rest."""
    yes = "cat" in question.lower()
    return (0.9 if yes else 0.1) if forms[0].strip().lower() == "yes" else (0.1 if yes else 0.9)


# -- DPG-Bench ---------------------------------------------------------------------------------------------------
DPG_CSV = (
    "item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,question_natural_language\n"
    "a1,a black cat on a red mat,,1,0,entity,whole,entity - whole (cat),Is there a cat?\n"
    "a1,a black cat on a red mat,,2,0,entity,whole,entity - whole (mat),Is there a mat?\n"
    "a1,a black cat on a red mat,,3,1,attribute,color,attribute - color (cat; black),Is the cat black?\n"
    "a1,a black cat on a red mat,,4,2,attribute,color,attribute - color (mat; red),Is the mat red?\n"
    "a1,a black cat on a red mat,,5,\"1,2\",relation,spatial,\"relation - spatial (cat, mat; on)\","
    "Is the cat on the mat?\n"
    "b2,a dog,,1,0,entity,whole,entity - whole (dog),Is there a dog?\n")


def _dpg_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    raw = DPG_CSV.encode()
    monkeypatch.setattr(converters, "DPG_BLOB", converters.git_blob(raw))
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path / "data"))
    return fetch("dpgbench", download=lambda url: raw)


def test_dpg_fetch_checks_the_git_blob_and_groups_questions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path / "data"))
    with pytest.raises(FetchError, match="git blob"):
        fetch("dpgbench", download=lambda url: DPG_CSV.encode())  # not the pinned file
    rows = [json.loads(line) for line in _dpg_file(tmp_path, monkeypatch).read_text().splitlines()]
    assert [r["item_id"] for r in rows] == ["a1", "b2"] and len(rows[0]["questions"]) == 5
    assert rows[0]["questions"][4]["parents"] == [1, 2] and rows[0]["questions"][0]["parents"] == []
    assert converters.git_blob(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object


def test_dpg_graph_zeroes_children_of_a_no_in_order() -> None:
    from flowrl.suites.dpgbench import category, graph_scores

    answers = {1: False, 2: True, 3: True, 4: True}
    parents = {1: [], 2: [1], 3: [2], 4: []}
    assert graph_scores(answers, parents) == {1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}  # 3 falls through 2
    assert graph_scores({1: True, 2: True}, {1: [], 2: [7]}) == {1: 1.0, 2: 1.0}  # no question 7: not a parent
    assert category({"tuple": "relation - spatial (cat, mat; on)"}) == "relation"


def test_dpg_scores_and_categories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dpg_file(tmp_path, monkeypatch)
    suite = flowrl.build("suite", {"type": "dpgbench", "judge": "test_suites_2026:cat_judge"})
    items = suite.items()
    rows = suite.score(torch.rand(2, 3, 8, 8), items)
    # a1: cat yes, mat no, black cat yes, red mat no, cat on mat yes but a parent (the mat) is no -> 2 of 5
    assert rows[0]["dpg"] == pytest.approx(2 / 5) and rows[1]["dpg"] == 0.0
    figures = suite.aggregate(rows, items)
    assert figures["dpg"] == pytest.approx(100 * (2 / 5 + 0) / 2)
    assert figures["category/entity"] == pytest.approx(100 / 3)  # cat yes; mat, dog no
    assert figures["category/attribute"] == pytest.approx(50.0)
    assert figures["category/relation"] == pytest.approx(100.0)  # its own answer, before the parent rule
    assert "category/global" not in figures
    assert suite.headline() == {"figure": "dpg_score", "of": "dpg", "by": "", "scale": 100.0}
    assert suite.scorer_problems({"judge": "test_suites_2026:cat_judge"})
    assert suite.scorer_problems({"judge": "openai:http://h:1#mplug_visual-question-answering_coco_large_en"}) == []


def test_dpg_suite_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dpg_file(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert main(["suite", "run", "dpgbench", EGRPO, "--out", str(out), "--quiet", "--set",
                 "judge='test_suites_2026:cat_judge'", "--protocol", "resolution=32", "--protocol", "steps=4",
                 "--protocol", "guidance=3.5"]) == 0
    summary = json.loads((out / "egrpo-initial" / "dpgbench" / "summary.json").read_text())
    assert summary["images"] == 8 and summary["figures"]["dpg"] == pytest.approx(20.0)
    assert not summary["comparable"] and any("mPLUG" in r for r in summary["differs"])


# -- T2I-CompBench++ ---------------------------------------------------------------------------------------------
def words(prompt: str) -> dict:
    """A parser for the tests: noun phrases split on " and ", adjectives are the colour words."""
    colours = {"red", "blue", "green", "black"}
    return {"noun_phrases": [p.strip() for p in prompt.rstrip(".").split(" and ")],
            "without_adjectives": " ".join(w for w in prompt.split() if w.lower() not in colours)}


def _t2i_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"color_val": "a black cat and a red dog\n", "spatial_val": "a cat next to a lamp\n",
             "non_spatial_val": "a cat is watching a bird\n", "numeracy_val": "two dogs\n",
             "complex_val": "The black cat sat on the red mat.\nThe blue dog chased the cat.\nThe cat and the dog.\n",
             "complex_val_spatial": "The black cat sat on the red mat.\n",
             "complex_val_action": "The blue dog chased the cat.\n"}
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path / "data"))
    from flowrl.suites import data

    sources = tuple(s for s in data.SOURCES["t2icompbench"] if Path(s.url).stem in files)
    monkeypatch.setitem(data.SOURCES, "t2icompbench", tuple(
        data.Source(s.url, None, s.licence, s.convert) for s in sources))
    fetch("t2icompbench", download=lambda url: files[Path(url).stem].encode())


def test_t2i_fetch_refuses_a_changed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path))
    with pytest.raises(FetchError, match="is not the pinned"):
        fetch("t2icompbench", download=lambda url: b"a red cat\n")
    assert len(SOURCES["t2icompbench"]) == 10


def test_t2i_categories_and_their_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.suites.t2icompbench import SUBSTITUTION, attribute_score, complex_score

    _t2i_data(tmp_path, monkeypatch)
    suite = flowrl.build("suite", {"type": "t2icompbench", "judge": "test_suites_2026:cat_judge",
                                   "parser": "test_suites_2026:words", "clip": CLIP})
    items = suite.items()
    assert [i.category for i in items] == ["color", "spatial", "non_spatial", "complex", "complex", "complex",
                                           "numeracy"]
    assert [i.meta["parts"] for i in items if i.category == "complex"] == ["spatial", "action", "all"]
    image = torch.rand(3, 16, 16)
    assert attribute_score(cat_judge, image, ["a black cat", "a red dog"]) == pytest.approx(0.9 * 0.1)
    assert attribute_score(cat_judge, image, ["top", "a cat"]) == pytest.approx(0.9)  # "top" is left out
    assert complex_score("spatial", 0.2, 0.4, 9.0) == pytest.approx(0.3)
    assert complex_score("all", 0.3, 0.6, 0.9) == pytest.approx(0.6)
    rows = suite.score(torch.rand(len(items), 3, 32, 32), items)
    scores = [r["score"] for r in rows]
    assert scores[0] == pytest.approx(0.09) and scores[1] == pytest.approx(0.9) and scores[6] == pytest.approx(0.1)
    assert -1 <= scores[2] <= 1 and scores[2] not in (0.9, 0.1)  # a CLIP cosine
    figures = suite.aggregate(rows, items)
    assert figures["mean"] == pytest.approx(sum(figures[c] for c in ("color", "spatial", "non_spatial", "complex",
                                                                     "numeracy")) / 5)
    assert suite.headline()["by"] == "category"
    own = {"judge": "openai:http://h:1#blip-vqa-capfilt-large", "parser": "spacy:en_core_web_sm"}
    assert suite.scorer_problems(own) == [SUBSTITUTION]  # UniDet's part is never the source's
    assert len(suite.scorer_problems({"judge": "test_suites_2026:cat_judge", "clip": CLIP})) == 3


# -- UniGenBench++ -----------------------------------------------------------------------------------------------
JUDGE_PY = '''
EXPLANATION_DICT_EN = {"Style": "how it is drawn", "Attribute - Color": "colours"}
EXPLANATION_DICT_ZH = {"风格": "画风"}
SYSTEM_PROMPT_EN_TEMPLATE = "P={prompt} T={testpoint} E={explanation} D={test_explanation}"
SYSTEM_PROMPT_ZH_TEMPLATE = "提示={prompt} {testpoint} {explanation} {test_explanation}"
LANG_CONFIGS = {"en": {"explanation_dict": EXPLANATION_DICT_EN, "checkpoint_header": "Defs",
                       "checkpoint_desc_header": "Descs"},
                "zh": {"explanation_dict": EXPLANATION_DICT_ZH, "checkpoint_header": "说明",
                       "checkpoint_desc_header": "描述"}}
'''
ANSWERS: list[str] = []


def answerer(image: torch.Tensor, text: str) -> str:
    """Answers from ANSWERS in turn (the last one again when they run out); records the instruction."""
    ANSWERS.append(text)
    replies = ["no list here", "<score>[1, 0]</score>", "<score>[1]</score>"]
    return replies[min(len(ANSWERS) - 1, 2)] if "Color" in text else "<score>[1]</score>"


def _unigen_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.suites import data

    def table(lang: str, rows: list) -> str:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["index", f"prompt_{lang}", f"sub_dims_{lang}"])
        writer.writerows([i, prompt, json.dumps(dims, ensure_ascii=False)] for i, (prompt, dims) in enumerate(rows))
        return out.getvalue()

    en = table("en", [("a red fox in ink", {"Testpoints": ["Style", "Attribute - Color"],
                                            "Testpoint Description": ["ink", "red"]}),
                      ("a sketch", {"Testpoints": ["Style"], "Testpoint Description": ["sketch"]})])
    zh = table("zh", [("水墨画", {"考点": ["风格"], "考点对应描述": ["水墨"]})])
    files = {"test_prompts_en": en, "test_prompts_zh": zh, "eval_common": JUDGE_PY}
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path / "data"))
    for name in ("unigenbench", "unigenbench-judge"):
        monkeypatch.setitem(data.SOURCES, name, tuple(data.Source(s.url, None, s.licence, s.convert)
                                                      for s in data.SOURCES[name] if Path(s.url).stem in files))
        fetch(name, download=lambda url: files[Path(url).stem].encode())


def test_unigen_instruction_scores_and_dimensions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.suites.unigenbench import dimension, read_scores

    _unigen_data(tmp_path, monkeypatch)
    ANSWERS.clear()
    suite = flowrl.build("suite", {"type": "unigenbench", "judge": "test_suites_2026:answerer"})
    items = suite.items()
    assert [i.prompt for i in items] == ["a red fox in ink", "a sketch"]  # the en form only
    assert [i.prompt for i in flowrl.build("suite", {"type": "unigenbench", "form": "zh"}).items()] == ["水墨画"]
    rows = suite.score(torch.rand(2, 3, 8, 8), items)
    assert ANSWERS[0] == ("P=a red fox in ink T=['Style', 'Attribute - Color'] E=Defs:\u300c\nStyle: how it is "
                          "drawn\nAttribute - Color: colours\n\u300d D=Descs:\u300c\nStyle: ink\nAttribute - Color: "
                          "red\n\u300d")
    assert len(ANSWERS) == 3  # an unreadable answer is asked again
    assert rows[0]["score"] == 0.5 and rows[1]["score"] == 1.0
    figures = suite.aggregate(rows, items)
    assert figures["dim/Style"] == 100.0 and figures["dim/Attribute"] == 0.0 and figures["overall"] == 50.0
    assert figures["score"] == 75.0 and figures["sub/Attribute - Color"] == 0.0
    assert dimension("属性-数量") == "属性" and read_scores("<score>[1, 2]</score>", 2) is None
    assert suite.scorer_problems({"judge": "http://h:8080#QwenVL"}) == []
    assert suite.scorer_problems({"judge": "test_suites_2026:answerer"})


def test_unigen_judge_that_never_answers_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.core.errors import UserError

    _unigen_data(tmp_path, monkeypatch)
    ANSWERS.clear()
    suite = flowrl.build("suite", {"type": "unigenbench", "judge": "test_suites_2026:silent"})
    with pytest.raises(UserError, match="no readable <score> list of 2 .* in 11 tries"):
        suite.score(torch.rand(1, 3, 8, 8), suite.items()[:1])


def silent(image: torch.Tensor, text: str) -> str:
    return "I cannot tell."


def test_the_new_suites_are_listed_and_documented() -> None:
    text = (ROOT / "docs" / "evaluation.md").read_text()
    for name in ("dpgbench", "t2icompbench", "unigenbench"):
        assert name in available("suite") and f"`{name}`" in text
