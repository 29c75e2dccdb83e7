"""Generated files (workflow, XID catalog, policy reference, schema.json) are current."""

from __future__ import annotations

from healer.cli import build_parser
from healer.docs import generated_files, write_generated


def test_generated_files_are_current() -> None:
    stale = write_generated(True, build_parser)
    assert not stale, f"run `make docs` (healer docs --write): stale {stale}"


def test_workflow_doc_names_every_phase() -> None:
    from healer.core.phases import Phase

    text = next(t for p, t in generated_files(build_parser).items() if p.name == "workflow.md")
    for phase in Phase:
        assert phase.value in text
    assert "stateDiagram-v2" in text
