"""The "where each rule lives" table is made from the mutation check.

The table is on the architecture page. It is made from the mutation check, so it cannot point at
a place the code has left: these tests say the page is current and that the place of a rule is
found the way a reader would look for it."""

from __future__ import annotations

from pathlib import Path

from dev import rule_map

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_in_the_architecture_page_is_current() -> None:
    assert rule_map.main(["--check"]) == 0, "run python -m dev.rule_map"


def test_every_covered_rule_has_a_row_naming_a_function_and_a_test() -> None:
    rows = [r for r in rule_map.table().splitlines()[2:]]
    rules = rule_map.mc.read_rules()
    assert len(rows) == len(rules)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert "(pending)" not in cells[2], row
        assert " · `" in cells[2] and "(module)" not in cells[2], row
        assert "::test_" in cells[3], row


def test_the_function_is_the_innermost_def_around_the_line() -> None:
    source = ("class A:\n"
              "    def f(self):\n"
              "        def g():\n"
              "            return 1\n"
              "        return g\n"
              "x = 1\n"
              "print(x)\n")
    assert rule_map._python_scope(source, 4) == "A.f.g"
    assert rule_map._python_scope(source, 5) == "A.f"
    assert rule_map._python_scope(source, 6) == "x"
    assert rule_map._python_scope(source, 7) == "(module)"


def test_an_anchor_in_a_migration_names_its_sql_function() -> None:
    sql = ("CREATE TABLE t (a int);\n"
           "CREATE OR REPLACE FUNCTION tidemark.stop_of(task text) RETURNS text AS $$\n"
           "  SELECT 'x';\n$$;\n")
    assert rule_map._sql_scope(sql, sql.index("SELECT")) == "tidemark.stop_of"
    assert rule_map._sql_scope(sql, sql.index("TABLE")) == "(schema)"


def test_a_stale_table_is_reported(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "architecture.md"
    doc.write_text(f"x\n{rule_map.START}\n| stale |\n{rule_map.END}\ny\n", encoding="utf-8")
    monkeypatch.setattr(rule_map, "DOC", doc)
    assert rule_map.main(["--check"]) == 1
    assert rule_map.main([]) == 0
    assert rule_map.main(["--check"]) == 0
    assert doc.read_text(encoding="utf-8").startswith("x\n") and doc.read_text().endswith("y\n")


def test_an_anchor_in_a_module_constant_names_the_constant() -> None:
    source = 'import x\n_SQL = (\n    "SELECT 1"\n)\n'
    assert rule_map._python_scope(source, 3) == "_SQL"
