"""Text the reports print."""

from __future__ import annotations

import pytest

from stallwatch.report.render import fold_roles


@pytest.mark.parametrize(("roles", "text"), [
    (["scheduler_TP0", "scheduler_TP1", "detokenizer"], "scheduler_TP0..1, detokenizer"),
    (["main"], "main"),
])
def test_roles_fold_ranks(roles: list[str], text: str) -> None:
    assert fold_roles(roles) == text
