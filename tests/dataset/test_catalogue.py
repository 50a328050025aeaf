"""The builder's inputs: the variable catalogue (TOML, JSON) and the labelled table (CSV, JSONL),
each problem reported as file:line."""

import json

import pytest

from psyrl.core.records import DataError
from psyrl.dataset.catalogue import load_catalogue
from psyrl.dataset.labelled import load_labelled

GOOD = """\
[[variable]]
code = "B_disap"
description = "disappointment"
range = [0, 3]
dimension = "emotional reactions"
subdimension = "specific emotions"
topics = ["a broken promise"]

[[variable]]
code = "J_div"
description = "diversity"
range = [0, 2.5]
dimension = "collective psychology"
subdimension = "national theme"
category = "diversity"
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_shipped_example_loads():
    catalogue = load_catalogue("data/build/catalogue.toml")
    stimuli = load_labelled("data/build/stimuli.csv", catalogue)
    assert list(catalogue)[:2] == ["B_disap", "B_anger"] and len(catalogue) == 7
    assert catalogue["C_dpol"].category == "targeted emotions"  # no category: the subdimension
    assert len(stimuli) == 12 and sum(len(s.values) for s in stimuli) == 44
    assert stimuli[0].id == "ex01" and stimuli[0].values == {
        "B_disap": 3.0,
        "B_anger": 1.0,
        "S_agency": 4.0,
    }


def test_catalogue_fields_and_the_range_text(tmp_path):
    catalogue = load_catalogue(write(tmp_path, "c.toml", GOOD))
    disap, div = catalogue["B_disap"], catalogue["J_div"]
    assert (disap.low, disap.high, disap.range_text, disap.category) == (
        0.0,
        3.0,
        "0 to 3",
        "specific emotions",
    )
    assert disap.topics == ("a broken promise",) and div.topics == ()
    assert div.range_text == "0 to 2.5" and div.category == "diversity"


def test_a_json_catalogue_is_the_same_shape(tmp_path):
    import tomli

    path = write(tmp_path, "c.json", json.dumps(tomli.loads(GOOD), indent=2))
    assert load_catalogue(path) == load_catalogue(write(tmp_path, "c.toml", GOOD))
    listed = write(tmp_path, "l.json", json.dumps(tomli.loads(GOOD)["variable"], indent=2))
    assert load_catalogue(listed) == load_catalogue(path)
    with pytest.raises(DataError, match=r"l.json:17: variable 2: 'description' must not be empty"):
        load_catalogue(
            write(tmp_path, "l.json", listed.read_text().replace('"diversity"', '""', 1))
        )


@pytest.mark.parametrize(
    "edit, line, message",
    [
        (("range = [0, 3]", "range = [3, 0]"), 4, "range must be [lowest, highest]"),
        (("range = [0, 3]", 'range = ["low", "high"]'), 4, "range must be"),
        (
            ('dimension = "emotional reactions"', 'dimension = "emotions"'),
            5,
            "dimension 'emotions' is not one of",
        ),
        (
            ('subdimension = "national theme"', 'subdimension = "nation"'),
            14,
            "subdimension 'nation' is not one of",
        ),
        (('category = "diversity"', 'categroy = "diversity"'), 15, "unknown key 'categroy'"),
        (('description = "diversity"\n', ""), 9, "missing key 'description'"),
        (('code = "J_div"', 'code = "B_disap"'), 10, "duplicate code 'B_disap'"),
        (('code = "J_div"', 'code = "J div"'), 10, "must be a letter then letters, digits or _"),
        (
            ('topics = ["a broken promise"]', 'topics = ["", "x"]'),
            7,
            "topics must be a list of non-empty strings",
        ),
        (
            ('description = "diversity"', 'description = "  "'),
            11,
            "'description' must not be empty",
        ),
    ],
)
def test_catalogue_errors_name_the_file_and_line(tmp_path, edit, line, message):
    path = write(
        tmp_path,
        "c.toml",
        GOOD.replace(*edit, 1)
        if edit[0] != 'description = "diversity"\n'
        else GOOD.replace(edit[0], edit[1]),
    )
    with pytest.raises(DataError, match="nothing loaded") as e:
        load_catalogue(path)
    assert f"{path}:{line}: " in str(e.value) and message in str(e.value)


def test_catalogue_errors_in_json_and_syntax(tmp_path):
    data = {
        "variable": [
            {
                "code": "A_a",
                "description": "a",
                "range": [0, 1],
                "dimension": "collective psychology",
                "subdimension": "needs fulfilment",
            },
            {
                "code": "A_b",
                "description": "b",
                "range": [0, 1],
                "dimension": "collective psychology",
                "subdimension": "needs fulfilment",
                "topics": "not a list",
            },
        ]
    }
    path = write(tmp_path, "c.json", json.dumps(data, indent=1))
    line = json.dumps(data, indent=1).splitlines().index('   "topics": "not a list"') + 1
    with pytest.raises(DataError, match=rf"c.json:{line}: variable 2: 'topics' must be a list"):
        load_catalogue(path)
    with pytest.raises(DataError, match=r"c.json:2: invalid JSON"):
        load_catalogue(write(tmp_path, "c.json", '{"variable": [\n  {"code": }]}'))
    with pytest.raises(DataError, match=r"invalid TOML: .*line 2"):
        load_catalogue(write(tmp_path, "c.toml", "[[variable]]\ncode = \n"))
    # a bad byte: the same message as a data table's (labelled.py), its line and its byte there
    latin = tmp_path / "latin.toml"
    latin.write_bytes("[[variable]]\nlabel = 'caf\u00e9'\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.toml:2: not valid UTF-8 \(byte 13 of the line\)"):
        load_catalogue(latin)
    with pytest.raises(DataError, match=r"expected one or more \[\[variable\]\] tables"):
        load_catalogue(write(tmp_path, "c.toml", "[variables]\ncode = 'x'\n"))
    with pytest.raises(DataError, match="no such catalogue file"):
        load_catalogue(tmp_path / "missing.toml")


TABLE = """id,stimuli,B_disap,J_div
s1,"I waited all day, and nobody came.",3,
s2,"Our team speaks five languages.",NA,2.5
s3,"A story
over two lines.",0,1
"""


def test_table_values_missing_cells_and_multiline_rows(tmp_path):
    catalogue = load_catalogue(write(tmp_path, "c.toml", GOOD))
    stimuli = load_labelled(write(tmp_path, "t.csv", TABLE), catalogue)
    assert [(s.id, s.values) for s in stimuli] == [
        ("s1", {"B_disap": 3.0}),
        ("s2", {"J_div": 2.5}),
        ("s3", {"B_disap": 0.0, "J_div": 1.0}),
    ]
    assert stimuli[2].text == "A story\nover two lines."
    rows = [
        {"id": "s1", "text": "One.", "B_disap": 1, "J_div": None},
        {"id": 7, "text": "Two.", "J_div": ""},
    ]
    jsonl = write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert [(s.id, s.values) for s in load_labelled(jsonl, catalogue)] == [
        ("s1", {"B_disap": 1.0}),
        ("7", {}),
    ]


@pytest.mark.parametrize(
    "table, problems",
    [
        (TABLE.replace("s2,", "s1,"), [":3: duplicate id 's1' (first on line 2)"]),
        (
            TABLE.replace(",3,\n", ",4,\n"),
            [":2: 'B_disap': 4 is outside the catalogue's range 0 to 3"],
        ),
        (TABLE.replace("NA,2.5", "high,2.5"), [":3: 'B_disap': \"high\" is not a number"]),
        (
            TABLE.replace('over two lines.",0,1', 'over two lines.",0'),
            [":4: 3 cells, the header has 4"],
        ),
        (
            TABLE.replace('"Our team speaks five languages."', '" "'),
            [":3: 'stimuli' (the stimulus) must be a non-empty"],
        ),
        (
            TABLE.replace("J_div\n", "J_dvi\n"),
            [
                ":1: column 'J_dvi' is not a variable of the catalogue; did you mean "
                "'J_div'? pass --ignore-column J_dvi"
            ],
        ),
        (
            TABLE.replace("id,", "ident,", 1),
            [":1: no 'id' column", ":1: column 'ident' is not a variable"],
        ),
    ],
)
def test_table_errors_name_the_file_and_line(tmp_path, table, problems):
    catalogue = load_catalogue(write(tmp_path, "c.toml", GOOD))
    path = write(tmp_path, "t.csv", table)
    with pytest.raises(DataError) as e:
        load_labelled(path, catalogue)
    for problem in problems:
        assert f"{path}{problem}" in str(e.value)


def test_table_columns_ignored_chosen_and_jsonl_errors(tmp_path):
    catalogue = load_catalogue(write(tmp_path, "c.toml", GOOD))
    extra = write(tmp_path, "t.csv", "key,story,age,B_disap\nk1,A story.,34,2\n")
    stimuli = load_labelled(extra, catalogue, id_column="key", ignore_columns=["age"])
    assert (stimuli[0].id, stimuli[0].text, stimuli[0].values) == (
        "k1",
        "A story.",
        {"B_disap": 2.0},
    )
    bad = write(tmp_path, "t.jsonl", '{"id": "a", "stimuli": "x", "B_disap": true}\nnot json\n')
    with pytest.raises(DataError) as e:
        load_labelled(bad, catalogue)
    assert f"{bad}:2: invalid JSON (Expecting value at column 1)" in str(e.value)
    with pytest.raises(DataError, match=r"t.jsonl:1: 'B_disap': true is not a number"):
        load_labelled(
            write(tmp_path, "t.jsonl", '{"id": "a", "stimuli": "x", "B_disap": true}\n'), catalogue
        )
    with pytest.raises(DataError, match="holds no stimuli"):
        load_labelled(write(tmp_path, "t.csv", "id,stimuli\n"), catalogue)


def test_tables_as_spreadsheets_write_them(tmp_path):
    catalogue = load_catalogue(write(tmp_path, "c.toml", GOOD))
    expected = [
        ("s1", "A story; with a semicolon.", {"B_disap": 3.0}),
        ("s2", "Another.", {"J_div": 1.0}),
    ]
    semicolon = write(
        tmp_path,
        "t.csv",
        'ID;Story;B_disap;J_div\ns1;"A story; with a semicolon.";3;\ns2;Another.;;1\n',
    )
    tab = write(
        tmp_path,
        "t.tsv",
        "ID\tStory\tB_disap\tJ_div\ns1\tA story; with a semicolon.\t3\t\ns2\tAnother.\t\t1\n",
    )
    pandas = write(
        tmp_path,
        "p.csv",
        ',id,stimuli,B_disap,J_div\n0,s1,"A story; with a semicolon.",3,\n1,s2,Another.,,1\n',
    )
    array = write(
        tmp_path,
        "t.json",
        json.dumps(
            [
                {"id": "s1", "text": "A story; with a semicolon.", "B_disap": 3},
                {"id": "s2", "text": "Another.", "J_div": 1},
            ],
            indent=1,
        ),
    )
    for path in (semicolon, tab, pandas, array):
        assert [(s.id, s.text, s.values) for s in load_labelled(path, catalogue)] == expected, path
    # the line where the second row's object opens
    second = array.read_text().splitlines().index(" {", 2) + 1
    with pytest.raises(DataError, match=rf"t.json:{second}: 'J_div': 9 is outside"):
        load_labelled(
            write(tmp_path, "t.json", array.read_text().replace('"J_div": 1', '"J_div": 9')),
            catalogue,
        )
    latin = tmp_path / "latin.csv"
    latin.write_bytes("id,stimuli\ns1,fine\ns2,caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.csv:3: not valid UTF-8 \(byte 7 of the line\)"):
        load_labelled(latin, catalogue)
    with pytest.raises(
        DataError,
        match=r"no 'key' column \(columns: id, stimuli, B_disap, J_div\); name it with "
        r"--id-column",
    ):
        load_labelled(write(tmp_path, "t.csv", TABLE), catalogue, id_column="key")


def test_one_variable_table_instead_of_an_array_of_tables(tmp_path):
    with pytest.raises(
        DataError, match=r"`variable` is one table; write each variable as \[\[variable\]\]"
    ):
        load_catalogue(
            write(tmp_path, "c.toml", GOOD.split("\n\n")[0].replace("[[variable]]", "[variable]"))
        )
