"""Queue files: hierarchy, validation and error messages."""

from __future__ import annotations

import pytest

from gpupool.engine.pool.queues import QueueConfigError, QueueSpec, QueueTree, load_queues_yaml, queues_from_dicts

GOOD = """
queues:
  - name: research
    quota: 48
  - name: vision
    parent: research
    quota: 32
    limit: 64
    weight: 2
  - name: nlp
    parent: research
    quota: 16
  - name: prod
    quota: 16
    priority: 10
    limit: -1
"""


def test_load_queue_file(tmp_path):
    path = tmp_path / "queues.yaml"
    path.write_text(GOOD)
    t = load_queues_yaml(path)
    assert t.names == ("research", "vision", "nlp", "prod")
    assert [t.names[i] for i in t.leaves] == ["vision", "nlp", "prod"]
    assert t.parent.tolist() == [-1, 0, 0, -1]
    assert t.limit_gpu[1] == 64 and t.limit_gpu[3] == float("inf")
    assert t.ancestors(1) == [1, 0]
    assert t.leaf_index("nlp") == 2
    q = t.quota_vectors(cpu_per_gpu=4000, mem_per_gpu=8192)
    assert q[1].tolist() == [32, 32 * 4000, 32 * 8192]


BAD = [
    ("unknown parent", [{"name": "a", "parent": "x"}], "parent 'x' is not defined"),
    ("duplicate", [{"name": "a"}, {"name": "a"}], "defined twice"),
    ("cycle", [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}], "cycle"),
    ("own parent", [{"name": "a", "parent": "a"}], "own parent"),
    ("limit below quota", [{"name": "a", "quota": 4, "limit": 2}], "below quota"),
    ("negative quota", [{"name": "a", "quota": -1}], "quota"),
    ("zero weight", [{"name": "a", "weight": 0}], "weight"),
    ("unknown field", [{"name": "a", "quotas": 3}], "quotas"),
    ("children above parent", [{"name": "p", "quota": 4}, {"name": "c", "parent": "p", "quota": 8}],
     "more than its own quota"),
    ("no queues", [], "no queues"),
    ("numeric name", [{"name": 103959}], "quote names"),
    ("boolean weight", [{"name": "a", "weight": True}], "weight.*expected a number, got true"),
    ("boolean quota", [{"name": "a", "quota": False}], "quota.*expected a number, got false"),
]


@pytest.mark.parametrize(("name", "items", "message"), BAD, ids=[b[0] for b in BAD])
def test_invalid_queues_are_reported(name, items, message):
    with pytest.raises(QueueConfigError, match=message) as info:
        queues_from_dicts(items, "q.yaml")
    assert "q.yaml" in str(info.value)


def test_file_level_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues: {a: 1}\n")
    with pytest.raises(QueueConfigError, match="bad.yaml: expected a 'queues:' list"):
        load_queues_yaml(bad)
    bad.write_text("queue: []\n")
    with pytest.raises(QueueConfigError, match="1:1: unknown field 'queue' at the top level; did you mean 'queues'"):
        load_queues_yaml(bad)
    bad.write_text("queues: [\n")
    with pytest.raises(QueueConfigError, match="invalid YAML"):
        load_queues_yaml(bad)


def test_only_leaves_take_jobs():
    t = QueueTree([QueueSpec(name="p"), QueueSpec(name="c", parent="p")])
    with pytest.raises(KeyError, match="only leaf queues"):
        t.leaf_index("p")
    with pytest.raises(KeyError, match="leaf queues: c"):
        t.leaf_index("nope")


def test_example_queue_file_covers_the_philly_virtual_clusters():
    from pathlib import Path

    t = load_queues_yaml(Path(__file__).resolve().parents[1] / "examples" / "queues" / "teams.yaml")
    leaves = {t.names[i] for i in t.leaves}
    assert leaves == {"6214e9", "11cb48", "6c71a0", "b436b2", "103959", "ee9e8c", "0e4a51", "ed69ec", "7f04ca",
                      "2869ce", "e13805", "23dbec", "51b7ef", "925e2b", "795a4c"}
    assert t.quota_gpu[[t.index[n] for n in ("research", "product", "shared")]].sum() <= 512


def test_a_bad_indent_in_a_queue_file_is_one_line_with_file_line_and_column(tmp_path):
    # before: "not valid YAML: " and PyYAML's 8-line dump (the offending lines and a caret)
    bad = tmp_path / "q.yaml"
    bad.write_text("queues:\n  - name: a\n    quota: 3\n   - name: b\n")
    with pytest.raises(QueueConfigError) as info:
        load_queues_yaml(bad)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{bad}:4:4: invalid YAML: ")
    assert str(info.value).endswith("; check the indentation of this line against the lines above")


def test_an_unknown_queue_field_names_its_line_and_column_and_the_field_meant(tmp_path):
    bad = tmp_path / "q.yaml"
    bad.write_text("queues:\n  - name: a\n    quotaa: 3\n")
    with pytest.raises(QueueConfigError) as info:
        load_queues_yaml(bad)
    assert str(info.value) == f"{bad}:3:5: unknown field 'quotaa' in queues[0]; did you mean 'quota'?"
    with pytest.raises(QueueConfigError, match="did you mean 'weight'"):  # a list of dicts: no lines, still a hint
        queues_from_dicts([{"name": "a", "weigth": 2}], "q.yaml")
